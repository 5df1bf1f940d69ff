import { mkdir, writeFile } from "node:fs/promises";
import { cpus } from "node:os";
import { join } from "node:path";
import { repoRoot } from "../test/helpers/processes.ts";

export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
}

/** Print the JSON result and keep it under bench/results/. */
export async function writeResult(name: string, result: Record<string, unknown>): Promise<void> {
  const full = { ...result, measured_at: new Date().toISOString(), node: process.version, cpus: cpus().length, cpu: cpus()[0]?.model };
  const dir = join(repoRoot, "bench/results");
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, `${name}.json`), JSON.stringify(full, null, 2) + "\n");
  process.stdout.write(JSON.stringify(full) + "\n");
}

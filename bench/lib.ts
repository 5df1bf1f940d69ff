import { readdirSync, readFileSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import { cpus } from "node:os";
import { join } from "node:path";
import { repoRoot } from "../test/helpers/processes.ts";
import globalSetup from "../test/helpers/global-setup.ts";

/** Benches that build test worlds need what `vitest` sets up once: the services checked and the migrated template database. */
export const prepareServices = globalSetup;

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

/**
 * CPU seconds per process class over a wall-clock window, from /proc (Linux).
 * Polls every `everyMs` and keeps a time series, so the window can be chosen
 * afterwards (e.g. from fact timestamps): `between(t0, t1)` gives each class's
 * CPU seconds between the polls nearest those times. Processes are classed by
 * `classify(pid, cmdline)`; null leaves a process out. A process that exits
 * inside the window is missed: keep the measured ones alive past it.
 */
export function startCpuSampler(classify: (pid: number, cmdline: string) => string | null, everyMs = 50) {
  const tick = 100; // USER_HZ on Linux
  const series: Array<{ at: number; cpu: Map<number, number> }> = [];
  const classes = new Map<number, string>();
  const poll = () => {
    const cpu = new Map<number, number>();
    for (const name of readdirSync("/proc")) {
      const pid = Number(name);
      if (!Number.isInteger(pid)) continue;
      try {
        if (!classes.has(pid)) {
          const c = classify(pid, readFileSync(`/proc/${pid}/cmdline`, "utf8").replace(/\0/g, " "));
          classes.set(pid, c ?? "");
        }
        if (classes.get(pid) === "") continue;
        const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.split(" ") ?? [];
        cpu.set(pid, (Number(f[11]) + Number(f[12])) / tick);
      } catch {
        // the process exited between the listing and the read
      }
    }
    series.push({ at: Date.now(), cpu });
  };
  poll();
  const timer = setInterval(poll, everyMs);
  const nearest = (t: number) => series.reduce((best, s) => (Math.abs(s.at - t) < Math.abs(best.at - t) ? s : best));
  return {
    stop: () => clearInterval(timer),
    between(t0: number, t1: number): Record<string, number> {
      const a = nearest(t0);
      const b = nearest(t1);
      const out: Record<string, number> = {};
      for (const [pid, v] of b.cpu) {
        const c = classes.get(pid) as string;
        out[c] = (out[c] ?? 0) + v - (a.cpu.get(pid) ?? 0); // a process started in the window counts from 0
      }
      return Object.fromEntries(Object.entries(out).map(([k, v]) => [k, Math.round(v * 100) / 100]));
    },
  };
}

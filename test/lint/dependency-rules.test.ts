import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { cruise, type IConfiguration } from "dependency-cruiser";
import { afterAll, describe, expect, it } from "vitest";
import { repoRoot } from "../helpers/processes.ts";

/**
 * Each rule of .dependency-cruiser.cjs catches what it names: the probes plant a small src/ tree in
 * a temporary folder and cruise it with the committed rule set, so removing or loosening a rule
 * fails its probe. `npm run lint` cruises the real src/ with the same file.
 */
const config = createRequire(import.meta.url)(`${repoRoot}/.dependency-cruiser.cjs`) as IConfiguration;
const roots: string[] = [];
afterAll(() => {
  for (const root of roots) rmSync(root, { recursive: true, force: true });
});

async function violations(files: Record<string, string>): Promise<string[]> {
  const root = mkdtempSync(join(tmpdir(), "rlq-depcruise-"));
  roots.push(root);
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(root, path)), { recursive: true });
    writeFileSync(join(root, path), text);
  }
  const result = await cruise(["src"], {
    ...config.options,
    tsConfig: undefined,
    baseDir: root,
    ruleSet: { forbidden: config.forbidden ?? [] },
    validate: true,
  });
  if (typeof result.output === "string") throw new Error(`dependency-cruiser returned text: ${result.output}`);
  return result.output.summary.violations.map((v) => `${v.rule.name}: ${v.from} -> ${v.to}`);
}

describe("lint: dependency rules (.dependency-cruiser.cjs)", () => {
  it("a cycle made only of type imports is refused", async () => {
    const found = await violations({
      "src/store/a.ts": 'import type { B } from "./b.ts";\nexport interface A { b?: B }\n',
      "src/store/b.ts": 'import type { A } from "./a.ts";\nexport interface B { a?: A }\n',
    });
    expect(found.some((v) => v.startsWith("no-cycle:"))).toBe(true);
  });
  it("the same two files without the cycle pass", async () => {
    const found = await violations({
      "src/store/a.ts": 'import type { B } from "./b.ts";\nexport interface A { b?: B }\n',
      "src/store/b.ts": "export interface B { n: number }\n",
    });
    expect(found).toEqual([]);
  });
  it("queue/ importing observability/ is refused", async () => {
    const found = await violations({
      "src/queue/host.ts": 'import { m } from "../observability/metrics.ts";\nexport const x = m;\n',
      "src/observability/metrics.ts": "export const m = 1;\n",
    });
    expect(found).toEqual(["queue-below-observability: src/queue/host.ts -> src/observability/metrics.ts"]);
  });
  it("observability/ importing the dashboard is refused", async () => {
    const found = await violations({
      "src/observability/prom.ts": 'import { q } from "../dashboard/queries.ts";\nexport const x = q;\n',
      "src/dashboard/queries.ts": "export const q = 1;\n",
    });
    expect(found).toEqual(["observability-beside-dashboard: src/observability/prom.ts -> src/dashboard/queries.ts"]);
  });
  it("runtime/ importing a job processor is refused; jobs/ importing runtime/ is allowed", async () => {
    const found = await violations({
      "src/runtime/host.ts": 'import { p } from "../jobs/proc.ts";\nexport const x = p;\n',
      "src/jobs/proc.ts": 'import { s } from "../runtime/services.ts";\nexport const p = s;\n',
      "src/runtime/services.ts": "export const s = 1;\n",
    });
    expect(found).toContain("runtime-below-jobs: src/runtime/host.ts -> src/jobs/proc.ts");
    expect(found.filter((v) => v.startsWith("runtime-below-jobs")).length).toBe(1);
  });
});

import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { describe, expect, it } from "vitest";
import { repoRoot } from "../helpers/processes.ts";

/**
 * Each mode of the weight sync has one writer (src/core/weight-sync.ts, docs/architecture.md "The
 * weight sync as a state machine"): this reads every source file under src/ and finds where each is
 * assigned. A second writer (a health check setting an engine's mode itself, a flag beside the
 * router) fails here, naming the file and line.
 */
function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    if (e.isDirectory()) return sources(p);
    return e.name.endsWith(".ts") && !e.name.endsWith(".test.ts") ? [p] : [];
  });
}

const files = sources(join(repoRoot, "src")).map((p) => ({ path: relative(repoRoot, p), lines: readFileSync(p, "utf8").split("\n") }));

function writers(pattern: RegExp): string[] {
  return files.flatMap((f) => f.lines.flatMap((line, i) => (pattern.test(line) ? [`${f.path}:${i + 1}`] : [])));
}

const at = (hits: string[]) => [...new Set(hits.map((h) => h.slice(0, h.lastIndexOf(":"))))];

describe("the weight sync: one writer per mode", () => {
  it("an engine's mode: PoolState.setEngineMode (engines/pool-state.ts)", () => {
    const hits = writers(/\b\w+\.mode\s*=[^=]/).filter((h) => /^src\/(engines|runtime|controller|rollout|jobs)\//.test(h));
    expect(at(hits.filter((h) => !h.startsWith("src/controller/engine-admin.ts")))).toEqual(["src/engines/pool-state.ts"]);
    expect(writers(/\.mode\s*=\s*nextEngineMode/)).toHaveLength(1);
  });

  it("the router's mode: PoolState.moveRouter (engines/pool-state.ts)", () => {
    expect(at(writers(/\brouterMode\s*=[^=]/))).toEqual(["src/engines/pool-state.ts"]);
    expect(at(writers(/\bnextRouterMode\(/).filter((h) => !h.startsWith("src/core/")))).toEqual(["src/engines/pool-state.ts"]);
  });

  it("the controller's loader: Loader.move (controller/engine-admin.ts)", () => {
    expect(writers(/\.mode\s*=\s*nextLoaderMode/).map((h) => h.slice(0, h.lastIndexOf(":")))).toEqual(["src/controller/engine-admin.ts"]);
  });

  it("the run's sync: weights.syncing and weights.synced are each built in one place", () => {
    expect(at(writers(/kind: "weights\.syncing"/))).toEqual(["src/core/pipeline.ts"]);
    expect(at(writers(/kind: "weights\.synced"/))).toEqual(["src/controller/step-blocks.ts"]);
  });

  it("the probe finds a second writer", () => {
    const probe = ['m.mode = "healthy";'];
    expect(probe.filter((l) => /\b\w+\.mode\s*=[^=]/.test(l))).toHaveLength(1);
  });
});

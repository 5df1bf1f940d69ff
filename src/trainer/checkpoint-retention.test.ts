import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { checkpointRootFor, isCheckpointKept, pruneCommittedCheckpoints } from "./checkpoint-retention.ts";

const sync = { save_interval: 5, eval_interval: null, max_staleness: null, train_async: false };
const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

describe("save_interval keeps every save_interval-th committed checkpoint and the ones still loadable", () => {
  it("keeps (t+1) % save_interval == 0 and the newest two in sync mode", () => {
    const kept = Array.from({ length: 12 }, (_, t) => t).filter((t) => isCheckpointKept(t, 11, sync));
    expect(kept).toEqual([4, 9, 10, 11]);
  });

  it("async mode keeps one more per version of staleness; eval versions are kept; null keeps all", () => {
    expect(Array.from({ length: 12 }, (_, t) => t).filter((t) => isCheckpointKept(t, 11, { ...sync, train_async: true, max_staleness: 2 }))).toEqual([
      4, 8, 9, 10, 11,
    ]);
    expect(Array.from({ length: 12 }, (_, t) => t).filter((t) => isCheckpointKept(t, 11, { ...sync, eval_interval: 3 }))).toEqual([2, 4, 5, 8, 9, 10, 11]);
    expect(isCheckpointKept(0, 100, { ...sync, save_interval: null })).toBe(true);
  });

  it("deletes the other committed step directories of the run, and nothing else", async () => {
    const root = mkdtempSync(join(tmpdir(), "rlq-retention-"));
    dirs.push(root);
    for (let t = 0; t <= 7; t++) {
      mkdirSync(join(root, "run1", `step-${t}`, "attempt-1"), { recursive: true });
      writeFileSync(join(root, "run1", `step-${t}`, "attempt-1", "weights.safetensors"), "w");
    }
    mkdirSync(join(root, "run2", "step-0"), { recursive: true });
    mkdirSync(join(root, "run1", "notes"));
    expect(await pruneCommittedCheckpoints(root, "run1", 7, { ...sync, save_interval: 3 })).toEqual([0, 1, 3, 4]);
    expect(readdirSync(join(root, "run1")).sort()).toEqual(["notes", "step-2", "step-5", "step-6", "step-7"]);
    expect(readdirSync(join(root, "run2"))).toEqual(["step-0"]);
    expect(await pruneCommittedCheckpoints(root, "run1", 7, { ...sync, save_interval: null })).toEqual([]);
  });

  it("checkpoint_dir (slime's --save) is the run's checkpoint root, relative to RLQ_HOME", () => {
    expect(checkpointRootFor("/home/rlq/checkpoints", "checkpoints")).toBe("/home/rlq/checkpoints");
    expect(checkpointRootFor("/home/rlq/checkpoints", "ckpt/qwen")).toBe("/home/rlq/ckpt/qwen");
    expect(checkpointRootFor("/home/rlq/checkpoints", "/data/slime-save")).toBe("/data/slime-save");
  });
});

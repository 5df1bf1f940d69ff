import { createHash } from "node:crypto";
import { closeSync, existsSync, fstatSync, openSync, readSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq } from "../helpers/processes.ts";
import { appendDecisions } from "../../src/store/decision-log.ts";
import { createRunContextCache } from "../../src/runtime/run-context.ts";
import { createTrainerProvider } from "../../src/runtime/engines.ts";
import { runTrainStep } from "../../src/jobs/run-train-step.ts";

/**
 * What the train job checks around a commit (jobs/run-train-step.ts): the weights file's sha256
 * is read as a stream, so a checkpoint past Node's 2 GiB whole-file read limit (a 0.5B model in
 * fp32 is 1.9 GiB) commits, and `rlq retrain` compares one; a job dispatched from the wrong
 * weight version fails before the trainer is asked to train.
 */
// 2.2 GiB of tensor data: a sparse file, so the trainer's checkpoints cost no disk.
const WEIGHTS_BYTES = Math.ceil(2.2 * 2 ** 30);

/**
 * The sha256 the fake trainer's --weights-bytes file must have: its safetensors header and first
 * tensor as written, then zeros up to the file's size. Hashed from memory, not by reading the file.
 */
function headThenZerosSha256(file: string): string {
  const fd = openSync(file, "r");
  try {
    const len = Buffer.alloc(8);
    readSync(fd, len, 0, 8, 0);
    const header = Buffer.alloc(Number(len.readBigUInt64LE(0)));
    readSync(fd, header, 0, header.length, 8);
    const first = (JSON.parse(header.toString("utf8")) as { w: { data_offsets: [number, number] } }).w.data_offsets[1];
    const head = Buffer.alloc(8 + header.length + first);
    readSync(fd, head, 0, head.length, 0);
    const h = createHash("sha256").update(head);
    const zeros = Buffer.alloc(1 << 20);
    for (let left = fstatSync(fd).size - head.length; left > 0; left -= zeros.length) h.update(left >= zeros.length ? zeros : zeros.subarray(0, left));
    return h.digest("hex");
  } finally {
    closeSync(fd);
  }
}

describe("committing a train step", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("trainstepcommit", { trainerArgs: ["--step-ms", "1", "--weights-bytes", String(WEIGHTS_BYTES)] });
  });
  afterAll(async () => {
    await w?.close();
    // The run's 2.2 GiB checkpoints: sparse here, but not in a copy of tmp that fills holes.
    if (w) rmSync(w.home, { recursive: true, force: true });
  });

  it("commits a checkpoint of 2.2 GiB with its sha256, and rlq retrain compares its tensors", async () => {
    const runId = await w.start({ num_rollout: 1, deterministic: true, train_max_attempts: 1 });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    const code = await up.exited;
    const run = (await w.db.pool.query("SELECT status, last_error FROM runs WHERE id = $1", [runId])).rows[0] as { status: string; last_error: string | null };
    expect(code, `run ${run.status}: ${run.last_error}\n${up.output()}`).toBe(0);
    const rows = (await w.db.pool.query("SELECT checkpoint_uri, checkpoint_sha256 FROM train_steps WHERE run_id = $1", [runId])).rows;
    expect(rows).toHaveLength(1);
    const file = join(fileURLToPath(String(rows[0].checkpoint_uri)), "weights.safetensors");
    expect(statSync(file).size).toBeGreaterThan(WEIGHTS_BYTES);
    expect(rows[0].checkpoint_sha256).toBe(headThenZerosSha256(file));

    // The retrain's checkpoint names another run id in its header: the whole-file hashes differ and
    // the tensor bytes after the header (2.2 GiB in both files) are compared.
    const retrain = spawnRlq(["retrain", runId, "--step", "0"], w.env);
    expect(await retrain.exited, retrain.output()).toBe(0);
    expect(retrain.output()).toMatch(
      new RegExp(`weights sha256 [0-9a-f]{64} != committed ${rows[0].checkpoint_sha256} {2}\\(same tensors; the header differs\\)`),
    );
  });

  it("a job dispatched from another weight version fails before the trainer receives the step", async () => {
    const runId = await w.start({ num_rollout: 1 });
    // A sealed (empty) batch for step 0, and its train.dispatched from version 1: step 0 starts from 0.
    await appendDecisions(w.db, runId, 0, 2, [
      { kind: "step.sealed", payload: { step: 0, kept: [], aborted: [] } },
      { kind: "train.dispatched", payload: { step: 0, weightVersionIn: 1 } },
    ]);
    const ctx = await createRunContextCache(w.db).get(runId);
    const trainers = createTrainerProvider(null);
    try {
      const deps = {
        db: w.db,
        checkpointRoot: join(w.home, "checkpoints"),
        trainerFor: () => trainers.trainerFor(ctx),
        reportProgress: async () => undefined,
        crashPoint: () => undefined,
        shutdown: new AbortController().signal,
      };
      await expect(runTrainStep(deps, ctx, { runId, step: 0 }, 0)).rejects.toMatchObject({
        code: "batch_inconsistent",
        message: expect.stringMatching(/dispatched with weight_version_in 1; step 0 starts from version 0/),
      });
    } finally {
      await trainers.close();
    }
    const asked = await fetch(`${w.trainer.url}/v1/steps/${runId}/0`);
    expect(asked.status, await asked.text()).toBe(404);
    expect(existsSync(join(w.home, "checkpoints", runId))).toBe(false);
  });
});

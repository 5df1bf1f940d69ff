import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createDemoWorld, type DemoWorld } from "../helpers/demo-runs.ts";
import { spawnRlq } from "../helpers/processes.ts";

/**
 * `rlq retrain` with the real embedded trainer (the jax-js trainer on the demo task):
 * a deterministic run's step, replayed from its recorded batch and the previous
 * step's committed checkpoint, gives the committed weights byte for byte.
 */
describe("rlq retrain with the embedded trainer", () => {
  let w: DemoWorld;
  beforeAll(async () => {
    w = await createDemoWorld("retrainemb");
  });
  afterAll(async () => {
    await w?.close();
  });

  it("reproduces a deterministic step's committed checkpoint hash", async () => {
    const runId = await w.start(["num_rollout=2", "rollout_batch_size=8", "deterministic=true"]);
    await w.driveAll({ trainConcurrency: 1 });
    const { rows } = await w.db.pool.query("SELECT step, checkpoint_sha256 FROM train_steps WHERE run_id = $1 ORDER BY step", [runId]);
    expect(rows).toHaveLength(2);
    const retrain = spawnRlq(["retrain", runId, "--step", "1"], w.env);
    expect(await retrain.exited, retrain.output()).toBe(0);
    expect(retrain.output()).toContain(`weights sha256 ${rows[1].checkpoint_sha256} == committed ${rows[1].checkpoint_sha256}`);
  });
});

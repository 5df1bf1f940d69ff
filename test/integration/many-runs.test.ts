import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createDemoWorld, type DemoWorld } from "../helpers/demo-runs.ts";

/**
 * One `rlq up` drives more runs than its Postgres pool has connections: each
 * controller's lease lives on its own connection, outside the pool (9 runs
 * once deadlocked a pool of 8).
 */
describe("many runs in one process", () => {
  let w: DemoWorld;
  beforeAll(async () => {
    w = await createDemoWorld("many");
  });
  afterAll(async () => {
    await w?.close();
  });

  it("completes 9 concurrent runs under one rlq up", async () => {
    const ids: string[] = [];
    for (let i = 0; i < 9; i++) ids.push(await w.start(["num_rollout=1", "rollout_batch_size=4", "n_samples_per_prompt=4"], `many-${i}`));
    await w.driveAll();
    const { rows } = await w.db.pool.query("SELECT id, status FROM runs WHERE id = ANY($1) ORDER BY id", [ids]);
    expect(rows.map((r) => r.status)).toEqual(ids.map(() => "completed"));
    const steps = await w.db.pool.query("SELECT count(*)::int AS n FROM train_steps WHERE run_id = ANY($1)", [ids]);
    expect(steps.rows[0].n).toBe(9);
  });
});

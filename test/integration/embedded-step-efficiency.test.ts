import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PEAK_ENV, SPLIT_KEYS } from "../../src/trainer/embedded/efficiency.ts";
import { createDemoWorld, type DemoWorld } from "../helpers/demo-runs.ts";

/**
 * The embedded trainer's efficiency metrics in a real run (the demo task, jax-js trainer in `rlq worker train`):
 * every committed step's train_metrics rows hold the step-time split, which sums to step_s within 5 %,
 * a positive TFLOP/s, and MFU against the RLQ_DEVICE_PEAK_TFLOPS the worker runs under.
 */
const PEAK_TFLOPS = 0.5;

describe("embedded trainer efficiency metrics in train_metrics", () => {
  let w: DemoWorld;
  beforeAll(async () => {
    w = await createDemoWorld("embeff");
  });
  afterAll(async () => {
    await w?.close();
  });

  it("stores the split, step_s, tflops and mfu for every step", async () => {
    const runId = await w.start(["num_rollout=2", "rollout_batch_size=8"]);
    w.env[PEAK_ENV] = String(PEAK_TFLOPS);
    await w.driveAll({ trainConcurrency: 1 });
    const { rows } = await w.db.pool.query<{ step: number; key: string; value: number }>(
      "SELECT step, key, value FROM train_metrics WHERE run_id = $1 ORDER BY step, key",
      [runId],
    );
    const steps = new Map<number, Record<string, number>>();
    for (const r of rows) steps.set(r.step, { ...steps.get(r.step), [r.key]: Number(r.value) });
    expect([...steps.keys()]).toEqual([0, 1]);
    for (const [step, m] of steps) {
      for (const k of [...SPLIT_KEYS, "step_s", "tokens_per_s", "tflops", "model_flops_per_step", "mfu"])
        expect(m[k], `step ${step} ${k}`).toBeGreaterThanOrEqual(0);
      const stepS = m.step_s as number;
      const sum = SPLIT_KEYS.reduce((a, k) => a + (m[k] as number), 0);
      expect(Math.abs(sum - stepS), `step ${step}: split ${sum} s vs step_s ${stepS} s`).toBeLessThanOrEqual(0.05 * stepS);
      expect(m.fwd_bwd_s, `step ${step}`).toBeGreaterThan(0);
      expect(m.tflops, `step ${step}`).toBeGreaterThan(0);
      expect(m.mfu, `step ${step}`).toBeCloseTo((m.tflops as number) / PEAK_TFLOPS, 9);
    }
  });
});

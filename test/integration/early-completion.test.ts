import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq } from "../helpers/processes.ts";
import { fakeStats } from "../fakes/fake-engine-control.ts";

/**
 * Early group completion (run config group_extra_samples, core/early-completion.ts): each fresh
 * group's first round asks the engine for n + extra samples, and the group is written with n of
 * them, as samples 0..n-1, each finished, so the rest of the run (rewards, advantages, training)
 * sees groups of n as always. The fake SGLang stops each sample at random (--stop-prob), so the
 * candidates end at different lengths, and some are still running when n have finished.
 */
describe("early group completion", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("earlydone", { engineArgs: ["--stop-prob", "0.15", "--token-delay-ms", "5"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("asks for n + extra samples per group and trains groups of the first n finished", async () => {
    const n = 4;
    const extra = 2;
    const groups = 4;
    const runId = await w.start({
      num_rollout: 2,
      rollout_batch_size: 2,
      n_samples_per_prompt: n,
      over_sampling_batch_size: 2,
      group_extra_samples: extra,
      rollout_max_response_len: 64,
      dynamic_sampling_filter_path: null,
    });
    const before = await fakeStats(w.engine.url);
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    const q = async (sql: string) => (await w.db.pool.query(sql, [runId])).rows;

    // Every trained group has exactly samples 0..n-1, each ended by the engine (stop or length).
    const trained = await q(
      "SELECT group_id, array_agg(sample_index ORDER BY sample_index) AS idx, bool_and(status IN ('completed', 'truncated')) AS done FROM rollout_history WHERE run_id = $1 AND trained_step IS NOT NULL GROUP BY group_id",
    );
    expect(trained).toHaveLength(groups);
    for (const g of trained) {
      expect(g.idx).toEqual([0, 1, 2, 3]);
      expect(g.done).toBe(true);
    }
    // The engine was asked for the extra candidates: at least n + extra first requests per group.
    const after = await fakeStats(w.engine.url);
    expect(after.generate - before.generate).toBeGreaterThanOrEqual(groups * (n + extra));
  }, 240_000);
});

import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq } from "../helpers/processes.ts";

describe("a synchronous run, end to end", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("sync", { engineArgs: ["--token-delay-ms", "1"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("trains N steps, each kept group exactly once, with filter drops recorded", async () => {
    const runId = await w.start({ num_rollout: 3, partial_rollout: true });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    if (process.env.RLQ_DEBUG_OUTPUT) console.log(up.output());

    const steps = await w.db.pool.query("SELECT step, weight_version_in, weight_version_out FROM train_steps WHERE run_id = $1 ORDER BY step", [runId]);
    expect(steps.rows).toEqual([0, 1, 2].map((s) => ({ step: s, weight_version_in: s, weight_version_out: s + 1 })));

    // Each step trained exactly rollout_batch_size groups of n samples, and no group twice.
    const perStep = await w.db.pool.query(
      "SELECT trained_step, count(DISTINCT group_id)::int AS groups, count(*)::int AS samples FROM rollout_history WHERE run_id = $1 AND trained_step IS NOT NULL GROUP BY 1 ORDER BY 1",
      [runId],
    );
    expect(perStep.rows).toEqual([0, 1, 2].map((s) => ({ trained_step: s, groups: 4, samples: 16 })));
    const twice = await w.db.pool.query(
      "SELECT group_id FROM decisions WHERE run_id = $1 AND kind = 'group.outcome' AND payload->>'outcome' = 'kept' GROUP BY group_id HAVING count(*) > 1",
      [runId],
    );
    expect(twice.rows).toEqual([]);

    // The filter dropped groups with zero reward variance, and said why.
    const drops = await w.db.pool.query(
      "SELECT payload->>'reason' AS reason FROM decisions WHERE run_id = $1 AND kind = 'group.filtered' AND payload->>'keep' = 'false'",
      [runId],
    );
    for (const r of drops.rows) expect(r.reason).toMatch(/^zero_std_(0|1)\.0$/);
    const kept = await w.db.pool.query("SELECT reward FROM rollout_history WHERE run_id = $1 AND kept", [runId]);
    expect(kept.rows.length).toBe(48);

    // Draw ordinals are gapless from 0.
    const draws = await w.db.pool.query("SELECT draw_ordinal FROM drawn_prompts WHERE run_id = $1 ORDER BY 1", [runId]);
    expect(draws.rows.map((r) => Number(r.draw_ordinal))).toEqual(draws.rows.map((_, i) => i));

    // Per-engine metrics were published by the rollout workers and are shown by `rlq run status`.
    const status = spawnRlq(["run", "status", runId, "--json"], w.env);
    expect(await status.exited).toBe(0);
    const report = JSON.parse(status.output().slice(status.output().indexOf("{"))) as { engines: Array<{ engineId: string; requests: number }> };
    expect(report.engines.map((e) => e.engineId)).toContain(w.engine.url);
    expect(report.engines.reduce((a, e) => a + e.requests, 0)).toBeGreaterThanOrEqual(48 * 1);

    const replay = spawnRlq(["replay", runId, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);
    expect(replay.output()).toMatch(/0 difference\(s\)/);
  });
});

import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq } from "../helpers/processes.ts";
import { checkRunInvariants } from "../helpers/invariants.ts";

/**
 * staleness_policy drop in sync mode (DESIGN §1): with partial rollouts and
 * max_staleness 0, every buffered partial group that resumes a step later is
 * stale. Its stale samples are cut and regenerated from the prompt, at most
 * max_regenerations times, then the group is discarded with a recorded
 * reason: the run always finishes (no livelock), and no trained token is stale.
 */
describe("staleness policies in sync mode", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("drop", { engineArgs: ["--token-delay-ms", "12", "--stop-prob", "0.04"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  const config = {
    num_rollout: 4,
    rollout_batch_size: 2,
    n_samples_per_prompt: 2,
    over_sampling_batch_size: 6,
    rollout_max_response_len: 48,
    dynamic_sampling_filter_path: null,
    partial_rollout: true,
    max_staleness: 0,
    staleness_policy: "drop",
  };
  const q = async (sql: string, runId: string) => (await w.db.pool.query(sql, [runId])).rows;

  it.each([1, 0])("drop finishes when every resumed partial rollout is stale (max_regenerations %i)", async (maxRegenerations) => {
    const runId = await w.start({ ...config, max_regenerations: maxRegenerations, engine: { kind: "sglang", urls: [await w.freshEngine()] } });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    await checkRunInvariants(w.db, runId, { numRollout: 4, datasetSize: 64, shuffle: false, seed: 42, rbs: 2 });

    // Partial groups were buffered with tokens and came back a version later: stale by construction.
    const resumedStale = await q(
      `SELECT count(*)::int AS n FROM decisions WHERE run_id = $1 AND ((kind = 'group.cut') OR (kind = 'group.outcome' AND payload->>'reason' LIKE 'stale:%'))`,
      runId,
    );
    expect(resumedStale[0].n).toBeGreaterThan(0);
    const cuts = await q("SELECT group_id, payload FROM decisions WHERE run_id = $1 AND kind = 'group.cut'", runId);
    const discards = await q(
      "SELECT group_id, payload->>'reason' AS reason FROM decisions WHERE run_id = $1 AND kind = 'group.outcome' AND payload->>'outcome' = 'discarded'",
      runId,
    );
    if (maxRegenerations === 0) {
      expect(cuts).toEqual([]);
      expect(discards.length).toBeGreaterThan(0);
    } else {
      expect(cuts.length).toBeGreaterThan(0);
      for (const c of cuts) expect(c.payload.reason).toMatch(/^stale: \d+ sample\(s\) up to \d+ versions stale for step \d+ \(max_staleness 0\)$/);
      // No group regenerated more often than allowed.
      const perGroup = new Map<number, number>();
      for (const c of cuts) perGroup.set(Number(c.group_id), (perGroup.get(Number(c.group_id)) ?? 0) + 1);
      expect(Math.max(...perGroup.values())).toBeLessThanOrEqual(maxRegenerations);
      // A cut sample restarted from the prompt at the current version.
      const restarted = await q(
        `SELECT s.weight_version, s.step FROM sample_segments s JOIN decisions c ON c.run_id = s.run_id AND c.kind = 'group.cut' AND c.group_id = s.group_id
           AND (c.payload->>'round')::int = s.round AND c.payload->'samples' @> to_jsonb(s.sample_index)
         WHERE s.run_id = $1 AND s.token_end > s.token_start`,
        runId,
      );
      expect(restarted.length).toBeGreaterThan(0);
      for (const r of restarted) expect(r.weight_version).toBe(r.step);
    }
    for (const d of discards) expect(d.reason).toMatch(/^(stale: .*after \d+ regeneration\(s\)|aborted|surplus)$/);

    // Nothing stale was trained.
    const worst = await q("SELECT coalesce(max(staleness), 0)::int AS s, count(*)::int AS n FROM staleness WHERE run_id = $1", runId);
    expect(worst[0]).toEqual({ s: 0, n: 4 * 2 * 2 });

    const replay = spawnRlq(["replay", runId, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);
  });

  it("mask: resumed partial tokens from an older version get loss mask 0 in the trained history", async () => {
    const runId = await w.start({ ...config, staleness_policy: "mask", engine: { kind: "sglang", urls: [await w.freshEngine()] } });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    await checkRunInvariants(w.db, runId, { numRollout: 4, datasetSize: 64, shuffle: false, seed: 42, rbs: 2 });
    // Trained samples that span versions: their older tokens are masked, the current step's are trained.
    const spanning = await q(
      `SELECT h.trained_step, h.token_versions, h.loss_mask FROM rollout_history h
        WHERE h.run_id = $1 AND h.trained_step IS NOT NULL
          AND EXISTS (SELECT 1 FROM unnest(h.token_versions) v WHERE v >= 0 AND v < h.trained_step)`,
      runId,
    );
    expect(spanning.length).toBeGreaterThan(0);
    for (const r of spanning) {
      (r.token_versions as number[]).forEach((v, i) => {
        if (v >= 0) expect((r.loss_mask as number[])[i]).toBe(v < r.trained_step ? 0 : 1);
      });
    }
    const worst = await q("SELECT coalesce(max(staleness), 0)::int AS s FROM staleness WHERE run_id = $1", runId);
    expect(worst[0].s).toBe(0);
    const replay = spawnRlq(["replay", runId, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);
  });
});

import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { repoRoot, spawnRlq, waitFor } from "../helpers/processes.ts";
import { checkRunInvariants } from "../helpers/invariants.ts";

/**
 * Asynchronous mode (train_async, DESIGN §1): generation keeps going while
 * steps train, under admission control; weight syncs abort in-flight requests
 * by id and they resume as new segments under the new version; no trained
 * token is staler than max_staleness.
 */
describe("asynchronous mode", () => {
  let w: World;
  beforeAll(async () => {
    // Generation (~40 tokens × 20 ms per sample) is slower than a train step (150 ms): rounds are
    // in flight at every weight sync.
    w = await createWorld("async", { engineArgs: ["--token-delay-ms", "20", "--stop-prob", "0.02"], trainerArgs: ["--step-ms", "150"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  const q = async (sql: string, runId: string) => (await w.db.pool.query(sql, [runId])).rows;

  it("overlaps generation with training, splits segments at weight syncs and keeps staleness within the bound", async () => {
    const runId = await w.start({
      train_async: true,
      max_staleness: 1,
      staleness_policy: "mask",
      num_rollout: 4,
      rollout_max_response_len: 40,
      dynamic_sampling_filter_path: null,
      // Samples of up to 40 tokens × 60 ms: the groups drawn at a sync are still generating at the
      // next one, however slowly a loaded machine runs the train step and the commits between (at
      // 20 ms a token, a CI run under load once had every request finished before every sync).
      engine: { kind: "sglang", urls: [await w.freshEngine(["--token-delay-ms", "60", "--stop-prob", "0.02"])] },
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);

    await checkRunInvariants(w.db, runId, { numRollout: 4, datasetSize: 64, shuffle: false, seed: 42, rbs: 4 });

    // The bound, over every trained sample (tokens with loss mask 1).
    const worst = await q("SELECT coalesce(max(staleness), 0)::int AS s FROM staleness WHERE run_id = $1", runId);
    expect(worst[0].s).toBeLessThanOrEqual(1);
    // Generation overlapped training: some step trained samples from the version before its own.
    const overlapped = await q("SELECT count(*)::int AS n FROM staleness WHERE run_id = $1 AND staleness = 1", runId);
    expect(overlapped[0].n).toBeGreaterThan(0);

    // Weight syncs aborted in-flight rounds, which resumed as new rounds at the new version:
    // one segment, one version, as the engine reported it.
    const syncs = await q("SELECT payload FROM decisions WHERE run_id = $1 AND kind = 'weights.syncing' ORDER BY seq", runId);
    expect(syncs.map((s) => s.payload.weightVersion)).toEqual([1, 2, 3, 4]);
    const aborted = await q("SELECT count(*)::int AS n FROM decisions WHERE run_id = $1 AND kind = 'group.aborted'", runId);
    expect(aborted[0].n).toBeGreaterThan(0);
    // An aborted request kept its tokens and the sample went on under the next version.
    const spanning = await q(
      "SELECT count(*)::int AS n FROM (SELECT 1 FROM sample_segments WHERE run_id = $1 AND token_end > token_start GROUP BY group_id, sample_index HAVING count(DISTINCT weight_version) > 1) x",
      runId,
    );
    expect(spanning[0].n).toBeGreaterThan(0);
    // Never older than its round's version. Newer is possible, and recorded as such: the load starts
    // with the sync (controller/engine-admin.ts beginLoad), so a request that reaches the engine just
    // then waits behind the load and runs on the new weights.
    expect(
      await q("SELECT count(*)::int AS n FROM sample_segments WHERE run_id = $1 AND is_version_mismatch AND weight_version < expected_weight_version", runId),
    ).toEqual([{ n: 0 }]);
    // A sample's versions never go down, segment after segment.
    expect(
      await q(
        `SELECT 1 FROM (SELECT weight_version, lag(weight_version) OVER (PARTITION BY group_id, sample_index ORDER BY segment_index) AS prev
           FROM sample_segments WHERE run_id = $1 AND token_end > token_start) x WHERE prev > weight_version`,
        runId,
      ),
    ).toEqual([]);

    // Admission control: for groups that generate on version v, at most (k + v + 1) × rbs groups were
    // accepted or running. v is the engines' version, or during an abort-mode sync the version it
    // loads (its groups are drawn before weights.synced, controller/async-pipeline.ts continueDuringSync).
    const draws = await q(
      "SELECT step, kind, payload FROM decisions WHERE run_id = $1 AND kind IN ('prompts.drawn', 'weights.syncing', 'weights.synced') ORDER BY seq",
      runId,
    );
    let v = 0;
    let drawn = 0;
    for (const d of draws) {
      if ("fresh" in d.payload) {
        drawn += (d.payload.fresh as unknown[]).length;
        // Drawn ⊇ accepted + running; filtered groups free their place, so only the cap on draws minus filtered holds.
        const filtered = await w.db.pool.query(
          "SELECT count(*)::int AS n FROM decisions x WHERE x.run_id = $1 AND x.kind = 'group.outcome' AND x.payload->>'outcome' <> 'kept' AND x.seq < (SELECT min(seq) FROM decisions WHERE run_id = $1 AND kind = 'prompts.drawn' AND payload = $2::jsonb)",
          [runId, JSON.stringify(d.payload)],
        );
        expect(drawn - filtered.rows[0].n).toBeLessThanOrEqual((1 + v + 1) * 4);
      } else if (d.kind === "weights.synced" || d.payload.mode === "abort") v = d.payload.weightVersion;
    }

    // Each sync continues the rounds it aborted, at the version it loads, as they land, before the
    // loads end and weights.synced; and before any new group is drawn, so the resumed requests queue
    // ahead of the new groups' (src/controller/async-pipeline.ts continueDuringSync).
    const log = await q(
      "SELECT seq, kind, payload FROM decisions WHERE run_id = $1 AND kind IN ('weights.syncing', 'weights.synced', 'group.aborted', 'group.dispatched', 'prompts.drawn') ORDER BY seq",
      runId,
    );
    let checked = 0;
    let dispatchedDuringSyncs = 0;
    for (const [i, d] of log.entries()) {
      if (d.kind !== "weights.syncing") continue;
      const after = log.slice(i + 1);
      const end = after.findIndex((x) => x.kind === "weights.syncing");
      const window = end < 0 ? after : after.slice(0, end);
      const synced = window.findIndex((x) => x.kind === "weights.synced");
      expect(synced, `sync at seq ${d.seq} ended`).toBeGreaterThanOrEqual(0);
      const during = window.slice(0, synced).filter((x) => x.kind === "group.dispatched");
      expect(
        during.filter((x) => x.payload.weightVersion !== d.payload.weightVersion),
        `sync at seq ${d.seq}: rounds dispatched during it run on the version it loads`,
      ).toEqual([]);
      dispatchedDuringSyncs += during.length;
      const abortedGroups = new Set(
        window.filter((x) => x.kind === "group.aborted" && x.seq < (window[synced]?.seq ?? 0)).map((x) => Number(x.payload.groupId)),
      );
      const firstDraw = window.findIndex((x) => x.kind === "prompts.drawn");
      if (abortedGroups.size === 0 || firstDraw < 0) continue;
      const resumedBeforeDraw = new Set(
        window
          .slice(0, firstDraw)
          .filter((x) => x.kind === "group.dispatched")
          .map((x) => Number(x.payload.groupId)),
      );
      expect(
        [...abortedGroups].filter((g) => !resumedBeforeDraw.has(g)),
        `sync at seq ${d.seq}: aborted groups not resumed before the next draw`,
      ).toEqual([]);
      checked++;
    }
    expect(dispatchedDuringSyncs, "no round was continued before its sync ended").toBeGreaterThan(0);
    expect(checked).toBeGreaterThan(0);

    // Per-step staleness metrics landed with each step.
    const hist = await q("SELECT step, key, value FROM train_metrics WHERE run_id = $1 AND key LIKE 'staleness_%' ORDER BY step, key", runId);
    expect(new Set(hist.map((h) => h.step))).toEqual(new Set([0, 1, 2, 3]));

    // `rlq run status` shows the pipeline: staleness histogram and the trainer's busy fraction.
    const status = spawnRlq(["run", "status", runId, "--json"], w.env);
    expect(await status.exited).toBe(0);
    const report = JSON.parse(status.output().slice(status.output().indexOf("{"))) as {
      pipeline: {
        stalenessHistogram: Record<string, number>;
        inflightByVersion: Record<string, number>;
        trainer: { stepsTrained: number; busyFraction: number };
      };
    };
    expect(Object.values(report.pipeline.stalenessHistogram).reduce((a, b) => a + b, 0)).toBe(4 * 4 * 4);
    expect(report.pipeline.inflightByVersion).toEqual({});
    expect(report.pipeline.trainer.stepsTrained).toBe(4);
    expect(report.pipeline.trainer.busyFraction).toBeGreaterThan(0);
    expect(report.pipeline.trainer.busyFraction).toBeLessThanOrEqual(1);
    const text = spawnRlq(["run", "status", runId], w.env);
    expect(await text.exited).toBe(0);
    expect(text.output()).toMatch(/staleness: +0:\d+ 1:\d+/);
    expect(text.output()).toMatch(/trainer: +busy \d+%/);

    const replay = spawnRlq(["replay", runId, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);
  });

  it("weight_update_mode drain: no request is aborted for a sync, and every sample is generated by one version", async () => {
    const runId = await w.start({
      train_async: true,
      max_staleness: 2,
      staleness_policy: "mask",
      weight_update_mode: "drain",
      num_rollout: 3,
      rollout_max_response_len: 24,
      dynamic_sampling_filter_path: null,
      engine: { kind: "sglang", urls: [await w.freshEngine()] },
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    await checkRunInvariants(w.db, runId, { numRollout: 3, datasetSize: 64, shuffle: false, seed: 42, rbs: 4 });
    expect(await q("SELECT count(*)::int AS n FROM decisions WHERE run_id = $1 AND kind = 'group.aborted'", runId)).toEqual([{ n: 0 }]);
    const modes = await q("SELECT DISTINCT payload->>'mode' AS mode FROM decisions WHERE run_id = $1 AND kind = 'weights.syncing'", runId);
    expect(modes).toEqual([{ mode: "drain" }]);
    const spanning = await q(
      "SELECT count(*)::int AS n FROM (SELECT 1 FROM sample_segments WHERE run_id = $1 AND token_end > token_start GROUP BY group_id, sample_index HAVING count(DISTINCT weight_version) > 1) x",
      runId,
    );
    expect(spanning).toEqual([{ n: 0 }]);
    const worst = await q("SELECT coalesce(max(staleness), 0)::int AS s FROM staleness WHERE run_id = $1", runId);
    expect(worst[0].s).toBeLessThanOrEqual(2);
  });

  it("train_async alone is slime's one-step-off pipeline (k = 1); update_weights_interval spaces the syncs", async () => {
    const runId = await w.start({
      train_async: true,
      staleness_policy: "mask",
      update_weights_interval: 2,
      eval_interval: 2,
      eval_prompt_data: { small: join(repoRoot, "test/fixtures/eval.jsonl") },
      n_samples_per_eval_prompt: 2,
      num_rollout: 4,
      rollout_max_response_len: 24,
      dynamic_sampling_filter_path: null,
      engine: { kind: "sglang", urls: [await w.freshEngine()] },
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    await checkRunInvariants(w.db, runId, { numRollout: 4, datasetSize: 64, shuffle: false, seed: 42, rbs: 4 });
    const syncs = await q("SELECT payload FROM decisions WHERE run_id = $1 AND kind = 'weights.synced' ORDER BY seq", runId);
    expect(syncs.map((s) => s.payload.weightVersion)).toEqual([2, 4]);
    // Evals run right after a sync, at the synced version: before training, then every 2 steps.
    const evals = await q("SELECT step, weight_version FROM eval_results WHERE run_id = $1 ORDER BY step", runId);
    expect(evals).toEqual([0, 2, 4].map((step) => ({ step, weight_version: step })));
    const worst = await q("SELECT coalesce(max(staleness), 0)::int AS s FROM staleness WHERE run_id = $1", runId);
    expect(worst[0].s).toBeLessThanOrEqual(1);
  });

  it("refuses to shorten num_rollout below the steps already sealed", async () => {
    // train_stall_timeout_s: the trainer is held below, and a held trainer must not cost attempts.
    const runId = await w.start({
      train_async: true,
      num_rollout: 4,
      rollout_max_response_len: 24,
      dynamic_sampling_filter_path: null,
      train_stall_timeout_s: 300,
      engine: { kind: "sglang", urls: [await w.freshEngine()] },
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    await waitFor(
      "two sealed steps",
      async () => (await q("SELECT count(*)::int AS n FROM decisions WHERE run_id = $1 AND kind = 'step.sealed'", runId))[0].n >= 2,
      60_000,
      50,
    );
    // Hold the trainer (SIGSTOP) so that the run cannot finish before the amend CLI has started and
    // the controller has answered it: without this the test raced the CLI's start-up time.
    w.trainer.child.kill("SIGSTOP");
    try {
      const amend = spawnRlq(["run", "amend", runId, "--set", "num_rollout=1"], w.env);
      expect(await amend.exited).toBe(0);
      await waitFor(
        "the amend answered",
        async () => (await q("SELECT error FROM run_requests WHERE run_id = $1 AND error IS NOT NULL", runId)).length > 0,
        120_000,
        50,
      );
    } finally {
      w.trainer.child.kill("SIGCONT");
    }
    expect(await up.exited, up.output()).toBe(0);
    const reqs = await q("SELECT error FROM run_requests WHERE run_id = $1", runId);
    expect(reqs[0].error).toMatch(/^num_rollout 1 is below the [2-4] step\(s\) already sealed/);
    expect(await q("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1", runId)).toEqual([{ n: 4 }]);
  });
});

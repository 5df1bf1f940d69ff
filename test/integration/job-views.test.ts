import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createDb, type Db } from "../../src/store/db.ts";
import { createTestDatabase } from "../helpers/services.ts";
import { insertDrawnPrompts, insertRun } from "../../src/store/run-facts.ts";
import { appendDecisions } from "../../src/store/decision-log.ts";
import {
  areRoundsAborted,
  roundAbortedSql,
  writeRewards,
  writeRewardsOfRounds,
  writeRound,
  writeRounds,
  type RoundFacts,
} from "../../src/store/rollout-facts.ts";
import { loadGroupView, loadGroupWithRewards } from "../../src/store/group-view.ts";
import {
  loadRewardJobView,
  loadRewardJobViews,
  loadRolloutJobView,
  loadRolloutJobViews,
  rewardJobViewsSql,
  rolloutJobViewsSql,
} from "../../src/store/job-views.ts";
import { createJobStore } from "../../src/store/job-batch.ts";
import type { Decision } from "../../src/core/decisions.ts";

/**
 * The one-statement reads and writes of the rollout and reward jobs
 * (store/job-views.ts, writeRound) against the multi-query loaders the
 * controller uses: a job must see a group exactly as the controller does.
 */
describe("job views and the one-statement round write", () => {
  let db: Db;
  let drop: () => Promise<void>;
  const runId = "jv1";
  const n = 3;
  let seq = 2;
  const decide = async (list: Decision[]) => {
    await appendDecisions(db, runId, 0, seq, list);
    seq += list.length;
  };
  const segment = (
    sampleIndex: number,
    segmentIndex: number,
    round: number,
    tokens: number[],
    logProbs: number[],
    status: "completed" | "aborted" | "truncated",
  ): RoundFacts["segments"][number] => ({
    sampleIndex,
    segmentIndex,
    round,
    weightVersion: round,
    tokens,
    logProbs,
    lossMask: tokens.map(() => 1),
    finishReason: status === "completed" ? "stop" : status === "aborted" ? "abort" : "length",
    status,
    engine: "http://e",
    tokenStart: 0,
    error: null,
  });

  // The controller's loader also returns the drawn row's run id and the rewards; a job uses neither.
  const asJobSees = async () => {
    const g = await loadGroupView(db, runId, 0, n, null);
    const { runId: _runId, ...prompt } = g.prompt as typeof g.prompt & { runId?: string };
    return { groupId: g.groupId, prompt, samples: g.samples };
  };

  beforeAll(async () => {
    const database = await createTestDatabase("rlq_jobviews");
    drop = () => database.drop();
    db = createDb(database.url, { max: 4 });
    await insertRun(db, { runId, name: runId, config: {}, datasetFingerprint: "x", datasetSize: 1, datasetErrors: [], pluginFingerprints: {} });
    await appendDecisions(db, runId, 0, seq, [], (tx) =>
      insertDrawnPrompts(tx, [
        {
          runId,
          drawOrdinal: 0,
          epoch: 0,
          datasetIndex: 4,
          step: 0,
          prompt: 'say "hi", {x}\\n',
          label: null,
          metadata: { k: [1, "a"] },
          promptTokens: [256, 72, 105],
        },
      ]),
    );
  });
  afterAll(async () => {
    await db?.close();
    await drop?.();
  });

  it("round 0: a job without its decision is refused; the marker wins once; a round with no segment is written too", async () => {
    expect(await loadRolloutJobView(db, { runId, groupId: 0, round: 0, step: 0 }, n)).toMatchObject({ isDispatched: false, hasRound: false, view: null });
    await decide([{ kind: "group.dispatched", payload: { groupId: 0, round: 0, step: 0, weightVersion: 0 } }]);
    const start = await loadRolloutJobView(db, { runId, groupId: 0, round: 0, step: 0 }, n);
    expect(start).toMatchObject({ isDispatched: true, hasRound: false, isAborted: false });
    expect(start.view).toEqual(await asJobSees());
    expect(start.view?.prompt).toMatchObject({ prompt: 'say "hi", {x}\\n', metadata: { k: [1, "a"] }, promptTokens: [256, 72, 105], datasetIndex: 4 });
    // Another step's dispatch is not this job's.
    expect((await loadRolloutJobView(db, { runId, groupId: 0, round: 0, step: 1 }, n)).isDispatched).toBe(false);

    const facts: RoundFacts = {
      runId,
      groupId: 0,
      round: 0,
      step: 0,
      jobId: "gen-0-0",
      expectedWeightVersion: 0,
      isComplete: false,
      wasAborted: true,
      segments: [
        segment(0, 0, 0, [65, 66, 257], [-0.5, -1.25e-7, -Infinity], "completed"),
        segment(1, 0, 0, [67, 68], [-0.1, -2], "aborted"),
        segment(2, 0, 0, [69], [-3.4028234e38], "aborted"),
      ],
    };
    expect(await writeRound(db, facts)).toBe(true);
    // A duplicate job loses: nothing of it is written.
    expect(await writeRound(db, { ...facts, jobId: "gen-0-0-dup", segments: [segment(0, 1, 0, [70], [-1], "completed")] })).toBe(false);
    const rows = await db.pool.query("SELECT job_id, segment_index FROM sample_segments WHERE run_id = $1 ORDER BY sample_index", [runId]);
    expect(rows.rows).toEqual([0, 1, 2].map(() => ({ job_id: "gen-0-0", segment_index: 0 })));
    expect((await loadRolloutJobView(db, { runId, groupId: 0, round: 0, step: 0 }, n)).hasRound).toBe(true);
    // An aborted round that generated nothing still lands its marker (no segment parameter to bind).
    await decide([{ kind: "group.dispatched", payload: { groupId: 0, round: 9, step: 0, weightVersion: 0 } }]);
    expect(await writeRound(db, { ...facts, round: 9, jobId: "gen-0-9", segments: [] })).toBe(true);
  });

  it("round 1 after a cut: the job sees the group's segments and cuts as the controller's loader does, -Infinity included", async () => {
    await decide([
      { kind: "group.cut", payload: { groupId: 0, step: 0, round: 1, samples: [2], reason: "stale" } },
      { kind: "group.dispatched", payload: { groupId: 0, round: 1, step: 0, weightVersion: 1 } },
    ]);
    const start = await loadRolloutJobView(db, { runId, groupId: 0, round: 1, step: 0 }, n);
    expect(start).toMatchObject({ isDispatched: true, hasRound: false });
    const expected = await asJobSees();
    expect(start.view).toEqual(expected);
    expect(start.view?.samples[0]?.logProbs).toEqual([-0.5, expected.samples[0]?.logProbs[1], -Infinity]);
    // The cut sample starts over (its segment index moves on), the aborted one continues.
    expect(start.view?.samples.map((s) => [s.responseTokens.length, s.nextSegmentIndex, s.status])).toEqual([
      [3, 1, "completed"],
      [2, 1, "aborted"],
      [0, 1, "pending"],
    ]);
  });

  it("the reward job's view: the round's facts, its decision, the rewards already stored", async () => {
    const key = { runId, groupId: 0, round: 0 };
    expect(await loadRewardJobView(db, { ...key, round: 5 }, n)).toMatchObject({ hasRound: false, view: null });
    const start = await loadRewardJobView(db, key, n);
    expect(start).toMatchObject({ hasRound: true, isDispatched: true, rewardCount: 0 });
    // The responses of the rollout job's full view, nothing else.
    const full = await asJobSees();
    expect(start.view).toEqual({
      ...full,
      samples: full.samples.map((x) => ({ sampleIndex: x.sampleIndex, responseTokens: x.responseTokens, status: x.status, finishReason: x.finishReason })),
    });
    expect(start.view?.samples.some((x) => x.responseTokens.length > 0)).toBe(true);
    await writeRewards(
      db,
      { ...key, step: 0, jobId: "rwd-0-0" },
      [0, 1, 2].map((i) => ({ sampleIndex: i, reward: i, components: {} })),
    );
    const done = await loadRewardJobView(db, key, n);
    expect(done).toMatchObject({ rewardCount: 3, view: null });
    expect((await loadGroupWithRewards(db, runId, 0, 0, n, null)).rewards.size).toBe(3);
  });

  it("batched: one statement serves jobs of several runs, each key gets its own answer, a duplicate round is written once", async () => {
    const other = "jv2";
    await insertRun(db, { runId: other, name: other, config: {}, datasetFingerprint: "x", datasetSize: 1, datasetErrors: [], pluginFingerprints: {} });
    await appendDecisions(db, other, 0, 2, [{ kind: "group.dispatched", payload: { groupId: 0, round: 0, step: 0, weightVersion: 0 } }], (tx) =>
      insertDrawnPrompts(tx, [
        { runId: other, drawOrdinal: 0, epoch: 0, datasetIndex: 1, step: 0, prompt: "other", label: null, metadata: {}, promptTokens: [256] },
      ]),
    );
    const views = await loadRolloutJobViews(
      db,
      [
        { runId, groupId: 0, round: 7, step: 0 }, // not dispatched
        { runId: other, groupId: 0, round: 0, step: 0 },
        { runId, groupId: 0, round: 0, step: 0 }, // already written
        { runId, groupId: 5, round: 0, step: 0 }, // never drawn, never dispatched: refused, not an error
      ],
      (id) => (id === other ? 2 : n),
    );
    expect(views.map((v) => (v instanceof Error ? v.message : [v.isDispatched, v.hasRound, v.view?.samples.length ?? null]))).toEqual([
      [false, false, null],
      [true, false, 2],
      [true, true, null],
      [false, false, null],
    ]);
    const single = await loadRolloutJobView(db, { runId: other, groupId: 0, round: 0, step: 0 }, 2);
    expect(views[1]).toEqual(single);

    const mine: RoundFacts = {
      runId: other,
      groupId: 0,
      round: 0,
      step: 0,
      jobId: "gen-jv2-0-0",
      expectedWeightVersion: 0,
      isComplete: true,
      wasAborted: false,
      segments: [segment(0, 0, 0, [80, 257], [-1, -0.5], "completed"), { ...segment(1, 0, 0, [81], [-2], "truncated"), weightVersion: 3 }],
    };
    const won = await writeRounds(db, [
      mine,
      { ...mine, jobId: "gen-jv2-0-0-dup", segments: [segment(0, 0, 0, [99], [-9], "completed")] },
      { runId, groupId: 0, round: 0, step: 0, jobId: "gen-0-0-late", expectedWeightVersion: 0, isComplete: true, wasAborted: false, segments: [] },
    ]);
    expect(won).toEqual([true, false, false]);
    const rows = await db.pool.query(
      "SELECT run_id, sample_index, job_id, tokens, is_version_mismatch FROM sample_segments WHERE run_id = $1 ORDER BY sample_index",
      [other],
    );
    expect(rows.rows).toEqual([
      { run_id: other, sample_index: 0, job_id: "gen-jv2-0-0", tokens: [80, 257], is_version_mismatch: false },
      { run_id: other, sample_index: 1, job_id: "gen-jv2-0-0", tokens: [81], is_version_mismatch: true },
    ]);

    // Reward views and writes, batched the same way; the first write of a reward wins.
    await writeRewardsOfRounds(db, [
      { key: { runId: other, groupId: 0, round: 0, step: 0, jobId: "rwd-jv2-0-0" }, rewards: [{ sampleIndex: 0, reward: 1, components: { a: 1 } }] },
      {
        key: { runId: other, groupId: 0, round: 0, step: 0, jobId: "rwd-jv2-0-0-dup" },
        rewards: [
          { sampleIndex: 0, reward: 5, components: {} },
          { sampleIndex: 1, reward: 0, components: {} },
        ],
      },
    ]);
    const rewards = await db.pool.query("SELECT sample_index, reward, job_id, components FROM sample_rewards WHERE run_id = $1 ORDER BY sample_index", [other]);
    expect(rewards.rows).toEqual([
      { sample_index: 0, reward: 1, job_id: "rwd-jv2-0-0", components: { a: 1 } },
      { sample_index: 1, reward: 0, job_id: "rwd-jv2-0-0-dup", components: {} },
    ]);
    const rv = await loadRewardJobViews(
      db,
      [
        { runId: other, groupId: 0, round: 0 },
        { runId, groupId: 0, round: 0 },
        { runId, groupId: 0, round: 4 },
      ],
      (id) => (id === other ? 2 : n),
    );
    expect(rv.map((v) => (v instanceof Error ? v.message : [v.hasRound, v.isDispatched, v.rewardCount, v.view === null]))).toEqual([
      [true, true, 2, true],
      [true, true, 3, true],
      [false, false, 0, true],
    ]);

    // The abort check, batched: round 0 of jv1 group 0 is listed by no seal and no group.aborted.
    await decide([{ kind: "group.aborted", payload: { groupId: 0, round: 1, step: 0, reason: "test" } }]);
    expect(
      await areRoundsAborted(db, [
        { runId, groupId: 0, round: 0, step: 0 },
        { runId, groupId: 0, round: 1, step: 0 },
        { runId: other, groupId: 0, round: 1, step: 0 },
      ]),
    ).toEqual([false, true, false]);
  });

  it("the abort check looks a round up through the run's group.aborted index, not through every abort of the run", async () => {
    // A long run's history: thousands of aborts of other groups. Through the (run, kind, step) index
    // the check walked all of them for every round (its cost grew with the run: 12 -> 56 ms a
    // statement over a 26-step bench run); the partial index finds the round's own.
    const many: Decision[] = Array.from({ length: 3000 }, (_, i) => ({
      kind: "group.aborted",
      payload: { groupId: 10_000 + i, round: 0, step: 1 + (i % 30), reason: "test" },
    }));
    await decide(many);
    const plan = await db.pool.query<{ "QUERY PLAN": unknown }>(
      `EXPLAIN (FORMAT JSON) SELECT k.i, ${roundAbortedSql({ runId: "k.run_id", groupId: "k.group_id", round: "k.round", step: "k.step" })} AS is_aborted
         FROM unnest($1::text[], $2::bigint[], $3::int[], $4::int[]) WITH ORDINALITY AS k(run_id, group_id, round, step, i)`,
      [
        [runId, runId],
        [0, 10_001],
        [1, 0],
        [0, 2],
      ],
    );
    expect(JSON.stringify(plan.rows[0]?.["QUERY PLAN"])).toContain("decisions_group_aborted_idx");
    expect(
      await areRoundsAborted(db, [
        { runId, groupId: 0, round: 1, step: 0 },
        { runId, groupId: 10_001, round: 0, step: 2 },
        { runId, groupId: 10_001, round: 1, step: 2 },
      ]),
    ).toEqual([true, true, false]);
  });

  it("the job views look a round's dispatch and its group's cuts up per key, through the group lookup index, not through every dispatch of the run", async () => {
    // A long run's history: thousands of dispatches and cuts of other groups. Through the
    // (run, kind, step) index the reward view (its dispatch lookup has no step) read every dispatch
    // of the run for each key, and an EXISTS may run as a hashed subplan that reads them all once.
    const many: Decision[] = Array.from({ length: 3000 }, (_, i) => [
      { kind: "group.dispatched" as const, payload: { groupId: 20_000 + i, round: 0, step: 1 + (i % 30), weightVersion: 0 } },
      { kind: "group.cut" as const, payload: { groupId: 20_000 + i, step: 1 + (i % 30), round: 1, samples: [0], reason: "test" } },
    ]).flat();
    await decide(many);
    // A worker's batch of job starts (store/job-batch.ts): with this many keys Postgres may hash.
    const groups = Array.from({ length: 64 }, (_, i) => 20_000 + i * 40);
    const keys = [groups.map(() => runId), groups, groups.map(() => 0), groups.map((g) => 1 + ((g - 20_000) % 30))];
    const scans = async (sql: string, args: unknown[][]) => {
      const res = await db.pool.query<{ "QUERY PLAN": Array<{ Plan: PlanNode }> }>(`EXPLAIN (FORMAT JSON) ${sql}`, args);
      const out: Array<{ alias: string; index: string | undefined; cond: string | undefined }> = [];
      const walk = (node: PlanNode, alias: string | undefined) => {
        const own = node["Relation Name"] === "decisions" ? node.Alias : alias;
        if (own === "d" || own === "c") {
          if (node["Node Type"] === "Seq Scan" || node["Index Name"] !== undefined)
            out.push({ alias: own, index: node["Index Name"], cond: node["Index Cond"] });
        }
        for (const child of node.Plans ?? []) walk(child, own === "d" || own === "c" ? own : undefined);
      };
      walk(res.rows[0]!["QUERY PLAN"][0]!.Plan, undefined);
      return out;
    };
    for (const [sql, args] of [
      [rolloutJobViewsSql, keys],
      [rewardJobViewsSql, keys.slice(0, 3)],
    ] as const) {
      const found = await scans(sql, args);
      expect(found.map((f) => f.alias).sort()).toEqual(["c", "d"]);
      for (const f of found) {
        expect(f.index).toBe("decisions_group_lookup_idx");
        // Per key: the group is in the index condition (a hashed subplan would read the index by kind alone).
        expect(f.cond).toContain("group_id = k.group_id");
      }
    }
  });

  it("per-token arrays land exactly as written: each segment's slice of the batch's binary arrays, empty ones and edge values included", async () => {
    const run = "jv3";
    await insertRun(db, { runId: run, name: run, config: {}, datasetFingerprint: "x", datasetSize: 1, datasetErrors: [], pluginFingerprints: {} });
    const seg = (sampleIndex: number, tokens: number[], logProbs: number[], lossMask: number[]): RoundFacts["segments"][number] => ({
      ...segment(sampleIndex, 0, 0, tokens, logProbs, tokens.length === 0 ? "truncated" : "completed"),
      lossMask,
    });
    const rounds: RoundFacts[] = [
      { runId: run, groupId: 0, round: 0, step: 0, jobId: "a", expectedWeightVersion: 0, isComplete: true, wasAborted: false, segments: [] },
      {
        runId: run,
        groupId: 1,
        round: 0,
        step: 0,
        jobId: "b",
        expectedWeightVersion: 0,
        isComplete: true,
        wasAborted: false,
        segments: [
          seg(0, [], [], []),
          seg(1, [2147483647], [-Infinity], [0]),
          seg(2, [0, 1, 151_643], [-0.1, -1e-30, -23.025850929940457], [1, 0, -32768]),
          seg(3, [], [], []),
          seg(4, [7, 7], [0, -1e-45], [32767, 1]),
        ],
      },
    ];
    expect(await writeRounds(db, rounds)).toEqual([true, true]);
    // What an `{...}` literal of the same numbers stores (the text path rlq wrote before): equal, element for element.
    const segs = rounds[1]!.segments;
    const same = await db.pool.query<{ sample_index: number; tokens: boolean; log_probs: boolean; loss_mask: boolean; lower: number | null }>(
      `SELECT s.sample_index, s.tokens IS NOT DISTINCT FROM e.tokens::int4[] AS tokens, s.log_probs IS NOT DISTINCT FROM e.log_probs::float4[] AS log_probs,
              s.loss_mask IS NOT DISTINCT FROM e.loss_mask::int2[] AS loss_mask, array_lower(s.tokens, 1) AS lower
         FROM sample_segments s JOIN unnest($2::int[], $3::text[], $4::text[], $5::text[]) AS e(i, tokens, log_probs, loss_mask) ON e.i = s.sample_index
        WHERE s.run_id = $1 ORDER BY s.sample_index`,
      [
        run,
        segs.map((x) => x.sampleIndex),
        segs.map((x) => `{${x.tokens.join(",")}}`),
        segs.map((x) => `{${x.logProbs.join(",")}}`),
        segs.map((x) => `{${x.lossMask.join(",")}}`),
      ],
    );
    expect(same.rows).toEqual([
      { sample_index: 0, tokens: true, log_probs: true, loss_mask: true, lower: null },
      { sample_index: 1, tokens: true, log_probs: true, loss_mask: true, lower: 1 },
      { sample_index: 2, tokens: true, log_probs: true, loss_mask: true, lower: 1 },
      { sample_index: 3, tokens: true, log_probs: true, loss_mask: true, lower: null },
      { sample_index: 4, tokens: true, log_probs: true, loss_mask: true, lower: 1 },
    ]);
    const back = await db.pool.query("SELECT tokens, loss_mask FROM sample_segments WHERE run_id = $1 ORDER BY sample_index", [run]);
    expect(back.rows).toEqual(segs.map((x) => ({ tokens: x.tokens, loss_mask: x.lossMask })));
    // A value the column cannot hold is refused before anything is sent: nothing of the batch lands.
    const bad = { ...rounds[1]!, groupId: 2, jobId: "c", segments: [seg(0, [1.5], [-1], [1])] };
    await expect(writeRounds(db, [bad])).rejects.toThrow(/a segment's tokens: 1.5 is not a 32-bit integer/);
    const none = await db.pool.query("SELECT count(*)::int AS n FROM group_rounds WHERE run_id = $1 AND group_id = 2", [run]);
    expect(none.rows[0].n).toBe(0);
  });

  it("the job store coalesces concurrent jobs' statements and answers each job as the one-job statements do", async () => {
    const store = createJobStore(db, { maxBatch: 3 });
    const keys = [0, 1, 2, 3, 4].map((round) => ({ runId, groupId: 0, round, step: 0 }));
    const [views, singles] = await Promise.all([
      Promise.all(keys.map((k) => store.loadRolloutView(k, n))),
      Promise.all(keys.map((k) => loadRolloutJobView(db, k, n))),
    ]);
    expect(views).toEqual(singles);
    // A bad round (a token id out of int4 range: the statement fails) fails its own job only.
    await decide([3, 4].map((round) => ({ kind: "group.dispatched" as const, payload: { groupId: 0, round, step: 0, weightVersion: 0 } })));
    const ok: RoundFacts = {
      runId,
      groupId: 0,
      round: 3,
      step: 0,
      jobId: "gen-0-3",
      expectedWeightVersion: 0,
      isComplete: false,
      wasAborted: true,
      segments: [],
    };
    const bad: RoundFacts = { ...ok, round: 4, jobId: "gen-0-4", segments: [segment(0, 1, 4, [2 ** 40], [-1], "aborted")] };
    const out = await Promise.allSettled([store.writeRound(ok), store.writeRound(bad)]);
    expect(out[0]).toEqual({ status: "fulfilled", value: true });
    expect(out[1]?.status).toBe("rejected");
    expect((await loadRolloutJobView(db, { runId, groupId: 0, round: 4, step: 0 }, n)).hasRound).toBe(false);
  });
});

/** The fields of a Postgres JSON plan node that the plan tests read. */
interface PlanNode {
  "Node Type": string;
  "Relation Name"?: string;
  Alias?: string;
  "Index Name"?: string;
  "Index Cond"?: string;
  Plans?: PlanNode[];
}

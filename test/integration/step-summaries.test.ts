import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq } from "../helpers/processes.ts";
import { loadRunOverview } from "../../src/dashboard/queries.ts";
import { readFileSync } from "node:fs";
import { migrationsFolder } from "../../src/store/migrate.ts";

/**
 * `step_summaries` (store/projections.ts): the dashboard's per-step curves read one row per step.
 * Checked against the aggregates computed here from the history itself, on an asynchronous run
 * with partial rollouts (samples trained a step after they were recorded, aborted groups that land
 * late), then broken on purpose: `rlq replay --check` names the difference and `rlq replay` mends it.
 */
describe("step summaries", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("stepsum", { engineArgs: ["--token-delay-ms", "1"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  const q = async (text: string, params: unknown[]) => (await w.db.pool.query(text, params)).rows;
  const num = (v: unknown) => (v === null ? null : Number(v));
  const rows = (rs: Array<Record<string, unknown>>) => rs.map((r) => Object.fromEntries(Object.entries(r).map(([k, v]) => [k, num(v)])));

  /** The per-step aggregates over the whole history, written independently of store/step-aggregates.ts. */
  const fromHistory = async (runId: string) =>
    rows(
      await q(
        `SELECT step, count(*) AS samples,
           avg(reward) FILTER (WHERE trained_step IS NOT NULL) AS reward_trained, avg(reward) AS reward_all,
           avg(reward) FILTER (WHERE outcome = 'filtered') AS reward_filtered,
           count(DISTINCT group_id) FILTER (WHERE outcome = 'kept') AS groups_kept,
           count(DISTINCT group_id) FILTER (WHERE outcome = 'filtered') AS groups_filtered,
           avg(response_length) FILTER (WHERE trained_step IS NOT NULL) AS response_length_mean,
           max(response_length) AS response_length_max, sum(response_length) AS response_tokens
         FROM rollout_history WHERE run_id = $1 GROUP BY step ORDER BY step`,
        [runId],
      ),
    );
  const close = (a: Array<Record<string, number | null>>, b: Array<Record<string, number | null>>) => {
    expect(a.map((r) => r.step)).toEqual(b.map((r) => r.step));
    a.forEach((r, i) => {
      for (const [k, v] of Object.entries(b[i] ?? {})) {
        if (v === null) expect(r[k], `step ${r.step} ${k}`).toBeNull();
        else expect(r[k], `step ${r.step} ${k}`).toBeCloseTo(v, 9);
      }
    });
  };
  const check = async (runId: string) => {
    const out = spawnRlq(["replay", runId, "--check"], w.env);
    await out.exited;
    return out.output();
  };

  it("chart what the history says, and replay finds and mends a summary that does not", async () => {
    const runId = await w.start({
      train_async: true,
      max_staleness: 1,
      partial_rollout: true,
      num_rollout: 4,
      rollout_max_response_len: 40,
      engine: { kind: "sglang", urls: [await w.freshEngine()] },
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);

    const summaries = await q("SELECT step, samples FROM step_summaries WHERE run_id = $1 ORDER BY step", [runId]);
    expect(summaries.map((r) => r.step)).toEqual([0, 1, 2, 3]);
    const want = await fromHistory(runId);
    const overview = await loadRunOverview(w.db, runId);
    close(overview.rewardPerStep, want);

    // Staleness and trained tokens: the staleness view and the trained marks, over the whole run.
    const stale = await q("SELECT staleness, count(*)::int AS samples FROM staleness WHERE run_id = $1 AND staleness IS NOT NULL GROUP BY 1 ORDER BY 1", [
      runId,
    ]);
    expect(stale.length).toBeGreaterThan(0);
    expect(overview.staleness).toEqual(stale);
    const tokens = await q(
      "SELECT trained_step AS step, sum(response_length)::int AS t FROM rollout_history WHERE run_id = $1 AND trained_step IS NOT NULL GROUP BY 1 ORDER BY 1",
      [runId],
    );
    expect(overview.trainSteps.map((s) => [s.step, s.response_tokens])).toEqual(tokens.map((r) => [r.step, r.t]));
    expect(await check(runId)).toMatch(/0 difference\(s\)/);

    // A step without its summary is charted live from the history (and the check misses it).
    await q("DELETE FROM step_summaries WHERE run_id = $1 AND step = 1", [runId]);
    close((await loadRunOverview(w.db, runId)).rewardPerStep, want);
    expect(await check(runId)).toMatch(/step_summaries step 1: missing from the live projection/);

    // A wrong value is named, and `rlq replay` rebuilds the summaries from the history.
    await q("UPDATE step_summaries SET reward_all = reward_all + 1, staleness = '{\"7\": 1}' WHERE run_id = $1 AND step = 2", [runId]);
    const found = await check(runId);
    expect(found).toMatch(/step_summaries step 2\.reward_all: live/);
    expect(found).toMatch(/step_summaries step 2\.staleness: live \{"7":1\}/);
    const mend = spawnRlq(["replay", runId], w.env);
    expect(await mend.exited, mend.output()).toBe(0);
    expect(await check(runId)).toMatch(/0 difference\(s\)/);
    close((await loadRunOverview(w.db, runId)).rewardPerStep, want);
    expect((await loadRunOverview(w.db, runId)).staleness).toEqual(stale);

    // A run recorded before migration 0010: its summaries come from the migration's backfill, and
    // they are what the commits would have written.
    await q("DELETE FROM step_summaries WHERE run_id = $1", [runId]);
    const migration = readFileSync(`${migrationsFolder}/0010_step_summaries.sql`, "utf8").split("--> statement-breakpoint");
    await q(migration.at(-1) ?? "", []);
    expect(await check(runId)).toMatch(/0 difference\(s\)/);
  });
});

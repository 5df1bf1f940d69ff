import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq, waitFor } from "../helpers/processes.ts";
import { checkRunInvariants } from "../helpers/invariants.ts";
import { fakeStats, restartFake, startFake, type FakeServer } from "../fakes/fake-engine-control.ts";
import { insertRunRequest } from "../../src/store/run-requests.ts";

/**
 * A whole run on two fake SGLang engines behind the pool (streaming, so a
 * dying server's tokens are kept); one engine is
 * killed mid-generation and restarted. The run completes, no sample is lost,
 * and the killed engine's in-flight samples come back as partial rollouts
 * (aborted segments with tokens, continued by a later segment).
 */
describe("a run on two engines, one killed and restarted mid-run", () => {
  let w: World;
  const extra: FakeServer[] = [];
  const args = ["--token-delay-ms", "6", "--stop-prob", "0.03"];
  beforeAll(async () => {
    w = await createWorld("engrun", { engineArgs: args });
    extra.push(await startFake("sglang", args));
  });
  afterAll(async () => {
    for (const f of extra) f.kill("SIGKILL");
    await w?.close();
  });

  it("completes with every sample accounted for", async () => {
    const b = extra[0] as FakeServer;
    const runId = await w.start({
      num_rollout: 6,
      partial_rollout: true,
      rollout_max_response_len: 128,
      rollout_health_check_interval: 1,
      engine: { kind: "sglang", urls: [w.engine.url, b.url], stream: true },
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    // Kill engine B once it has produced segments of this run and the engines left version 0, while it still has requests in flight.
    // ... and its live requests have streamed some tokens: at least 4 live, and ~10 tokens each generated since first seen so.
    let tokensWhenLive: number | null = null;
    await waitFor(
      "engine B generating",
      async () => {
        // After the first weight sync: the restarted engine must then be given the current weights.
        const r = await w.db.pool.query(
          "SELECT (SELECT count(*)::int FROM sample_segments WHERE run_id = $1 AND engine = $2) AS n, (SELECT count(*)::int FROM decisions WHERE run_id = $1 AND kind = 'weights.synced') AS synced",
          [runId, b.url],
        );
        const s = await fakeStats(b.url);
        if ((r.rows[0]?.n ?? 0) === 0 || (r.rows[0]?.synced ?? 0) === 0 || s.live < 4) return false;
        tokensWhenLive ??= s.tokensGenerated;
        return s.tokensGenerated >= tokensWhenLive + 10 * s.live;
      },
      120_000,
      20,
    );
    // The run pauses (an operator's pause: in-flight jobs go on, nothing new is dispatched) so that it
    // cannot end before the restarted engine is back: the CI box once finished the run's last step
    // in the 2-3 s a restart and a health round took.
    await insertRunRequest(w.db, runId, "pause");
    b.kill("SIGKILL");
    await waitFor("engine B out of the rotation", () => /engine left the rotation/.test(up.output()));
    extra.push(await restartFake("sglang", b.port, args));
    // The controller's pool notices the restarted engine (on version 0) and loads the current weights into it.
    await waitFor("restarted engine reloaded", async () => ((await (await fetch(`${b.url}/stats`)).json()) as { loads: number }).loads > 0, 60_000).catch(
      async (e: Error) => {
        const d = (await w.db.pool.query("SELECT seq, kind, step FROM decisions WHERE run_id = $1 ORDER BY seq DESC LIMIT 4", [runId])).rows;
        throw new Error(`${e.message} ${JSON.stringify(d)} ${up.output().slice(-3000)}`, { cause: e });
      },
    );
    const paused = await w.db.pool.query(
      "SELECT count(*)::int AS n FROM decisions WHERE run_id = $1 AND kind = 'run.status' AND payload->>'status' = 'paused'",
      [runId],
    );
    expect(paused.rows[0]?.n).toBe(1); // the run was still going when it paused
    await insertRunRequest(w.db, runId, "resume");

    expect(await up.exited, up.output()).toBe(0);
    // The death is in the log (it used to show only in engine_metrics).
    expect(up.output()).toMatch(/engine left the rotation/);
    await checkRunInvariants(w.db, runId, { numRollout: 6, datasetSize: 64, shuffle: false, seed: 42, rbs: 4 });

    // The killed engine's in-flight samples: aborted segments with tokens, each continued by a later segment.
    const partial = await w.db.pool.query(
      `SELECT s.group_id, s.sample_index, s.segment_index, s.token_end - s.token_start AS n,
         EXISTS (SELECT 1 FROM sample_segments t WHERE t.run_id = s.run_id AND t.group_id = s.group_id AND t.sample_index = s.sample_index AND t.segment_index = s.segment_index + 1) AS continued
       FROM sample_segments s WHERE s.run_id = $1 AND s.engine = $2 AND s.finish_reason = 'abort' AND s.token_end > s.token_start`,
      [runId, b.url],
    );
    expect(partial.rows.length).toBeGreaterThan(0);
    const trainedOrKept = await w.db.pool.query("SELECT count(*)::int AS n FROM rollout_history WHERE run_id = $1 AND trained_step IS NOT NULL", [runId]);
    expect(trainedOrKept.rows[0]?.n).toBe(6 * 4 * 4);
    // Every partial that belongs to a group that was later trained was continued, not regenerated.
    for (const r of partial.rows)
      if (!r.continued) {
        const g = await w.db.pool.query("SELECT 1 FROM rollout_history WHERE run_id = $1 AND group_id = $2 AND trained_step IS NOT NULL", [runId, r.group_id]);
        expect(g.rows).toEqual([]);
      }

    const replay = spawnRlq(["replay", runId, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);
  });
});

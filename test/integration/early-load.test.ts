import { existsSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { keepRestarting, spawnRlq, waitFor } from "../helpers/processes.ts";
import { checkRunInvariants } from "../helpers/invariants.ts";

/**
 * Asynchronous mode's weight sync asks the engines to load the new weights when it records the
 * intent (`weights.syncing`), not once the aborted rounds have landed (controller/engine-admin.ts
 * `beginLoad`): SGLang's load waits for the requests in the server to end and holds new ones
 * (tokenizer_manager.py model_update_lock.writer_lock; the fake does the same), so each engine
 * loads as soon as its own aborted requests are out, while the rollout workers record them.
 *
 * Made visible by stopping the rollout worker (SIGSTOP) between two syncs, with rounds dispatched
 * that have not landed: none can land while it is stopped, so a controller that waits for the
 * landing never asks for the next load; one that overlaps them asks, and the engine loads.
 */
describe("weight sync: the load overlaps the aborts", () => {
  let w: World;
  beforeAll(async () => {
    // Every request runs to its 400 tokens at 5 ms a token (2 s): the rounds drawn after the first
    // sync are still generating when the test stops the rollout worker.
    w = await createWorld("earlyload", { engineArgs: ["--token-delay-ms", "5", "--stop-prob", "0"], trainerArgs: ["--step-ms", "1000"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  /** An async run (k = 1, 3 steps, 400-token responses) on these SGLang servers; `engine` and `extra` add to its config. */
  const startRun = (urls: string[], engine: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
    w.start({
      train_async: true,
      max_staleness: 1,
      staleness_policy: "mask",
      num_rollout: 3,
      rollout_max_response_len: 400,
      dynamic_sampling_filter_path: null,
      engine: { kind: "sglang", urls, ...engine },
      ...extra,
    });
  const isCompleted = async (runId: string) =>
    (await w.db.pool.query<{ status: string }>("SELECT status FROM runs WHERE id = $1", [runId])).rows[0]?.status === "completed";
  /** Segments generated on an older version than their round was dispatched at (a request the load held runs on the newer one, and says so). */
  const olderSegments = async (runId: string) =>
    (
      await w.db.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM sample_segments WHERE run_id = $1 AND weight_version < expected_weight_version", [
        runId,
      ])
    ).rows[0]!.n;

  /**
   * An async run whose rollout worker the test stops between the first and second sync; returns once
   * the engine has loaded version 2, with what the engine had counted then, and lets the run finish.
   */
  async function syncWithWorkerStopped(exclusive: boolean): Promise<{ syncs: number; abortAlls: () => Promise<number> }> {
    const engineUrl = await w.freshEngine();
    const runId = await startRun([engineUrl], { exclusive });
    const engineStats = async () => (await (await fetch(`${engineUrl}/stats`)).json()) as { live: number; weightVersion: number; abortAlls: number };
    const decisionCount = async (kind: string) =>
      (await w.db.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM decisions WHERE run_id = $1 AND kind = $2", [runId, kind])).rows[0]!.n;

    // The controller with the reward and train workers in one process, the rollout worker in another.
    const up = spawnRlq(["up", "--run", runId, "--workers", "reward,train"], w.env);
    const rollout = spawnRlq(["worker", "rollout"], w.env);
    const stepRounds = async (step: number) =>
      (await w.db.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM group_rounds WHERE run_id = $1 AND step = $2", [runId, step])).rows[0]!.n;
    try {
      // With max_staleness 1, steps 0 and 1 generate at once; step 2's groups are drawn after the
      // first sync, and the rollout worker is stopped while they generate.
      await waitFor(
        "the first sync done and step 2's requests in the engine",
        async () => (await decisionCount("weights.synced")) >= 1 && (await engineStats()).live > 0,
      );
      rollout.kill("SIGSTOP");
      expect(await stepRounds(2), "step 2's rounds landed before the rollout worker was stopped").toBe(0);
      expect(await decisionCount("weights.syncing"), "the second sync began before the rollout worker was stopped").toBe(1);
      // Step 1 trains and commits; the second sync records its aborts. Nothing can land while the
      // rollout worker is stopped: only a load that overlaps the aborts reaches the engine now.
      await waitFor("the engine to load version 2", async () => (await engineStats()).weightVersion === 2);
      expect(await decisionCount("weights.syncing")).toBe(2);
      expect(await decisionCount("weights.synced")).toBe(1);
      expect(await stepRounds(2)).toBe(0);
      rollout.kill("SIGCONT");
      await waitFor("the run to complete", () => isCompleted(runId), 180_000, 200);
    } finally {
      rollout.kill("SIGCONT");
      rollout.kill("SIGTERM");
      up.kill("SIGTERM");
      await Promise.all([rollout.exited, up.exited]);
    }
    await checkRunInvariants(w.db, runId, { numRollout: 3, datasetSize: 64, shuffle: false, seed: 42, rbs: 4 });
    expect(await olderSegments(runId)).toBe(0);
    return { syncs: await decisionCount("weights.syncing"), abortAlls: async () => (await engineStats()).abortAlls };
  }

  it("asks the engines to load before the aborted rounds land; the run then completes with every segment's version as the engine reported it", async () => {
    const { abortAlls } = await syncWithWorkerStopped(false);
    // Servers other runs may share: only requests by id were aborted.
    expect(await abortAlls()).toBe(0);
  });

  it("an engine whose load has ended takes the sync's resumed and new requests before the slowest load ends and weights.synced", async () => {
    // Two engines; the second loads slower. The sync's rounds are dispatched at the new version
    // as they land (controller/async-pipeline.ts continueDuringSync), the rollout worker holds them
    // until an engine reports it, and the controller says when each load ends (rlq_loaded): the fast
    // engine generates on each new version while the slow one still loads. Dispatched only after
    // weights.synced, no request would reach any engine on a new version before the slow load ended.
    // The fast engine's load ends 1.5 s into each sync, after the rounds continued at the new version
    // have reached the rollout worker (which then finds both engines still loading); only the
    // controller's word that it ended (rlq_loaded) sends them there before the slow one's, 5 s in.
    // No health round runs in between (rollout_health_check_interval) to admit it by chance.
    const fast = await w.freshEngine(["--token-delay-ms", "5", "--stop-prob", "0", "--load-delay-ms", "1500"]);
    const slow = await w.freshEngine(["--token-delay-ms", "5", "--stop-prob", "0", "--load-delay-ms", "5000"]);
    const runId = await startRun([fast, slow], {}, { rollout_health_check_interval: 600 });
    const up = spawnRlq(["up", "--run", runId, "--workers", "reward,train,rollout"], w.env);
    try {
      await waitFor("the run to complete", () => isCompleted(runId), 180_000, 200);
    } finally {
      up.kill("SIGTERM");
      await up.exited;
    }
    const firstOn = async (url: string) => ((await (await fetch(`${url}/stats`)).json()) as { firstGenerateAt: Record<string, number> }).firstGenerateAt;
    const [onFast, onSlow] = [await firstOn(fast), await firstOn(slow)];
    // The syncs that had rounds to continue or groups to draw: those dispatched at the sync's version before it ended.
    const syncs = (
      await w.db.pool.query<{ version: number; at: Date }>(
        `SELECT (s.payload->>'weightVersion')::int AS version, s.created_at AS at FROM decisions s
          WHERE s.run_id = $1 AND s.kind = 'weights.synced'
            AND EXISTS (SELECT 1 FROM decisions d WHERE d.run_id = s.run_id AND d.kind = 'group.dispatched' AND d.seq < s.seq
                          AND (d.payload->>'weightVersion')::int = (s.payload->>'weightVersion')::int)
          ORDER BY s.seq`,
        [runId],
      )
    ).rows;
    expect(syncs.length, "no sync dispatched anything before it ended").toBeGreaterThanOrEqual(1);
    for (const { version, at } of syncs) {
      const fastAt = onFast[String(version)];
      expect(fastAt, `the fast engine never generated on version ${version}`).toBeDefined();
      expect(fastAt as number, `version ${version}: the fast engine's first request on it came only after weights.synced`).toBeLessThan(at.getTime());
      // The slow engine cannot have generated on it before its own load ended (a sanity check of the fake).
      if (onSlow[String(version)] !== undefined) expect(onSlow[String(version)] as number).toBeGreaterThan(fastAt as number);
    }
    await checkRunInvariants(w.db, runId, { numRollout: 3, datasetSize: 64, shuffle: false, seed: 42, rbs: 4 });
  });

  it("a controller killed during such a sync resumes it on the version its rounds run on: no segment older than its round, one load per version", async () => {
    // The sync's rounds run at the new version when the controller dies (crash point
    // controller.during_sync); the restarted one loads that version into the engines, not the last
    // synced one (which would run the new rounds' requests on the old weights), and does not load it
    // a second time when it finishes the sync.
    const engineUrl = await w.freshEngine(["--token-delay-ms", "5", "--stop-prob", "0", "--load-delay-ms", "200"]);
    const runId = await startRun([engineUrl], { exclusive: true });
    const mark = join(w.home, "crash-during-sync");
    const crashEnv = { ...w.env, RLQ_CRASH_AT: `controller.during_sync:once=${mark}` };
    const up = keepRestarting(() => spawnRlq(["up", "--run", runId, "--workers", "reward,train"], crashEnv));
    const rollout = spawnRlq(["worker", "rollout"], w.env);
    try {
      await waitFor(
        "the run to complete",
        () => {
          up.check();
          return isCompleted(runId);
        },
        180_000,
        200,
      );
    } finally {
      up.current().kill("SIGTERM");
      rollout.kill("SIGTERM");
      await Promise.all([up.current().exited, rollout.exited]);
    }
    expect(existsSync(mark), "the controller never reached the crash point").toBe(true);
    expect(up.restarts()).toBeGreaterThanOrEqual(1);
    expect(await olderSegments(runId), "segments generated on an older version than their round's").toBe(0);
    const engine = (await (await fetch(`${engineUrl}/stats`)).json()) as { loads: number; weightVersion: number };
    expect(engine.weightVersion).toBe(3);
    // Versions 1, 2 and 3, once each: the interrupted sync's load (200 ms) ended before the controller
    // was back (a restart takes longer), so the restarted one finds the engine on it and loads nothing.
    expect(engine.loads).toBe(3);
    await checkRunInvariants(w.db, runId, { numRollout: 3, datasetSize: 64, shuffle: false, seed: 42, rbs: 4 });
  });

  it("on exclusive servers, the sync itself ends their requests with one abort_all each", async () => {
    // One per sync (the second sent while the rollout worker was stopped), from the controller.
    const { syncs, abortAlls } = await syncWithWorkerStopped(true);
    expect(syncs).toBe(3);
    await waitFor("one abort_all per sync", async () => (await abortAlls()) === syncs);
  });
});

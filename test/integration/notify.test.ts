import { afterAll, beforeAll, describe, expect, it } from "vitest";
import pg from "pg";
import { createDb, type Db } from "../../src/store/db.ts";
import { createNotifications, createWaker, notifyInTx, notifyRuns, type Channel, type Notifications } from "../../src/store/notify.ts";
import { insertDrawnPrompts, insertRun } from "../../src/store/run-facts.ts";
import { appendDecisions } from "../../src/store/decision-log.ts";
import { createJobStore } from "../../src/store/job-batch.ts";
import { insertRunRequest } from "../../src/store/run-requests.ts";
import { createTestDatabase } from "../helpers/services.ts";
import { waitFor } from "../helpers/processes.ts";

/**
 * The wake-ups over LISTEN/NOTIFY (store/notify.ts) against a real Postgres:
 * who is woken, that a rolled-back transaction wakes nobody, that the listening
 * connection comes back after its backend is killed, and that the writes the
 * controller and the rollout jobs wait for send them.
 */
describe("notifications", () => {
  let db: Db;
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  const hubs: Notifications[] = [];

  /** Every wake of (channel, runId), as a list a test can wait on. */
  const recorder = (hub: Notifications, channel: Channel, runId: string) => {
    const waiters: Array<{ n: number; resolve: () => void }> = [];
    const r = {
      count: 0,
      /** Resolves once `n` wakes have come (the test's own timeout bounds a broken hub). */
      reached(n: number): Promise<void> {
        if (r.count >= n) return Promise.resolve();
        return new Promise((resolve) => waiters.push({ n, resolve }));
      },
      stop: hub.subscribe(channel, runId, () => {
        r.count++;
        for (const w of waiters.filter((w) => r.count >= w.n)) w.resolve();
      }),
    };
    return r;
  };
  /**
   * Until the hub listens on `channel` (added after it connected): notify a probe run until one
   * arrives (a fact, not a delay). Late copies of the probe's notifications wake only the probe.
   */
  let probes = 0;
  const listened = async (hub: Notifications, channel: Channel) => {
    const probe = `probe-${probes++}`;
    const rec = recorder(hub, channel, probe);
    await waitFor(`LISTEN ${channel}`, async () => {
      await notifyRuns(db.pool, channel, [probe]);
      return rec.count > 0;
    });
    rec.stop();
  };
  /** A hub whose connection is up: its first wake is the one it sends after LISTEN. */
  const connectedHub = async (channel: Channel, runId: string, applicationName = "notify-test") => {
    const hub = createNotifications(database.url, { applicationName, retryMs: 20 });
    hubs.push(hub);
    const rec = recorder(hub, channel, runId);
    await rec.reached(1);
    return { hub, rec };
  };

  beforeAll(async () => {
    database = await createTestDatabase("rlq_notify");
    db = createDb(database.url, { max: 4 });
  });
  afterAll(async () => {
    for (const h of hubs) await h.close();
    await db?.close();
    await database?.drop();
  });

  it("wakes the subscribers of the notified run and channel only", async () => {
    const { hub, rec: a } = await connectedHub("rlq_facts", "run-a");
    const b = recorder(hub, "rlq_facts", "run-b");
    const abortA = recorder(hub, "rlq_abort", "run-a");
    await listened(hub, "rlq_abort");
    const before = { a: a.count, b: b.count, abortA: abortA.count };
    await notifyRuns(db.pool, "rlq_facts", ["run-a", "run-a"]);
    await notifyRuns(db.pool, "rlq_facts", ["run-b"]);
    await b.reached(before.b + 1);
    // Notifications of one session arrive in order: run-a's came before run-b's, and only once
    // (pg folds identical notifications of one transaction).
    expect(a.count).toBe(before.a + 1);
    expect(abortA.count).toBe(before.abortA);
  });

  it("a rolled-back transaction wakes nobody; a committed one does, at commit", async () => {
    const { rec: gone } = await connectedHub("rlq_facts", "rolled-back");
    const { rec: kept } = await connectedHub("rlq_facts", "committed");
    const goneBefore = gone.count;
    await db.db
      .transaction(async (tx) => {
        await notifyInTx(tx, "rlq_facts", "rolled-back");
        throw new Error("roll back");
      })
      .catch(() => undefined);
    await db.db.transaction(async (tx) => {
      await notifyInTx(tx, "rlq_facts", "committed");
    });
    await kept.reached(2);
    expect(gone.count).toBe(goneBefore);
  });

  it("comes back after its connection is killed, wakes everyone (notifications were missed), and is woken again", async () => {
    const { rec } = await connectedHub("rlq_facts", "reconnect", "notify-test-kill");
    const admin = new pg.Client({ connectionString: database.adminUrl });
    await admin.connect();
    try {
      const killed = await admin.query("SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity WHERE application_name = 'notify-test-kill'");
      expect(killed.rows.length).toBe(1);
    } finally {
      await admin.end();
    }
    // The drop wakes it (1 + 1), the reconnect wakes it again once it listens (+ 1).
    await rec.reached(3);
    await notifyRuns(db.pool, "rlq_facts", ["reconnect"]);
    await rec.reached(4);
  });

  it("the writes the controller and the rollout jobs wait for send them", async () => {
    const runId = "notify-run";
    const { hub, rec: facts } = await connectedHub("rlq_facts", runId);
    const aborts = recorder(hub, "rlq_abort", runId);
    await listened(hub, "rlq_abort");
    const abortsBefore = aborts.count;
    const syncs = recorder(hub, "rlq_weights", runId);
    await listened(hub, "rlq_weights");
    const syncsBefore = syncs.count;
    const kept = recorder(hub, "rlq_kept", runId);
    await listened(hub, "rlq_kept");
    const keptBefore = kept.count;
    await insertRun(db, { runId, name: runId, config: {}, datasetFingerprint: "x", datasetSize: 1, datasetErrors: [], pluginFingerprints: {} });
    let seq = 2;
    const decide = async (list: Parameters<typeof appendDecisions>[4]) => {
      await appendDecisions(db, runId, 0, seq, list);
      seq += list.length;
    };
    await appendDecisions(db, runId, 0, seq, [], (tx) =>
      insertDrawnPrompts(tx, [{ runId, drawOrdinal: 0, epoch: 0, datasetIndex: 0, step: 0, prompt: "p", label: null, metadata: {}, promptTokens: [1] }]),
    );
    await decide([{ kind: "group.dispatched", payload: { groupId: 0, round: 0, step: 0, weightVersion: 0 } }]);
    expect(aborts.count).toBe(abortsBefore); // a dispatch aborts nothing

    const store = createJobStore(db);
    const seen = facts.count;
    const segment = { sampleIndex: 0, segmentIndex: 0, round: 0, weightVersion: 0, tokens: [5], logProbs: [-1], lossMask: [1] };
    const rest = { finishReason: "stop", status: "completed" as const, engine: "e", tokenStart: 0, error: null };
    await store.writeRound({
      runId,
      groupId: 0,
      round: 0,
      step: 0,
      jobId: "j",
      expectedWeightVersion: 0,
      isComplete: true,
      wasAborted: false,
      segments: [{ ...segment, ...rest }],
    });
    await facts.reached(seen + 1);
    await store.writeRewards({ key: { runId, groupId: 0, round: 0, step: 0, jobId: "r" }, rewards: [{ sampleIndex: 0, reward: 1, components: {} }] });
    await facts.reached(seen + 2);
    await insertRunRequest(db, runId, "pause");
    await facts.reached(seen + 3);

    // A weight sync's abort and a seal with aborted rounds wake the rollout jobs' watchers.
    await decide([{ kind: "group.aborted", payload: { groupId: 0, round: 0, step: 0, reason: "weight_sync" } }]);
    await aborts.reached(abortsBefore + 1);
    await decide([{ kind: "step.sealed", payload: { step: 0, kept: [], aborted: [{ groupId: 0, round: 1 }] } }]);
    await aborts.reached(abortsBefore + 2);
    expect(syncs.count).toBe(syncsBefore); // nothing so far loaded weights

    // A group kept for a step's batch wakes the train worker's stager; a buffered one does not.
    // (Notifications come in commit order on the one connection: the abort after it shows the buffered outcome sent none.)
    await decide([{ kind: "group.outcome", payload: { groupId: 0, step: 0, outcome: "buffered", reason: "aborted" } }]);
    await decide([{ kind: "group.aborted", payload: { groupId: 0, round: 1, step: 1, reason: "weight_sync" } }]);
    await aborts.reached(abortsBefore + 3);
    expect(kept.count).toBe(keptBefore);
    await decide([
      { kind: "group.filtered", payload: { groupId: 0, round: 1, step: 1, keep: true, reason: null } },
      { kind: "group.outcome", payload: { groupId: 0, step: 1, outcome: "kept", reason: null } },
    ]);
    await kept.reached(keptBefore + 1);

    // A weight sync's record wakes the rollout workers' engine pools.
    await decide([{ kind: "weights.synced", payload: { step: 0, weightVersion: 1, checkpointUri: "file:///step-0" } }]);
    await syncs.reached(syncsBefore + 1);
  });
});

describe("the waker", () => {
  it("a wake before the wait ends it at once; clear() forgets it; a wake during the wait ends it", async () => {
    const w = createWaker();
    w.wake();
    await w.wait(3_600_000); // would time the test out if the wake were lost
    w.clear();
    const pending = w.wait(3_600_000);
    w.wake();
    await pending;
  });

  it("an aborted signal ends the wait", async () => {
    const w = createWaker();
    const ac = new AbortController();
    const pending = w.wait(3_600_000, ac.signal);
    ac.abort();
    await pending;
  });
});

import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createDb, type Db } from "../../src/store/db.ts";
import { createTestDatabase } from "../helpers/services.ts";
import { waitFor } from "../helpers/processes.ts";
import { insertRun } from "../../src/store/run-facts.ts";
import { tryAcquireLease } from "../../src/store/decision-log.ts";

/**
 * The run's lease (src/store/decision-log.ts) against real Postgres: a waiting
 * attempt sits in Postgres's lock queue and gets the lease when the holder's
 * lock goes, by a release or by its backend's end (what a SIGKILLed
 * controller's connection does); a wait that times out returns null and
 * leaves no backend behind.
 */
describe("the run's lease", () => {
  let db: Db;
  let drop: () => Promise<void>;
  const runId = "lease1";

  /** The lease backends of this run in pg_locks: how many hold the advisory lock, how many wait for it. */
  const lockRows = async () => {
    const r = await db.pool.query<{ granted: boolean; pid: number }>(
      `SELECT l.granted, l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
       WHERE l.locktype = 'advisory' AND a.application_name = $1 AND a.datname = current_database()`,
      [`rlq-lease-${runId}`],
    );
    return { held: r.rows.filter((x) => x.granted), waiting: r.rows.filter((x) => !x.granted) };
  };

  beforeAll(async () => {
    const database = await createTestDatabase("rlq_lease");
    drop = () => database.drop();
    db = createDb(database.url, { max: 4 });
    await insertRun(db, { runId, name: runId, config: {}, datasetFingerprint: "x", datasetSize: 1, datasetErrors: [], pluginFingerprints: {} });
  });
  afterAll(async () => {
    await db?.close();
    await drop?.();
  });

  it("a waiting attempt gets the lease when the holder releases it, with the next epoch", async () => {
    const first = await tryAcquireLease(db, runId, "a");
    expect(first).not.toBeNull();
    expect(await tryAcquireLease(db, runId, "b")).toBeNull();
    const second = tryAcquireLease(db, runId, "b", 60_000);
    await waitFor("the second attempt waiting in the lock queue", async () => (await lockRows()).waiting.length === 1);
    await first!.release();
    const got = await second;
    expect(got?.epoch).toBe(first!.epoch + 1);
    expect((await lockRows()).held).toHaveLength(1);
    await got!.release();
    expect(await lockRows()).toEqual({ held: [], waiting: [] });
  });

  it("a waiting attempt gets the lease when the holder's backend ends (a killed controller's connection)", async () => {
    const first = await tryAcquireLease(db, runId, "a");
    const second = tryAcquireLease(db, runId, "b", 60_000);
    await waitFor("the second attempt waiting in the lock queue", async () => (await lockRows()).waiting.length === 1);
    const holderPid = (await lockRows()).held[0]!.pid;
    await db.pool.query("SELECT pg_terminate_backend($1)", [holderPid]);
    await first!.lost;
    const got = await second;
    expect(got?.epoch).toBe(first!.epoch + 1);
    await got!.release();
  });

  it("a wait that times out returns null and closes its connection; the holder keeps the lease", async () => {
    const first = await tryAcquireLease(db, runId, "a");
    expect(await tryAcquireLease(db, runId, "b", 50)).toBeNull();
    await waitFor("the timed-out attempt's backend gone", async () => {
      const r = await db.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1", [`rlq-lease-${runId}`]);
      return r.rows[0]?.n === 1;
    });
    expect(await lockRows()).toMatchObject({ held: [{ granted: true }], waiting: [] });
    await first!.release();
  });
});

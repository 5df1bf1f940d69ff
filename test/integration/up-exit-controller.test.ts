import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq } from "../helpers/processes.ts";

/**
 * `rlq up --exit-when-done` whose controller dies (an error that is not an
 * outage) exits 1 with the reason, instead of 0 with the run still running
 * (issue 15). The fault here is real: the run's log holds a fact the
 * controller cannot read back (a decision kind it does not know, as a newer
 * rlq could write), so folding the log fails.
 */
describe("rlq up --exit-when-done with a controller that dies", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("upctl");
  });
  afterAll(async () => {
    await w?.close();
  });

  it("exits 1 and prints the controller's error", async () => {
    const runId = await w.start({ num_rollout: 1 });
    const q = async (sql: string, args: unknown[] = []) => (await w.db.pool.query(sql, [runId, ...args])).rows;
    // The decision fence (migrations/0001) wants the current lease epoch and the next seq.
    await q("INSERT INTO run_leases (run_id, epoch, holder) VALUES ($1, 0, 'test') ON CONFLICT (run_id) DO NOTHING");
    const [{ epoch }] = await q("SELECT epoch FROM run_leases WHERE run_id = $1");
    const [{ next }] = await q("SELECT coalesce(max(seq) + 1, 0)::bigint AS next FROM decisions WHERE run_id = $1");
    await q("INSERT INTO decisions (run_id, seq, lease_epoch, kind, payload) VALUES ($1, $2, $3, 'run.from_the_future', '{}'::jsonb)", [next, epoch]);

    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    let timer: NodeJS.Timeout | undefined;
    const code = await Promise.race([up.exited, new Promise((r) => (timer = setTimeout(() => r("still running after 90 s"), 90_000)))]);
    clearTimeout(timer);
    if (code === "still running after 90 s") {
      up.kill("SIGTERM");
      await up.exited;
    }
    expect(code, up.output().slice(-3000)).toBe(1);
    expect(up.output()).toMatch(new RegExp(`run ${runId}: the controller stopped with an error: .*unknown kind 'run\\.from_the_future'`));
    // Nothing was decided on top of the unreadable log.
    const after = await q("SELECT count(*)::int AS n FROM decisions WHERE run_id = $1 AND seq > $2", [next]);
    expect(after[0].n).toBe(0);
  }, 120_000);
});

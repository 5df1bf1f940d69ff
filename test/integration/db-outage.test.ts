import { asRole } from "../helpers/services.ts";
import { freePort } from "../helpers/tls-services.ts";
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRun } from "../../src/api.ts";
import { createDb, type Db } from "../../src/store/db.ts";
import { migrateDb } from "../../src/store/migrate.ts";
import { checkRunInvariants } from "../helpers/invariants.ts";
import { ownPostgres, ownRedis, ownServicesAvailable, type OwnPostgres, type OwnRedis } from "../helpers/own-services.ts";
import { repoRoot, spawnFake, spawnRlq, waitFor, type Proc } from "../helpers/processes.ts";

/**
 * Postgres and Redis outages under `rlq up` (docs/deploy.md, "Outages"), on a Postgres and a
 * Redis of this test's own (ports the kernel picks): never the shared services.
 * - A Postgres restart (immediate: SIGQUIT, as `pg_ctl restart -m immediate`) and a Redis
 *   SIGKILL with an AOF restart, mid-run: rlq up rides them out (the controller is started
 *   again and takes the lease anew) and the run completes with its invariants.
 * - Postgres down for longer than RLQ_OUTAGE_TIMEOUT_S: rlq up exits with code 75 and says
 *   why; a new rlq up (what a supervisor does) finishes the run.
 */
const skip = ownServicesAvailable();
if (skip) console.warn(`db-outage.test.ts SKIPPED: ${skip}`);

const RBS = 4;
describe.skipIf(skip !== null)("Postgres and Redis outages under rlq up", () => {
  let dir: string;
  let pgs: OwnPostgres;
  let redis: OwnRedis;
  let db: Db;
  let engine: Proc & { url: string };
  let trainer: Proc & { url: string };
  let env: Record<string, string>;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "rlq-t16-outage-"));
    chmodSync(dir, 0o755); // the postgres user must reach its data directory
    // Ports the kernel picks: fixed ones collide with other tests' ephemeral ports.
    pgs = ownPostgres({ dir: join(dir, "pg"), host: "127.0.0.1", port: await freePort() });
    redis = ownRedis({ dir: join(dir, "redis"), host: "127.0.0.1", port: await freePort() });
    await pgs.start();
    await redis.start();
    await pgs.createDatabase("rlq");
    db = createDb(pgs.url("rlq"), { max: 2 });
    await migrateDb(db);
    engine = await spawnFake("test/fakes/fake-sglang.ts", ["--token-delay-ms", "2"]);
    trainer = await spawnFake("test/fakes/fake-trainer.ts", ["--step-ms", "300"]);
    // rlq's processes log in as rlq_runtime (docs/security.md); the test migrated as the superuser.
    env = {
      DATABASE_URL: asRole(pgs.url("rlq"), "rlq_runtime"),
      REDIS_URL: redis.url,
      RLQ_HOME: join(dir, "home"),
      RLQ_QUEUE_PREFIX: "t16outage",
      RLQ_LOG_LEVEL: "warn",
    };
  });
  afterAll(async () => {
    engine?.kill("SIGTERM");
    trainer?.kill("SIGTERM");
    await db?.close().catch(() => undefined); // the test is over: a pool whose server went down may fail to close, nothing is left to read
    await pgs?.stop("SIGINT");
    await redis?.stop("SIGTERM");
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const config = (numRollout: number, engineUrl: string) => ({
    prompt_data: join(repoRoot, "test/fixtures/prompts.jsonl"),
    tokenizer: "bytes", // the fake SGLang speaks rlq's byte ids
    rollout_batch_size: RBS,
    n_samples_per_prompt: 4,
    over_sampling_batch_size: 6,
    num_rollout: numRollout,
    rollout_max_response_len: 24,
    custom_rm_path: join(repoRoot, "test/fixtures/reward-parity.mjs"),
    dynamic_sampling_filter_path: "check_reward_nonzero_std",
    engine: { kind: "sglang", urls: [engineUrl] },
    trainer: { kind: "remote", url: trainer.url },
    train_stall_timeout_s: 30,
  });
  const committed = async (runId: string) => {
    for (;;) {
      try {
        return (await db.pool.query("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1", [runId])).rows[0].n as number;
      } catch {
        await new Promise((r) => setTimeout(r, 200)); // our own reads ride out the restart too
      }
    }
  };
  async function invariants(runId: string, numRollout: number, up: Proc) {
    await checkRunInvariants(db, runId, { numRollout, datasetSize: 64, shuffle: false, seed: 42, rbs: RBS });
    const replay = spawnRlq(["replay", runId, "--check"], env);
    expect(await replay.exited, `${replay.output()}\n--- rlq up ---\n${up.output()}`).toBe(0);
  }

  it("rides out a Postgres restart and a Redis kill -9 + AOF restart mid-run", async () => {
    const { runId } = await startRun(db, { config: config(6, engine.url) });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], { ...env, RLQ_OUTAGE_TIMEOUT_S: "120" });
    try {
      await waitFor("step 1 committed", async () => (await committed(runId)) >= 1, 120_000, 100);
      await pgs.stop("SIGQUIT"); // pg_ctl restart -m immediate
      await new Promise((r) => setTimeout(r, 2000)); // a real outage, not a blip: the length is the fault
      await pgs.start();
      await waitFor("step 3 committed", async () => (await committed(runId)) >= 3, 120_000, 100);
      await redis.stop("SIGKILL");
      await new Promise((r) => setTimeout(r, 2000));
      await redis.start();
      const code = await Promise.race([up.exited, new Promise<string>((r) => setTimeout(() => r("still running after 150 s"), 150_000))]);
      expect(code, up.output()).toBe(0);
      expect(up.output()).toMatch(/starting it again/); // the controller did fail and come back
      await invariants(runId, 6, up);
    } finally {
      up.kill("SIGKILL");
    }
  });

  it("exits with code 75 and the reason when Postgres stays down past RLQ_OUTAGE_TIMEOUT_S; a new rlq up finishes", async () => {
    const engine2 = await spawnFake("test/fakes/fake-sglang.ts", ["--token-delay-ms", "2"]);
    try {
      const { runId } = await startRun(db, { config: config(3, engine2.url) });
      const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], { ...env, RLQ_OUTAGE_TIMEOUT_S: "4" });
      try {
        await waitFor("step 1 committed", async () => (await committed(runId)) >= 1, 120_000, 100);
        await pgs.stop("SIGQUIT");
        const t0 = Date.now();
        const code = await Promise.race([up.exited, new Promise<string>((r) => setTimeout(() => r("still running after 120 s"), 120_000))]);
        expect(code, `exit ${code}\n${up.output()}`).toBe(75);
        expect(Date.now() - t0).toBeGreaterThanOrEqual(4000);
        expect(up.output()).toMatch(/rlq up exits with code 75: .* has failed for \d+ s \(RLQ_OUTAGE_TIMEOUT_S=4\)/);
      } finally {
        up.kill("SIGKILL");
      }
      await pgs.start();
      const again = spawnRlq(["up", "--run", runId, "--exit-when-done"], env);
      try {
        expect(await again.exited, again.output()).toBe(0);
        await invariants(runId, 3, again);
      } finally {
        again.kill("SIGKILL");
      }
    } finally {
      engine2.kill("SIGTERM");
    }
  });
});

import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { requestRunChange, startRun } from "../../src/api.ts";
import { rlqNodeFlags } from "../../src/runtime/node-flags.ts";
import { createDb, type Db } from "../../src/store/db.ts";
import { migrateDb } from "../../src/store/migrate.ts";
import { checkRunInvariants } from "../helpers/invariants.ts";
import { ownPostgres, ownRedis, ownServicesAvailable, type OwnPostgres, type OwnRedis } from "../helpers/own-services.ts";
import { repoRoot, waitFor } from "../helpers/processes.ts";
import { rlqPython } from "../helpers/python.ts";
import { createCluster, netnsAvailable, type Cluster, type HostProc } from "./netns.ts";

/**
 * rlq across machines (docs/deploy.md): every role on its own host, hosts being network
 * namespaces joined by a bridge (./netns.ts), each rlq host with its own RLQ_HOME.
 *
 *   db        Postgres (own data dir) and Redis with AOF
 *   ctl, ctl2 `rlq up --workers ""`: the run's controller, and a standby on another host
 *   r1, r2    `rlq worker rollout train`: embedded ONNX engines, train jobs
 *   reward    `rlq worker reward`
 *   trainer   workers/trainer-torch/server.py (CPU) where torch imports, else the protocol fake;
 *             bearer token; `checkpoints: fetch`; in a mount namespace where the cluster's
 *             directories (every rlq host's RLQ_HOME) and examples/ are hidden under a tmpfs:
 *             it sees no rlq file, only what it fetches with its tokens.
 *
 * The demo config (examples/demo.yaml; fewer, smaller steps) runs to completion through the
 * faults below, one after another, each followed by a recovery (a train step committed after
 * it) and the invariants so far; at the end every invariant (test/helpers/invariants.ts: 0
 * samples lost, 0 trained twice, 0 prompts skipped) and `rlq replay --check`. Times go to
 * bench/results/cluster-faults.json. The test observes Postgres over its Unix socket, so no
 * traffic crosses into the machine's own network namespace.
 *
 * Skipped, saying why, without root, network namespaces, or the Postgres/Redis binaries.
 */
// The demo's embedded engines load the trainer's checkpoints, so the trainer must be the real
// one (the protocol fake writes stand-in weights; a fake-SGLang variant is not written yet).
const skip = netnsAvailable() ?? ownServicesAvailable();
if (skip) console.warn(`test/cluster/cluster.test.ts SKIPPED: ${skip}`);

const PARTITION_S = Number(process.env.RLQ_CLUSTER_PARTITION_S ?? 30);
/** Long enough for every fault; amended down to "two more steps" after the last one. */
const NUM_ROLLOUT = 500;
const RBS = 8;
const TOKEN = `cluster-${Math.random().toString(36).slice(2)}`;

interface FaultResult {
  fault: string;
  /** Seconds from the end of the fault (heal / restart) to the next committed train step. */
  recovery_s: number;
  steps_before: number;
  steps_after: number;
  notes?: string;
}

describe.skipIf(skip !== null)("rlq on seven hosts (network namespaces) through real faults", () => {
  let cluster: Cluster;
  let dir: string;
  let trainerDir: string;
  let pgs: OwnPostgres;
  let redis: OwnRedis;
  let db: Db;
  let runId: string;
  const python = rlqPython();
  const procs = new Map<string, HostProc>();
  /** Processes the test killed (a powered-off host). */
  const expectedDead = new Set<HostProc>();
  const results: FaultResult[] = [];
  let env: Record<string, string>;
  let noNetem: string | null = null;

  const dbIp = () => cluster.host("db").ip;
  const trainerUrl = () => `http://${cluster.host("trainer").ip}:8700`;
  const rlq = (host: string, args: string[]) =>
    cluster.spawn(
      host,
      // As users start rlq on a host: bin/rlq.js (dist/bundle/ while it matches the sources).
      [process.execPath, ...rlqNodeFlags, "bin/rlq.js", ...args],
      { ...env, RLQ_HOME: join(dir, host, "home") },
      repoRoot,
    );

  function startRole(host: string): HostProc {
    let p: HostProc;
    if (host === "ctl" || host === "ctl2") p = rlq(host, ["up", "--run", runId, "--workers", ""]);
    else if (host === "r1" || host === "r2") p = rlq(host, ["worker", "rollout", "train"]);
    else if (host === "reward") p = rlq(host, ["worker", "reward"]);
    else if (host === "trainer") {
      // A private mount namespace: the cluster's directories and examples/ are not there.
      const hide = `mount -t tmpfs none ${dir} && mount -t tmpfs none ${join(repoRoot, "examples")}`;
      // Without sch_netem the trainer sits behind test/cluster/slow-link.ts (port 8700 → 8701).
      const port = noNetem ? 8701 : 8700;
      const server = `exec ${python} workers/trainer-torch/server.py --host ${cluster.host("trainer").ip} --port ${port} --device cpu --threads 1 --checkpoint-dir ${trainerDir}`;
      if (noNetem && !procs.has("trainer-link")) {
        const ip = cluster.host("trainer").ip;
        procs.set(
          "trainer-link",
          cluster.spawn(host, [process.execPath, "--import", "tsx", "test/cluster/slow-link.ts", "--listen", `${ip}:8700`, "--to", `${ip}:8701`], {}, repoRoot),
        );
      }
      p = cluster.spawn(host, ["unshare", "--mount", "--propagation", "private", "sh", "-c", `${hide} && ${server}`], { ...env }, repoRoot);
    } else throw new Error(`no role for ${host}`);
    procs.set(host, p);
    return p;
  }

  /** Committed train steps; our own reads ride out the Postgres restart too. */
  const committed = async (): Promise<number> => {
    for (let i = 0; ; i++) {
      try {
        return (await db.pool.query("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1", [runId])).rows[0].n as number;
      } catch (e) {
        if (i > 300) throw e;
        await new Promise((r) => setTimeout(r, 200));
      }
    }
  };
  const logs = () => [...procs].map(([h, p]) => `--- ${h} ---\n${p.output().slice(-6000)}`).join("\n");

  /** The facts so far: no step twice, no group kept twice, draws gapless. */
  async function invariantsSoFar(): Promise<void> {
    const q = async (text: string) => (await db.pool.query(text, [runId])).rows;
    expect(await q("SELECT step FROM train_steps WHERE run_id = $1 GROUP BY step HAVING count(*) > 1")).toEqual([]);
    expect(
      await q(
        "SELECT group_id FROM decisions WHERE run_id = $1 AND kind = 'group.outcome' AND payload->>'outcome' = 'kept' GROUP BY group_id HAVING count(*) > 1",
      ),
    ).toEqual([]);
    const d = (await q("SELECT count(*)::int AS n, coalesce(max(draw_ordinal), -1)::int AS m FROM drawn_prompts WHERE run_id = $1"))[0];
    expect(d.m).toBe(d.n - 1);
    const steps = (await q("SELECT step FROM train_steps WHERE run_id = $1 ORDER BY step")).map((r) => r.step);
    expect(steps).toEqual([...steps.keys()]);
  }

  /** Run a fault; then wait for the next committed step and check the invariants so far. */
  async function fault(name: string, act: () => Promise<void>, notes?: string): Promise<void> {
    const before = await committed();
    if (before >= NUM_ROLLOUT) throw new Error(`the run finished before fault ${name}: raise NUM_ROLLOUT`);
    await act();
    const healedAt = Date.now();
    await until(`a train step after fault ${name}`, async () => (await committed()) > before);
    const after = await committed();
    results.push({ fault: name, recovery_s: (Date.now() - healedAt) / 1000, steps_before: before, steps_after: after, ...(notes ? { notes } : {}) });
    await invariantsSoFar();
  }

  /** Wait for a fact; fail at once, with every host's output, if a role's process died on its own. */
  const until = async (what: string, fn: () => Promise<boolean>) =>
    waitFor(
      what,
      async () => {
        for (const [h, p] of procs)
          if (p.child.exitCode !== null && !expectedDead.has(p)) throw new Error(`${h} exited (${p.child.exitCode}) while waiting for ${what}\n${logs()}`);
        return (await fn()) ? true : null;
      },
      600_000,
      250,
    ).catch((e: unknown) => {
      throw new Error(`${(e as Error).message}\n${logs()}`);
    });
  const stepsAtLeast = (n: number) => until(`${n} committed steps`, async () => (await committed()) >= n);

  beforeAll(async () => {
    cluster = createCluster(["db", "ctl", "ctl2", "r1", "r2", "reward", "trainer"]);
    noNetem = cluster.netemUnavailable();
    dir = mkdtempSync(join(tmpdir(), `rlq16-cluster-`));
    chmodSync(dir, 0o755);
    trainerDir = mkdtempSync(join(tmpdir(), `rlq16-trainer-`));
    for (const h of ["ctl", "ctl2", "r1", "r2", "reward"]) mkdirSync(join(dir, h, "home"), { recursive: true });
    // Keepalives: a partitioned controller's lease connection is dropped in seconds (not hours),
    // which releases its advisory lock for the standby (docs/deploy.md, "Controllers").
    pgs = ownPostgres({
      dir: join(dir, "db", "pg"),
      host: cluster.host("db").ip,
      port: 5432,
      netns: cluster.host("db").ns,
      settings: {
        tcp_keepalives_idle: "3",
        tcp_keepalives_interval: "1",
        tcp_keepalives_count: "3",
        tcp_user_timeout: "5000",
        client_connection_check_interval: "1000",
      },
    });
    redis = ownRedis({ dir: join(dir, "db", "redis"), host: cluster.host("db").ip, port: 6379, netns: cluster.host("db").ns });
    await pgs.start();
    await redis.start();
    await pgs.createDatabase("rlq");
    db = createDb(pgs.socketUrl("rlq"), { max: 2 });
    await migrateDb(db);
    env = {
      // rlq's processes log in as rlq_runtime (docs/security.md); the test migrated as the superuser.
      DATABASE_URL: `postgres://rlq_runtime@${dbIp()}:5432/rlq`,
      REDIS_URL: `redis://${dbIp()}:6379`,
      RLQ_QUEUE_PREFIX: "cluster",
      RLQ_LOG_LEVEL: "warn",
      RLQ_OUTAGE_TIMEOUT_S: "300",
      RLQ_TRAINER_TOKEN: TOKEN,
    };
  }, 180_000);

  afterAll(async () => {
    for (const p of procs.values()) p.kill("SIGKILL");
    await db?.close().catch(() => undefined);
    await pgs?.stop("SIGQUIT").catch(() => undefined);
    await redis?.stop("SIGKILL").catch(() => undefined);
    cluster?.destroy();
    if (dir) rmSync(dir, { recursive: true, force: true });
    if (trainerDir) rmSync(trainerDir, { recursive: true, force: true });
  });

  it("runs the demo config to completion through every fault, with the invariants after each", async () => {
    const t0 = Date.now();
    ({ runId } = await startRun(db, {
      config: join(repoRoot, "examples/demo.yaml"),
      set: [
        `num_rollout=${NUM_ROLLOUT}`,
        `rollout_batch_size=${RBS}`,
        `trainer={kind: remote, url: '${trainerUrl()}', api_key: {env: RLQ_TRAINER_TOKEN}, checkpoints: fetch}`,
        "train_stall_timeout_s=120",
        "trainer_unreachable_timeout_s=600",
        "train_max_attempts=20",
      ],
    }));
    for (const h of ["trainer", "ctl", "r1", "r2", "reward"]) startRole(h);
    // The first controller leads; the second waits as standby.
    const leader = procs.get("ctl") as HostProc;
    await until("ctl to lead", async () => {
      const r = await db.pool.query("SELECT holder FROM run_leases WHERE run_id = $1", [runId]);
      return String(r.rows[0]?.holder ?? "").endsWith(`:${leader.child.pid}`);
    });
    startRole("ctl2");
    await stepsAtLeast(1);

    await fault("rollout host r1 powered off (every process SIGKILLed), then back", async () => {
      expectedDead.add(procs.get("r1") as HostProc);
      const killed = cluster.powerOff("r1");
      expect(killed.length).toBeGreaterThan(0);
      await new Promise((r) => setTimeout(r, 3000));
      startRole("r1");
    });
    await fault(`rollout host r2 partitioned ${PARTITION_S} s`, async () => {
      cluster.partition("r2", true);
      await new Promise((r) => setTimeout(r, PARTITION_S * 1000));
      cluster.partition("r2", false);
    });
    await fault(`trainer host partitioned ${PARTITION_S} s (mid-step)`, async () => {
      const n = await committed();
      await until(
        "a train step to reach the trainer",
        async () => (await db.pool.query("SELECT 1 FROM decisions WHERE run_id = $1 AND kind = 'train.dispatched' AND step = $2", [runId, n])).rowCount === 1,
      );
      cluster.partition("trainer", true);
      await new Promise((r) => setTimeout(r, PARTITION_S * 1000));
      cluster.partition("trainer", false);
    });
    if (noNetem) {
      console.warn(`cluster.test.ts: tc netem unavailable (${noNetem}): the latency/loss fault uses the userspace stand-in test/cluster/slow-link.ts`);
      const link = procs.get("trainer-link") as HostProc;
      await fault(
        "200 ms per chunk and a 1 s stall on 5% of chunks, worker-to-trainer connections, for two steps (test/cluster/slow-link.ts)",
        async () => {
          link.kill("SIGUSR1");
          const n = await committed();
          await stepsAtLeast(n + 2);
          link.kill("SIGUSR2");
        },
        `tc netem is unavailable here (${noNetem}); userspace stand-in, the trainer's batch fetches are not slowed`,
      );
    } else {
      await fault("200 ms latency and 5% loss on the trainer link for two steps", async () => {
        cluster.netem("trainer", "delay 200ms loss 5%");
        const n = await committed();
        await stepsAtLeast(n + 2);
        cluster.netem("trainer", null);
      });
    }
    await fault("Postgres restart (immediate) mid-run", async () => {
      await pgs.stop("SIGQUIT");
      await new Promise((r) => setTimeout(r, 3000));
      await pgs.start();
    });
    await fault("Redis kill -9, restart from its AOF, mid-run", async () => {
      await redis.stop("SIGKILL");
      await new Promise((r) => setTimeout(r, 3000));
      await redis.start();
    });
    await fault("Redis FLUSHALL", async () => {
      cluster.exec("db", ["redis-cli", "-h", dbIp(), "-p", "6379", "FLUSHALL"]);
    });
    // Whichever controller leads now (the Postgres restart may have handed the lease over already).
    const lease = (await db.pool.query("SELECT holder, epoch FROM run_leases WHERE run_id = $1", [runId])).rows[0];
    const leaderHost = String(lease.holder).endsWith(`:${(procs.get("ctl") as HostProc).child.pid}`) ? "ctl" : "ctl2";
    const standbyHost = leaderHost === "ctl" ? "ctl2" : "ctl";
    expect(String(lease.holder)).toMatch(new RegExp(`:${(procs.get(leaderHost) as HostProc).child.pid}$`));
    const standby = procs.get(standbyHost) as HostProc;
    let takeoverS = -1;
    await fault(
      `the leader's host (${leaderHost}) partitioned ${PARTITION_S} s: the standby (${standbyHost}) takes over, the old leader is fenced`,
      async () => {
        const epochBefore = lease.epoch as number;
        const cut = Date.now();
        cluster.partition(leaderHost, true);
        await until(`${standbyHost} to take the lease`, async () => {
          const r = await db.pool.query("SELECT holder, epoch FROM run_leases WHERE run_id = $1", [runId]);
          return String(r.rows[0]?.holder ?? "").endsWith(`:${standby.child.pid}`) && r.rows[0].epoch > epochBefore;
        });
        takeoverS = (Date.now() - cut) / 1000;
        await new Promise((r) => setTimeout(r, Math.max(0, PARTITION_S * 1000 - (Date.now() - cut))));
        cluster.partition(leaderHost, false);
      },
    );
    (results.at(-1) as FaultResult).notes =
      `the standby took the lease ${takeoverS} s after the cut (Postgres tcp_keepalives 3 s + 3 x 1 s, tcp_user_timeout 5 s)`;

    // Two more steps, then the end.
    const finalSteps = (await committed()) + 2;
    await requestRunChange(db, runId, "amend", { changes: { num_rollout: finalSteps } });

    // To the end: the run completes (the controller now on the standby's host).
    await until(
      "the run to complete",
      async () => (await db.pool.query("SELECT status FROM runs WHERE id = $1", [runId])).rows[0]?.status === "completed",
    ).catch((e: unknown) => {
      throw new Error(`${(e as Error).message}\n${logs()}`);
    });
    const runTimeS = (Date.now() - t0) / 1000;
    const numRollout = await committed();
    expect(numRollout).toBeGreaterThanOrEqual(finalSteps);

    // Fencing: after the takeover's epoch began, no decision of an older epoch was written.
    const fenced = await db.pool.query(
      "SELECT count(*)::int AS n FROM decisions d WHERE run_id = $1 AND lease_epoch < (SELECT max(lease_epoch) FROM decisions WHERE run_id = $1) AND seq > (SELECT min(seq) FROM decisions WHERE run_id = $1 AND lease_epoch = (SELECT max(lease_epoch) FROM decisions WHERE run_id = $1))",
      [runId],
    );
    expect(fenced.rows[0].n).toBe(0);

    await checkRunInvariants(db, runId, { numRollout, datasetSize: await datasetSize(), shuffle: true, seed: 42, rbs: RBS });
    // On the standby, which led the run to its end: the old leader's host has just come back from
    // its partition and may not reach the database host yet (EHOSTUNREACH).
    const replay = rlq(standbyHost, ["replay", runId, "--check"]);
    expect(await replay.exited, replay.output()).toBe(0);
    expect(replay.output()).toMatch(/0 difference\(s\)/);

    // No shared filesystem: the trainer wrote its checkpoints on its own disk; every rlq host that
    // loaded a version holds a copy it downloaded and verified.
    const rows = (await db.pool.query("SELECT step, checkpoint_sha256 FROM train_steps WHERE run_id = $1 ORDER BY step", [runId])).rows;
    expect(rows).toHaveLength(numRollout);
    expect(readdirSync(join(trainerDir, runId)).length).toBeGreaterThanOrEqual(numRollout);
    for (const h of ["r1", "r2"]) expect(existsSync(join(dir, h, "home", "checkpoints", runId))).toBe(true);

    const out = {
      test: "test/cluster/cluster.test.ts",
      trainer: "workers/trainer-torch/server.py (cpu, 1 thread)",
      config: `examples/demo.yaml with rollout_batch_size=${RBS}; num_rollout amended to ${numRollout} after the last fault`,
      hosts: Object.fromEntries(Object.values(cluster.hosts).map((h) => [h.name, h.ip.replace(/\.\d+\.(\d+)$/, ".N.$1")])),
      partition_s: PARTITION_S,
      run_time_s: runTimeS,
      faults: results,
      invariants:
        "0 samples lost, 0 trained twice, 0 prompts skipped (test/helpers/invariants.ts); replay --check clean; no decision of an old epoch after the takeover",
      measured_at: new Date().toISOString(),
    };
    mkdirSync(join(repoRoot, "bench/results"), { recursive: true });
    writeFileSync(join(repoRoot, "bench/results/cluster-faults.json"), `${JSON.stringify(out, null, 2)}\n`);
  }, 3_600_000);
});

async function datasetSize(): Promise<number> {
  const { readFileSync } = await import("node:fs");
  return readFileSync(join(repoRoot, "examples/demo/train.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l.trim()).length;
}

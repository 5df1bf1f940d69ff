import { chmodSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { startRun } from "../../src/api.ts";
import { createDb, type Db } from "../../src/store/db.ts";
import { migrateDb } from "../../src/store/migrate.ts";
import { checkRunInvariants } from "./invariants.ts";
import { ownPostgres, ownRedis, type OwnPostgres, type OwnRedis } from "./own-services.ts";
import { repoRoot, spawnFake, spawnRlq, type Proc } from "./processes.ts";
import { asRole } from "./services.ts";
import { freePort } from "./tls-services.ts";

/**
 * Random outage schedules against a live run (issue 40): Postgres and Redis of the caller's own
 * (test/helpers/own-services.ts) are stopped for seeded random lengths at seeded random moments
 * aimed at a phase of the run, under `rlq up --exit-when-done`, and every run is then checked for
 * exactness (test/helpers/invariants.ts), for a pause, and with `rlq replay --check`.
 * scripts/fault-outages.ts runs the long schedule and writes bench/results/fault-outages.json;
 * test/integration/fault-outages-short.test.ts runs a short one in CI.
 *
 * A phase is caught in flight by polling what the run shows while the services are up:
 * - train: the fake trainer reports a step running (GET /v1/health `busy`), the train job waits on it;
 * - weight-sync: a `step.trained` or `weights.syncing` with no `weights.synced` after it (the fake
 *   engine's --load-delay-ms holds each load open);
 * - seal: the open step holds rbs - 1 kept groups, so the next kept group's commit seals it;
 * - eval: an `eval.dispatched` with no `eval.recorded` after it;
 * - controller-commit: the decision log just grew (the controller is between two commits of a tick).
 */
export type Service = "postgres" | "redis";
export type Phase = "train" | "weight-sync" | "seal" | "eval" | "controller-commit";
export const PHASES: readonly Phase[] = ["train", "weight-sync", "seal", "eval", "controller-commit"];
export type QueueKind = "redis" | "postgres";
export type Mode = "sync" | "async";

/** mulberry32: a seeded generator, so a printed seed replays the schedule. */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function logUniform(rand: () => number, lo: number, hi: number): number {
  return Math.exp(Math.log(lo) + rand() * (Math.log(hi) - Math.log(lo)));
}

export interface PlannedOutage {
  service: Service;
  phase: Phase;
  lengthMs: number;
  /** How the service stops: Postgres SIGINT (fast shutdown) or SIGQUIT (immediate); Redis SIGKILL or SIGTERM. */
  signal: NodeJS.Signals;
  /** After the previous outage ends (or the run starts), how long before watching for the phase. */
  gapMs: number;
  /** After the phase is seen, how long before the stop (a random moment inside it). */
  delayMs: number;
}

export interface LengthDistribution {
  /** Most outages: log-uniform between these. */
  minMs: number;
  maxMs: number;
  /** The share drawn instead from the long range, log-uniform. */
  longShare: number;
  longMinMs: number;
  longMaxMs: number;
}

/** `count` outages, phases drawn without repeats until all five were used, services from `services`. */
export function planOutages(rand: () => number, count: number, services: readonly Service[], lengths: LengthDistribution): PlannedOutage[] {
  const out: PlannedOutage[] = [];
  let bag: Phase[] = [];
  for (let i = 0; i < count; i++) {
    if (bag.length === 0) bag = [...PHASES];
    const phase = bag.splice(Math.floor(rand() * bag.length), 1)[0] as Phase;
    const service = services[Math.floor(rand() * services.length)] as Service;
    const isLong = rand() < lengths.longShare;
    const lengthMs = Math.round(isLong ? logUniform(rand, lengths.longMinMs, lengths.longMaxMs) : logUniform(rand, lengths.minMs, lengths.maxMs));
    const signal: NodeJS.Signals = service === "postgres" ? (rand() < 0.5 ? "SIGINT" : "SIGQUIT") : rand() < 0.5 ? "SIGKILL" : "SIGTERM";
    out.push({ service, phase, lengthMs, signal, gapMs: Math.round(rand() * 3000), delayMs: Math.round(rand() * (phase === "train" ? 600 : 80)) });
  }
  return out;
}

export interface FaultWorld {
  pgs: OwnPostgres;
  redis: OwnRedis;
  /** The superuser's pool on the own Postgres: phase polling and the exactness checks. */
  db: Db;
  trainer: Proc & { url: string };
  trainerStepMs: number;
  loadDelayMs: number;
  dir: string;
  close(): Promise<void>;
}

/** An own Postgres (migrated database `rlq`), an own Redis and a fake trainer; each run gets a fake SGLang of its own. */
export async function createFaultWorld(dir: string, opts: { trainerStepMs: number; loadDelayMs: number }): Promise<FaultWorld> {
  mkdirSync(dir, { recursive: true });
  chmodSync(dir, 0o755); // the postgres user must reach its data directory
  const pgs = ownPostgres({ dir: join(dir, "pg"), host: "127.0.0.1", port: await freePort() });
  const redis = ownRedis({ dir: join(dir, "redis"), host: "127.0.0.1", port: await freePort() });
  await pgs.start();
  await redis.start();
  await pgs.createDatabase("rlq");
  const db = createDb(pgs.url("rlq"), { max: 2 });
  await migrateDb(db);
  const trainer = await spawnFake("test/fakes/fake-trainer.ts", ["--step-ms", String(opts.trainerStepMs)]);
  return {
    pgs,
    redis,
    db,
    trainer,
    trainerStepMs: opts.trainerStepMs,
    loadDelayMs: opts.loadDelayMs,
    dir,
    async close() {
      trainer.kill("SIGTERM");
      await db.close().catch((e: unknown) => console.warn(`fault world: closing the admin pool: ${(e as Error).message}`));
      await pgs.stop("SIGINT");
      await redis.stop("SIGTERM");
    },
  };
}

export interface RunSpec {
  name: string;
  mode: Mode;
  queue: QueueKind;
  numRollout: number;
  outageTimeoutS: number;
}

export const RBS = 4;

/**
 * A fake SGLang for one run: an engine keeps the weight version it last loaded, and a run that
 * starts from version 0 refuses engines at another (it pauses, naming them).
 */
function spawnEngine(w: FaultWorld): Promise<Proc & { url: string }> {
  return spawnFake("test/fakes/fake-sglang.ts", ["--token-delay-ms", "2", "--load-delay-ms", String(w.loadDelayMs)]);
}

function runConfig(w: FaultWorld, spec: RunSpec, engineUrl: string): Record<string, unknown> {
  return {
    prompt_data: join(repoRoot, "test/fixtures/prompts.jsonl"),
    tokenizer: "bytes", // the fake SGLang speaks rlq's byte ids
    rollout_batch_size: RBS,
    n_samples_per_prompt: 4,
    over_sampling_batch_size: 6,
    num_rollout: spec.numRollout,
    rollout_max_response_len: 24,
    custom_rm_path: join(repoRoot, "test/fixtures/reward-parity.mjs"),
    dynamic_sampling_filter_path: "check_reward_nonzero_std",
    engine: { kind: "sglang", urls: [engineUrl] },
    trainer: { kind: "remote", url: w.trainer.url },
    train_stall_timeout_s: 30,
    eval_interval: 2,
    eval_prompt_data: { small: join(repoRoot, "test/fixtures/eval.jsonl") },
    n_samples_per_eval_prompt: 2,
    eval_max_response_len: 12,
    ...(spec.mode === "async" ? { train_async: true } : {}),
  };
}

/** rlq's environment for a run: the own Postgres as rlq_runtime, and the own Redis or (no REDIS_URL) BullMQ's Postgres backend. */
export function rlqEnv(w: FaultWorld, spec: RunSpec): Record<string, string> {
  return {
    DATABASE_URL: asRole(w.pgs.url("rlq"), "rlq_runtime"),
    ...(spec.queue === "redis" ? { REDIS_URL: w.redis.url } : {}),
    RLQ_HOME: join(w.dir, "home"),
    RLQ_QUEUE_PREFIX: `fault_${spec.name.replace(/[^a-z0-9]/gi, "")}`,
    RLQ_LOG_LEVEL: "warn",
    RLQ_OUTAGE_TIMEOUT_S: String(spec.outageTimeoutS),
  };
}

interface Progress {
  maxSeq: number;
  steps: number;
  status: string;
  keptOpen: number;
  isSyncing: boolean;
  isEvaluating: boolean;
}

async function readProgress(db: Db, runId: string): Promise<Progress> {
  const r = await db.pool.query(
    `WITH d AS (SELECT seq, kind, payload FROM decisions WHERE run_id = $1),
       last AS (SELECT kind, max(seq) AS seq FROM d GROUP BY kind)
     SELECT (SELECT max(seq) FROM d) AS max_seq,
       (SELECT count(*) FROM train_steps WHERE run_id = $1)::int AS steps,
       (SELECT status FROM runs WHERE id = $1) AS status,
       (SELECT count(*) FROM d WHERE kind = 'group.outcome' AND payload->>'outcome' = 'kept'
          AND seq > coalesce((SELECT seq FROM last WHERE kind = 'step.sealed'), 0))::int AS kept_open,
       coalesce((SELECT max(seq) FROM last WHERE kind IN ('step.trained', 'weights.syncing')), 0)
         > coalesce((SELECT seq FROM last WHERE kind = 'weights.synced'), 0) AS is_syncing,
       coalesce((SELECT seq FROM last WHERE kind = 'eval.dispatched'), 0)
         > coalesce((SELECT seq FROM last WHERE kind = 'eval.recorded'), 0) AS is_evaluating`,
    [runId],
  );
  const row = r.rows[0];
  return {
    maxSeq: Number(row.max_seq ?? 0),
    steps: row.steps,
    status: row.status,
    keptOpen: row.kept_open,
    isSyncing: row.is_syncing,
    isEvaluating: row.is_evaluating,
  };
}

async function isTrainerBusy(w: FaultWorld): Promise<boolean> {
  const res = await fetch(`${w.trainer.url}/v1/health`);
  return ((await res.json()) as { busy: boolean }).busy;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

const TERMINAL_STATUSES = new Set(["completed", "cancelled", "failed", "paused"]);

/** Poll until `phase` is in flight; null when the run ended (or `up` exited) first. */
async function waitForPhase(w: FaultWorld, runId: string, spec: RunSpec, phase: Phase, exitCode: () => number | string | null): Promise<string | null> {
  let lastSeq = -1;
  for (;;) {
    if (exitCode() !== null) return null;
    const p = await readProgress(w.db, runId);
    if (p.status === undefined) throw new Error(`run ${runId}: no row in runs`);
    // Before its controller starts, a run is not yet "running": its phases are still ahead.
    if (TERMINAL_STATUSES.has(p.status) || p.steps >= spec.numRollout) return null;
    if (p.status !== "running") {
      await sleep(100);
      continue;
    }
    // The last step's train and sync end the run: an outage aimed there would land after it.
    const isLastStep = p.steps >= spec.numRollout - 1;
    if (phase === "train" && !isLastStep && (await isTrainerBusy(w))) return `trainer busy at ${p.steps} committed step(s)`;
    if (phase === "weight-sync" && !isLastStep && p.isSyncing) return `sync open after ${p.steps} committed step(s)`;
    if (phase === "seal" && p.keptOpen >= RBS - 1) return `${p.keptOpen} kept group(s) in the open step`;
    if (phase === "eval" && p.isEvaluating) return `eval open after ${p.steps} committed step(s)`;
    if (phase === "controller-commit" && lastSeq >= 0 && p.maxSeq > lastSeq) return `decision log grew ${lastSeq} -> ${p.maxSeq}`;
    lastSeq = p.maxSeq;
    await sleep(25);
  }
}

export interface OutageRecord extends PlannedOutage {
  run: string;
  /** What was seen in flight when the stop began (null: the phase never came before the run ended). */
  phaseSeen: string | null;
  startedAt: string | null;
  /** Committed train steps when the service stopped. */
  stepsAtStart: number | null;
  outcome:
    | "ridden out"
    | "phase not reached before the run ended"
    | "rlq up exited during the outage"
    | "no progress after the outage"
    | "past the timeout: rlq up exited 75"
    | "past the timeout: rlq up did not exit 75";
  /** Seconds from the restart to the run's first decision after it (null: it ended or did not move). */
  progressAfterS: number | null;
  /** "waiting out a Postgres or Redis outage" lines rlq up logged during this outage. */
  jobWaitsLogged: number;
  controllerRestartsLogged: number;
}

export interface RunRecord {
  run: string;
  runId: string;
  mode: Mode;
  queue: QueueKind;
  numRollout: number;
  outageTimeoutS: number;
  /** Every `rlq up` this run took, in order, with its exit code. */
  upExits: (number | string)[];
  stepsCommitted: number;
  paused: string[];
  exact: boolean;
  exactnessError: string | null;
  replayExit: number | string;
  replayOutput: string;
  durationS: number;
  outages: OutageRecord[];
  upOutputTail: string;
}

function stopService(w: FaultWorld, o: PlannedOutage): Promise<void> {
  return o.service === "postgres" ? w.pgs.stop(o.signal) : w.redis.stop(o.signal);
}

function startService(w: FaultWorld, service: Service): Promise<void> {
  return service === "postgres" ? w.pgs.start() : w.redis.start();
}

const count = (text: string, re: RegExp) => (text.match(re) ?? []).length;

/** One planned outage against the run under `up`: wait for its phase, stop, hold, start, watch the run move on. */
async function applyOutage(
  w: FaultWorld,
  spec: RunSpec,
  runId: string,
  up: Proc,
  exitCode: () => number | string | null,
  o: PlannedOutage,
  log: (line: string) => void,
): Promise<OutageRecord> {
  const base = {
    ...o,
    run: spec.name,
    phaseSeen: null,
    startedAt: null,
    stepsAtStart: null,
    progressAfterS: null,
    jobWaitsLogged: 0,
    controllerRestartsLogged: 0,
  };
  await sleep(o.gapMs);
  const seen = await waitForPhase(w, runId, spec, o.phase, exitCode);
  if (seen === null) return { ...base, outcome: "phase not reached before the run ended" };
  await sleep(o.delayMs);
  const before = await readProgress(w.db, runId);
  const outBefore = up.output();
  const startedAt = new Date().toISOString();
  log(`  ${spec.name}: ${o.service} down ${(o.lengthMs / 1000).toFixed(1)} s (${o.signal}) in ${o.phase}: ${seen}`);
  await stopService(w, o);
  await sleep(o.lengthMs); // the outage's length is the fault
  await startService(w, o.service);
  const restartedAt = Date.now();
  const during = up.output().slice(outBefore.length);
  const rec = {
    ...base,
    phaseSeen: seen,
    startedAt,
    stepsAtStart: before.steps,
    jobWaitsLogged: count(during, /waiting out a Postgres or Redis outage/g),
    controllerRestartsLogged: count(during, /starting it again/g),
  };
  if (exitCode() !== null) return { ...rec, outcome: "rlq up exited during the outage" };
  // The run moves on by itself: a decision after the restart, or it completes. (During a Redis
  // outage the controller may still commit to Postgres: the log's length at the restart counts.)
  const atRestart = await readProgress(w.db, runId);
  for (const deadline = Date.now() + 240_000; Date.now() < deadline; await sleep(200)) {
    const p = await readProgress(w.db, runId).catch((e: unknown) => {
      log(`  ${spec.name}: reading progress after the restart: ${(e as Error).message}`);
      return null;
    });
    if (p && (p.maxSeq > atRestart.maxSeq || p.status !== "running"))
      return { ...rec, outcome: "ridden out", progressAfterS: (Date.now() - restartedAt) / 1000 };
    if (exitCode() !== null && exitCode() !== 0) return { ...rec, outcome: "rlq up exited during the outage" };
  }
  return { ...rec, outcome: "no progress after the outage" };
}

function watchExit(up: Proc): () => number | string | null {
  let code: number | string | null = null;
  void up.exited.then((c) => (code = c));
  return () => code;
}

function raceTimeout<T>(p: Promise<T>, ms: number, what: T): Promise<T> {
  return Promise.race([p, sleep(ms).then(() => what)]);
}

/** The exactness checks of a finished run: invariants, no pause, replay clean. */
async function checkFinished(w: FaultWorld, spec: RunSpec, runId: string, rec: RunRecord): Promise<void> {
  try {
    await checkRunInvariants(w.db, runId, { numRollout: spec.numRollout, datasetSize: 64, shuffle: false, seed: 42, rbs: RBS });
    rec.exact = true;
  } catch (e) {
    rec.exactnessError = (e as Error).message.slice(0, 2000);
  }
  const paused = await w.db.pool.query("SELECT payload FROM decisions WHERE run_id = $1 AND kind = 'run.status' AND payload->>'status' = 'paused'", [runId]);
  rec.paused = paused.rows.map((r) => JSON.stringify(r.payload));
  rec.stepsCommitted = (await w.db.pool.query("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1", [runId])).rows[0].n;
  const replay = spawnRlq(["replay", runId, "--check"], rlqEnv(w, spec));
  rec.replayExit = await raceTimeout(replay.exited, 300_000, "still running after 300 s");
  replay.kill("SIGKILL");
  rec.replayOutput = replay.output().trim().split("\n").slice(-3).join("\n");
}

/** A run under `rlq up --exit-when-done` with `plan` applied one outage after another. */
export async function runWithOutages(w: FaultWorld, spec: RunSpec, plan: readonly PlannedOutage[], log: (line: string) => void): Promise<RunRecord> {
  const t0 = Date.now();
  const engine = await spawnEngine(w);
  const { runId } = await startRun(w.db, { config: runConfig(w, spec, engine.url) });
  const rec = newRecord(spec, runId);
  const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], rlqEnv(w, spec));
  const exitCode = watchExit(up);
  try {
    for (const o of plan) rec.outages.push(await applyOutage(w, spec, runId, up, exitCode, o, log));
    rec.upExits.push(await raceTimeout(up.exited, 600_000, "still running after 600 s"));
    rec.upOutputTail = up.output().slice(-4000);
  } finally {
    up.kill("SIGKILL");
    engine.kill("SIGTERM");
    // A failure above leaves no service down for the next run.
    await startService(w, "postgres");
    await startService(w, "redis");
  }
  await checkFinished(w, spec, runId, rec);
  rec.durationS = (Date.now() - t0) / 1000;
  return rec;
}

function newRecord(spec: RunSpec, runId: string): RunRecord {
  return {
    run: spec.name,
    runId,
    mode: spec.mode,
    queue: spec.queue,
    numRollout: spec.numRollout,
    outageTimeoutS: spec.outageTimeoutS,
    upExits: [],
    stepsCommitted: 0,
    paused: [],
    exact: false,
    exactnessError: null,
    replayExit: -1,
    replayOutput: "",
    durationS: 0,
    outages: [],
    upOutputTail: "",
  };
}

/**
 * One outage past RLQ_OUTAGE_TIMEOUT_S: `rlq up` must exit 75 with the reason on stderr while the
 * service is still down; then the service comes back and a new `rlq up` (what a supervisor does,
 * with the default timeout) finishes the run exactly.
 */
export async function runPastTimeout(
  w: FaultWorld,
  spec: RunSpec,
  o: PlannedOutage,
  log: (line: string) => void,
): Promise<RunRecord & { stderrReason: string | null; exitAfterS: number | null }> {
  const t0 = Date.now();
  const engine = await spawnEngine(w);
  const { runId } = await startRun(w.db, { config: runConfig(w, spec, engine.url) });
  const rec = { ...newRecord(spec, runId), stderrReason: null as string | null, exitAfterS: null as number | null };
  const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], rlqEnv(w, spec));
  const exitCode = watchExit(up);
  const stderr: string[] = [];
  up.child.stderr?.on("data", (d: Buffer) => stderr.push(d.toString()));
  try {
    await sleep(o.gapMs);
    const seen = await waitForPhase(w, runId, spec, o.phase, exitCode);
    const before = seen === null ? null : await readProgress(w.db, runId);
    const startedAt = new Date().toISOString();
    log(`  ${spec.name}: ${o.service} down until rlq up exits (RLQ_OUTAGE_TIMEOUT_S=${spec.outageTimeoutS}) in ${o.phase}: ${seen}`);
    await stopService(w, o);
    const stoppedAt = Date.now();
    const code = await raceTimeout(up.exited, (spec.outageTimeoutS + 180) * 1000, "still running");
    rec.upExits.push(code);
    rec.exitAfterS = code === "still running" ? null : (Date.now() - stoppedAt) / 1000;
    rec.stderrReason = /rlq up: .*RLQ_OUTAGE_TIMEOUT_S[^\n]*/.exec(stderr.join(""))?.[0] ?? null;
    rec.upOutputTail = up.output().slice(-4000);
    up.kill("SIGKILL");
    await startService(w, o.service);
    rec.outages.push({
      ...o,
      lengthMs: Date.now() - stoppedAt,
      run: spec.name,
      phaseSeen: seen,
      startedAt,
      stepsAtStart: before?.steps ?? null,
      outcome: code === 75 ? "past the timeout: rlq up exited 75" : "past the timeout: rlq up did not exit 75",
      progressAfterS: null,
      jobWaitsLogged: count(rec.upOutputTail, /waiting out a Postgres or Redis outage/g),
      controllerRestartsLogged: count(rec.upOutputTail, /starting it again/g),
    });
    const again = spawnRlq(["up", "--run", runId, "--exit-when-done"], rlqEnv(w, { ...spec, outageTimeoutS: 300 }));
    rec.upExits.push(await raceTimeout(again.exited, 600_000, "still running after 600 s"));
    again.kill("SIGKILL");
    rec.upOutputTail += `\n--- restarted rlq up ---\n${again.output().slice(-3000)}`;
  } finally {
    up.kill("SIGKILL");
    engine.kill("SIGTERM");
    await startService(w, "postgres");
    await startService(w, "redis");
  }
  await checkFinished(w, spec, runId, rec);
  rec.durationS = (Date.now() - t0) / 1000;
  return rec;
}

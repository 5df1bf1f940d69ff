/**
 * How much GPU time rlq wastes at cluster scale (issue 20), simulated on this machine: the real rlq
 * (`rlq up` with the controller and the train worker, `rlq worker rollout reward`, Postgres, Redis,
 * aborts, partial rollouts, weight syncs) against N simulated SGLang engines in one process
 * (bench/sim/engine-farm.ts: timers, no CPU per token), a trainer whose step is a timer that scales
 * with tokens (bench/sim/trainer.ts) and a fixed-cost reward (bench/sim/reward-fixed.mjs). The
 * model and its parameters are in bench/sim/model.ts and go into the JSON with their sources.
 *
 * Measured in the steady state: from the commit of step 0 to the commit of the last step (async: the
 * last step before the pipeline's drain), so the pipeline's fill and drain are left out (the ideal is a steady state too). Against the ideal pipeline of the
 * same model (model.ts idealPipeline): samples/s and tokens/s, engine and trainer busy fractions,
 * the bubble (seal -> train start; train commit -> every engine decoding on the new version), the
 * weight-sync time, and rlq's CPU per sample and per 1k tokens.
 *
 *   npx tsx bench/cluster-sim.ts [--engines 8,64,512] [--modes sync_partial_off,sync_partial_on,async_k1,async_k2,async_k4]
 *     [--reps 3] [--steps 6] [--time-scale 8:4,64:4,512:2] [--reps-at 64:1,512:1] [--steps-at 64:5,512:4]
 *     [--modes-at 512:async_k1]
 *     [--sync-arms abort,in_place,early,staggered_early]
 *     [--max-running 16] [--token-scale 16] [--server-concurrency N] [--prof DIR] [--out cluster-sim]
 *
 * Uses the test services (TEST_DATABASE_URL / TEST_REDIS_URL, default 127.0.0.1), each run in its
 * own database and queue prefix.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { createDb } from "../src/store/db.ts";
import { startRun } from "../src/api.ts";
import { createTestDatabase, redisUrl } from "../test/helpers/services.ts";
import { repoRoot, spawnFake, spawnRlq, type Proc } from "../test/helpers/processes.ts";
import { median, prepareServices, startCpuSampler, writeResult } from "./lib.ts";
import { defaultParams, idealPipeline, paramSources, type SimParams } from "./sim/model.ts";
import {
  benchModePolicies,
  EARLY_EXTRA_SAMPLES,
  simulatePolicy,
  staggerWidth,
  syncArmNames,
  syncArmPolicy,
  type BenchMode,
  type SyncArm,
} from "./sim/policy-sim.ts";

const { values } = parseArgs({
  options: {
    engines: { type: "string", default: "8,64,512" },
    modes: { type: "string", default: "sync_partial_off,sync_partial_on,async_k1,async_k2" },
    reps: { type: "string", default: "3" },
    steps: { type: "string", default: "6" },
    "time-scale": { type: "string", default: "8:4,64:4,512:2" },
    "reps-at": { type: "string", default: "64:1,512:1" },
    "modes-at": { type: "string", default: "512:async_k1" },
    "steps-at": { type: "string", default: "64:5,512:4" },
    "max-running": { type: "string", default: "16" },
    "token-scale": { type: "string", default: "16" },
    // rlq's per-engine cap (slime's sglang_server_concurrency); default: the engines' max running requests.
    "server-concurrency": { type: "string" },
    prof: { type: "string" },
    // Keep each run's database (its name is printed) to read the decisions' timeline afterwards.
    "keep-db": { type: "boolean", default: false },
    // engine.exclusive: the simulated servers serve this run alone (one 8B engine per GPU for one RL
    // run, as slime runs its own), so a weight sync ends their requests with one abort_all each.
    // "false" measures servers other runs may share: one abort per request.
    "engine-exclusive": { type: "string", default: "true" },
    // weight_update_mode per arm (async modes), interleaved with the modes in each repetition:
    // abort (today's), in_place (engines paused keeping their requests: SGLang pause_generation in_place),
    // early (group_extra_samples 2), staggered_early (in_place, an eighth of the engines loading at once, and early).
    "sync-arms": { type: "string", default: "abort" },
    out: { type: "string", default: "cluster-sim" },
  },
});
const isExclusive = values["engine-exclusive"] !== "false";
const perEngines = (spec: string, e: number, fallback: number) => {
  for (const kv of spec.split(",")) {
    const [k, v] = kv.split(":");
    if (Number(k) === e) return Number(v);
  }
  return fallback;
};
type Mode = BenchMode;
/** Async mode as AReaL runs it: admission bounded by the policy's k, stale tokens masked. */
const asyncConfig = (m: Mode) => ({ train_async: true, max_staleness: benchModePolicies[m].k, staleness_policy: "mask" });
const modeConfig: Record<Mode, Record<string, unknown>> = {
  // Synchronous, over-sampling 1.5x: the groups drained at the seal are discarded (and recorded so).
  sync_partial_off: { partial_rollout: false },
  // Synchronous, over-sampling 1.5x: the drained groups go back to the buffer with their tokens.
  sync_partial_on: { partial_rollout: true },
  async_k1: asyncConfig("async_k1"),
  async_k2: asyncConfig("async_k2"),
  // AReaL's documented async setting (docs/en/algorithms/async.md: max_head_offpolicyness 4, typically 2-8);
  // prime-rl's max_off_policy_steps defaults to 8.
  async_k4: asyncConfig("async_k4"),
};
const isAsyncMode = (m: Mode) => m.startsWith("async");
/** An async mode's max_staleness (0 for the sync modes). */
const stalenessOf = (m: Mode) => benchModePolicies[m].k;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function getJson<T>(url: string): Promise<T> {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return (await r.json()) as T;
}

interface Totals {
  wallNowMs: number;
  busyMs: number;
  tokens: number;
  slotMs: number;
  /** Engine-sim-ms with no request decoding (bench/sim/model.ts SimEngine.idleMs), summed over engines. */
  idleMs?: number;
  timerLateness?: { count: number; sumMs: number; maxMs: number };
}
/** A series of the farm's totals, read at any wall time by linear interpolation. */
function totalsAt(series: Totals[], t: number): Totals {
  let a = series[0] as Totals;
  for (const s of series) {
    if (s.wallNowMs <= t) a = s;
    else {
      const f = (t - a.wallNowMs) / Math.max(1, s.wallNowMs - a.wallNowMs);
      const at = (k: "busyMs" | "tokens" | "slotMs" | "idleMs") => (a[k] ?? 0) + f * ((s[k] ?? 0) - (a[k] ?? 0));
      return { wallNowMs: t, busyMs: at("busyMs"), tokens: at("tokens"), slotMs: at("slotMs"), idleMs: at("idleMs") };
    }
  }
  return a;
}

type SyncArmName = SyncArm;
/** Each arm's run-config keys (the same policies as policy-sim.ts syncArmPolicy). */
const armConfig = (arm: SyncArmName, engines: number): Record<string, unknown> => {
  switch (arm) {
    case "abort":
      return {};
    case "in_place":
      return { weight_update_mode: "in_place" };
    case "early":
      return { group_extra_samples: EARLY_EXTRA_SAMPLES };
    case "staggered_early":
      return { weight_update_mode: "in_place", weight_load_max_engines: staggerWidth(engines), group_extra_samples: EARLY_EXTRA_SAMPLES };
  }
};

async function once(engines: number, mode: Mode, p: SimParams, steps: number, rep: number, arm: SyncArmName = "abort") {
  const n = 8;
  const samplesPerStep = engines * p.maxRunning;
  const rbs = Math.max(1, Math.round(samplesPerStep / n));
  const database = await createTestDatabase(`rlq_csim${engines}`);
  const db = createDb(database.url, { max: 2 });
  const home = mkdtempSync(join(tmpdir(), "rlq-csim-"));
  const procs: Proc[] = [];
  const loadAvgAtStart = loadavg()[0] as number;
  try {
    const farm = await spawnFake("bench/sim/engine-farm.ts", ["--engines", String(engines), "--params", JSON.stringify(p)]);
    procs.push(farm);
    // One port per simulated engine, as each real engine is its own server (engine-farm.ts).
    const { ports: enginePorts } = await getJson<{ ports: number[] }>(`${farm.url}/_ports`);
    const trainer = await spawnFake("bench/sim/trainer.ts", ["--params", JSON.stringify(p)]);
    procs.push(trainer);
    const prefix = `csim${engines}${mode}${Date.now().toString(36)}`.replace(/[^a-z0-9]/g, "");
    const env: Record<string, string> = {
      DATABASE_URL: database.url,
      RLQ_QUEUE_PREFIX: prefix,
      RLQ_HOME: home,
      RLQ_LOG_LEVEL: "warn",
      REDIS_URL: redisUrl,
      RLQ_SIM_REWARD_WALL_MS: String(p.rewardMs / p.timeScale),
    };
    const config = {
      prompt_data: join(repoRoot, "test/fixtures/prompts.jsonl"),
      rollout_batch_size: rbs,
      n_samples_per_prompt: n,
      over_sampling_batch_size: isAsyncMode(mode) ? null : Math.ceil(rbs * 1.5),
      num_rollout: steps,
      rollout_max_response_len: Math.ceil(p.lenCap / p.tokenScale),
      custom_rm_path: join(repoRoot, "bench/sim/reward-fixed.mjs"),
      dynamic_sampling_filter_path: null,
      // The farm speaks rlq's byte ids, as the test fakes do (run configs must now say so).
      tokenizer: "bytes",
      engine: {
        kind: "sglang",
        urls: enginePorts.map((port) => `http://127.0.0.1:${port}`),
        logprob_check: "off",
        stream: false,
        exclusive: isExclusive,
      },
      sglang_server_concurrency: values["server-concurrency"] ? Number(values["server-concurrency"]) : p.maxRunning,
      trainer: { kind: "remote", url: trainer.url },
      train_stall_timeout_s: 120,
      ...modeConfig[mode],
      ...armConfig(arm, engines),
    };
    const { runId } = await startRun(db, { config });
    // Enough rollout jobs in flight for every group the controller may admit (async: (k+1) steps' worth).
    const inflightGroups = Math.ceil((isAsyncMode(mode) ? stalenessOf(mode) + 1 : 1.5) * rbs) + 8;
    const pids = { up: -1, worker: -1 };
    const cpu = startCpuSampler((pid, cmd) => {
      if (pid === pids.up) return "rlq_up";
      if (pid === pids.worker) return "rlq_worker";
      if (pid === farm.child.pid) return "engine_farm";
      if (pid === trainer.child.pid) return "trainer";
      if (/^postgres: /.test(cmd)) return "postgres";
      if (cmd.startsWith("redis-server") || cmd.includes("/redis-server")) return "redis";
      return null;
    }, 200);
    const prof = (name: string) => (values.prof ? ["--cpu-prof", `--cpu-prof-dir=${values.prof}/${engines}-${mode}-${rep}-${name}`] : []);
    const worker = spawnRlq(["worker", "rollout", "reward", "--concurrency", String(inflightGroups)], env, prof("worker"));
    procs.push(worker);
    pids.worker = worker.child.pid ?? -1;
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done", "--workers", "train,eval"], env, prof("up"));
    pids.up = up.child.pid ?? -1;
    const series: Totals[] = [];
    let isDone = false;
    const poller = (async () => {
      while (!isDone) {
        series.push(await getJson<Totals>(`${farm.url}/_totals`));
        await sleep(250);
      }
    })();
    const code = await up.exited;
    isDone = true;
    await poller;
    series.push(await getJson<Totals>(`${farm.url}/_totals`));
    cpu.stop();
    if (code !== 0) throw new Error(`rlq up exited ${code}: ${up.output().slice(-3000)}\nworker: ${worker.output().slice(-2000)}`);
    const farmStats = await getJson<{
      engines: Array<{
        firstDecodeWallMs: Record<string, number>;
        firstRequestWallMs: Record<string, number>;
        firstFullWallMs: Record<string, number>;
        loadsWallMs: Array<{ version: number; askedAt: number; doneAt: number }>;
      }>;
      occupancy: Array<[number, number]>;
      abortsWallMs: number[];
      requests: number;
      aborts: number;
      abortAlls: number;
      healthChecks: number;
      healthBusy: number;
    }>(`${farm.url}/_stats`);
    /** The engines' mean slot occupancy over [from, to) wall ms (the farm's 100 ms samples). */
    const occupancyIn = (from: number, to: number) => {
      const xs = farmStats.occupancy.filter(([t]) => t >= from && t < to).map(([, x]) => x);
      return xs.length > 0 ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN;
    };
    const trainerStats = await getJson<{
      steps: Array<{ step: number; receivedAt: number; startAt: number; endAt: number; samples: number; realTokens: number }>;
    }>(`${trainer.url}/_stats`);
    const q = async <T>(text: string) => (await db.pool.query(text, [runId])).rows as T[];
    const ms = (d: Date | string | null) => (d === null ? NaN : new Date(d).getTime());
    const commits = new Map(
      (await q<{ step: number; at: Date }>("SELECT step, committed_at AS at FROM train_steps WHERE run_id = $1 ORDER BY step")).map((r) => [r.step, ms(r.at)]),
    );
    const seals = new Map(
      (
        await q<{ step: number; at: Date }>(
          "SELECT coalesce(step, (payload->>'step')::int) AS step, min(created_at) AS at FROM decisions WHERE run_id = $1 AND kind = 'step.sealed' GROUP BY 1",
        )
      ).map((r) => [r.step, ms(r.at)]),
    );
    const synced = new Map(
      (
        await q<{ step: number; at: Date }>(
          "SELECT (payload->>'step')::int AS step, min(created_at) AS at FROM decisions WHERE run_id = $1 AND kind = 'weights.synced' GROUP BY 1",
        )
      ).map((r) => [r.step, ms(r.at)]),
    );
    const syncing = new Map(
      (
        await q<{ step: number; at: Date }>(
          "SELECT (payload->>'step')::int AS step, min(created_at) AS at FROM decisions WHERE run_id = $1 AND kind = 'weights.syncing' GROUP BY 1",
        )
      ).map((r) => [r.step, ms(r.at)]),
    );
    // The rounds each sync aborted, and when the last of them landed (its transaction's start).
    const abortedLanded = new Map(
      (
        await q<{ step: number; n: number; last: Date | null }>(
          `SELECT (y.payload->>'step')::int AS step, count(*)::int AS n, max(r.created_at) AS last
             FROM decisions y
             JOIN decisions a ON a.run_id = y.run_id AND a.kind = 'group.aborted' AND a.seq > y.seq
                AND a.seq < (SELECT min(z.seq) FROM decisions z WHERE z.run_id = y.run_id AND z.kind = 'weights.synced' AND z.seq > y.seq)
             LEFT JOIN group_rounds r ON r.run_id = y.run_id AND r.group_id = (a.payload->>'groupId')::bigint AND r.round = (a.payload->>'round')::int
            WHERE y.run_id = $1 AND y.kind = 'weights.syncing' GROUP BY 1`,
        )
      ).map((r) => [r.step, { n: r.n, last: ms(r.last) }]),
    );
    const trained = await q<{ step: number; samples: number; tokens: number }>(
      "SELECT trained_step AS step, count(*)::int AS samples, sum(response_length)::float8 AS tokens FROM rollout_history WHERE run_id = $1 AND trained_step IS NOT NULL GROUP BY 1 ORDER BY 1",
    );
    // Control-plane latencies per step, from the facts: the step's start (the previous step's weights
    // synced, or the first draw) to its first dispatch and its first generated round, and the last
    // reward before the seal to the seal.
    const cp = new Map(
      (
        await q<{ step: number; first_dispatch: Date; first_round: Date | null; last_reward: Date | null }>(
          `SELECT d.step, d.first_dispatch,
                  (SELECT min(created_at) FROM group_rounds r WHERE r.run_id = $1 AND r.step = d.step) AS first_round,
                  (SELECT max(w.created_at) FROM sample_rewards w WHERE w.run_id = $1
                      AND w.created_at <= (SELECT min(created_at) FROM decisions x WHERE x.run_id = $1 AND x.kind = 'step.sealed' AND coalesce(x.step, (x.payload->>'step')::int) = d.step)) AS last_reward
             FROM (SELECT (payload->>'step')::int AS step, min(created_at) AS first_dispatch FROM decisions
                    WHERE run_id = $1 AND kind = 'group.dispatched' GROUP BY 1) d`,
        )
      ).map((r) => [r.step, { firstDispatch: ms(r.first_dispatch), firstRound: ms(r.first_round), lastReward: ms(r.last_reward) }]),
    );
    const firstDraw = ms((await q<{ at: Date }>("SELECT min(created_at) AS at FROM decisions WHERE run_id = $1 AND kind = 'prompts.drawn'"))[0]?.at ?? null);
    const outcomes = await q<{ kind: string; n: number }>(
      "SELECT kind, count(*)::int AS n FROM decisions WHERE run_id = $1 AND kind IN ('group.dispatched', 'group.aborted', 'group.cut', 'group.outcome') GROUP BY 1",
    );
    // The steady-state window: step 0's commit to the last step the engines still had work for. Async
    // mode draws the run's last prompts k+1 steps ahead of training them, so its last k+1 steps are the
    // pipeline's drain (engines idle for want of prompts, not because of rlq): they are left out.
    const last = isAsyncMode(mode) ? steps - 2 - stalenessOf(mode) : steps - 1;
    if (last < 1) throw new Error(`--steps ${steps}: ${mode} needs at least ${stalenessOf(mode) + 3} steps for a steady-state window`);
    const t0 = commits.get(0) as number;
    const t1 = commits.get(last) as number;
    const windowS = (t1 - t0) / 1000;
    const inWindow = trained.filter((r) => r.step >= 1 && r.step <= last);
    const samples = inWindow.reduce((a, r) => a + r.samples, 0);
    const rlqTokens = inWindow.reduce((a, r) => a + r.tokens, 0);
    const a = totalsAt(series, t0);
    const b = totalsAt(series, t1);
    const trainerBusyMs = trainerStats.steps.reduce((acc, s) => acc + Math.max(0, Math.min(s.endAt, t1) - Math.max(s.startAt, t0)), 0);
    const perStep: Array<Record<string, number>> = [];
    for (let s = 0; s <= last; s++) {
      const tr = trainerStats.steps.find((x) => x.step === s);
      const seal = seals.get(s) ?? NaN;
      const commit = commits.get(s) ?? NaN;
      // Version s+1 is step s's output: when did the last engine first decode on it?
      const firstDecodes = farmStats.engines.map((e) => e.firstDecodeWallMs[String(s + 1)] ?? NaN);
      // ... and first had a request to run on it (from there to its first decode is the model's prefill).
      const firstRequests = farmStats.engines.map((e) => e.firstRequestWallMs[String(s + 1)] ?? NaN);
      // ... and first had every slot holding a request on it (the refill after the load).
      const firstFull = farmStats.engines.map((e) => e.firstFullWallMs[String(s + 1)] ?? NaN).filter((x) => !Number.isNaN(x));
      const loads = farmStats.engines.flatMap((e) => e.loadsWallMs.filter((l) => l.version === s + 1));
      const c = cp.get(s);
      const ready = s === 0 ? firstDraw : (synced.get(s - 1) ?? NaN);
      perStep.push({
        step: s,
        ready_to_first_dispatch_ms: (c?.firstDispatch ?? NaN) - ready,
        first_dispatch_to_first_round_ms: (c?.firstRound ?? NaN) - (c?.firstDispatch ?? NaN),
        last_reward_to_seal_ms: seal - (c?.lastReward ?? NaN),
        seal_to_trainer_received_ms: (tr?.receivedAt ?? NaN) - seal,
        seal_to_train_start_ms: (tr?.startAt ?? NaN) - seal,
        train_ms: (tr?.endAt ?? NaN) - (tr?.startAt ?? NaN),
        train_end_to_commit_ms: commit - (tr?.endAt ?? NaN),
        commit_to_synced_ms: (synced.get(s) ?? NaN) - commit,
        syncing_to_synced_ms: (synced.get(s) ?? NaN) - (syncing.get(s) ?? NaN),
        commit_to_all_engines_decoding_ms: firstDecodes.some((x) => Number.isNaN(x)) ? NaN : Math.max(...firstDecodes) - commit,
        engines_decoding_on_new_version: firstDecodes.filter((x) => !Number.isNaN(x)).length,
        commit_to_all_engines_requested_ms: firstRequests.some((x) => Number.isNaN(x)) ? NaN : Math.max(...firstRequests) - commit,
        synced_to_first_engine_requested_ms: firstRequests.some((x) => !Number.isNaN(x))
          ? Math.min(...firstRequests.filter((x) => !Number.isNaN(x))) - (synced.get(s) ?? NaN)
          : NaN,
        commit_to_half_engines_full_ms: firstFull.length >= engines / 2 ? median(firstFull) - commit : NaN,
        // How full the engines were in the 2 s before the train commit, and in the 1 s and the 1-3 s after weights.synced.
        occupancy_before_commit: occupancyIn(commit - 2000 / p.timeScale, commit),
        occupancy_first_s_after_synced: occupancyIn(synced.get(s) ?? NaN, (synced.get(s) ?? NaN) + 1000 / p.timeScale),
        occupancy_1_3_s_after_synced: occupancyIn((synced.get(s) ?? NaN) + 1000 / p.timeScale, (synced.get(s) ?? NaN) + 3000 / p.timeScale),
        engines_full_on_new_version: firstFull.length,
        engine_load_ms_max: loads.length ? Math.max(...loads.map((l) => l.doneAt - l.askedAt)) : NaN,
      });
      // What rlq adds to the sync beyond the engines' own load (the model's weight-load time).
      const row = perStep[perStep.length - 1] as Record<string, number>;
      // The engines' idle time during the sync (no request decoding), from the train commit to
      // weights.synced: mean wall ms per engine, and as a share of that window.
      {
        const syncEnd = synced.get(s) ?? NaN;
        if (!Number.isNaN(commit) && !Number.isNaN(syncEnd) && syncEnd > commit) {
          const idle = ((totalsAt(series, syncEnd).idleMs ?? 0) - (totalsAt(series, commit).idleMs ?? 0)) / p.timeScale / engines;
          row.sync_engine_idle_ms_per_engine = idle;
          row.sync_engine_idle_frac = idle / (syncEnd - commit);
        }
      }
      row.commit_to_all_engines_decoding_beyond_load_ms = (row.commit_to_all_engines_decoding_ms as number) - (row.engine_load_ms_max as number);
      row.commit_to_all_engines_requested_beyond_load_ms = (row.commit_to_all_engines_requested_ms as number) - (row.engine_load_ms_max as number);
      // Each engine, from the end of its own load to its first request on the new version (median and slowest engine).
      const afterLoad = farmStats.engines.flatMap((e) => {
        const done = e.loadsWallMs.find((l) => l.version === s + 1)?.doneAt;
        const first = e.firstRequestWallMs[String(s + 1)];
        return done === undefined || first === undefined ? [] : [first - done];
      });
      row.engine_load_done_to_first_request_ms_median = afterLoad.length ? median(afterLoad) : NaN;
      row.engine_load_done_to_first_request_ms_max = afterLoad.length ? Math.max(...afterLoad) : NaN;
      row.commit_to_syncing_ms = (syncing.get(s) ?? NaN) - commit;
      // Inside the sync: the aborts reaching the engines, the aborted rounds landing, the load asked.
      const from = syncing.get(s) ?? NaN;
      const to = synced.get(s) ?? NaN;
      const aborts = farmStats.abortsWallMs.filter((t) => t >= from && t < to);
      row.sync_aborted_groups = abortedLanded.get(s)?.n ?? 0;
      row.sync_aborts = aborts.length;
      row.syncing_to_first_abort_ms = aborts.length ? Math.min(...aborts) - from : NaN;
      row.syncing_to_last_abort_ms = aborts.length ? Math.max(...aborts) - from : NaN;
      row.syncing_to_last_aborted_round_ms = (abortedLanded.get(s)?.last ?? NaN) - from;
      row.syncing_to_median_abort_ms = aborts.length ? median(aborts) - from : NaN;
      row.syncing_to_load_asked_ms = loads.length ? Math.min(...loads.map((l) => l.askedAt)) - from : NaN;
      // How busy each process was from weights.syncing to the load asked (cores; /proc ticks polled every 50 ms):
      // whether the aborts and the aborted rounds wait on CPU or on each other.
      const abortPhaseMs = row.syncing_to_load_asked_ms;
      if (abortPhaseMs >= 200) {
        const busy = cpu.between(from, from + abortPhaseMs);
        for (const [k, v] of Object.entries(busy)) row[`sync_abort_phase_cores_${k}`] = Math.round((v / (abortPhaseMs / 1000)) * 100) / 100;
      }
    }
    const cpuS = cpu.between(t0, t1);
    const rlqCpuS = (cpuS.rlq_up ?? 0) + (cpuS.rlq_worker ?? 0);
    const ideal = idealPipeline(p, engines, samplesPerStep);
    const samplesPerS = samples / windowS;
    const realTokensPerS = (rlqTokens * p.tokenScale) / windowS;
    const idealSamplesPerS = ideal.pipelined.samplesPerS * p.timeScale;
    const stepMs = (t1 - t0) / last;
    const medianOf = (k: string) =>
      median(
        perStep
          .filter((r) => (r.step as number) >= 1)
          .map((r) => r[k] as number)
          .filter((x) => !Number.isNaN(x)),
      );
    const r = {
      engines,
      mode,
      arm,
      rep,
      // The farm draws each sample's length from `${runId}-${groupId}-${sampleIndex}` (engine-farm.ts
      // runOne): policy-sim.ts replays this run's own lengths with the run id as its key prefix.
      run_id: runId,
      rollout_batch_size: rbs,
      samples_per_step: rbs * n,
      window_s: windowS,
      steady_steps: last,
      samples_per_s: samplesPerS,
      real_tokens_per_s: realTokensPerS,
      ideal_samples_per_s: idealSamplesPerS,
      ideal_real_tokens_per_s: ideal.pipelined.tokensPerS * p.timeScale,
      ratio_samples_vs_ideal: samplesPerS / idealSamplesPerS,
      ratio_tokens_vs_ideal: realTokensPerS / (ideal.pipelined.tokensPerS * p.timeScale),
      ratio_samples_vs_sequential_ideal: samplesPerS / (ideal.sequential.samplesPerS * p.timeScale),
      engine_busy_fraction: (b.busyMs - a.busyMs) / p.timeScale / (engines * (t1 - t0)),
      // No request decoding (loads, pauses, empty or prefilling engines), over the steady window.
      engine_idle_fraction: ((b.idleMs ?? 0) - (a.idleMs ?? 0)) / p.timeScale / (engines * (t1 - t0)),
      engine_decode_utilization: (b.tokens - a.tokens) / (engines * ideal.engineTokensPerSAtFullBatch * p.timeScale * windowS),
      // The engines' slots holding a request (prefilling or decoding), weight loads included.
      engine_slot_occupancy: (b.slotMs - a.slotMs) / p.timeScale / (engines * p.maxRunning * (t1 - t0)),
      trainer_busy_fraction: trainerBusyMs / (t1 - t0),
      ideal_engine_busy: ideal.pipelined.engineBusy,
      ideal_trainer_busy: ideal.pipelined.trainerBusy,
      step_ms: stepMs,
      bubble_seal_to_train_start_ms: medianOf("seal_to_train_start_ms"),
      bubble_seal_to_train_start_frac: medianOf("seal_to_train_start_ms") / stepMs,
      bubble_commit_to_all_engines_decoding_ms: medianOf("commit_to_all_engines_decoding_ms"),
      bubble_commit_to_all_engines_decoding_frac: medianOf("commit_to_all_engines_decoding_ms") / stepMs,
      // Train commit -> every engine has a request on the new version (the control plane's part), and
      // from there to every engine decoding (the engines' own: the model's prefill of what they got).
      bubble_commit_to_all_engines_requested_ms: medianOf("commit_to_all_engines_requested_ms"),
      commit_to_syncing_ms: medianOf("commit_to_syncing_ms"),
      syncing_to_load_asked_ms: medianOf("syncing_to_load_asked_ms"),
      engine_load_done_to_first_request_ms_median: medianOf("engine_load_done_to_first_request_ms_median"),
      engine_load_done_to_first_request_ms_max: medianOf("engine_load_done_to_first_request_ms_max"),
      bubble_requested_to_decoding_ms: medianOf("commit_to_all_engines_decoding_ms") - medianOf("commit_to_all_engines_requested_ms"),
      // Train commit -> the median engine has all its slots holding requests on the new version.
      bubble_commit_to_half_engines_full_ms: medianOf("commit_to_half_engines_full_ms"),
      // The bubble rlq adds: seal -> train start, plus train commit -> every engine holding a request on
      // the new version, minus the engines' own load. As a share of this run's step, and of the step at
      // real time (time scale 1: the same wall latencies against a step timeScale times longer).
      bubble_beyond_model_ms: medianOf("seal_to_train_start_ms") + medianOf("commit_to_all_engines_requested_beyond_load_ms"),
      bubble_beyond_model_frac: (medianOf("seal_to_train_start_ms") + medianOf("commit_to_all_engines_requested_beyond_load_ms")) / stepMs,
      bubble_beyond_model_frac_at_real_time:
        (medianOf("seal_to_train_start_ms") + medianOf("commit_to_all_engines_requested_beyond_load_ms")) / (stepMs * p.timeScale),
      // The same up to every engine decoding (the model's prefill counted as rlq's): session 11's definition.
      bubble_beyond_load_to_decoding_ms: medianOf("seal_to_train_start_ms") + medianOf("commit_to_all_engines_decoding_beyond_load_ms"),
      bubble_beyond_load_to_decoding_frac_at_real_time:
        (medianOf("seal_to_train_start_ms") + medianOf("commit_to_all_engines_decoding_beyond_load_ms")) / (stepMs * p.timeScale),
      ready_to_first_dispatch_ms: medianOf("ready_to_first_dispatch_ms"),
      first_dispatch_to_first_round_ms: medianOf("first_dispatch_to_first_round_ms"),
      last_reward_to_seal_ms: medianOf("last_reward_to_seal_ms"),
      farm_timer_lateness_ms_mean: (series.at(-1)?.timerLateness?.sumMs ?? 0) / Math.max(1, series.at(-1)?.timerLateness?.count ?? 0),
      farm_timer_lateness_ms_max: series.at(-1)?.timerLateness?.maxMs ?? null,
      weight_load_ms_model: p.weightLoadMs / p.timeScale,
      weight_sync_engine_ms_max: medianOf("engine_load_ms_max"),
      sync_engine_idle_ms_per_engine: medianOf("sync_engine_idle_ms_per_engine"),
      sync_engine_idle_frac: medianOf("sync_engine_idle_frac"),
      weight_sync_commit_to_synced_ms: medianOf("commit_to_synced_ms"),
      rlq_cpu_s: rlqCpuS,
      rlq_cpu_cores: rlqCpuS / windowS,
      rlq_cpu_ms_per_sample: (1000 * rlqCpuS) / samples,
      rlq_cpu_ms_per_1k_rlq_tokens: (1e6 * rlqCpuS) / rlqTokens,
      rlq_cpu_ms_per_1k_real_tokens: (1e6 * rlqCpuS) / (rlqTokens * p.tokenScale),
      cpu_s_in_window: cpuS,
      decisions: Object.fromEntries(outcomes.map((o) => [o.kind, o.n])),
      farm_requests: farmStats.requests,
      engine_exclusive: isExclusive,
      // The box's 1-minute load average when the run began and ended (the 64-engine sim is load-sensitive).
      load_avg_1m_start: loadAvgAtStart,
      load_avg_1m_end: loadavg()[0] as number,
      farm_aborts: farmStats.aborts,
      farm_abort_alls: farmStats.abortAlls,
      // /health_generate calls, and those that answered 503 (a load held the lock past SGLang's 20 s).
      farm_health_checks: farmStats.healthChecks,
      farm_health_busy: farmStats.healthBusy,
      per_step: perStep,
    };
    process.stderr.write(
      `${engines} engines ${mode} ${arm} #${rep}: ${samplesPerS.toFixed(1)} samples/s vs ideal ${idealSamplesPerS.toFixed(1)} (x${r.ratio_samples_vs_ideal.toFixed(2)}); engine busy ${r.engine_busy_fraction.toFixed(2)}, decode util ${r.engine_decode_utilization.toFixed(2)}, slots held ${r.engine_slot_occupancy.toFixed(2)}, trainer busy ${r.trainer_busy_fraction.toFixed(2)}; bubbles ${r.bubble_seal_to_train_start_ms.toFixed(0)} / ${r.bubble_commit_to_all_engines_decoding_ms.toFixed(0)} ms of ${stepMs.toFixed(0)} (beyond the model ${r.bubble_beyond_model_ms.toFixed(0)} ms); rlq ${r.rlq_cpu_cores.toFixed(2)} cores, ${r.rlq_cpu_ms_per_sample.toFixed(2)} ms/sample\n`,
    );
    return r;
  } finally {
    for (const pr of procs.reverse()) pr.kill("SIGTERM");
    await Promise.all(procs.map((pr) => Promise.race([pr.exited, sleep(3000).then(() => pr.kill("SIGKILL"))])));
    await db.close();
    if (values["keep-db"]) process.stderr.write(`kept the database ${database.name}\n`);
    else await database.drop();
    rmSync(home, { recursive: true, force: true });
  }
}

await prepareServices();
const modes = values.modes.split(",") as Mode[];
for (const m of modes) if (!(m in modeConfig)) throw new Error(`--modes: unknown mode ${m}; expected some of ${Object.keys(modeConfig).join(", ")}`);
const arms = values["sync-arms"].split(",") as SyncArmName[];
for (const a of arms)
  if (!(syncArmNames as readonly string[]).includes(a)) throw new Error(`--sync-arms: unknown arm ${a}; expected some of ${syncArmNames.join(", ")}`);
const results: Record<string, unknown> = {};
const allRuns: unknown[] = [];
for (const e of values.engines.split(",").map(Number)) {
  const modesHere =
    (values["modes-at"]
      .split(",")
      .find((kv) => Number(kv.split(":")[0]) === e)
      ?.split(":")[1]
      ?.split("+") as Mode[] | undefined) ?? modes;
  const p: SimParams = {
    ...defaultParams(e),
    timeScale: perEngines(values["time-scale"], e, 1),
    maxRunning: Number(values["max-running"]),
    tokenScale: Number(values["token-scale"]),
  };
  const reps = perEngines(values["reps-at"], e, Number(values.reps));
  const steps = perEngines(values["steps-at"], e, Number(values.steps));
  const runs: Array<Awaited<ReturnType<typeof once>>> = [];
  // Modes interleaved within each repetition, so every mode sees the same machine noise.
  for (let rep = 0; rep < reps; rep++)
    for (const m of modesHere)
      for (const arm of isAsyncMode(m) ? arms : (["abort"] as const)) {
        runs.push(await once(e, m, p, steps, rep, arm));
        // Each run as it ends, so a run cut short keeps what it measured (the medians come below).
        await writeResult(values.out, { bench: "cluster-sim", note: "partial: runs so far", results, runs: [...allRuns, ...runs] });
      }
  allRuns.push(...runs);
  const ideal = idealPipeline(p, e, e * p.maxRunning);
  const byMode: Record<string, unknown> = {};
  for (const m of modesHere)
    for (const arm of isAsyncMode(m) ? arms : (["abort"] as const)) {
      const rs = runs.filter((r) => r.mode === m && r.arm === arm);
      const key = arm === "abort" ? m : `${m}_${arm}`;
      const med = (k: keyof (typeof rs)[number]) => median(rs.map((r) => r[k] as number));
      // The zero-overhead event simulation of the same policy (bench/sim/policy-sim.ts), in wall units.
      const armPolicy = syncArmPolicy(arm, e);
      const policy = simulatePolicy(p, e, { ...benchModePolicies[m], ...armPolicy }, Math.max(1, Math.round((e * p.maxRunning) / 8)), 8, steps);
      const policySps = policy.samplesPerS * p.timeScale;
      // The same policy on each run's own draw of the response lengths: over a window of a few steps
      // the draw moves the policy ideal by up to ±25 % at 8 engines (bench/policy-ideal.ts), and the
      // single draw above is one of them, so a run is compared with its own.
      const sameDraw = rs.map((r) => {
        const x = simulatePolicy(p, e, { ...benchModePolicies[m], ...armPolicy }, Math.max(1, Math.round((e * p.maxRunning) / 8)), 8, steps, r.run_id);
        return { policySps: x.samplesPerS * p.timeScale, ratio: r.samples_per_s / (x.samplesPerS * p.timeScale) };
      });
      process.stderr.write(
        `${e} engines ${m} ${arm}: vs the policy ideal on each run's own lengths ${sameDraw.map((x) => x.ratio.toFixed(2)).join(", ")} (on the fixed draw ${(med("samples_per_s") / policySps).toFixed(2)})\n`,
      );
      // The same, with rlq's pool cap and its batch /generate holding a finished request's slot until
      // its batch-mates finish (src/engines/pool.ts runOn, src/engines/sglang-batcher.ts SglangBatcher).
      const serverConcurrency = values["server-concurrency"] ? Number(values["server-concurrency"]) : p.maxRunning;
      const coupled = simulatePolicy(
        p,
        e,
        { ...benchModePolicies[m], ...armPolicy, poolCap: serverConcurrency, isBatchCoupled: true },
        Math.max(1, Math.round((e * p.maxRunning) / 8)),
        8,
        steps,
      );
      byMode[key] = {
        weight_update_mode: arm,
        reps: rs.length,
        steps,
        policy_ideal_samples_per_s: policySps,
        policy_ideal_step_ms: policy.stepMs / p.timeScale,
        policy_ideal_engine_decode_utilization: policy.engineDecodeUtilization,
        policy_ideal_ratio_vs_pipeline_ideal: policySps / (ideal.pipelined.samplesPerS * p.timeScale),
        ratio_samples_vs_policy_ideal: med("samples_per_s") / policySps,
        policy_ideal_same_draw_samples_per_s: sameDraw.map((x) => x.policySps),
        policy_ideal_same_draw_ratio_vs_pipeline_ideal: median(sameDraw.map((x) => x.policySps)) / (ideal.pipelined.samplesPerS * p.timeScale),
        ratio_samples_vs_policy_ideal_same_draw: median(sameDraw.map((x) => x.ratio)),
        ratio_samples_vs_policy_ideal_same_draw_per_rep: sameDraw.map((x) => x.ratio),
        policy_ideal_batch_coupled_samples_per_s: coupled.samplesPerS * p.timeScale,
        ratio_samples_vs_policy_ideal_batch_coupled: med("samples_per_s") / (coupled.samplesPerS * p.timeScale),
        samples_per_s: med("samples_per_s"),
        real_tokens_per_s: med("real_tokens_per_s"),
        ratio_samples_vs_ideal: med("ratio_samples_vs_ideal"),
        ratio_tokens_vs_ideal: med("ratio_tokens_vs_ideal"),
        ratio_samples_vs_sequential_ideal: med("ratio_samples_vs_sequential_ideal"),
        engine_busy_fraction: med("engine_busy_fraction"),
        engine_idle_fraction: med("engine_idle_fraction"),
        sync_engine_idle_ms_per_engine: med("sync_engine_idle_ms_per_engine"),
        sync_engine_idle_frac: med("sync_engine_idle_frac"),
        engine_decode_utilization: med("engine_decode_utilization"),
        engine_slot_occupancy: med("engine_slot_occupancy"),
        bubble_commit_to_half_engines_full_ms: med("bubble_commit_to_half_engines_full_ms"),
        policy_ideal_engine_slot_occupancy: policy.engineSlotOccupancy,
        trainer_busy_fraction: med("trainer_busy_fraction"),
        step_ms: med("step_ms"),
        bubble_seal_to_train_start_ms: med("bubble_seal_to_train_start_ms"),
        bubble_seal_to_train_start_frac: med("bubble_seal_to_train_start_frac"),
        bubble_commit_to_all_engines_decoding_ms: med("bubble_commit_to_all_engines_decoding_ms"),
        bubble_commit_to_all_engines_decoding_frac: med("bubble_commit_to_all_engines_decoding_frac"),
        bubble_commit_to_all_engines_requested_ms: med("bubble_commit_to_all_engines_requested_ms"),
        commit_to_syncing_ms: med("commit_to_syncing_ms"),
        syncing_to_load_asked_ms: med("syncing_to_load_asked_ms"),
        engine_load_done_to_first_request_ms_median: med("engine_load_done_to_first_request_ms_median"),
        engine_load_done_to_first_request_ms_max: med("engine_load_done_to_first_request_ms_max"),
        bubble_requested_to_decoding_ms: med("bubble_requested_to_decoding_ms"),
        bubble_beyond_model_ms: med("bubble_beyond_model_ms"),
        bubble_beyond_model_frac: med("bubble_beyond_model_frac"),
        bubble_beyond_model_frac_at_real_time: med("bubble_beyond_model_frac_at_real_time"),
        bubble_beyond_load_to_decoding_ms: med("bubble_beyond_load_to_decoding_ms"),
        bubble_beyond_load_to_decoding_frac_at_real_time: med("bubble_beyond_load_to_decoding_frac_at_real_time"),
        weight_sync_engine_ms_max: med("weight_sync_engine_ms_max"),
        weight_sync_commit_to_synced_ms: med("weight_sync_commit_to_synced_ms"),
        rlq_cpu_cores: med("rlq_cpu_cores"),
        rlq_cpu_ms_per_sample: med("rlq_cpu_ms_per_sample"),
        rlq_cpu_ms_per_1k_rlq_tokens: med("rlq_cpu_ms_per_1k_rlq_tokens"),
        rlq_cpu_ms_per_1k_real_tokens: med("rlq_cpu_ms_per_1k_real_tokens"),
        ready_to_first_dispatch_ms: med("ready_to_first_dispatch_ms"),
        first_dispatch_to_first_round_ms: med("first_dispatch_to_first_round_ms"),
        last_reward_to_seal_ms: med("last_reward_to_seal_ms"),
        farm_timer_lateness_ms_mean: med("farm_timer_lateness_ms_mean"),
      };
    }
  const sps = (m: string) => (byMode[m] as { samples_per_s: number } | undefined)?.samples_per_s;
  const pol = (m: string) => (byMode[m] as { policy_ideal_samples_per_s: number } | undefined)?.policy_ideal_samples_per_s;
  results[String(e)] = {
    params: p,
    steps,
    reps,
    ideal: {
      ...ideal,
      samples_per_s_wall: ideal.pipelined.samplesPerS * p.timeScale,
      sequential_samples_per_s_wall: ideal.sequential.samplesPerS * p.timeScale,
    },
    modes: byMode,
    // AReaL's comparison: async over sync without partial rollouts, measured and in the policy ideal.
    ...Object.fromEntries(
      (Object.keys(modeConfig) as Mode[]).filter(isAsyncMode).flatMap((m) => [
        [`${m}_over_sync_partial_off`, sps(m) && sps("sync_partial_off") ? (sps(m) as number) / (sps("sync_partial_off") as number) : null],
        [`policy_ideal_${m}_over_sync_partial_off`, pol(m) && pol("sync_partial_off") ? (pol(m) as number) / (pol("sync_partial_off") as number) : null],
      ]),
    ),
  };
  // Written after each engine count, so a long run keeps what it measured.
  await writeResult(values.out, {
    bench: "cluster-sim",
    note:
      "medians over reps; steady state (step 0's commit to the last steady step's); ideal = model.ts idealPipeline (a fluid perfect pipeline, same engine and trainer model); " +
      "policy_ideal = policy-sim.ts (rlq's scheduling policy with zero overhead, same model) on one fixed draw of the response lengths (`sim`); " +
      "policy_ideal_same_draw = the same on each run's own lengths (its run id), ratio_samples_vs_policy_ideal_same_draw the median of the runs' own ratios; absolute rates are at time_scale (sim ms per wall ms)",
    param_sources: paramSources,
    results,
    runs: allRuns,
  });
}

/**
 * Asynchronous vs synchronous mode on the demo config (examples/demo.yaml:
 * embedded ONNX engine + embedded trainer): the trainer's busy fraction and
 * samples trained per minute, same run length, alternating modes so that
 * both see the same machine noise. Both modes train with TIS (use_tis: the
 * off-policy correction async mode needs; in sync mode it is a no-op here).
 * One extra async run without TIS records what the correction is for.
 * Writes bench/results/async-pipeline.json.
 *
 *   npx tsx bench/async-pipeline.ts [--reps 3] [--steps 20] [--k 1]
 *
 * Uses DATABASE_URL / REDIS_URL when set, else the embedded defaults.
 */
import { parseArgs } from "node:util";
import { fileURLToPath } from "node:url";
import { readEnv } from "../src/config/env.ts";
import { createServices } from "../src/runtime/services.ts";
import { startRun } from "../src/api.ts";
import { trainerUtilization } from "../src/store/pipeline.ts";
import { spawnRlq } from "../test/helpers/processes.ts";
import { median, writeResult } from "./lib.ts";

const { values } = parseArgs({
  options: { reps: { type: "string", default: "3" }, steps: { type: "string", default: "20" }, k: { type: "string", default: "1" } },
});
const reps = Number(values.reps);
const steps = Number(values.steps);
const env = readEnv();
const s = await createServices(env, { applicationName: "bench-async" });
const childEnv: Record<string, string> = {
  DATABASE_URL: s.db.url,
  RLQ_HOME: env.RLQ_HOME,
  RLQ_LOG_LEVEL: "warn",
  ...(env.REDIS_URL ? { REDIS_URL: env.REDIS_URL } : {}),
};
const config = fileURLToPath(new URL("../examples/demo.yaml", import.meta.url));

interface Sample {
  mode: string;
  seconds: number;
  busyFraction: number;
  trainSecondsPerStep: number;
  samplesPerMinute: number;
  rewardFirst3: number;
  rewardLast3: number;
  maxStaleness: number;
}

async function once(mode: "sync" | "async" | "async_no_tis"): Promise<Sample> {
  const set = [
    `num_rollout=${steps}`,
    `use_tis=${mode !== "async_no_tis"}`,
    ...(mode !== "sync" ? ["train_async=true", `max_staleness=${values.k}`, "staleness_policy=mask"] : []),
  ];
  const { runId } = await startRun(s.db, { config, set, name: `bench-${mode}` });
  const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], childEnv);
  if ((await up.exited) !== 0) throw new Error(`rlq up failed for ${mode}: ${up.output().slice(-2000)}`);
  const util = await trainerUtilization(s.db, runId);
  const q = async (text: string) => (await s.db.pool.query(text, [runId])).rows;
  const trained = (await q("SELECT count(*)::int AS n FROM rollout_history WHERE run_id = $1 AND trained_step IS NOT NULL"))[0].n as number;
  const rewards = (
    await q("SELECT avg(reward)::float8 AS r FROM rollout_history WHERE run_id = $1 AND trained_step IS NOT NULL GROUP BY trained_step ORDER BY trained_step")
  ).map((r) => Number(r.r));
  const worst = (await q("SELECT coalesce(max(staleness), 0)::int AS s FROM staleness WHERE run_id = $1"))[0].s as number;
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const r: Sample = {
    mode,
    seconds: util.wallSeconds,
    busyFraction: util.busyFraction,
    trainSecondsPerStep: util.busySeconds / util.stepsTrained,
    samplesPerMinute: trained / (util.wallSeconds / 60),
    rewardFirst3: mean(rewards.slice(0, 3)),
    rewardLast3: mean(rewards.slice(-3)),
    maxStaleness: worst,
  };
  process.stderr.write(`${JSON.stringify(r)}\n`);
  return r;
}

const runs: Sample[] = [];
for (let i = 0; i < reps; i++) for (const mode of ["sync", "async"] as const) runs.push(await once(mode));
runs.push(await once("async_no_tis"));
const of = (mode: string, key: keyof Sample) => median(runs.filter((r) => r.mode === mode).map((r) => r[key] as number));
const summary = {
  sync: {
    busy_fraction: of("sync", "busyFraction"),
    train_seconds_per_step: of("sync", "trainSecondsPerStep"),
    samples_per_minute: of("sync", "samplesPerMinute"),
    seconds: of("sync", "seconds"),
    reward_first3: of("sync", "rewardFirst3"),
    reward_last3: of("sync", "rewardLast3"),
  },
  async: {
    busy_fraction: of("async", "busyFraction"),
    train_seconds_per_step: of("async", "trainSecondsPerStep"),
    samples_per_minute: of("async", "samplesPerMinute"),
    seconds: of("async", "seconds"),
    reward_first3: of("async", "rewardFirst3"),
    reward_last3: of("async", "rewardLast3"),
    max_staleness: of("async", "maxStaleness"),
  },
  async_no_tis: { reward_first3: of("async_no_tis", "rewardFirst3"), reward_last3: of("async_no_tis", "rewardLast3") },
};
await writeResult("async-pipeline", {
  bench: "async-pipeline",
  config: "examples/demo.yaml",
  steps,
  reps,
  max_staleness: Number(values.k),
  medians: summary,
  speedup_samples_per_minute: summary.async.samples_per_minute / summary.sync.samples_per_minute,
  busy_fraction_ratio: summary.async.busy_fraction / summary.sync.busy_fraction,
  runs,
});
await s.close();

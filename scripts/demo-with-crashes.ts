/**
 * The demo run (examples/demo.yaml) with its processes SIGKILLed and
 * restarted midway: a controller process and a worker process, each killed
 * at random moments and restarted. Prints the reward per step and writes
 * bench/results/demo-crash.json. Uses the embedded defaults unless
 * DATABASE_URL / REDIS_URL are set.
 *
 *   npx tsx scripts/demo-with-crashes.ts [--kills 6] [--set num_rollout=60]
 */
import { parseArgs } from "node:util";
import { fileURLToPath } from "node:url";
import { readEnv } from "../src/config/env.ts";
import { createServices } from "../src/runtime/services.ts";
import { startRun } from "../src/api.ts";
import { mulberry32 } from "../src/core/random.ts";
import { spawnRlq, type Proc } from "../test/helpers/processes.ts";
import { writeResult } from "../bench/lib.ts";

const { values } = parseArgs({ options: { kills: { type: "string", default: "6" }, set: { type: "string", multiple: true, default: [] } } });
const env = readEnv();
const s = await createServices(env, { applicationName: "demo-crash" });
const childEnv: Record<string, string> = {
  DATABASE_URL: s.db.url,
  RLQ_HOME: env.RLQ_HOME,
  RLQ_LOG_LEVEL: "warn",
  ...(env.REDIS_URL ? { REDIS_URL: env.REDIS_URL } : {}),
};
const { runId, config } = await startRun(s.db, {
  config: fileURLToPath(new URL("../examples/demo.yaml", import.meta.url)),
  set: values.set,
  name: "demo-crash",
});
const total = config.num_rollout as number;
const rand = mulberry32(7);
const t0 = Date.now();
const procs: { ctl: Proc; work: Proc } = {
  ctl: spawnRlq(["up", "--run", runId, "--workers", ""], childEnv),
  work: spawnRlq(["worker", "rollout", "reward", "train"], childEnv),
};
const steps = async () => (await s.db.pool.query(`SELECT count(*)::int AS n FROM train_steps WHERE run_id = '${runId}'`)).rows[0]?.n as number;
let kills = 0;
const killAt = Array.from({ length: Number(values.kills) }, (_, i) => Math.floor(((i + 1) * total) / (Number(values.kills) + 1)));
while ((await steps()) < total) {
  const n = await steps();
  if (kills < killAt.length && n >= (killAt[kills] as number)) {
    const which = rand() < 0.5 ? "ctl" : "work";
    procs[which].kill("SIGKILL");
    await procs[which].exited;
    kills++;
    process.stdout.write(`  SIGKILL ${which === "ctl" ? "controller" : "worker"} process at step ${n}\n`);
    procs[which] = which === "ctl" ? spawnRlq(["up", "--run", runId, "--workers", ""], childEnv) : spawnRlq(["worker", "rollout", "reward", "train"], childEnv);
  }
  await new Promise((r) => setTimeout(r, 300 + rand() * 700));
}
procs.ctl.kill("SIGTERM");
procs.work.kill("SIGTERM");
await Promise.all([procs.ctl.exited, procs.work.exited]);
const seconds = (Date.now() - t0) / 1000;
const { rows } = await s.db.pool.query(
  `SELECT trained_step AS step, avg(reward)::float8 AS reward FROM rollout_history WHERE run_id = '${runId}' AND trained_step IS NOT NULL GROUP BY 1 ORDER BY 1`,
);
const rewards = rows.map((r) => Number(r.reward));
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
const first = mean(rewards.slice(0, 3));
const last = mean(rewards.slice(-3));
process.stdout.write(
  `run ${runId}: ${kills} SIGKILLs; reward first 3 steps ${first.toFixed(3)} -> last 3 steps ${last.toFixed(3)} in ${seconds.toFixed(0)} s\n`,
);
await writeResult("demo-crash", {
  bench: "demo-crash",
  runId,
  kills,
  steps: total,
  reward_first3: first,
  reward_last3: last,
  rise: last - first,
  seconds,
  rewards,
});
await s.close();

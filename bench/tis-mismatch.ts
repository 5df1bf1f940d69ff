/**
 * TIS under an injected train/rollout mismatch: the demo task (examples/demo.yaml)
 * with the embedded engine's `logit_noise_std` at several levels, TIS on
 * (`use_tis`, slime's vanilla TIS, tis_clip 2 / tis_clip_low 0) and off
 * (`get_mismatch_metrics`: the same metrics, loss unchanged). Per run: the reward
 * curve's endpoints (mean of the first and last `window` steps, from rollout_history)
 * and the mismatch metrics averaged over the run (train_metrics). Runs are driven
 * `--parallel` at a time by one `rlq up` plus a train worker (two trainer threads).
 * Needs Postgres and Redis (.ci/services.sh).
 *
 *   npx tsx bench/tis-mismatch.ts [--steps 60] [--noise 0,0.5,1,1.5] [--tis on,off] [--window 5]
 */
import { parseArgs } from "node:util";
import setupServices from "../test/helpers/global-setup.ts";
import { createDemoWorld, mean, stepFacts } from "../test/helpers/demo-runs.ts";
import { writeResult } from "./lib.ts";

const { values } = parseArgs({
  options: {
    steps: { type: "string", default: "60" },
    noise: { type: "string", default: "0,0.5,1,1.5" },
    tis: { type: "string", default: "on,off" },
    window: { type: "string", default: "5" },
    "train-concurrency": { type: "string", default: "2" },
    parallel: { type: "string", default: "4" },
  },
});
const steps = Number(values.steps);
const window = Number(values.window);
const noises = values.noise.split(",").map(Number);
const tisModes = values.tis.split(",").map((s) => s.trim() === "on");
const parallel = Number(values.parallel);

const METRICS = ["train_rollout_logprob_abs_diff", "tis", "tis_clipfrac", "tis_abs", "ois", "pg_clipfrac", "ppo_kl", "grad_norm"] as const;

await setupServices();
const w = await createDemoWorld("btis");
const t0 = Date.now();
try {
  const runs: Array<{ runId: string; noise: number; useTis: boolean }> = [];
  const plan = noises.flatMap((noise) => tisModes.map((useTis) => ({ noise, useTis })));
  // Waves of `parallel` runs: one `rlq up` starves its connection pool with 8 controllers (demo-runs.ts).
  for (let i = 0; i < plan.length; i += parallel) {
    for (const { noise, useTis } of plan.slice(i, i + parallel)) {
      const sets = [`num_rollout=${steps}`, `engine.logit_noise_std=${noise}`, useTis ? "use_tis=true" : "get_mismatch_metrics=true"];
      runs.push({ runId: await w.start(sets, `tis-${useTis ? "on" : "off"}-noise-${noise}`), noise, useTis });
    }
    await w.driveAll({ trainConcurrency: Number(values["train-concurrency"]) });
    process.stderr.write(`${runs.length}/${plan.length} runs done in ${((Date.now() - t0) / 1000).toFixed(0)} s\n`);
  }
  const wallS = (Date.now() - t0) / 1000;
  const results = [];
  for (const r of runs) {
    const facts = await stepFacts(w.db, r.runId);
    if (facts.length !== steps) throw new Error(`run ${r.runId}: ${facts.length} of ${steps} steps trained`);
    const rewards = facts.map((f) => f.reward);
    const metricMeans = Object.fromEntries(
      METRICS.filter((k) => facts.some((f) => f.metrics[k] !== undefined)).map((k) => [k, round(mean(facts.map((f) => f.metrics[k] ?? NaN)))]),
    );
    results.push({
      logit_noise_std: r.noise,
      use_tis: r.useTis,
      run_id: r.runId,
      reward_first: round(mean(rewards.slice(0, window))),
      reward_last: round(mean(rewards.slice(-window))),
      reward_max_window: round(Math.max(...rewards.map((_, i) => (i + window <= rewards.length ? mean(rewards.slice(i, i + window)) : -Infinity)))),
      reward_curve: rewards.map(round),
      metrics_mean: metricMeans,
      metrics_first_step: pick(facts[0]?.metrics ?? {}),
      metrics_last_step: pick(facts[facts.length - 1]?.metrics ?? {}),
    });
    process.stderr.write(
      `noise ${r.noise} tis ${r.useTis ? "on " : "off"}: reward ${results.at(-1)?.reward_first} -> ${results.at(-1)?.reward_last}  ${JSON.stringify(metricMeans)}\n`,
    );
  }
  await writeResult("tis-mismatch", {
    bench: "tis-mismatch",
    task: "examples/demo.yaml (rollout_batch_size 32 x 8 samples, lr 1e-3, vanilla TIS tis_clip 2, tis_clip_low 0)",
    steps,
    reward_window_steps: window,
    runs_driven_together: Math.min(parallel, plan.length),
    wall_s: round(wallS),
    results,
  });
} finally {
  await w.close();
}

function round(x: number): number {
  return Number.isFinite(x) ? Number(x.toPrecision(4)) : x;
}

function pick(m: Record<string, number>): Record<string, number> {
  return Object.fromEntries(METRICS.filter((k) => m[k] !== undefined).map((k) => [k, round(m[k] as number)]));
}

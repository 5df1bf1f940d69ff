/**
 * Merge cluster-sim results run separately (say 64 and 512 engines, each with its own --out) into
 * bench/results/cluster-sim.json, fill the batch-coupled policy ideal where a result lacks it, and
 * print the tables docs/performance.md shows.
 *
 *   npx tsx bench/sim/report.ts [--into cluster-sim] cluster-sim cluster-sim-64 cluster-sim-512
 */
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { repoRoot } from "../../test/helpers/processes.ts";
import type { SimParams } from "./model.ts";
import { simulatePolicy, type PolicyMode } from "./policy-sim.ts";
import { median } from "../lib.ts";

const { values, positionals } = parseArgs({ options: { into: { type: "string", default: "cluster-sim" } }, allowPositionals: true });
const path = (name: string) => join(repoRoot, "bench/results", `${name}.json`);
type ModeResult = Record<string, number | null>;
type EnginesResult = { params: SimParams; steps: number; reps: number; modes: Record<string, ModeResult>; ideal: { samples_per_s_wall: number } } & Record<
  string,
  unknown
>;
const merged: { results: Record<string, EnginesResult>; runs: unknown[] } & Record<string, unknown> = { results: {}, runs: [] };
for (const name of positionals) {
  const r = JSON.parse(readFileSync(path(name), "utf8")) as typeof merged;
  for (const [k, v] of Object.entries(r)) if (k !== "results" && k !== "runs") merged[k] = v;
  Object.assign(merged.results, r.results);
  merged.runs.push(...r.runs);
}
const policyOf: Record<string, PolicyMode> = {
  sync_partial_off: { isAsync: false, k: 0, isPartial: false, overSampling: 1.5 },
  sync_partial_on: { isAsync: false, k: 0, isPartial: true, overSampling: 1.5 },
  async_k1: { isAsync: true, k: 1, isPartial: false, overSampling: 1 },
  async_k2: { isAsync: true, k: 2, isPartial: false, overSampling: 1 },
};
for (const [e, r] of Object.entries(merged.results)) {
  for (const [m, mr] of Object.entries(r.modes)) {
    if (mr.policy_ideal_batch_coupled_samples_per_s === undefined) {
      const rbs = Math.max(1, Math.round((Number(e) * r.params.maxRunning) / 8));
      const c = simulatePolicy(r.params, Number(e), { ...(policyOf[m] as PolicyMode), poolCap: r.params.maxRunning, isBatchCoupled: true }, rbs, 8, r.steps);
      mr.policy_ideal_batch_coupled_samples_per_s = c.samplesPerS * r.params.timeScale;
      mr.ratio_samples_vs_policy_ideal_batch_coupled = (mr.samples_per_s as number) / (c.samplesPerS * r.params.timeScale);
    }
  }
}
writeFileSync(path(values.into), JSON.stringify(merged, null, 2) + "\n");

const f = (x: number | null | undefined, d = 2) => (x === null || x === undefined || Number.isNaN(x) ? "n/a" : x.toFixed(d));
/** A share as a percentage ("n/a" for a result file that predates the field). */
const pct = (x: number | null | undefined, d: number) => (x === null || x === undefined || Number.isNaN(x) ? "n/a" : `${(x * 100).toFixed(d)}%`);
const lines: string[] = [];
lines.push(
  "| engines (time scale, reps) | mode | samples/s | pipeline ideal | policy ideal | policy ideal, batch-coupled | rlq / pipeline | rlq / policy | rlq / coupled | engine busy | decode util | trainer busy |",
);
lines.push("|---|---|---|---|---|---|---|---|---|---|---|---|");
for (const [e, r] of Object.entries(merged.results)) {
  for (const [m, mr] of Object.entries(r.modes)) {
    lines.push(
      `| ${e} (x${r.params.timeScale}, ${mr.reps}) | ${m} | ${f(mr.samples_per_s, 1)} | ${f(r.ideal.samples_per_s_wall, 1)} | ${f(mr.policy_ideal_samples_per_s, 1)} | ${f(mr.policy_ideal_batch_coupled_samples_per_s, 1)} | ${f(mr.ratio_samples_vs_ideal)} | ${f(mr.ratio_samples_vs_policy_ideal)} | ${f(mr.ratio_samples_vs_policy_ideal_batch_coupled)} | ${f(mr.engine_busy_fraction)} | ${f(mr.engine_decode_utilization)} | ${f(mr.trainer_busy_fraction)} |`,
    );
  }
}
lines.push("");
lines.push(
  "| engines | mode | step ms | seal → train start ms (of step) | commit → all engines decoding ms (of step) | engine load ms (model) | commit → synced ms | ready → 1st dispatch ms | 1st dispatch → 1st round ms | last reward → seal ms | rlq cores | rlq CPU ms/sample | ms per 1k sim tokens | farm timer late ms (mean) |",
);
lines.push("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
for (const [e, r] of Object.entries(merged.results)) {
  for (const [m, mr] of Object.entries(r.modes)) {
    lines.push(
      `| ${e} | ${m} | ${f(mr.step_ms, 0)} | ${f(mr.bubble_seal_to_train_start_ms, 0)} (${f(mr.bubble_seal_to_train_start_frac, 3)}) | ${f(mr.bubble_commit_to_all_engines_decoding_ms, 0)} (${f(mr.bubble_commit_to_all_engines_decoding_frac, 3)}) | ${f(mr.weight_sync_engine_ms_max, 0)} (${f(r.params.weightLoadMs / r.params.timeScale, 0)}) | ${f(mr.weight_sync_commit_to_synced_ms, 0)} | ${f(mr.ready_to_first_dispatch_ms, 0)} | ${f(mr.first_dispatch_to_first_round_ms, 0)} | ${f(mr.last_reward_to_seal_ms, 0)} | ${f(mr.rlq_cpu_cores)} | ${f(mr.rlq_cpu_ms_per_sample)} | ${f(mr.rlq_cpu_ms_per_1k_real_tokens)} | ${f(mr.farm_timer_lateness_ms_mean, 1)} |`,
    );
  }
}
lines.push("");
// What rlq adds beyond the engines' own weight load, and each rlq process's share of a core (medians over the runs).
type Run = { engines: number; mode: string; window_s: number; cpu_s_in_window: Record<string, number> };
lines.push(
  "| engines | mode | commit → all engines have a request ms | → all decoding (prefill) ms | bubble beyond the model ms | of step | of step at real time | with the prefill, at real time | controller (`rlq up`) cores | rollout worker cores |",
);
lines.push("|---|---|---|---|---|---|---|---|---|---|");
for (const [e, r] of Object.entries(merged.results)) {
  for (const [m, mr] of Object.entries(r.modes)) {
    const runs = (merged.runs as Run[]).filter((x) => String(x.engines) === e && x.mode === m);
    const cores = (name: string) => median(runs.map((x) => (x.cpu_s_in_window[name] ?? NaN) / x.window_s));
    lines.push(
      `| ${e} | ${m} | ${f(mr.bubble_commit_to_all_engines_requested_ms, 0)} | ${f(mr.bubble_requested_to_decoding_ms, 0)} | ${f(mr.bubble_beyond_model_ms, 0)} | ${pct(mr.bubble_beyond_model_frac, 1)} | ${pct(mr.bubble_beyond_model_frac_at_real_time, 2)} | ${pct(mr.bubble_beyond_load_to_decoding_frac_at_real_time, 2)} | ${f(cores("rlq_up"))} | ${f(cores("rlq_worker"))} |`,
    );
  }
}
lines.push("");
for (const [e, r] of Object.entries(merged.results)) {
  lines.push(
    `${e} engines: async_k1 / sync_partial_off = ${f(r.async_k1_over_sync_partial_off as number)}, async_k2 / sync_partial_off = ${f(r.async_k2_over_sync_partial_off as number)} (policy ideal: ${f(r.policy_ideal_async_k1_over_sync_partial_off as number)}, ${f(r.policy_ideal_async_k2_over_sync_partial_off as number)})`,
  );
}
process.stdout.write(lines.join("\n") + "\n");

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
import { benchModePolicies, simulatePolicy, type PolicyMode } from "./policy-sim.ts";
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
  // Modes measured separately at the same engine count and model join one entry; a result with other
  // parameters (another time scale) gets its own, keyed "<engines> (x<time scale>)".
  for (const [e, er] of Object.entries(r.results)) {
    // Each mode keeps the number of steps it was measured over.
    for (const mr of Object.values(er.modes)) mr.steps ??= er.steps;
    const key = [e, `${e} (x${er.params.timeScale})`].find((k) => {
      const same = merged.results[k];
      return !same || JSON.stringify(same.params) === JSON.stringify(er.params);
    });
    if (key === undefined) throw new Error(`${name}: ${e} engines at time scale ${er.params.timeScale} has other parameters than a result merged before it`);
    const same = merged.results[key];
    if (same) same.modes = { ...same.modes, ...er.modes };
    else merged.results[key] = er;
  }

  merged.runs.push(...r.runs);
}
for (const [e, r] of Object.entries(merged.results)) {
  for (const [m, mr] of Object.entries(r.modes)) {
    if (mr.policy_ideal_batch_coupled_samples_per_s === undefined) {
      const engines = parseInt(e, 10);
      const rbs = Math.max(1, Math.round((engines * r.params.maxRunning) / 8));
      const c = simulatePolicy(
        r.params,
        engines,
        { ...(benchModePolicies[m as keyof typeof benchModePolicies] as PolicyMode), poolCap: r.params.maxRunning, isBatchCoupled: true },
        rbs,
        8,
        mr.steps ?? r.steps,
      );
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
      `| ${parseInt(e, 10)} (x${r.params.timeScale}, ${mr.reps}) | ${m} | ${f(mr.samples_per_s, 1)} | ${f(r.ideal.samples_per_s_wall, 1)} | ${f(mr.policy_ideal_samples_per_s, 1)} | ${f(mr.policy_ideal_batch_coupled_samples_per_s, 1)} | ${f(mr.ratio_samples_vs_ideal)} | ${f(mr.ratio_samples_vs_policy_ideal)} | ${f(mr.ratio_samples_vs_policy_ideal_batch_coupled)} | ${f(mr.engine_busy_fraction)} | ${f(mr.engine_decode_utilization)} | ${f(mr.trainer_busy_fraction)} |`,
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
type Run = { engines: number; mode: string; window_s: number; weight_load_ms_model: number; cpu_s_in_window: Record<string, number> };
lines.push(
  "| engines | mode | commit → all engines have a request ms | → all decoding (prefill) ms | bubble beyond the model ms | of step | of step at real time | with the prefill, at real time | controller (`rlq up`) cores | rollout worker cores |",
);
lines.push("|---|---|---|---|---|---|---|---|---|---|");
for (const [e, r] of Object.entries(merged.results)) {
  for (const [m, mr] of Object.entries(r.modes)) {
    // A run's scale shows in its model load time (weightLoadMs / timeScale).
    const runs = (merged.runs as Run[]).filter(
      (x) => x.engines === parseInt(e, 10) && x.mode === m && x.weight_load_ms_model === r.params.weightLoadMs / r.params.timeScale,
    );
    const cores = (name: string) => median(runs.map((x) => (x.cpu_s_in_window[name] ?? NaN) / x.window_s));
    lines.push(
      `| ${e} | ${m} | ${f(mr.bubble_commit_to_all_engines_requested_ms, 0)} | ${f(mr.bubble_requested_to_decoding_ms, 0)} | ${f(mr.bubble_beyond_model_ms, 0)} | ${pct(mr.bubble_beyond_model_frac, 1)} | ${pct(mr.bubble_beyond_model_frac_at_real_time, 2)} | ${pct(mr.bubble_beyond_load_to_decoding_frac_at_real_time, 2)} | ${f(cores("rlq_up"))} | ${f(cores("rlq_worker"))} |`,
    );
  }
}
lines.push("");
for (const [e, r] of Object.entries(merged.results)) {
  const sync = r.modes.sync_partial_off;
  const ratios = Object.keys(r.modes)
    .filter((m) => m.startsWith("async_"))
    .map((m) => {
      const a = r.modes[m] as ModeResult;
      return `${m} / sync_partial_off = ${f(sync ? (a.samples_per_s as number) / (sync.samples_per_s as number) : null)} (policy ideal: ${f(sync ? (a.policy_ideal_samples_per_s as number) / (sync.policy_ideal_samples_per_s as number) : null)})`;
    });
  if (ratios.length > 0) lines.push(`${e} engines: ${ratios.join(", ")}`);
}
process.stdout.write(lines.join("\n") + "\n");

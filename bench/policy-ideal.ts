/**
 * The policy ideal (bench/sim/policy-sim.ts: rlq's scheduling policy with zero overhead) re-derived
 * for the weight-sync and group-completion arms of bench/cluster-sim.ts --sync-arms, with the
 * parameters the cluster bench uses (bench/sim/model.ts defaultParams, 16 slots, token scale 16).
 * Reports each arm's samples/s and trained tokens/s against the pipeline ideal: early completion
 * trains shorter samples (it drops each group's slowest), so its tokens ratio is the fair one.
 * Also a sweep of the stagger width and the extra samples per group at 64 engines.
 *
 *   npx tsx bench/policy-ideal.ts [--engines 8,64] [--out policy-ideal-sync-arms]
 */
import { parseArgs } from "node:util";
import { writeResult } from "./lib.ts";
import { defaultParams, idealPipeline, type SimParams } from "./sim/model.ts";
import { benchModePolicies, simulatePolicy, syncArmNames, syncArmPolicy, type PolicyMode } from "./sim/policy-sim.ts";

const { values } = parseArgs({
  options: { engines: { type: "string", default: "8,64" }, out: { type: "string", default: "policy-ideal-sync-arms" } },
});
const modes = ["async_k1", "async_k2"] as const;
/** Steps per engine count: enough for two steady steps at k = 2 (the bench runs 64 engines with --steps-at 64:8). */
const stepsAt = (e: number) => (e === 64 ? 8 : 6);

function run(p: SimParams, e: number, mode: PolicyMode) {
  const ideal = idealPipeline(p, e, e * p.maxRunning);
  const r = simulatePolicy(p, e, mode, Math.max(1, Math.round((e * p.maxRunning) / 8)), 8, stepsAt(e));
  return {
    samples_ratio_vs_pipeline_ideal: r.samplesPerS / ideal.pipelined.samplesPerS,
    tokens_ratio_vs_pipeline_ideal: r.trainedTokensPerS / ideal.pipelined.tokensPerS,
    engine_decode_utilization: r.engineDecodeUtilization,
  };
}

const results: Record<string, unknown> = {};
for (const e of values.engines.split(",").map(Number)) {
  const p: SimParams = { ...defaultParams(e), timeScale: 4, maxRunning: 16, tokenScale: 16 };
  const arms: Record<string, unknown> = {};
  for (const m of modes)
    for (const arm of syncArmNames) arms[`${m}_${arm}`] = { mode: m, arm, ...run(p, e, { ...benchModePolicies[m], ...syncArmPolicy(arm, e) }) };
  const sweep: unknown[] = [];
  if (e === 64)
    for (const m of modes)
      for (const width of [8, 16, 32, 64])
        for (const extra of [0, 1, 2, 4]) {
          const mode: PolicyMode = {
            ...benchModePolicies[m],
            syncMode: "in_place",
            extraSamplesPerGroup: extra,
            ...(width < e ? { maxLoadingEngines: width } : {}),
          };
          sweep.push({ mode: m, weight_load_max_engines: width < e ? width : null, group_extra_samples: extra, ...run(p, e, mode) });
        }
  results[String(e)] = { steps: stepsAt(e), arms, sweep_in_place: sweep };
  for (const [k, v] of Object.entries(arms)) {
    const x = v as { samples_ratio_vs_pipeline_ideal: number; tokens_ratio_vs_pipeline_ideal: number };
    process.stderr.write(`${e} ${k}: samples x${x.samples_ratio_vs_pipeline_ideal.toFixed(3)}, tokens x${x.tokens_ratio_vs_pipeline_ideal.toFixed(3)}\n`);
  }
}
await writeResult(values.out, {
  bench: "policy-ideal",
  note: "policy-sim.ts with zero control-plane overhead; ratios against model.ts idealPipeline; staggered arms load engines/8 at a time; early arms draw 2 extra samples per group",
  results,
});

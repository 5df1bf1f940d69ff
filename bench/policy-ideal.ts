/**
 * The policy ideal (bench/sim/policy-sim.ts: rlq's scheduling policy with zero overhead) re-derived
 * for the weight-sync and group-completion arms of bench/cluster-sim.ts --sync-arms, with the
 * parameters the cluster bench uses (bench/sim/model.ts defaultParams, 16 slots, token scale 16).
 * Reports each arm's samples/s and trained tokens/s against the pipeline ideal: early completion
 * trains shorter samples (it drops each group's slowest), so its tokens ratio is the fair one.
 * Also a sweep of the stagger width and the extra samples per group at 64 engines (one draw).
 *
 * Each arm runs over `--draws` draws of the response lengths (policy-sim.ts `keyPrefix`: `draw0`,
 * `draw1`, ...): over the bench's short windows the draw moves the result more than most arms do
 * (at 8 engines a step is 128 samples, and the few long ones, up to 16x the median length, decide
 * when it ends), and each real run draws its own lengths from its run id. The headline ratios are
 * the medians over draws; the quartiles, the range, each arm against abort on the same draw, and the
 * single draw the bench used to compare against (`sim`, cluster-sim.ts `policy_ideal_samples_per_s`)
 * are beside them.
 *
 *   npx tsx bench/policy-ideal.ts [--engines 8,64] [--draws 31] [--out policy-ideal-sync-arms]
 */
import { parseArgs } from "node:util";
import { median, writeResult } from "./lib.ts";
import { defaultParams, idealPipeline, type SimParams } from "./sim/model.ts";
import { benchModePolicies, simulatePolicy, syncArmNames, syncArmPolicy, type PolicyMode } from "./sim/policy-sim.ts";

const { values } = parseArgs({
  options: {
    engines: { type: "string", default: "8,64" },
    draws: { type: "string", default: "31" },
    out: { type: "string", default: "policy-ideal-sync-arms" },
  },
});
const modes = ["async_k1", "async_k2"] as const;
/** Steps per engine count: enough for two steady steps at k = 2 (the bench runs 64 engines with --steps-at 64:8). */
const stepsAt = (e: number) => (e === 64 ? 8 : 6);

const draws = Array.from({ length: Number(values.draws) }, (_, i) => `draw${i}`);

function run(p: SimParams, e: number, mode: PolicyMode, keyPrefix = "sim") {
  const ideal = idealPipeline(p, e, e * p.maxRunning);
  const r = simulatePolicy(p, e, mode, Math.max(1, Math.round((e * p.maxRunning) / 8)), 8, stepsAt(e), keyPrefix);
  return {
    samples_ratio_vs_pipeline_ideal: r.samplesPerS / ideal.pipelined.samplesPerS,
    tokens_ratio_vs_pipeline_ideal: r.trainedTokensPerS / ideal.pipelined.tokensPerS,
    engine_decode_utilization: r.engineDecodeUtilization,
  };
}

/** Median, quartiles and range (nearest rank). */
function spread(xs: number[]) {
  const s = [...xs].sort((a, b) => a - b);
  const at = (q: number) => s[Math.min(s.length - 1, Math.max(0, Math.round(q * (s.length - 1))))] as number;
  return { median: median(xs), q1: at(0.25), q3: at(0.75), min: s[0] as number, max: s[s.length - 1] as number };
}

/** One arm over every draw: medians as the headline, the spread, and the `sim` draw the bench compares against. */
function overDraws(p: SimParams, e: number, mode: PolicyMode, abortSamples: number[] | null) {
  const rs = draws.map((d) => run(p, e, mode, d));
  const samples = rs.map((r) => r.samples_ratio_vs_pipeline_ideal);
  const fixed = run(p, e, mode, "sim");
  return {
    samples_ratio_vs_pipeline_ideal: median(samples),
    tokens_ratio_vs_pipeline_ideal: median(rs.map((r) => r.tokens_ratio_vs_pipeline_ideal)),
    engine_decode_utilization: median(rs.map((r) => r.engine_decode_utilization)),
    draws: draws.length,
    samples_ratio_spread: spread(samples),
    tokens_ratio_spread: spread(rs.map((r) => r.tokens_ratio_vs_pipeline_ideal)),
    ...(abortSamples ? { samples_vs_abort_same_draw: spread(samples.map((x, i) => x / (abortSamples[i] as number))) } : {}),
    samples_per_draw: samples,
    draw_sim: fixed,
  };
}

const results: Record<string, unknown> = {};
for (const e of values.engines.split(",").map(Number)) {
  const p: SimParams = { ...defaultParams(e), timeScale: 4, maxRunning: 16, tokenScale: 16 };
  const arms: Record<string, unknown> = {};
  for (const m of modes) {
    const abort = overDraws(p, e, { ...benchModePolicies[m], ...syncArmPolicy("abort", e) }, null);
    for (const arm of syncArmNames)
      arms[`${m}_${arm}`] = {
        mode: m,
        arm,
        ...(arm === "abort" ? abort : overDraws(p, e, { ...benchModePolicies[m], ...syncArmPolicy(arm, e) }, abort.samples_per_draw)),
      };
  }
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
  results[String(e)] = { steps: stepsAt(e), draws: draws.length, arms, sweep_in_place: sweep };
  for (const [k, v] of Object.entries(arms)) {
    const x = v as ReturnType<typeof overDraws>;
    const q = x.samples_ratio_spread;
    process.stderr.write(
      `${e} ${k}: samples x${x.samples_ratio_vs_pipeline_ideal.toFixed(3)} (quartiles ${q.q1.toFixed(3)}-${q.q3.toFixed(3)}, range ${q.min.toFixed(3)}-${q.max.toFixed(3)}; ` +
        `draw sim x${x.draw_sim.samples_ratio_vs_pipeline_ideal.toFixed(3)}), tokens x${x.tokens_ratio_vs_pipeline_ideal.toFixed(3)}` +
        (x.samples_vs_abort_same_draw ? `; vs abort on the same draw x${x.samples_vs_abort_same_draw.median.toFixed(3)}` : "") +
        "\n",
    );
  }
}
await writeResult(values.out, {
  bench: "policy-ideal",
  note:
    "policy-sim.ts with zero control-plane overhead; ratios against model.ts idealPipeline; each arm's ratios are medians over `draws` draws of the response lengths " +
    "(keys draw0, draw1, ...; spreads and the single draw `sim` beside them); the sweep is one draw (`sim`); staggered arms load engines/8 at a time; early arms draw 2 extra samples per group",
  results,
});

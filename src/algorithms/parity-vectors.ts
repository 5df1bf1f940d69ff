/**
 * Parity vectors: deterministic input/output cases that an independent trainer
 * (e.g. a Python/torch port of slime's math) must reproduce to `tolerance`.
 * Everything is plain JSON (numbers, nested number arrays, strings, null), so a
 * later step can dump `makeParityVectors()` to a file as is.
 *
 * Each case names the rlq function (`fn`), its `input` (ragged arrays as nested
 * lists), its slime-named `options`, and the `output` rlq computed in float64.
 * `evaluateParityCase` recomputes an output from a case: the same code path the
 * vectors were made with, so a test can check that they still agree.
 */

import { aggregate } from "./aggregation.ts";
import { computeAdvantagesAndReturns } from "./advantages.ts";
import { computeApproxKl, klLossWithGrad } from "./kl.ts";
import { logitsGradient, logProbsAndEntropyFromLogits } from "./logprobs.ts";
import { computeMisWeights } from "./mis.ts";
import { type AlgorithmOptionsInput, type KlType, parseAlgorithmOptions } from "./options.ts";
import { passAtK } from "./pass-at-k.ts";
import { computePolicyLossTerms } from "./policy-loss-terms.ts";
import { makeRng, type Rng } from "./prng.ts";
import { postProcessRewards } from "./rewards.ts";
import { computeValueLossTerms } from "./value-loss.ts";

export const PARITY_VECTORS_VERSION = 1;
export const PARITY_DEFAULT_SEED = 20240531;

export type ParityFunction =
  | "postProcessRewards"
  | "computeAdvantagesAndReturns"
  | "computeApproxKl"
  | "klLossWithGrad"
  | "computePolicyLossTerms"
  | "computeMisWeights"
  | "aggregate"
  | "logProbsAndEntropyFromLogits"
  | "passAtK"
  | "computeValueLossTerms";

type Json = number | string | boolean | null | Json[] | { [key: string]: Json };
export type ParityRecord = Record<string, Json>;

export interface ParityCase {
  name: string;
  fn: ParityFunction;
  input: ParityRecord;
  options: ParityRecord;
  output: ParityRecord;
}

export interface ParityVectors {
  version: number;
  seed: number;
  /** A port matches when every number is within `tolerance · max(1, |expected|)`. */
  tolerance: number;
  cases: ParityCase[];
}

const nested = (x: readonly ArrayLike<number>[]): number[][] => x.map((r) => Array.from(r));
const flat = (x: ArrayLike<number>): number[] => Array.from(x);
const m = (x: Json | undefined): number[][] => (x ?? []) as number[][];
const v = (x: Json | undefined): number[] => (x ?? []) as number[];

/** Recomputes a case's output from its function name, input and options. */
export function evaluateParityCase(fn: ParityFunction, input: ParityRecord, options: ParityRecord): ParityRecord {
  switch (fn) {
    case "postProcessRewards": {
      const o = parseAlgorithmOptions(options);
      return { normalized: flat(postProcessRewards(v(input.rewards), v(input.groupIndices), o).normalized) };
    }
    case "computeAdvantagesAndReturns": {
      const o = parseAlgorithmOptions(options);
      const opt = (k: string): number[][] | undefined => (input[k] === undefined ? undefined : m(input[k]));
      const out = computeAdvantagesAndReturns(
        {
          rewards: v(input.rewards),
          lossMask: m(input.lossMask),
          ...(opt("oldLogProbs") && { oldLogProbs: m(input.oldLogProbs) }),
          ...(opt("refLogProbs") && { refLogProbs: m(input.refLogProbs) }),
          ...(opt("values") && { values: m(input.values) }),
        },
        o,
      );
      return { advantages: nested(out.advantages), returns: nested(out.returns), kl: nested(out.kl) };
    }
    case "computeApproxKl": {
      const ratio = input.importanceRatio === null ? undefined : v(input.importanceRatio);
      return { kl: flat(computeApproxKl(v(input.logProbs), v(input.baseLogProbs), options.kl_loss_type as KlType, ratio)) };
    }
    case "klLossWithGrad": {
      const old = input.oldLogProbs === null ? undefined : v(input.oldLogProbs);
      const out = klLossWithGrad(v(input.logProbs), v(input.refLogProbs), options.kl_loss_type as KlType, old);
      return { value: flat(out.value), grad: flat(out.grad) };
    }
    case "computePolicyLossTerms": {
      const out = computePolicyLossTerms(
        {
          logProbs: m(input.logProbs),
          oldLogProbs: m(input.oldLogProbs),
          refLogProbs: m(input.refLogProbs),
          rolloutLogProbs: m(input.rolloutLogProbs),
          advantages: m(input.advantages),
          lossMask: m(input.lossMask),
          entropy: m(input.entropy),
          rolloutIds: v(input.rolloutIds),
        },
        options,
      );
      return {
        loss: out.loss,
        pgLoss: nested(out.pgLoss),
        tokenLoss: nested(out.tokenLoss),
        dLoss_dLogp: nested(out.dLoss_dLogp),
        dLoss_dEntropy: nested(out.dLoss_dEntropy),
        effectiveLossMask: nested(out.effectiveLossMask),
        tisWeights: out.tisWeights === null ? null : nested(out.tisWeights),
        klLoss: out.klLoss === null ? null : nested(out.klLoss),
        metrics: out.metrics,
      };
    }
    case "computeMisWeights": {
      const out = computeMisWeights(m(input.trainLogProbs), m(input.rolloutLogProbs), m(input.lossMask), parseAlgorithmOptions(options));
      const metrics: ParityRecord = {};
      for (const [k, x] of Object.entries(out.metrics)) metrics[k] = nested(x);
      return { weights: out.weights === null ? null : nested(out.weights), modifiedMask: nested(out.modifiedMask), metrics };
    }
    case "aggregate": {
      const x = aggregate(m(input.values), m(input.lossMask), {
        calculate_per_token_loss: options.calculate_per_token_loss === true,
        denomMask: m(input.denomMask),
        rolloutIds: v(input.rolloutIds),
      });
      return { value: x };
    }
    case "logProbsAndEntropyFromLogits": {
      const logits = Float64Array.from(v(input.logits));
      const vocab = input.vocabSize as number;
      const temperature = options.rollout_temperature as number;
      const out = logProbsAndEntropyFromLogits(logits, v(input.tokens), vocab, temperature);
      const grad = logitsGradient(logits, v(input.tokens), vocab, temperature, v(input.dLoss_dLogp), v(input.dLoss_dEntropy));
      return { logProbs: flat(out.logProbs), entropy: flat(out.entropy), dLoss_dLogits: flat(grad) };
    }
    case "passAtK":
      return { value: passAtK(input.n as number, input.c as number, input.k as number) };
    case "computeValueLossTerms": {
      const out = computeValueLossTerms(
        { values: m(input.values), oldValues: m(input.oldValues), returns: m(input.returns), lossMask: m(input.lossMask) },
        options.value_clip as number,
        { calculate_per_token_loss: options.calculate_per_token_loss === true },
      );
      return { loss: out.loss, dLoss_dValue: nested(out.dLoss_dValue), metrics: out.metrics };
    }
  }
}

const round = (x: number): number => Math.round(x * 1e6) / 1e6;

interface RandomBatch {
  lengths: number[];
  logProbs: number[][];
  oldLogProbs: number[][];
  refLogProbs: number[][];
  rolloutLogProbs: number[][];
  advantages: number[][];
  lossMask: number[][];
  entropy: number[][];
  values: number[][];
  rolloutIds: number[];
}

/** A batch with an empty response, a fully masked sample, masked tool tokens and one catastrophic token. */
function randomBatch(rng: Rng): RandomBatch {
  const lengths = [rng.int(3, 8), 0, rng.int(2, 6), rng.int(1, 8), rng.int(4, 8), rng.int(2, 5)];
  const b: RandomBatch = {
    lengths,
    logProbs: [],
    oldLogProbs: [],
    refLogProbs: [],
    rolloutLogProbs: [],
    advantages: [],
    lossMask: [],
    entropy: [],
    values: [],
    rolloutIds: [0, 1, 2, 3, 3, 4],
  };
  lengths.forEach((n, i) => {
    // Inputs are rounded to 6 decimals so the JSON round-trips exactly.
    const old = Array.from({ length: n }, () => round(-rng.uniform(0.02, 3)));
    const adv = rng.normal();
    b.oldLogProbs.push(old);
    b.logProbs.push(old.map((o) => round(o + rng.normal(0.25))));
    b.refLogProbs.push(old.map((o) => round(o + rng.normal(0.3))));
    b.rolloutLogProbs.push(old.map((o, t) => (i === 5 && t === 0 ? round(o + 10) : round(o + rng.normal(0.5)))));
    b.advantages.push(old.map(() => round(adv + rng.normal(0.3))));
    b.lossMask.push(old.map(() => (i === 2 ? 0 : rng.chance(0.85) ? 1 : 0)));
    b.entropy.push(old.map(() => round(rng.uniform(0, 4))));
    b.values.push(old.map(() => round(rng.normal())));
  });
  return b;
}

function policyCases(rng: Rng): [string, ParityRecord][] {
  const configs: [string, AlgorithmOptionsInput][] = [
    ["ppo defaults", {}],
    ["ppo dual clip, asymmetric", { eps_clip: 0.2, eps_clip_high: 0.28, eps_clip_c: 3 }],
    ["ppo per-token loss", { calculate_per_token_loss: true, entropy_coef: 0.01 }],
    ["gspo", { advantage_estimator: "gspo", eps_clip: 3e-4, eps_clip_high: 4e-4 }],
    ["gspo + tis", { advantage_estimator: "gspo", eps_clip: 0.05, use_tis: true }],
    ["cispo", { advantage_estimator: "cispo", eps_clip: 1, eps_clip_high: 4 }],
    ["opsm", { use_opsm: true, opsm_delta: 0.01 }],
    ["vanilla tis", { use_tis: true, tis_clip: 1.5, tis_clip_low: 0.5 }],
    ["icepop", { use_tis: true, tis_function: "icepop", tis_clip: 1.5, tis_clip_low: 0.5 }],
    ["mis yaml defaults (token truncate, rs, veto, batch norm)", { use_tis: true, tis_function: "mis" }],
    ["mis sequence clip", { use_tis: true, tis_function: "mis", tis_level: "sequence", tis_mode: "clip", tis_upper_bound: 3, use_rs: false }],
    [
      "mis geometric mask",
      { use_tis: true, tis_function: "mis", tis_level: "geometric", tis_mode: "mask", tis_lower_bound: 0.8, tis_upper_bound: 1.25, tis_batch_normalize: false },
    ],
    ["mismatch metrics only", { get_mismatch_metrics: true, tis_function: "mis" }],
    ["kl loss k1", { use_kl_loss: true, kl_loss_coef: 0.05 }],
    ["kl loss k2", { use_kl_loss: true, kl_loss_coef: 0.05, kl_loss_type: "k2" }],
    ["kl loss k3 unbiased", { use_kl_loss: true, kl_loss_coef: 0.05, kl_loss_type: "k3", use_unbiased_kl: true }],
    ["kl loss low_var_kl unbiased", { use_kl_loss: true, kl_loss_coef: 0.05, kl_loss_type: "low_var_kl", use_unbiased_kl: true }],
    ["bypass mode", { use_rollout_logprobs: true }],
  ];
  return configs.map(([name, options]) => [name, { batch: randomBatch(rng) as unknown as Json, options: options }]);
}

/**
 * The parity set. Pure and deterministic in `seed`.
 */
export function makeParityVectors(seed: number = PARITY_DEFAULT_SEED): ParityVectors {
  const rng = makeRng(seed);
  const cases: ParityCase[] = [];
  const add = (name: string, fn: ParityFunction, input: ParityRecord, options: ParityRecord): void => {
    cases.push({ name, fn, input, options, output: evaluateParityCase(fn, input, options) });
  };

  // rewards: interleaved groups of mixed sizes, an all-equal group and a singleton
  const groupIndices = [3, 1, 3, 0, 1, 3, 0, 2, 1, 4, 4, 4];
  const binary = groupIndices.map((g) => (g === 4 ? 1 : rng.chance(0.5) ? 1 : 0));
  const cont = groupIndices.map(() => round(rng.normal()));
  for (const [label, rewards] of [
    ["binary", binary],
    ["continuous", cont],
  ] as const) {
    for (const est of ["grpo", "reinforce_plus_plus_baseline", "ppo"] as const) {
      add(`rewards ${label} ${est}`, "postProcessRewards", { rewards: [...rewards], groupIndices }, { advantage_estimator: est, normalize_advantages: true });
    }
    add(`rewards ${label} dr.grpo`, "postProcessRewards", { rewards: [...rewards], groupIndices }, { grpo_std_normalization: false });
  }

  // pinned: slime's dual-clip vector
  add(
    "policy loss slime pinned dual clip",
    "computePolicyLossTerms",
    {
      logProbs: [[Math.log(2), Math.log(2), Math.log(0.5)]],
      oldLogProbs: [[0, 0, 0]],
      refLogProbs: [[0, 0, 0]],
      rolloutLogProbs: [[0, 0, 0]],
      advantages: [[2, -2, 2]],
      lossMask: [[1, 1, 1]],
      entropy: [[0, 0, 0]],
      rolloutIds: [0],
    },
    { eps_clip: 0.2, eps_clip_high: 0.2, eps_clip_c: 1.5 },
  );

  // advantages
  const adv = randomBatch(rng);
  const advInput = {
    rewards: adv.lengths.map(() => round(rng.normal())),
    lossMask: adv.lossMask.map((r, i) => (i === 0 ? r.map(() => 1) : r)),
    oldLogProbs: adv.oldLogProbs,
    refLogProbs: adv.refLogProbs,
    values: adv.values,
  };
  add("advantages grpo", "computeAdvantagesAndReturns", advInput, { advantage_estimator: "grpo" });
  add("advantages grpo whitened", "computeAdvantagesAndReturns", advInput, { advantage_estimator: "grpo", normalize_advantages: true });
  const rppInput = { ...advInput, lossMask: advInput.lossMask.map((r, i) => (i === 2 ? r.map(() => 1) : r)) };
  add("advantages reinforce_plus_plus k1", "computeAdvantagesAndReturns", rppInput, {
    advantage_estimator: "reinforce_plus_plus",
    kl_coef: 0.1,
    gamma: 0.99,
    normalize_advantages: true,
  });
  add("advantages reinforce_plus_plus_baseline low_var_kl", "computeAdvantagesAndReturns", rppInput, {
    advantage_estimator: "reinforce_plus_plus_baseline",
    kl_coef: 0.05,
    kl_loss_type: "low_var_kl",
    normalize_advantages: true,
  });
  add("advantages ppo gae k3", "computeAdvantagesAndReturns", advInput, {
    advantage_estimator: "ppo",
    kl_coef: 0.02,
    kl_loss_type: "k3",
    gamma: 0.99,
    lambd: 0.95,
  });

  // KL estimators, including values beyond the low_var_kl clamp
  const logProbs = Array.from({ length: 10 }, () => round(-rng.uniform(0, 4)));
  const baseLogProbs = logProbs.map((x, t) => (t < 2 ? round(x + 12) : round(x + rng.normal(0.8))));
  const ratio = logProbs.map(() => round(Math.exp(rng.normal(0.5))));
  const old = logProbs.map((x) => round(x + rng.normal(0.3)));
  // The gradient cases keep the two |d| = 12 tokens only for low_var_kl (clamped, gradient 0): for
  // k3 the gradient r·(k3 + 1 − e^{−d}) cancels two e^12 terms, which slime's float32 KL cannot resolve.
  const moderateBase = baseLogProbs.map((x, t) => (t < 2 ? round(x - 11.5) : x));
  for (const type of ["k1", "k2", "k3", "low_var_kl"] as const) {
    add(`kl ${type}`, "computeApproxKl", { logProbs, baseLogProbs, importanceRatio: null }, { kl_loss_type: type });
    add(`kl ${type} with ratio`, "computeApproxKl", { logProbs, baseLogProbs, importanceRatio: ratio }, { kl_loss_type: type });
    const refLogProbs = type === "low_var_kl" ? baseLogProbs : moderateBase;
    add(`kl loss grad ${type} unbiased`, "klLossWithGrad", { logProbs, refLogProbs, oldLogProbs: old }, { kl_loss_type: type });
  }

  // policy loss variants
  for (const [name, c] of policyCases(rng)) {
    const b = c.batch as unknown as RandomBatch;
    const { lengths: _lengths, values: _values, ...input } = b;
    add(`policy loss ${name}`, "computePolicyLossTerms", input, c.options as ParityRecord);
  }

  // MIS on its own (every metric)
  const mis = randomBatch(rng);
  const misInput = { trainLogProbs: mis.oldLogProbs, rolloutLogProbs: mis.rolloutLogProbs, lossMask: mis.lossMask };
  for (const level of ["token", "sequence", "geometric"] as const) {
    for (const mode of ["truncate", "clip", "mask"] as const) {
      add(`mis ${level} ${mode}`, "computeMisWeights", misInput, {
        tis_level: level,
        tis_mode: mode,
        use_rs: true,
        rs_level: level === "geometric" ? "token" : level,
        tis_batch_normalize: level !== "geometric",
      });
    }
  }

  // aggregation
  const agg = randomBatch(rng);
  const denomMask = agg.lossMask.map((r) => r.map(() => 1));
  for (const perToken of [false, true]) {
    add(
      `aggregate ${perToken ? "per-token" : "per-rollout"}`,
      "aggregate",
      { values: agg.entropy, lossMask: agg.lossMask, denomMask, rolloutIds: agg.rolloutIds },
      {
        calculate_per_token_loss: perToken,
      },
    );
  }

  // log-probs and entropy from logits, with the backward pass
  const vocabSize = 7;
  const tokens = [0, 3, 6, 2];
  add(
    "logprobs temperature 0.7",
    "logProbsAndEntropyFromLogits",
    {
      logits: Array.from({ length: tokens.length * vocabSize }, () => round(rng.normal(2))),
      tokens,
      vocabSize,
      dLoss_dLogp: tokens.map(() => round(rng.normal())),
      dLoss_dEntropy: tokens.map(() => round(rng.normal())),
    },
    { rollout_temperature: 0.7 },
  );

  // pass@k
  for (const [n, c, k] of [
    [16, 3, 1],
    [16, 3, 4],
    [16, 3, 16],
    [64, 1, 32],
    [8, 0, 2],
    [5, 4, 2],
  ] as const) {
    add(`pass@${k} n=${n} c=${c}`, "passAtK", { n, c, k }, {});
  }

  // value loss
  const val = randomBatch(rng);
  add(
    "value loss",
    "computeValueLossTerms",
    { values: val.values, oldValues: val.values.map((r) => r.map((x) => round(x + rng.normal(0.3)))), returns: val.advantages, lossMask: val.lossMask },
    { value_clip: 0.2 },
  );

  return { version: PARITY_VECTORS_VERSION, seed, tolerance: 1e-6, cases };
}

import { describe, expect, it } from "vitest";
import type { AlgorithmOptionsInput } from "./options.ts";
import { computePolicyLossTerms, type PolicyLossInput } from "./policy-loss-terms.ts";
import { makeRng } from "./prng.ts";

const close = (actual: ArrayLike<number> | undefined, expected: number[], digits = 12): void => {
  expect(actual?.length).toBe(expected.length);
  expected.forEach((v, i) => expect(actual?.[i]).toBeCloseTo(v, digits));
};

/** A MIS config with only the parts a test turns on. */
const MIS_OFF = { use_rs: false, rs_veto_threshold: null, tis_batch_normalize: false } as const;

describe("computePolicyLossTerms: hand-computed cases", () => {
  it("slime's pinned dual-clip vector through the full entry", () => {
    // pg = [-2.4, 3, -1] (see policy-loss.test.ts); mean over 3 tokens = -0.4/3
    // clipfrac [1, 0, 0] -> 1/3; ppo_kl = mean(old - logp) = (-ln2 - ln2 + ln2)/3 = -ln2/3
    // d loss/d logp = (1/3) * dpg/dratio * ratio = (1/3) * [0, 0, -2 * 0.5] = [0, 0, -1/3]
    const old = [-1, -1, -1];
    const input: PolicyLossInput = {
      logProbs: [[-1 + Math.log(2), -1 + Math.log(2), -1 + Math.log(0.5)]],
      oldLogProbs: [old],
      advantages: [[2, -2, 2]],
      lossMask: [[1, 1, 1]],
    };
    const out = computePolicyLossTerms(input, { eps_clip: 0.2, eps_clip_high: 0.2, eps_clip_c: 1.5 });
    close(out.pgLoss[0], [-2.4, 3, -1]);
    expect(out.loss).toBeCloseTo(-0.4 / 3, 12);
    expect(out.metrics.pg_loss).toBeCloseTo(-0.4 / 3, 12);
    expect(out.metrics.pg_clipfrac).toBeCloseTo(1 / 3, 12);
    expect(out.metrics.ppo_kl).toBeCloseTo(-Math.LN2 / 3, 12);
    close(out.dLoss_dLogp[0], [0, 0, -1 / 3]);
    expect(out.metrics.loss).toBe(out.loss);
    expect(out.metrics.tis).toBeUndefined();
  });

  it("vanilla TIS multiplies pg by clamp(exp(old - rollout), low, high), a constant", () => {
    // ratio 1, A 1 -> pg [-1, -1]; rho = [1, 3] -> w = [1, 2] -> [-1, -2], mean -1.5
    // metrics: tis = (1 + 3)/2 = 2, tis_clipfrac = (0 + 1)/2, tis_abs = (0 + 2)/2 = 1, ois = 1
    // d/dlogp = W * w * (-A) * ratio = 0.5 * [1, 2] * -1 = [-0.5, -1]
    const out = computePolicyLossTerms(
      { logProbs: [[-1, -1]], oldLogProbs: [[-1, -1]], rolloutLogProbs: [[-1, -1 - Math.log(3)]], advantages: [[1, 1]], lossMask: [[1, 1]] },
      { use_tis: true },
    );
    expect(out.loss).toBeCloseTo(-1.5, 12);
    close(out.tisWeights?.[0], [1, 2]);
    expect(out.metrics.tis).toBeCloseTo(2, 12);
    expect(out.metrics.tis_clipfrac).toBeCloseTo(0.5, 12);
    expect(out.metrics.tis_abs).toBeCloseTo(1, 12);
    expect(out.metrics.ois).toBeCloseTo(1, 12);
    close(out.dLoss_dLogp[0], [-0.5, -1]);
    // |old - rollout| = [0, ln 3] -> ln3 / 2
    expect(out.metrics.train_rollout_logprob_abs_diff).toBeCloseTo(Math.log(3) / 2, 12);
  });

  it("icepop zeroes out-of-range tokens but keeps them in the denominator", () => {
    // w = [1, 0] -> pg [-1, 0], loss -1/2
    const out = computePolicyLossTerms(
      { logProbs: [[-1, -1]], oldLogProbs: [[-1, -1]], rolloutLogProbs: [[-1, -1 - Math.log(3)]], advantages: [[1, 1]], lossMask: [[1, 1]] },
      { use_tis: true, tis_function: "icepop" },
    );
    expect(out.loss).toBeCloseTo(-0.5, 12);
  });

  it("MIS rejection drops tokens from the numerators but not from the denominators", () => {
    // rho = [1, 3]; truncate U 2 -> w [1, 2]; RS token [0.5, 2] rejects token 1 -> mask [1, 0]
    // loss = (-1*1 + 0) / 2 original tokens = -0.5 (a recomputed denominator would give -1)
    // ois / mis_* use the pre-rejection mask: mis_tis_weight_before_bound = (1 + 3)/2 = 2
    const out = computePolicyLossTerms(
      { logProbs: [[-1, -1]], oldLogProbs: [[-1, -1]], rolloutLogProbs: [[-1, -1 - Math.log(3)]], advantages: [[1, 1]], lossMask: [[1, 1]] },
      { use_tis: true, tis_function: "mis", ...MIS_OFF, use_rs: true },
    );
    expect(out.loss).toBeCloseTo(-0.5, 12);
    expect(Array.from(out.effectiveLossMask[0] ?? [])).toEqual([1, 0]);
    close(out.dLoss_dLogp[0], [-0.5, 0]);
    expect(out.metrics.mis_tis_weight_before_bound).toBeCloseTo(2, 12);
    expect(out.metrics.ois).toBeCloseTo(1, 12);
    expect(out.metrics.pg_clipfrac).toBe(0);
    // per-token mode: same numerator over N = max(2, 1) = 2
    const perToken = computePolicyLossTerms(
      { logProbs: [[-1, -1]], oldLogProbs: [[-1, -1]], rolloutLogProbs: [[-1, -1 - Math.log(3)]], advantages: [[1, 1]], lossMask: [[1, 1]] },
      { use_tis: true, tis_function: "mis", ...MIS_OFF, use_rs: true, calculate_per_token_loss: true },
    );
    expect(perToken.loss).toBeCloseTo(-0.5, 12);
  });

  it("entropy and KL terms: loss = pg - entropy_coef*H + kl_loss_coef*kl", () => {
    // pg = -1 (ratio 1, A 1), H = 2, k1 kl = -1 - (-1.5) = 0.5
    // loss = -1 - 0.1*2 + 0.2*0.5 = -1.1; d/dlogp = -1 + 0.2*1 = -0.8; d/dH = -0.1
    const out = computePolicyLossTerms(
      { logProbs: [[-1]], oldLogProbs: [[-1]], refLogProbs: [[-1.5]], entropy: [[2]], advantages: [[1]], lossMask: [[1]] },
      { entropy_coef: 0.1, use_kl_loss: true, kl_loss_coef: 0.2 },
    );
    expect(out.loss).toBeCloseTo(-1.1, 12);
    expect(out.metrics.entropy_loss).toBeCloseTo(2, 12);
    expect(out.metrics.kl_loss).toBeCloseTo(0.5, 12);
    close(out.dLoss_dLogp[0], [-0.8]);
    close(out.dLoss_dEntropy[0], [-0.1]);
    close(out.tokenLoss[0], [-1.1]);
  });

  it("bypass mode: rollout log-probs are old; abs diff compares logp with rollout", () => {
    // ratio = exp(-1 - (-1 - ln2)) = 2 -> clipped 1.2 -> pg -1.2, grad 0; |logp - rollout| = ln 2
    const out = computePolicyLossTerms(
      { logProbs: [[-1]], oldLogProbs: [[-5]], rolloutLogProbs: [[-1 - Math.LN2]], advantages: [[1]], lossMask: [[1]] },
      { use_rollout_logprobs: true },
    );
    expect(out.loss).toBeCloseTo(-1.2, 12);
    expect(out.dLoss_dLogp[0]?.[0]).toBe(0);
    expect(out.metrics.train_rollout_logprob_abs_diff).toBeCloseTo(Math.LN2, 12);
  });

  it("GSPO: one sequence ratio, and the gradient spreads over the sequence's trained tokens", () => {
    // sample 0: logp - old = [ln2, 0] -> ratio = exp(ln2/2) = 1.414 > 1.2 -> pg [-1.2, -1.2], grad 0
    // sample 1: logp - old = [0.1, -0.1] -> ratio 1; A [1, 3] -> pg [-1, -3]
    //   S = 0.25*(-1) + 0.25*(-3) = -1 (W = 1/2/2); d/dlogp = S * ratio * m / 2 = [-0.5, -0.5]
    // loss = (-1.2 + -2) / 2 = -1.6
    const out = computePolicyLossTerms(
      {
        logProbs: [
          [-1 + Math.LN2, -2],
          [-0.9, -1.1],
        ],
        oldLogProbs: [
          [-1, -2],
          [-1, -1],
        ],
        advantages: [
          [1, 1],
          [1, 3],
        ],
        lossMask: [
          [1, 1],
          [1, 1],
        ],
      },
      { advantage_estimator: "gspo" },
    );
    close(out.pgLoss[0], [-1.2, -1.2]);
    close(out.pgLoss[1], [-1, -3]);
    expect(out.loss).toBeCloseTo(-1.6, 12);
    close(out.dLoss_dLogp[0], [0, 0]);
    close(out.dLoss_dLogp[1], [-0.5, -0.5]);
    // ppo_kl is the sequence value on every token: (-ln2/2 + 0) / 2
    expect(out.metrics.ppo_kl).toBeCloseTo(-Math.LN2 / 4, 12);
  });

  it("OPSM zeroes negative-advantage tokens of drifted sequences", () => {
    // old - logp = [0.5, 0.5] -> seq_kl 0.5 > 1e-4; A = [1, -1] -> mask [1, 0]
    // ratio = e^-0.5 = 0.6065 < 0.8: token 0 (A>0): max(-0.6065, -0.8) = -0.6065; token 1 masked out
    // loss = -0.6065 / 2; opsm_clipfrac = 1/2 (1 zeroed of 2) / 1 sample
    const out = computePolicyLossTerms({ logProbs: [[-1.5, -1.5]], oldLogProbs: [[-1, -1]], advantages: [[1, -1]], lossMask: [[1, 1]] }, { use_opsm: true });
    expect(out.loss).toBeCloseTo(-Math.exp(-0.5) / 2, 12);
    expect(out.metrics.opsm_clipfrac).toBeCloseTo(0.5, 12);
    expect(out.dLoss_dLogp[1 - 1]?.[1]).toBe(0);
  });

  it("edge cases: empty batch, empty response, fully masked sample", () => {
    const empty = computePolicyLossTerms({ logProbs: [], advantages: [], lossMask: [] });
    expect(empty.loss).toBe(0);
    expect(Object.values(empty.metrics).every((v) => v === 0)).toBe(true);
    // sample 0: ratio 1, A = 2 -> pg -2 (mean -2); sample 1 empty; sample 2 masked -> 0; 3 samples: -2/3
    const out = computePolicyLossTerms({
      logProbs: [[-1], [], [-1, -1]],
      oldLogProbs: [[-1], [], [-1, -1]],
      advantages: [[2], [], [5, 5]],
      lossMask: [[1], [], [0, 0]],
    });
    expect(out.loss).toBeCloseTo(-2 / 3, 12);
    expect(Array.from(out.dLoss_dLogp[2] ?? [], (v) => v + 0)).toEqual([0, 0]);
    // per token: -2 / (1 + 1 + 1)
    const perToken = computePolicyLossTerms(
      { logProbs: [[-1], [], [-1, -1]], oldLogProbs: [[-1], [], [-1, -1]], advantages: [[2], [], [5, 5]], lossMask: [[1], [], [0, 0]] },
      { calculate_per_token_loss: true },
    );
    expect(perToken.loss).toBeCloseTo(-2 / 3, 12);
  });

  it("without old log-probs the current ones are used as constants: ratio 1, gradient -A*W", () => {
    const out = computePolicyLossTerms({ logProbs: [[-0.3, -2]], advantages: [[0.5, -1]], lossMask: [[1, 1]] });
    // pg = [-0.5, 1] -> 0.25; d/dlogp = 0.5 * [-0.5, 1] = [-0.25, 0.5]
    expect(out.loss).toBeCloseTo(0.25, 12);
    close(out.dLoss_dLogp[0], [-0.25, 0.5]);
  });

  it("names the missing input or bad option", () => {
    const base = { logProbs: [[-1]], advantages: [[1]], lossMask: [[1]] };
    expect(() => computePolicyLossTerms(base, { use_tis: true })).toThrow(/rolloutLogProbs/);
    expect(() => computePolicyLossTerms(base, { use_kl_loss: true })).toThrow(/refLogProbs/);
    expect(() => computePolicyLossTerms(base, { entropy_coef: 0.01 })).toThrow(/entropy/);
    expect(() => computePolicyLossTerms(base, { eps_clip_c: 0.5 })).toThrow(/eps_clip_c/);
    expect(() => computePolicyLossTerms({ ...base, advantages: [[1, 2]] })).toThrow(/advantages\[0\]/);
  });
});

// ---------------------------------------------------------------------------
// Every gradient coefficient against a central finite difference of the loss.
// ---------------------------------------------------------------------------

interface Batch {
  logProbs: number[][];
  oldLogProbs: number[][];
  refLogProbs: number[][];
  rolloutLogProbs: number[][];
  advantages: number[][];
  lossMask: number[][];
  entropy: number[][];
  rolloutIds: number[];
}

function randomBatch(seed: number): Batch {
  const rng = makeRng(seed);
  const lengths = [4, 1, 5, 3];
  const logProbs: number[][] = [];
  const oldLogProbs: number[][] = [];
  const refLogProbs: number[][] = [];
  const rolloutLogProbs: number[][] = [];
  const advantages: number[][] = [];
  const lossMask: number[][] = [];
  const entropy: number[][] = [];
  for (const n of lengths) {
    const adv = rng.normal();
    const old = Array.from({ length: n }, () => -rng.uniform(0.1, 2));
    oldLogProbs.push(old);
    logProbs.push(old.map((o) => o + rng.normal(0.3)));
    refLogProbs.push(old.map((o) => o + rng.normal(0.3)));
    rolloutLogProbs.push(old.map((o) => o + rng.normal(0.4)));
    advantages.push(old.map(() => adv + rng.normal(0.2)));
    lossMask.push(old.map((_, t) => (t === 1 ? 0 : 1)));
    entropy.push(old.map(() => rng.uniform(0, 3)));
  }
  return { logProbs, oldLogProbs, refLogProbs, rolloutLogProbs, advantages, lossMask, entropy, rolloutIds: [0, 1, 1, 2] };
}

function withPerturbed(x: readonly number[][], i: number, t: number, h: number): number[][] {
  return x.map((r, j) => (j === i ? r.map((v, s) => (s === t ? v + h : v)) : r.slice()));
}

const FD_CONFIGS: [string, AlgorithmOptionsInput][] = [
  ["ppo clip", { eps_clip: 0.2 }],
  ["asymmetric + dual clip", { eps_clip: 0.2, eps_clip_high: 0.28, eps_clip_c: 3 }],
  ["gspo", { advantage_estimator: "gspo", eps_clip: 0.1 }],
  ["vanilla tis", { use_tis: true, tis_clip: 1.5, tis_clip_low: 0.5 }],
  ["icepop", { use_tis: true, tis_function: "icepop", tis_clip: 1.5, tis_clip_low: 0.5 }],
  ["mis token truncate + rs + veto + batch norm", { use_tis: true, tis_function: "mis" }],
  ["mis sequence clip", { use_tis: true, tis_function: "mis", tis_level: "sequence", tis_mode: "clip", tis_upper_bound: 5 }],
  ["mis geometric mask", { use_tis: true, tis_function: "mis", tis_level: "geometric", tis_mode: "mask", tis_batch_normalize: false }],
  ["opsm", { use_opsm: true }],
  ["kl k1", { use_kl_loss: true, kl_loss_coef: 0.3, kl_loss_type: "k1" }],
  ["kl k2 unbiased", { use_kl_loss: true, kl_loss_coef: 0.3, kl_loss_type: "k2", use_unbiased_kl: true }],
  ["kl k3 unbiased", { use_kl_loss: true, kl_loss_coef: 0.3, kl_loss_type: "k3", use_unbiased_kl: true }],
  ["kl low_var_kl unbiased", { use_kl_loss: true, kl_loss_coef: 0.3, kl_loss_type: "low_var_kl", use_unbiased_kl: true }],
  ["entropy + per-token loss", { entropy_coef: 0.05, calculate_per_token_loss: true }],
  ["bypass (use_rollout_logprobs)", { use_rollout_logprobs: true, use_kl_loss: true, kl_loss_coef: 0.1, use_unbiased_kl: true }],
];

describe("computePolicyLossTerms: d loss / d logp equals a central finite difference", () => {
  const h = 1e-6;
  for (const [name, options] of FD_CONFIGS) {
    it(name, () => {
      for (const seed of [11, 12]) {
        const batch = randomBatch(seed);
        const terms = computePolicyLossTerms(batch, options);
        // loss = Σ tokenLoss * weights (the per-token contributions are consistent with the scalar)
        let recomposed = 0;
        terms.tokenLoss.forEach((x, i) => x.forEach((v, t) => (recomposed += v * (terms.weights[i]?.[t] ?? 0))));
        expect(recomposed).toBeCloseTo(terms.loss, 12);
        let nonZero = 0;
        batch.logProbs.forEach((row, i) =>
          row.forEach((_, t) => {
            const up = computePolicyLossTerms({ ...batch, logProbs: withPerturbed(batch.logProbs, i, t, h) }, options).loss;
            const dn = computePolicyLossTerms({ ...batch, logProbs: withPerturbed(batch.logProbs, i, t, -h) }, options).loss;
            const g = terms.dLoss_dLogp[i]?.[t] ?? NaN;
            expect(g).toBeCloseTo((up - dn) / (2 * h), 6);
            if (Math.abs(g) > 1e-3) nonZero++;
          }),
        );
        // a config whose gradient is identically zero would make this test vacuous
        expect(nonZero).toBeGreaterThan(3);
      }
    });
  }

  it("cispo (stop-gradient ratio: move logp and old together so the clipped ratio stays fixed)", () => {
    const batch = randomBatch(13);
    const options: AlgorithmOptionsInput = { advantage_estimator: "cispo", eps_clip: 0.2, eps_clip_high: 0.3 };
    const terms = computePolicyLossTerms(batch, options);
    batch.logProbs.forEach((row, i) =>
      row.forEach((_, t) => {
        const at = (d: number): number =>
          computePolicyLossTerms(
            { ...batch, logProbs: withPerturbed(batch.logProbs, i, t, d), oldLogProbs: withPerturbed(batch.oldLogProbs, i, t, d) },
            options,
          ).loss;
        expect(terms.dLoss_dLogp[i]?.[t]).toBeCloseTo((at(h) - at(-h)) / (2 * h), 6);
      }),
    );
  });

  it("d loss / d entropy equals a central finite difference", () => {
    const batch = randomBatch(14);
    const options: AlgorithmOptionsInput = { entropy_coef: 0.07 };
    const terms = computePolicyLossTerms(batch, options);
    batch.entropy.forEach((row, i) =>
      row.forEach((_, t) => {
        const up = computePolicyLossTerms({ ...batch, entropy: withPerturbed(batch.entropy, i, t, h) }, options).loss;
        const dn = computePolicyLossTerms({ ...batch, entropy: withPerturbed(batch.entropy, i, t, -h) }, options).loss;
        expect(terms.dLoss_dEntropy[i]?.[t]).toBeCloseTo((up - dn) / (2 * h), 8);
      }),
    );
  });
});

describe("computePolicyLossTerms: options", () => {
  it("accepts estimators whose config-level rules do not concern the loss", () => {
    // reinforce_plus_plus needs normalize_advantages in a run config, but its loss is PPO's
    const input = { logProbs: [[-1]], advantages: [[1]], lossMask: [[1]] };
    expect(computePolicyLossTerms(input, { advantage_estimator: "reinforce_plus_plus" }).loss).toBeCloseTo(-1, 12);
  });
  it("rejects unknown option values with the field name", () => {
    expect(() => computePolicyLossTerms({ logProbs: [], advantages: [], lossMask: [] }, { kl_loss_type: "k4" } as never)).toThrow(/kl_loss_type/);
  });
});

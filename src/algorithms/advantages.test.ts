import { describe, expect, it } from "vitest";
import {
  type AdvantageOptions,
  computeAdvantagesAndReturns,
  grpoAdvantages,
  ppoAdvantages,
  reinforcePlusPlusBaselineAdvantages,
  reinforcePlusPlusReturns,
} from "./advantages.ts";
import { discountedReturns, gae } from "./returns.ts";
import { maskedWhiten } from "./whiten.ts";

const close = (actual: ArrayLike<number> | undefined, expected: number[], digits = 12): void => {
  expect(actual?.length).toBe(expected.length);
  expected.forEach((v, i) => expect(actual?.[i]).toBeCloseTo(v, digits));
};

const OPTS: AdvantageOptions = {
  advantage_estimator: "grpo",
  kl_coef: 0,
  kl_loss_type: "k1",
  gamma: 1,
  lambd: 1,
  normalize_advantages: false,
  use_rollout_logprobs: false,
  use_opd: false,
  opd_kl_coef: 1,
};

describe("discountedReturns and gae", () => {
  it("G_t = r_t + gamma G_{t+1}", () => {
    // gamma 0.5: G_2 = 4, G_1 = 2 + 2 = 4, G_0 = 1 + 2 = 3
    expect(Array.from(discountedReturns([1, 2, 4], 0.5))).toEqual([3, 4, 4]);
    expect(discountedReturns([], 0.9).length).toBe(0);
  });
  it("gae with gamma 0.9, lambda 0.8", () => {
    // r = [-0.01, -0.02, 0.97], V = [0.5, 0.4, 0.3]
    // t2: delta = 0.97 + 0 - 0.3 = 0.67, A = 0.67
    // t1: delta = -0.02 + 0.9*0.3 - 0.4 = -0.15, A = -0.15 + 0.72*0.67 = 0.3324
    // t0: delta = -0.01 + 0.9*0.4 - 0.5 = -0.15, A = -0.15 + 0.72*0.3324 = 0.089328
    const { advantages, returns } = gae([-0.01, -0.02, 0.97], [0.5, 0.4, 0.3], 0.9, 0.8);
    close(advantages, [0.089328, 0.3324, 0.67]);
    close(returns, [0.589328, 0.7324, 0.97]);
  });
});

describe("estimators", () => {
  it("grpo broadcasts the reward to every token", () => {
    const out = grpoAdvantages([0.5, -1, 2], [2, 3, 0]);
    expect(out.map((a) => Array.from(a))).toEqual([[0.5, 0.5], [-1, -1, -1], []]);
  });

  it("reinforce_plus_plus matches slime's variable-length vector", () => {
    // tests/test_discounted_returns.py: kl_coef 0.1, gamma 0.99
    // sample 0: r = -0.1*kl*m = [0, -0.01, -0.03, -0.04, 0]; last m=1 index 3 gets +2 -> 1.96
    //   G4 = 0, G3 = 1.96, G2 = -0.03 + 0.99*1.96 = 1.9104, G1 = -0.01 + 0.99*1.9104 = 1.881296,
    //   G0 = 0.99*1.881296 = 1.86248304
    // sample 1: r = [-0.04, -0.02, -0.01 - 1 = -1.01]
    //   G2 = -1.01, G1 = -0.02 - 0.9999 = -1.0199, G0 = -0.04 - 1.009701 = -1.049701
    const out = reinforcePlusPlusReturns(
      [2, -1],
      [
        [0.2, 0.1, 0.3, 0.4, 0.5],
        [0.4, 0.2, 0.1],
      ],
      [
        [0, 1, 1, 1, 0],
        [1, 1, 1],
      ],
      0.1,
      0.99,
    );
    close(out[0], [1.86248304, 1.881296, 1.9104, 1.96, 0]);
    close(out[1], [-1.049701, -1.0199, -1.01]);
  });

  it("reinforce_plus_plus: a fully masked sample gets no reward (all zeros)", () => {
    // -kl_coef * kl * 0 = 0 everywhere and no m=1 index to put the reward on.
    const out = reinforcePlusPlusReturns([5], [[0.3, 0.2]], [[0, 0]], 0.1, 1);
    expect(Array.from(out[0] ?? [])).toEqual([0, 0]);
  });

  it("reinforce_plus_plus_baseline: reward - kl_coef * kl, unmasked", () => {
    // 0.5 - 0.5*0.1 = 0.45, 0.5 - 0.5*0.2 = 0.4
    close(reinforcePlusPlusBaselineAdvantages([0.5], [[0.1, 0.2]], 0.5)[0], [0.45, 0.4]);
  });

  it("ppo: KL unmasked, reward on the last token even when it is masked, GAE", () => {
    // r = -0.1*[0.1, 0.2, 0.3] + [0, 0, 1] = [-0.01, -0.02, 0.97]: as in the gae test above.
    const { advantages, returns } = ppoAdvantages([1], [[0.1, 0.2, 0.3]], [[0.5, 0.4, 0.3]], 0.1, 0.9, 0.8);
    close(advantages[0], [0.089328, 0.3324, 0.67]);
    close(returns[0], [0.589328, 0.7324, 0.97]);
    // empty response: empty arrays, no throw
    expect(ppoAdvantages([1], [[]], [[]], 0.1, 1, 1).advantages[0]?.length).toBe(0);
  });
});

describe("maskedWhiten", () => {
  it("whitens with masked mean and Bessel-corrected variance, applied to every token", () => {
    // mask picks 1, 2, 3: n = 3, mu = 2, E[A^2] = 14/3, var = 14/3 - 4 = 2/3, * 3/2 = 1
    // scale = 1/sqrt(1 + 1e-8); masked token 100 -> 98*scale
    const s = 1 / Math.sqrt(1 + 1e-8);
    const { whitened, stats } = maskedWhiten(
      [
        [1, 2],
        [3, 100],
      ],
      [
        [1, 1],
        [1, 0],
      ],
    );
    close(whitened[0], [-s, 0]);
    close(whitened[1], [s, 98 * s]);
    expect(stats.mean).toBe(2);
    expect(stats.count).toBe(3);
    expect(stats.variance).toBeCloseTo(1, 14);
  });
  it("one trained token: variance 0 (no Bessel), so it maps to 0", () => {
    expect(Array.from(maskedWhiten([[5, 7]], [[1, 0]]).whitened[0] ?? [])).toEqual([0, 2 / Math.sqrt(1e-8)]);
  });
  it("shiftMean false adds the mean back", () => {
    close(maskedWhiten([[1, 3]], [[1, 1]], { shiftMean: false }).whitened[0], [2 - 1 / Math.sqrt(2 + 1e-8), 2 + 1 / Math.sqrt(2 + 1e-8)]);
  });
  it("throws when the whole batch is masked", () => {
    expect(() => maskedWhiten([[1], []], [[0], []])).toThrow(expect.objectContaining({ code: "algo_empty_mask" }));
  });
});

describe("computeAdvantagesAndReturns", () => {
  it("grpo: KL ignored, returns = advantages, whitening changes advantages only", () => {
    // advantages [[1, 1], [-1]], all trained: mu = 1/3, E[A^2] = 1, var = 1 - 1/9 = 8/9, *3/2 = 4/3
    const raw = computeAdvantagesAndReturns({ rewards: [1, -1], lossMask: [[1, 1], [1]] }, OPTS);
    expect(raw.advantages.map((a) => Array.from(a))).toEqual([[1, 1], [-1]]);
    const w = computeAdvantagesAndReturns({ rewards: [1, -1], lossMask: [[1, 1], [1]] }, { ...OPTS, normalize_advantages: true });
    const s = 1 / Math.sqrt(4 / 3 + 1e-8);
    close(w.advantages[0], [(2 / 3) * s, (2 / 3) * s]);
    close(w.advantages[1], [(-4 / 3) * s]);
    expect(w.returns.map((a) => Array.from(a))).toEqual([[1, 1], [-1]]);
  });

  it("reinforce_plus_plus computes the shaping KL from old (or rollout) vs ref with kl_loss_type", () => {
    // k1 KL = old - ref = [0.2, 0.4]; r = -0.5*[0.2, 0.4] + [0, 1] = [-0.1, 0.8]; gamma 1: G = [0.7, 0.8]
    const input = { rewards: [1], lossMask: [[1, 1]], oldLogProbs: [[-1, -1]], refLogProbs: [[-1.2, -1.4]], rolloutLogProbs: [[-1.2, -1.4]] };
    const out = computeAdvantagesAndReturns(input, { ...OPTS, advantage_estimator: "reinforce_plus_plus", kl_coef: 0.5 });
    close(out.kl[0], [0.2, 0.4]);
    close(out.advantages[0], [0.7, 0.8]);
    // bypass mode: rollout log-probs equal ref, so KL = 0 and G = [1, 1]
    const bypass = computeAdvantagesAndReturns(input, { ...OPTS, advantage_estimator: "reinforce_plus_plus", kl_coef: 0.5, use_rollout_logprobs: true });
    close(bypass.advantages[0], [1, 1]);
  });

  it("refuses kl_coef without the log-probs it needs (slime would silently use 0)", () => {
    expect(() => computeAdvantagesAndReturns({ rewards: [1], lossMask: [[1]] }, { ...OPTS, advantage_estimator: "ppo", kl_coef: 0.1 })).toThrow(/refLogProbs/);
    expect(() => computeAdvantagesAndReturns({ rewards: [1], lossMask: [[1]] }, { ...OPTS, advantage_estimator: "ppo" })).toThrow(/critic values/);
  });

  it("OPD subtracts opd_kl_coef * (student - teacher) before whitening; grpo returns keep the raw value", () => {
    // 1 - 0.5*(-1 - -1.5) = 0.75; 1 - 0.5*(-2 - -1) = 1.5
    const out = computeAdvantagesAndReturns(
      { rewards: [1], lossMask: [[1, 1]], oldLogProbs: [[-1, -2]], teacherLogProbs: [[-1.5, -1]] },
      { ...OPTS, use_opd: true, opd_kl_coef: 0.5 },
    );
    close(out.advantages[0], [0.75, 1.5]);
    expect(Array.from(out.returns[0] ?? [])).toEqual([1, 1]);
    // reinforce_plus_plus_baseline aliases returns to advantages in slime, so OPD shows in its returns.
    const rpp = computeAdvantagesAndReturns(
      { rewards: [1], lossMask: [[1, 1]], oldLogProbs: [[-1, -2]], teacherLogProbs: [[-1.5, -1]] },
      { ...OPTS, advantage_estimator: "reinforce_plus_plus_baseline", use_opd: true, opd_kl_coef: 0.5 },
    );
    close(rpp.returns[0], [0.75, 1.5]);
  });

  it("keeps empty responses and fully masked samples", () => {
    const out = computeAdvantagesAndReturns({ rewards: [1, 2, 3], lossMask: [[1], [], [0, 0]] }, { ...OPTS, normalize_advantages: true });
    // only one trained token (value 1): mu = 1, var 0 -> sample 2's masked tokens map to (3-1)/1e-4 = 20000
    expect(out.advantages[1]?.length).toBe(0);
    expect(out.advantages[0]?.[0]).toBe(0);
    close(out.advantages[2], [2 / Math.sqrt(1e-8), 2 / Math.sqrt(1e-8)], 6);
  });
});

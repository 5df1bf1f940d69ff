import { describe, expect, it } from "vitest";
import * as algorithms from "./index.ts";

/**
 * The public rlq/algorithms functions as a script calls them from plain JS:
 * a partial options object takes slime's defaults, a wrong one is an
 * algo_bad_argument error naming the function, the key and the value, and
 * nothing comes back NaN.
 */
const bad = (fn: () => unknown, message: RegExp) => {
  let err: unknown;
  try {
    fn();
  } catch (e) {
    err = e;
  }
  expect(err, "expected a throw").toMatchObject({ code: "algo_bad_argument", message: expect.stringMatching(message) });
};
const noNaN = (xs: ArrayLike<number>[]) => xs.forEach((x) => expect(Array.from(x).every(Number.isFinite)).toBe(true));
// Plain JS passes whatever it has: the casts stand for an untyped caller.
const js = <T>(v: unknown) => v as T;

const rewards = [1, 0, 1, 1];
const groups = [0, 0, 1, 1];
const lossMask = [[1, 1], [1, 1, 1], [1], [1, 1]];
const logProbs = [[-1, -0.5], [-0.2, -0.3, -0.1], [-2], [-0.7, -0.9]];
const rollout = [[-1.1, -0.4], [-0.2, -0.35, -0.1], [-1.5], [-0.6, -1.2]];

describe("rlq/algorithms: every public function validates or defaults its own options", () => {
  it("computeAdvantagesAndReturns: {} is slime's defaults (grpo); a typo in a value names the key", () => {
    const withDefaults = algorithms.computeAdvantagesAndReturns({ rewards, lossMask }, {});
    const explicit = algorithms.computeAdvantagesAndReturns({ rewards, lossMask }, algorithms.parseAlgorithmOptions({}));
    expect(withDefaults).toEqual(explicit);
    noNaN(withDefaults.advantages);
    bad(
      () => algorithms.computeAdvantagesAndReturns({ rewards, lossMask }, js({ advantage_estimator: "grpoo" })),
      /computeAdvantagesAndReturns: options.advantage_estimator = "grpoo": .*"grpo"/,
    );
    bad(() => algorithms.computeAdvantagesAndReturns({ rewards, lossMask }, js({ gamma: "1" })), /options.gamma = "1": .*expected number/);
    bad(() => algorithms.computeAdvantagesAndReturns({ rewards, lossMask }, js(5)), /options must be an object of slime-named options/);
  });

  it("postProcessRewards and groupNormalizeRewards", () => {
    const r = algorithms.postProcessRewards(rewards, groups, {});
    expect(Array.from(r.normalized)).toEqual(
      Array.from(
        algorithms.postProcessRewards(rewards, groups, { advantage_estimator: "grpo", rewards_normalization: true, grpo_std_normalization: true }).normalized,
      ),
    );
    bad(() => algorithms.postProcessRewards(rewards, groups, js({ rewards_normalization: "no" })), /postProcessRewards: options.rewards_normalization = "no"/);
    bad(() => algorithms.groupNormalizeRewards(rewards, groups, js(undefined)), /groupNormalizeRewards: options.useStd must be true or false/);
  });

  it("computePolicyLossTerms: a partial object defaults, a string where a number belongs is refused", () => {
    const terms = algorithms.computePolicyLossTerms({ logProbs, advantages: lossMask.map((m) => m.map(() => 0.5)), lossMask }, { eps_clip_high: 0.28 });
    expect(Number.isFinite(terms.loss)).toBe(true);
    bad(
      () => algorithms.computePolicyLossTerms({ logProbs, advantages: lossMask, lossMask }, js({ eps_clip: "0.2" })),
      /computePolicyLossTerms: options.eps_clip = "0.2"/,
    );
  });

  it("vanillaTis and icepop take tis_clip before tis_clip_low, or an options object; the old (low, high) order is refused", () => {
    const positional = algorithms.vanillaTis(logProbs, rollout, 2, 0.5);
    expect(algorithms.vanillaTis(logProbs, rollout, { tis_clip: 2, tis_clip_low: 0.5 })).toEqual(positional);
    expect(algorithms.vanillaTis(logProbs, rollout)).toEqual(algorithms.vanillaTis(logProbs, rollout, { tis_clip: 2, tis_clip_low: 0 }));
    expect(algorithms.icepop(logProbs, rollout, 1.2)).toEqual(algorithms.icepop(logProbs, rollout, { tis_clip: 1.2 }));
    bad(
      () => algorithms.vanillaTis(logProbs, rollout, 0.5, 2),
      /vanillaTis: tis_clip_low \(2\) > tis_clip \(0.5\); the arguments are \(trainLogProbs, rolloutLogProbs, tis_clip, tis_clip_low\)/,
    );
    bad(() => algorithms.icepop(logProbs, rollout, js({ tis_clip: null })), /icepop: options.tis_clip = null/);
  });

  it("computeMisWeights: mis.yaml's defaults for what is left out", () => {
    const partial = algorithms.computeMisWeights(logProbs, rollout, lossMask, { tis_mode: "mask" });
    noNaN(partial.weights ?? []);
    bad(() => algorithms.computeMisWeights(logProbs, rollout, lossMask, js({ tis_level: "seq" })), /computeMisWeights: options.tis_level = "seq"/);
  });

  it("positional numbers: missing or non-numeric arguments are refused, never NaN; eps_clip_high defaults to eps_clip as in slime", () => {
    const kl = [0.1, -0.2, 0];
    const adv = [1, -1, 0.5];
    expect(algorithms.computePolicyLoss(kl, adv, 0.2)).toEqual(algorithms.computePolicyLoss(kl, adv, 0.2, 0.2, null));
    bad(
      () => js<(a: number[], b: number[]) => unknown>(algorithms.computePolicyLoss)(kl, adv),
      /computePolicyLoss: epsClip \(eps_clip\) must be a finite number, got undefined/,
    );
    bad(() => algorithms.computeCispoLoss(kl, [-1, -1, -1], adv, js("0.2")), /computeCispoLoss: epsClip \(eps_clip\) must be a finite number, got "0.2"/);
    bad(() => js<(...a: unknown[]) => unknown>(algorithms.gae)([1, 0], [0, 0], 1), /gae: lambd must be a finite number, got undefined/);
    bad(() => js<(...a: unknown[]) => unknown>(algorithms.discountedReturns)([1, 0]), /discountedReturns: gamma must be a finite number/);
    bad(
      () => js<(...a: unknown[]) => unknown>(algorithms.computeValueLoss)([1], [1], [1]),
      /computeValueLoss: valueClip \(value_clip\) must be a finite number/,
    );
    noNaN([algorithms.computeValueLossTerms({ values: [[1]], oldValues: [[0.9]], returns: [[1.2]], lossMask: [[1]] }).dLoss_dValue[0] as Float64Array]);
    bad(() => algorithms.aggregate(lossMask, lossMask, js({ calculate_per_token_loss: "yes" })), /aggregation: calculate_per_token_loss must be true or false/);
  });
});

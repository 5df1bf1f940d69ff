import { describe, expect, it } from "vitest";
import { computeAdvantagesAndReturns, type AdvantageOptions } from "./advantages.ts";
import { computePolicyLossTerms } from "./policy-loss-terms.ts";

/**
 * On-policy distillation goldens, derived by hand from slime's formula
 * (slime/backends/megatron_utils/loss.py compute_advantages_and_returns, use_opd branch; the method in
 * docs/en/advanced/on-policy-distillation.md): Â_t = A_t − opd_kl_coef · (log π_student,t − log π_teacher,t),
 * added to any estimator's A_t before whitening. workers/trainer-torch/tests/test_opd.py holds the same
 * numbers for the torch trainer.
 *
 * Two samples, response lengths 3 and 2:
 *   student (old) log-probs [[-0.5, -1.0, -2.0], [-0.1, -3.0]]
 *   teacher log-probs       [[-0.7, -0.4, -2.0], [-1.1, -2.0]]
 *   student − teacher       [[ 0.2, -0.6,  0.0], [ 1.0, -1.0]]
 */
const student = [
  [-0.5, -1.0, -2.0],
  [-0.1, -3.0],
];
const teacher = [
  [-0.7, -0.4, -2.0],
  [-1.1, -2.0],
];
const lossMask = [
  [1, 1, 1],
  [1, 1],
];
const BASE: AdvantageOptions = {
  advantage_estimator: "grpo",
  kl_coef: 0,
  kl_loss_type: "k1",
  gamma: 1,
  lambd: 1,
  normalize_advantages: false,
  use_rollout_logprobs: false,
  use_opd: true,
  opd_kl_coef: 0.5,
};

const close = (actual: ArrayLike<number> | undefined, expected: number[]): void => {
  expect(actual?.length).toBe(expected.length);
  expected.forEach((v, i) => expect(actual?.[i]).toBeCloseTo(v, 12));
};

describe("on-policy distillation: advantage goldens (slime's formula, by hand)", () => {
  it("GRPO: the group-normalised reward on every token, minus 0.5 · (student − teacher)", () => {
    // rewards (already normalised) 0.7 and −0.7:
    //   sample 0: 0.7 − 0.5·[0.2, −0.6, 0] = [0.6, 1.0, 0.7]; sample 1: −0.7 − 0.5·[1, −1] = [−1.2, −0.2]
    const out = computeAdvantagesAndReturns({ rewards: [0.7, -0.7], lossMask, oldLogProbs: student, teacherLogProbs: teacher }, BASE);
    close(out.advantages[0], [0.6, 1.0, 0.7]);
    close(out.advantages[1], [-1.2, -0.2]);
  });

  it("zero reward is pure distillation: A_t = opd_kl_coef · (log π_teacher − log π_student)", () => {
    const out = computeAdvantagesAndReturns({ rewards: [0, 0], lossMask, oldLogProbs: student, teacherLogProbs: teacher }, { ...BASE, opd_kl_coef: 1 });
    close(out.advantages[0], [-0.2, 0.6, 0]);
    close(out.advantages[1], [-1.0, 1.0]);
  });

  it("PPO (γ = λ = 1): GAE first, then the OPD term; returns stay A + V without it", () => {
    // values [[0.1, 0.2, 0.3], [0.5, 0.4]], rewards 1 and 0 at the last token. With γ = λ = 1 GAE telescopes:
    //   A_t = Σ_{k≥t} r_k − V_t: sample 0 [0.9, 0.8, 0.7], sample 1 [−0.5, −0.4]; returns [1, 1, 1], [0, 0]
    //   OPD: [0.9 − 0.1, 0.8 + 0.3, 0.7] = [0.8, 1.1, 0.7]; [−0.5 − 0.5, −0.4 + 0.5] = [−1.0, 0.1]
    const values = [
      [0.1, 0.2, 0.3],
      [0.5, 0.4],
    ];
    const out = computeAdvantagesAndReturns(
      { rewards: [1, 0], lossMask, oldLogProbs: student, teacherLogProbs: teacher, values },
      { ...BASE, advantage_estimator: "ppo" },
    );
    close(out.advantages[0], [0.8, 1.1, 0.7]);
    close(out.advantages[1], [-1.0, 0.1]);
    close(out.returns[0], [1, 1, 1]);
    close(out.returns[1], [0, 0]);
  });

  it("use_rollout_logprobs: the student is the rollout's log-probs", () => {
    // rollout [[−0.7, −0.4, −2.0], [−1.1, −2.0]] = the teacher: the OPD term vanishes, A = the reward.
    const out = computeAdvantagesAndReturns(
      { rewards: [0.7, -0.7], lossMask, oldLogProbs: student, rolloutLogProbs: teacher, teacherLogProbs: teacher },
      { ...BASE, use_rollout_logprobs: true },
    );
    close(out.advantages[0], [0.7, 0.7, 0.7]);
    close(out.advantages[1], [-0.7, -0.7]);
  });

  it("refuses use_opd without the teacher's log-probs", () => {
    expect(() => computeAdvantagesAndReturns({ rewards: [1, 0], lossMask, oldLogProbs: student }, BASE)).toThrow(
      /use_opd needs oldLogProbs and teacherLogProbs/,
    );
  });
});

describe("on-policy distillation: loss goldens at the start weights (logp = old, ratio 1)", () => {
  // The GRPO advantages above: [[0.6, 1.0, 0.7], [−1.2, −0.2]].
  const advantages = [
    [0.6, 1.0, 0.7],
    [-1.2, -0.2],
  ];

  it("GRPO: loss = mean over samples of the token mean of −Â; d loss/d logp_t = −Â_t / (T_i · B)", () => {
    // sample 0: −(0.6 + 1.0 + 0.7)/3 = −2.3/3; sample 1: −(−1.2 − 0.2)/2 = 0.7; loss = (−2.3/3 + 0.7)/2 = −1/30
    const t = computePolicyLossTerms({ logProbs: student, oldLogProbs: student, advantages, lossMask }, { advantage_estimator: "grpo" });
    expect(t.loss).toBeCloseTo(-1 / 30, 12);
    close(t.dLoss_dLogp[0], [-0.6 / 6, -1.0 / 6, -0.7 / 6]);
    close(t.dLoss_dLogp[1], [1.2 / 4, 0.2 / 4]);
  });

  it("GSPO: the same loss; the sequence ratio spreads each sample's gradient evenly: −ΣÂ / (T_i² · B)", () => {
    // ratio_i = exp(mean_t(logp − old)) multiplies every token: d ratio_i / d logp_k = ratio_i / T_i.
    //   sample 0: −2.3 / (9 · 2) per token; sample 1: 1.4 / (4 · 2) per token
    const t = computePolicyLossTerms({ logProbs: student, oldLogProbs: student, advantages, lossMask }, { advantage_estimator: "gspo" });
    expect(t.loss).toBeCloseTo(-1 / 30, 12);
    close(t.dLoss_dLogp[0], [-2.3 / 18, -2.3 / 18, -2.3 / 18]);
    close(t.dLoss_dLogp[1], [1.4 / 8, 1.4 / 8]);
  });
});

/**
 * The trainer's one seam to the loss math: given the current per-token
 * log-probs (and entropies) of a minibatch, return the scalar loss, dLoss/dlogp
 * and dLoss/dH per token, and the step metrics. The autodiff model then turns
 * these coefficients into weight gradients (jax-model.ts `gradient`), so every
 * loss src/algorithms implements (PPO clip, dual clip, GSPO, CISPO, OPSM, TIS,
 * MIS, KL loss, entropy bonus) trains here without touching the network code.
 */

import { computePolicyLossTerms, type PolicyLossInput } from "../../algorithms/policy-loss-terms.ts";
import type { AlgorithmOptions } from "../../algorithms/options.ts";
import { computeSftLossTerms } from "../../algorithms/sft-loss.ts";

export type ObjectiveInput = Omit<PolicyLossInput, "logProbs" | "entropy">;

export interface ObjectiveOutput {
  loss: number;
  /** [B][T_i] d loss / d logp */
  dLossDLogp: Float64Array[];
  /** [B][T_i] d loss / d entropy */
  dLossDEntropy: Float64Array[];
  metrics: Record<string, number>;
}

export function lossAndGrad(perTokenLogp: Float64Array[], perTokenEntropy: Float64Array[], input: ObjectiveInput, options: AlgorithmOptions): ObjectiveOutput {
  const terms = computePolicyLossTerms({ ...input, logProbs: perTokenLogp, entropy: perTokenEntropy }, options);
  return { loss: terms.loss, dLossDLogp: terms.dLoss_dLogp, dLossDEntropy: terms.dLoss_dEntropy, metrics: terms.metrics };
}

/** loss_type sft_loss (docs/sft.md): the responses' NLL, aggregated as the policy loss is (src/algorithms/sft-loss.ts). */
export function sftObjective(
  perTokenLogp: Float64Array[],
  lossMask: Float64Array[],
  denomMask: Float64Array[],
  calculatePerTokenLoss: boolean,
): ObjectiveOutput {
  const terms = computeSftLossTerms(perTokenLogp, lossMask, { calculate_per_token_loss: calculatePerTokenLoss, denomMask });
  return { loss: terms.loss, dLossDLogp: terms.dLoss_dLogp, dLossDEntropy: terms.dLoss_dEntropy, metrics: terms.metrics };
}

/**
 * The SFT loss (loss_type sft_loss, docs/sft.md): slime's sft_loss_function
 * (slime/backends/megatron_utils/loss.py), `loss = -sum_of_sample_mean(log_probs)`, with the
 * policy loss's reducer (aggregation.ts: per-sample token means over the batch's sample count, or
 * with calculate_per_token_loss the token sum over its token count). The loss is linear in the
 * log-probs, so d loss / d logp_it = -w_it, the reducer's weights. The same math as the torch
 * trainer's workers/trainer-torch/rlq_torch/sft.py.
 */

import { makeAggregator } from "./aggregation.ts";
import type { Ragged } from "./ragged.ts";

export interface SftLossTerms {
  loss: number;
  /** [B][T_i] d loss / d logp */
  dLoss_dLogp: Float64Array[];
  /** [B][T_i] zeros: the SFT loss has no entropy term. */
  dLoss_dEntropy: Float64Array[];
  metrics: { loss: number };
}

export function computeSftLossTerms(logProbs: Ragged, lossMask: Ragged, options: { calculate_per_token_loss: boolean; denomMask?: Ragged }): SftLossTerms {
  const agg = makeAggregator(lossMask, {
    calculate_per_token_loss: options.calculate_per_token_loss,
    ...(options.denomMask !== undefined && { denomMask: options.denomMask }),
  });
  const loss = -agg.reduce(logProbs);
  return {
    loss,
    dLoss_dLogp: agg.weights.map((w) => w.map((x) => -x)),
    dLoss_dEntropy: agg.weights.map((w) => new Float64Array(w.length)),
    metrics: { loss },
  };
}

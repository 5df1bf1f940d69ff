"""The SFT loss (loss_type sft_loss): the negative log-likelihood of the response tokens.

slime's sft_loss_function (slime/backends/megatron_utils/loss.py) is

    loss = -sum_of_sample_mean(log_probs)

with the same reducer as its policy loss (cp_utils.get_sum_of_sample_mean, scaled in
loss_function): by default each sample's mean over its loss-masked tokens, summed and divided
by the global batch's sample count; with calculate_per_token_loss the sum over every
loss-masked token divided by the global batch's token count. The trainer's aggregation weights
(device_loss.aggregation_weights, policy_loss.make_aggregator) are exactly that reducer's
d agg / d x, so the loss is -sum_t w_t * logp_t and its gradient with respect to logp_t is -w_t.
The log-probs are those of the logits divided by rollout_temperature, as slime's get_responses
computes them (docs/sft.md says to leave it at 1).
"""

from __future__ import annotations

import torch


def loss_terms(
    logp: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """(d loss / d logp, d loss / d entropy, metrics) of one micro-batch.

    logp: [T] the micro-batch's response log-probs, flat; weights: [T] (float64) their
    aggregation weights within the global batch. The micro-batches' `loss` metrics add up to
    the global batch's loss (the weights of a global batch sum to 1 over its samples)."""
    w = weights.to(torch.float64)
    loss = -(w * logp.detach().to(torch.float64)).sum()
    return -w, torch.zeros_like(w), {"loss": float(loss)}

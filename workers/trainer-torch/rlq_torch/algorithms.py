"""rlq's RL math (src/algorithms, docs/algorithms.md) ported to numpy, float64.

This is the loss math the PyTorch trainer trains with, and it is checked against the
TypeScript reference by tests/test_parity.py (every number within 1e-6 * max(1, |x|)).
It mirrors rlq/algorithms function by function, with the same names in snake_case.

Ragged per-sample arrays (one response per sample, lengths may be 0) are held as a
``Ragged``: one flat float64 array plus offsets, so every formula is vectorised over the
whole batch. Per-sample reductions add tokens in order (np.bincount), as the TypeScript
loops do.

The trainer uses ``policy_loss_terms``: given the current per-token log-probs and
entropies of a micro-batch, it returns the scalar loss, the exact d loss / d logp and
d loss / d H per token (torch's tie rules, as src/algorithms), and the metrics. The model
then backpropagates the surrogate sum(dlogp * logp) + sum(dH * H), exactly as the
embedded trainer does, so both trainers optimise the same objective.

The math lives in one module per concept and is re-exported here, so callers keep writing
``from . import algorithms as A; A.policy_loss_terms(...)``:

    algo_options.py   options, defaults, constants, AlgorithmError
    ragged.py         Ragged and per-sample reductions
    kl.py             KL estimators and their gradients
    advantages.py     reward post-processing, returns, GAE, advantages per estimator
    policy_loss.py    aggregation (denominators), policy loss terms, value loss
    logits_math.py    log-probs/entropy/gradient from logits, pass@k
"""

from __future__ import annotations

from .advantages import (  # noqa: F401
    compute_advantages_and_returns,
    discounted_returns,
    gae,
    group_normalize_rewards,
    group_positions,
    masked_whiten,
    post_process_rewards,
)
from .algo_options import (  # noqa: F401
    DEFAULT_OPTIONS,
    ESTIMATORS,
    GROUP_STD_EPS,
    KL_TYPES,
    LOW_VAR_KL_BOUND,
    MIS_LOG_RATIO_BOUND,
    WHITEN_EPS,
    AlgorithmError,
    effective_eps_clip_high,
    parse_options,
    resolved_mis_bounds,
    validate_options,
)
from .kl import approx_kl_with_grad, compute_approx_kl, kl_loss_with_grad  # noqa: F401
from .logits_math import log_probs_and_entropy_from_logits, logits_gradient, pass_at_k  # noqa: F401
from .policy_loss import (  # noqa: F401
    Aggregator,
    PolicyLossTerms,
    aggregate,
    cispo_loss,
    compute_mis_weights,
    gspo_kl,
    make_aggregator,
    opsm_mask,
    policy_loss_terms,
    ppo_clip,
    tis_per_token,
    value_loss_terms,
)
from .ragged import Ragged, masked_mean_per_sample  # noqa: F401

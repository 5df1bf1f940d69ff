"""The algorithm options (slime's flag names and defaults, src/algorithms/options.ts) and the math's constants and error."""

from __future__ import annotations

from typing import Any

GROUP_STD_EPS = 1e-6
WHITEN_EPS = 1e-8
LOW_VAR_KL_BOUND = 10.0
MIS_LOG_RATIO_BOUND = 20.0

ESTIMATORS = (
    "grpo",
    "gspo",
    "cispo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "ppo",
)
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")
LOSS_TYPES = ("policy_loss", "sft_loss")

# slime's defaults (src/algorithms/options.ts algorithmOptionsShape).
DEFAULT_OPTIONS: dict[str, Any] = {
    "advantage_estimator": "grpo",
    "rewards_normalization": True,
    "grpo_std_normalization": True,
    "reward_key": None,
    "kl_coef": 0.0,
    "gamma": 1.0,
    "lambd": 1.0,
    "normalize_advantages": False,
    "use_opd": False,
    "opd_kl_coef": 1.0,
    "eps_clip": 0.2,
    "eps_clip_high": None,
    "eps_clip_c": None,
    "value_clip": 0.2,
    "use_kl_loss": False,
    "kl_loss_coef": 0.0,
    "kl_loss_type": "k1",
    "use_unbiased_kl": False,
    "entropy_coef": 0.0,
    "calculate_per_token_loss": False,
    "use_opsm": False,
    "opsm_delta": 1e-4,
    "use_rollout_logprobs": False,
    "use_tis": False,
    "get_mismatch_metrics": False,
    "tis_clip": 2.0,
    "tis_clip_low": 0.0,
    "tis_function": "vanilla",
    "tis_level": "token",
    "tis_mode": "truncate",
    "tis_lower_bound": 0.5,
    "tis_upper_bound": 2.0,
    "use_rs": True,
    "rs_level": "token",
    "rs_lower_bound": None,
    "rs_upper_bound": None,
    "rs_veto_threshold": 1e-4,
    "tis_batch_normalize": True,
    # slime's --loss-type: policy_loss (RL) or sft_loss (sft.py).
    "loss_type": "policy_loss",
}


class AlgorithmError(ValueError):
    """A user or programming error in the inputs (never retried): algo_* codes."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


def parse_options(options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Defaults applied; keys the math does not know are kept (a run config carries many)."""
    o = dict(DEFAULT_OPTIONS)
    o.update(options or {})
    if o["advantage_estimator"] not in ESTIMATORS:
        raise AlgorithmError(
            "algo_bad_argument",
            f'unknown advantage_estimator "{o["advantage_estimator"]}"',
        )
    if o["kl_loss_type"] not in KL_TYPES:
        raise AlgorithmError(
            "algo_bad_argument", f'unknown kl_loss_type "{o["kl_loss_type"]}"'
        )
    if o["loss_type"] not in LOSS_TYPES:
        raise AlgorithmError(
            "algo_bad_argument",
            f'unknown loss_type "{o["loss_type"]}": expected policy_loss or sft_loss',
        )
    if o["tis_function"] not in ("vanilla", "icepop", "mis"):
        raise AlgorithmError(
            "algo_bad_argument", f'unknown tis_function "{o["tis_function"]}"'
        )
    return o


def validate_options(o: dict[str, Any]) -> None:
    """slime's cross-field asserts (refineAlgorithmOptions)."""
    if o["eps_clip_c"] is not None and not (o["eps_clip_c"] > 1):
        raise AlgorithmError(
            "algo_bad_argument", f"eps_clip_c must be > 1, got {o['eps_clip_c']}"
        )
    if o["kl_coef"] != 0 and o["kl_loss_coef"] != 0:
        raise AlgorithmError(
            "algo_bad_argument",
            "only one of kl_coef and kl_loss_coef can be non-zero (slime)",
        )
    if (
        o["advantage_estimator"]
        in ("reinforce_plus_plus", "reinforce_plus_plus_baseline")
        and not o["normalize_advantages"]
    ):
        raise AlgorithmError(
            "algo_bad_argument",
            f"{o['advantage_estimator']} requires normalize_advantages: true (slime)",
        )
    if o["use_rollout_logprobs"] and o["use_tis"]:
        raise AlgorithmError(
            "algo_bad_argument",
            "use_tis cannot be combined with use_rollout_logprobs (slime)",
        )


def effective_eps_clip_high(o: dict[str, Any]) -> float:
    return o["eps_clip"] if o["eps_clip_high"] is None else o["eps_clip_high"]


def resolved_mis_bounds(o: dict[str, Any]):
    tis_lower = (
        o["tis_lower_bound"]
        if o["tis_lower_bound"] is not None
        else 1.0 / o["tis_upper_bound"]
    )
    rs_lower = o["rs_lower_bound"] if o["rs_lower_bound"] is not None else tis_lower
    rs_upper = (
        o["rs_upper_bound"] if o["rs_upper_bound"] is not None else o["tis_upper_bound"]
    )
    return tis_lower, o["tis_upper_bound"], rs_lower, rs_upper

"""On-policy distillation's input to the advantage: the teacher's per-token log-probs.

The teacher engine scores each sample's response tokens (src/engines/teacher.ts); they travel in the
batch as `teacher_log_probs` (batch.py) and enter compute_advantages_and_returns (advantages.py), which
subtracts opd_kl_coef * (log pi_student - log pi_teacher) from A_t as slime does
(slime/backends/megatron_utils/loss.py compute_advantages_and_returns).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .batch import Sample
from .ragged import Ragged
from .train_config import bad_request


def opd_teacher_log_probs(
    o: dict[str, Any], samples: list[Sample], shape: Ragged
) -> Ragged | None:
    """The batch's teacher log-probs shaped like the loss mask, or None without use_opd."""
    if not o["use_opd"]:
        return None
    rows = []
    for s in samples:
        if s.teacher_log_probs is None:
            raise bad_request(
                f"use_opd: sample {s.sample_index} of group {s.group_index} has no teacher_log_probs in the batch"
            )
        rows.append(s.teacher_log_probs.astype(np.float64))
    flat = np.concatenate(rows) if rows else np.zeros(0)
    return shape.like(flat)

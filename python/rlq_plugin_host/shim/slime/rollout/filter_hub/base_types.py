"""slime's dynamic-filter verdict (slime/rollout/filter_hub/base_types.py, THUDM/slime)."""

from dataclasses import dataclass


@dataclass
class DynamicFilterOutput:
    keep: bool
    reason: str | None = None
    # Keep a rejected group when dropping it would start another over-sampling round.
    keep_when_insufficient: bool = False

"""slime's `Sample` as a slime plugin sees it (fields, Status enum, methods).

Follows slime/utils/types.py (THUDM/slime); torch-free, since rlq's plugin host
needs only the standard library. Fields rlq has no value for keep slime's
defaults.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass
class Sample:
    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_routed_experts: list[list[int]] | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        out["status"] = self.status.value
        return out

    @staticmethod
    def from_dict(data: dict) -> "Sample":
        data = dict(data)
        if "status" in data:
            data["status"] = Sample.Status(data["status"])
        known = set(Sample.__dataclass_fields__)
        sample = Sample(**{k: v for k, v in data.items() if k in known})
        for k, v in data.items():
            if k not in known:
                setattr(sample, k, v)
        return sample

    def get_reward_value(self, args) -> float:
        key = getattr(args, "reward_key", None)
        return self.reward if not key else self.reward[key]

    @property
    def effective_response_length(self) -> int:
        return (
            sum(self.loss_mask) if self.loss_mask is not None else self.response_length
        )

"""The PPO critic (``advantage_estimator: ppo``): a value model beside the policy.

A separate model, as slime's and verl's critics: the embedded GPT trunk, initialised from the
policy's start weights (slime loads the critic from the actor checkpoint when there is no
critic checkpoint yet), plus a linear value head ``value_head.weight`` [d, 1] and
``value_head.bias`` [1] initialised to zero (so the first values are 0). The value of
response token j is read where the policy reads its logits: the hidden state at position
prompt_length - 1 + j, the state before token j is generated.

Checkpoints: ``critic/weights.safetensors`` (format ``rlq-critic-v1``: the trunk under rlq's
names plus the head, F32) and ``critic/optimizer.safetensors`` (rlq-adamw-v1) inside the step's
output directory, written before the policy's files, so a committed step always carries its
critic. Only the embedded model family has a critic here.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from . import gpt
from .batch import Sample
from .safetensors_io import read_metadata, read_safetensors, write_safetensors

CRITIC_DIR = "critic"
CRITIC_FORMAT = "rlq-critic-v1"
HEAD = ("value_head.weight", "value_head.bias")


class CriticError(Exception):
    pass


class Critic:
    def __init__(self, config: Dict, trunk: Dict[str, torch.Tensor], head_w: torch.Tensor, head_b: torch.Tensor, device: torch.device):
        self.config = gpt.parse_model_config(config)
        self.module = gpt.RlqGpt(self.config, trunk).to(device)
        self.head_w = nn.Parameter(head_w.detach().to(torch.float32).clone().reshape(self.config["d_model"], 1).to(device))
        self.head_b = nn.Parameter(head_b.detach().to(torch.float32).clone().reshape(1).to(device))
        self.device = device
        # head.weight (the LM head) is not on the value path: no gradient, never updated (and not in DDP's reduction).
        self._params = [(n, p) for n, p in self.module.canonical if n != "head.weight"] + [(HEAD[0], self.head_w), (HEAD[1], self.head_b)]
        self._lm_head = dict(self.module.canonical)["head.weight"]
        self._lm_head.requires_grad_(False)
        self.net = ValueNet(self.module, self.head_w, self.head_b)

    @staticmethod
    def from_policy(policy, device: torch.device) -> "Critic":
        if getattr(policy, "kind", None) != "embedded":
            raise CriticError("the PPO critic is implemented for the embedded model family only (not for Hugging Face models yet)")
        trunk = {n: p.detach().clone() for n, p in policy.named_params()}
        d = policy.config["d_model"]
        return Critic(policy.config, trunk, torch.zeros(d, 1), torch.zeros(1), device)

    def named_params(self) -> List[Tuple[str, nn.Parameter]]:
        return self._params

    def values(self, samples: List[Sample], grad: bool, fwd=None) -> torch.Tensor:
        """Flat per-response-token values (float32, in sample order); ``fwd``: the DDP-wrapped ``net`` on many ranks."""
        L = max(max(len(s.tokens) - 1 for s in samples), 1)
        ids = torch.zeros((len(samples), L), dtype=torch.long)
        rows, cols = [], []
        for i, s in enumerate(samples):
            n = len(s.tokens)
            if n > 1:
                ids[i, :n - 1] = torch.from_numpy(s.tokens[:n - 1].astype(np.int64))
            r = s.response_length
            if r > 0:
                rows.append(np.full(r, i))
                cols.append(np.arange(s.prompt_length - 1, s.prompt_length - 1 + r))
        if not rows:
            return torch.zeros(0, device=self.device)
        rows_t = torch.from_numpy(np.concatenate(rows)).to(self.device)
        cols_t = torch.from_numpy(np.concatenate(cols)).to(self.device)
        with (torch.enable_grad() if grad else torch.no_grad()):
            return (fwd or self.net)(ids.to(self.device), rows_t, cols_t).float()

    def zero_backward(self, fwd) -> None:
        """A backward with zero gradients (a rank with no micro-batch left still joins DDP's all-reduce)."""
        z = torch.zeros(1, dtype=torch.long, device=self.device)
        (fwd(torch.zeros((1, 1), dtype=torch.long, device=self.device), z, z).sum() * 0.0).backward()

    def save_optimizer(self, out_dir: str, version: int, run_id: str, step: int, moments, iteration: int, owner: Dict[str, int],
                       rank: int, shard: Optional[Tuple[int, int]]) -> None:
        """critic/optimizer.safetensors, or this rank's shard of it (the same layout as the policy's)."""
        from .models import write_optimizer

        d = os.path.join(out_dir, CRITIC_DIR)
        os.makedirs(d, exist_ok=True)
        write_optimizer(d, [(n, p) for n, p in self._params if owner[n] == rank], moments, iteration, version, run_id, step, {}, shard=shard)

    def save_weights(self, out_dir: str, version: int, run_id: str, step: int) -> None:
        d = os.path.join(out_dir, CRITIC_DIR)
        os.makedirs(d, exist_ok=True)
        tensors = [(n, p.detach()) for n, p in self.module.canonical] + [(HEAD[0], self.head_w.detach()), (HEAD[1], self.head_b.detach())]
        meta = {"format": CRITIC_FORMAT, "version": str(version), "run": run_id, "step": str(step), "config": gpt.config_json(self.config)}
        write_safetensors(os.path.join(d, "weights.safetensors"), tensors, meta)


class ValueNet(nn.Module):
    """The value path as one module (what DistributedDataParallel wraps): values at the response positions."""

    def __init__(self, trunk: nn.Module, head_w: nn.Parameter, head_b: nn.Parameter):
        super().__init__()
        self.trunk = trunk
        self.head_w = head_w
        self.head_b = head_b

    def forward(self, ids, rows, cols):
        h = self.trunk.hidden_states(ids)[rows, cols]
        return (h @ self.head_w + self.head_b)[:, 0]


def load_critic(checkpoint_dir: str, device: torch.device, names_for=None, shard: Optional[Tuple[int, int]] = None) -> Optional[Tuple[Critic, Optional[Tuple[int, Dict[str, Tuple[torch.Tensor, torch.Tensor]]]]]]:
    """(critic, (iteration, moments) or None) from ``checkpoint_dir/critic``, or None when the checkpoint has no critic."""
    from .models import read_optimizer

    d = os.path.join(checkpoint_dir, CRITIC_DIR)
    f = os.path.join(d, "weights.safetensors")
    if not os.path.isfile(f):
        return None
    meta = read_metadata(f)
    if meta.get("format") != CRITIC_FORMAT:
        raise CriticError(f"{f}: metadata.format is {meta.get('format')!r}, expected {CRITIC_FORMAT}")
    _, tensors = read_safetensors(f)
    head_w, head_b = tensors.pop(HEAD[0]), tensors.pop(HEAD[1])
    critic = Critic(json.loads(meta["config"]), tensors, head_w, head_b, device)
    names = [n for n, _ in critic.named_params()] if names_for is None else names_for(critic)
    opt = read_optimizer(d, names, shard=shard)
    if opt is None:
        return critic, None
    iteration, moments, _ = opt
    return critic, (iteration, {n: (m.to(device, torch.float32), v.to(device, torch.float32)) for n, (m, v) in moments.items()})

"""The PPO critic (``advantage_estimator: ppo``): a value model beside the policy.

A separate model, as slime's and verl's critics: the policy's trunk, initialised from the policy's
start weights (slime loads the critic from the actor checkpoint when there is no critic checkpoint
yet), plus a linear value head ``value_head.weight`` [d, 1] and ``value_head.bias`` [1] initialised
to zero (so the first values are 0). The trunk is the embedded GPT (without its LM head), or a
Hugging Face policy's base model (``model.base_model``, e.g. Qwen2Model: the decoder and its final
norm, no LM head), built from the policy's config. The value of response token j is read where the
policy reads its logits: the hidden state at position prompt_length - 1 + j, the state before
token j is generated.

Checkpoints: ``critic/weights.safetensors`` and ``critic/optimizer.safetensors`` (rlq-adamw-v1)
inside the step's output directory, written before the policy's files, so a committed step always
carries its critic. The weights file is F32 and holds the trunk plus the head; its metadata
``config`` rebuilds the trunk: format ``rlq-critic-v1`` for the embedded model (rlq's tensor names,
the GPT config), ``rlq-hf-critic-v1`` for a HF model (the base model's parameter names, the HF
config as JSON).
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import torch
from torch import nn

from . import gpt
from .batch import Sample
from .safetensors_io import read_metadata, read_safetensors, write_safetensors

CRITIC_DIR = "critic"
CRITIC_FORMAT = "rlq-critic-v1"
HF_CRITIC_FORMAT = "rlq-hf-critic-v1"
HEAD = ("value_head.weight", "value_head.bias")


class CriticError(Exception):
    pass


class Critic:
    """The value model: ``trunk`` (hidden states [B, T, d]), its trained parameters ``trunk_params``, and the head."""

    def __init__(
        self,
        trunk: nn.Module,
        trunk_params: list[tuple[str, nn.Parameter]],
        d_model: int,
        head_w: torch.Tensor,
        head_b: torch.Tensor,
        device: torch.device,
        meta: dict[str, str],
    ):
        self.module = trunk.to(device)
        self.head_w = nn.Parameter(
            head_w.detach().to(torch.float32).clone().reshape(d_model, 1).to(device)
        )
        self.head_b = nn.Parameter(
            head_b.detach().to(torch.float32).clone().reshape(1).to(device)
        )
        self.device = device
        self.meta = meta  # format and config: what load_critic rebuilds the trunk from
        self._params = list(trunk_params) + [
            (HEAD[0], self.head_w),
            (HEAD[1], self.head_b),
        ]
        self.net = ValueNet(self.module, self.head_w, self.head_b)

    @staticmethod
    def embedded(
        config: dict,
        trunk: dict[str, torch.Tensor],
        head_w: torch.Tensor,
        head_b: torch.Tensor,
        device: torch.device,
    ) -> Critic:
        config = gpt.parse_model_config(config)
        module = gpt.RlqGpt(config, trunk)
        # head.weight (the LM head) is not on the value path: no gradient, never updated (and not in DDP's reduction).
        lm_head = dict(module.canonical)["head.weight"]
        lm_head.requires_grad_(False)
        params = [(n, p) for n, p in module.canonical if n != "head.weight"]
        return Critic(
            module,
            params,
            config["d_model"],
            head_w,
            head_b,
            device,
            {"format": CRITIC_FORMAT, "config": gpt.config_json(config)},
        )

    @staticmethod
    def hf(
        config,
        trunk: dict[str, torch.Tensor],
        head_w: torch.Tensor,
        head_b: torch.Tensor,
        device: torch.device,
    ) -> Critic:
        """``config``: a transformers config; ``trunk``: the base model's tensors by name."""
        from transformers import AutoModel

        # transformers initialises the new module at random before the trunk's weights are copied in: on a forked
        # generator, so building a critic (from the policy, or reloaded after a restart) leaves torch's own untouched.
        with torch.random.fork_rng(devices=[]):
            module = AutoModel.from_config(config, dtype=torch.float32)
        missing, unexpected = module.load_state_dict(trunk, strict=False)
        # Non-persistent buffers (rotary inv_freq) are rebuilt by the constructor; every parameter must be in the file.
        missing = [n for n in missing if n in dict(module.named_parameters())]
        if missing or unexpected:
            raise CriticError(
                f"the critic's trunk does not match its config: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        module.train()
        return Critic(
            module,
            list(module.named_parameters()),
            int(config.hidden_size),
            head_w,
            head_b,
            device,
            {
                "format": HF_CRITIC_FORMAT,
                "config": config.to_json_string(use_diff=False),
            },
        )

    @staticmethod
    def from_policy(policy, device: torch.device) -> Critic:
        if policy.kind == "embedded":
            trunk = {n: p.detach().clone() for n, p in policy.named_params()}
            d = policy.config["d_model"]
            return Critic.embedded(
                policy.config, trunk, torch.zeros(d, 1), torch.zeros(1), device
            )
        base = policy.module.base_model
        trunk = {n: p.detach().clone() for n, p in base.named_parameters()}
        config = copy.deepcopy(policy.module.config)
        return Critic.hf(
            config, trunk, torch.zeros(config.hidden_size, 1), torch.zeros(1), device
        )

    def named_params(self) -> list[tuple[str, nn.Parameter]]:
        return self._params

    def values(self, samples: list[Sample], grad: bool, fwd=None) -> torch.Tensor:
        """Flat per-response-token values (float32, in sample order); ``fwd``: the DDP-wrapped ``net`` on many ranks."""
        L = max(max(len(s.tokens) - 1 for s in samples), 1)
        ids = torch.zeros((len(samples), L), dtype=torch.long)
        rows, cols = [], []
        for i, s in enumerate(samples):
            n = len(s.tokens)
            if n > 1:
                ids[i, : n - 1] = torch.from_numpy(s.tokens[: n - 1].astype(np.int64))
            r = s.response_length
            if r > 0:
                rows.append(np.full(r, i))
                cols.append(np.arange(s.prompt_length - 1, s.prompt_length - 1 + r))
        if not rows:
            return torch.zeros(0, device=self.device)
        rows_t = torch.from_numpy(np.concatenate(rows)).to(self.device)
        cols_t = torch.from_numpy(np.concatenate(cols)).to(self.device)
        with torch.enable_grad() if grad else torch.no_grad():
            return (fwd or self.net)(ids.to(self.device), rows_t, cols_t).float()

    def zero_backward(self, fwd) -> None:
        """A backward with zero gradients (a rank with no micro-batch left still joins DDP's all-reduce)."""
        z = torch.zeros(1, dtype=torch.long, device=self.device)
        (
            fwd(torch.zeros((1, 1), dtype=torch.long, device=self.device), z, z).sum()
            * 0.0
        ).backward()

    def save_optimizer(
        self,
        out_dir: str,
        version: int,
        run_id: str,
        step: int,
        moments,
        iteration: int,
        owner: dict[str, int],
        rank: int,
        shard: tuple[int, int] | None,
    ) -> None:
        """critic/optimizer.safetensors, or this rank's shard of it (the same layout as the policy's)."""
        from .models import write_optimizer

        d = os.path.join(out_dir, CRITIC_DIR)
        os.makedirs(d, exist_ok=True)
        write_optimizer(
            d,
            [(n, p) for n, p in self._params if owner[n] == rank],
            moments,
            iteration,
            version,
            run_id,
            step,
            {},
            shard=shard,
        )

    def save_weights(self, out_dir: str, version: int, run_id: str, step: int) -> None:
        d = os.path.join(out_dir, CRITIC_DIR)
        os.makedirs(d, exist_ok=True)
        trunk = (
            self.module.canonical
            if isinstance(self.module, gpt.RlqGpt)
            else list(self.module.named_parameters())
        )
        tensors = [(n, p.detach()) for n, p in trunk] + [
            (HEAD[0], self.head_w.detach()),
            (HEAD[1], self.head_b.detach()),
        ]
        meta = {
            "format": self.meta["format"],
            "version": str(version),
            "run": run_id,
            "step": str(step),
            "config": self.meta["config"],
        }
        write_safetensors(os.path.join(d, "weights.safetensors"), tensors, meta)


class ValueNet(nn.Module):
    """The value path as one module (what DistributedDataParallel wraps): values at the response positions."""

    def __init__(self, trunk: nn.Module, head_w: nn.Parameter, head_b: nn.Parameter):
        super().__init__()
        self.trunk = trunk
        self.head_w = head_w
        self.head_b = head_b

    def forward(self, ids, rows, cols):
        if isinstance(self.trunk, gpt.RlqGpt):
            h = self.trunk.hidden_states(ids)
        else:  # a HF base model: [B, T, d] after its final norm (right padding: causal attention never reads it)
            h = self.trunk(input_ids=ids, use_cache=False).last_hidden_state
        return (h[rows, cols] @ self.head_w + self.head_b)[:, 0]


def load_critic(
    checkpoint_dir: str,
    device: torch.device,
    names_for=None,
    shard: tuple[int, int] | None = None,
) -> (
    tuple[Critic, tuple[int, dict[str, tuple[torch.Tensor, torch.Tensor]]] | None]
    | None
):
    """(critic, (iteration, moments) or None) from ``checkpoint_dir/critic``, or None when the checkpoint has no critic."""
    from .models import read_optimizer

    d = os.path.join(checkpoint_dir, CRITIC_DIR)
    f = os.path.join(d, "weights.safetensors")
    if not os.path.isfile(f):
        return None
    meta = read_metadata(f)
    if meta.get("format") not in (CRITIC_FORMAT, HF_CRITIC_FORMAT):
        raise CriticError(
            f"{f}: metadata.format is {meta.get('format')!r}, expected {CRITIC_FORMAT} or {HF_CRITIC_FORMAT}"
        )
    _, tensors = read_safetensors(f)
    head_w, head_b = tensors.pop(HEAD[0]), tensors.pop(HEAD[1])
    if meta["format"] == CRITIC_FORMAT:
        critic = Critic.embedded(
            json.loads(meta["config"]), tensors, head_w, head_b, device
        )
    else:
        from transformers import AutoConfig

        cfg = json.loads(meta["config"])
        critic = Critic.hf(
            AutoConfig.for_model(cfg.pop("model_type"), **cfg),
            tensors,
            head_w,
            head_b,
            device,
        )
    names = (
        [n for n, _ in critic.named_params()]
        if names_for is None
        else names_for(critic)
    )
    opt = read_optimizer(d, names, shard=shard)
    if opt is None:
        return critic, None
    iteration, moments, _ = opt
    return critic, (
        iteration,
        {
            n: (m.to(device, torch.float32), v.to(device, torch.float32))
            for n, (m, v) in moments.items()
        },
    )

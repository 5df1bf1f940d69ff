"""LoRA RL for Hugging Face models through peft: the run-config keys, the wrapped policy, its merged weights and its adapter.

The keys follow verl's ``actor_rollout_ref.model.lora_rank / lora_alpha / target_modules`` (verl/trainer/config, with
``lora_rank: 0`` meaning off and ``target_modules: all-linear``) and peft's LoraConfig (``lora_dropout``).

How it fits the trainer:

- the policy is an HFPolicy whose module has peft's LoRA layers injected (``peft.get_peft_model``); its
  ``named_params()`` are the adapter parameters only, so the optimizer, the gradient clip, the owners of ZeRO-1
  shards, FSDP's moment shards and the optimizer checkpoint all see the adapters and nothing else. The base
  weights are frozen and stay those of ``hf_checkpoint``;
- ``engine_params()`` are the merged weights (base + peft's own ``get_delta_weight``) under the model's HF names,
  what peft's ``merge_and_unload`` gives; the weights file, the disk sync and the push paths send these, so an
  engine serves the merged model at every version with its names unchanged;
- a checkpoint directory holds, beside the merged weights, ``adapter/`` in peft's ``save_pretrained`` layout
  (``adapter_config.json`` + ``adapter_model.safetensors``, fp32), which a user loads with
  ``PeftModel.from_pretrained(base, dir/adapter)`` and from which a resume rebuilds the policy (base from
  ``hf_checkpoint``, adapters bit-exact, moments from the optimizer file as for a full fine-tune).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from .models import CheckpointError, HFPolicy, load_hf_dir, path_from_uri

ADAPTER_DIR = "adapter"
ADAPTER_NAME = "default"  # peft's adapter name when none is given
_PEFT_PREFIX = "base_model.model."  # PeftModel -> LoraModel -> the HF model


@dataclass(frozen=True)
class LoraOptions:
    rank: int
    alpha: float
    dropout: float
    target_modules: Any  # a list of module names, or "all-linear"


def parse(c: dict[str, Any], t: Any) -> LoraOptions | None:
    """The LoRA keys of a run config (None when lora_rank is 0 or absent); raises ValueError naming the bad key."""
    rank = c.get("lora_rank", 0)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(
            f"config.lora_rank = {rank!r}: expected an integer >= 0 (0: no LoRA, e.g. 8 or 16)"
        )
    extra = [
        k
        for k in ("lora_alpha", "lora_dropout", "target_modules")
        if k in c and c[k] is not None
    ]
    if rank == 0:
        if extra:
            raise ValueError(
                f"config.{extra[0]} is set but lora_rank is 0 (LoRA off): set lora_rank (e.g. 8) or drop {', '.join(extra)}"
            )
        return None
    alpha = _or(c, "lora_alpha", 16)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise ValueError(
            f"config.lora_alpha = {alpha!r}: expected a number > 0 (e.g. 16; the scale is alpha / rank)"
        )
    dropout = _or(c, "lora_dropout", 0.0)
    if (
        isinstance(dropout, bool)
        or not isinstance(dropout, (int, float))
        or not 0 <= dropout < 1
    ):
        raise ValueError(
            f"config.lora_dropout = {dropout!r}: expected a number in [0, 1)"
        )
    target = _or(c, "target_modules", "all-linear")
    if target != "all-linear" and (
        not isinstance(target, list)
        or not target
        or not all(isinstance(x, str) and x for x in target)
    ):
        raise ValueError(
            f'config.target_modules = {target!r}: expected "all-linear" or a non-empty list of module names (e.g. ["q_proj", "v_proj"])'
        )
    if t.hf_checkpoint is None:
        raise ValueError(
            "config.lora_rank needs a Hugging Face model (hf_checkpoint): the embedded model has no peft LoRA; "
            "set hf_checkpoint or lora_rank: 0"
        )
    par = getattr(t, "parallel", None)
    if par is not None and (getattr(par, "tp", 1) or 1) > 1:
        raise ValueError(
            "config.lora_rank with tensor_model_parallel_size > 1 is not supported: set one of them back"
        )
    return LoraOptions(
        rank,
        float(alpha),
        float(dropout),
        target if isinstance(target, str) else list(target),
    )


def _or(c: dict[str, Any], key: str, default):
    """The key's value; absent or null (the run config's default): ``default``."""
    v = c.get(key)
    return default if v is None else v


def peft_config(o: LoraOptions):
    from peft import LoraConfig

    return LoraConfig(
        r=o.rank,
        lora_alpha=o.alpha,
        lora_dropout=o.dropout,
        target_modules=o.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def wrap(policy, o: LoraOptions, seed: int):
    """The HFPolicy given LoRA adapters (peft's initialisation: A random from ``seed``, B zero, so version 0 is the base)."""
    from peft import get_peft_model

    if not isinstance(policy, HFPolicy):
        raise ValueError(f"LoRA needs a Hugging Face model, not a {policy.kind} policy")
    torch.manual_seed(seed)
    try:
        peft_model = get_peft_model(policy.module, peft_config(o))
    except ValueError as e:
        raise ValueError(f"config.target_modules {o.target_modules!r}: {e}") from e
    policy.__class__ = LoraPolicy
    policy.peft = peft_model
    policy.adapter_names = frozenset(
        n for n, p in policy.module.named_parameters() if p.requires_grad
    )
    policy.lora = o
    policy.module.train()
    return policy


def load(path: str, t: Any, device: torch.device, version: int):
    """(policy, fresh) for a LoRA step starting from checkpoint ``path``:

    - a LoRA checkpoint (``adapter/``): its base (the adapter config's ``base_model_name_or_path``, the directory
      the run started from; else hf_checkpoint) with the adapters bit-exact (fp32); fresh is False;
    - at version 0, a plain HF directory (rlq passes ref_load as the first checkpoint): it is the base, the adapters
      start from peft's initialisation and fresh is True (its optimizer state, if any, belongs to other weights)."""
    f = os.path.join(path, ADAPTER_DIR, "adapter_model.safetensors")
    if not os.path.isfile(f):
        if version == 0:
            return wrap(load_hf_dir(path, device), t.lora, t.seed), True
        raise CheckpointError(
            f"{path}: no {ADAPTER_DIR}/adapter_model.safetensors, so it is not a LoRA checkpoint (lora_rank was 0 when "
            f"version {version} was written): resume it with lora_rank 0, or start LoRA from version 0"
        )
    base = None
    try:
        with open(os.path.join(path, ADAPTER_DIR, "adapter_config.json")) as fh:
            base = json.load(fh).get("base_model_name_or_path")
    except (OSError, ValueError):
        base = None
    if not (isinstance(base, str) and os.path.isdir(base)):
        if t.hf_checkpoint is None:
            raise CheckpointError(
                f"{path}: its adapter's base model is not a directory here ({base!r}) and the config has no hf_checkpoint"
            )
        base = path_from_uri(t.hf_checkpoint)
    policy = wrap(load_hf_dir(base, device), t.lora, t.seed)
    policy.load_adapter_file(f)
    return policy, False


def _merged(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The weights peft's merge_and_unload leaves, under the HF names: each LoRA layer's base weight plus its
    get_delta_weight (peft/tuners/lora/layer.py, Linear.merge), every other parameter as it is."""
    from peft.tuners.lora import LoraLayer

    deltas = {}
    for mname, m in module.named_modules():
        if isinstance(m, LoraLayer) and ADAPTER_NAME in m.lora_A:
            deltas[f"{mname}.base_layer.weight"] = m
    out = []
    with torch.no_grad():
        for n, p in module.named_parameters():
            if ".lora_" in n:
                continue
            m = deltas.get(n)
            w = (
                p.detach()
                if m is None
                else p.detach() + m.get_delta_weight(ADAPTER_NAME).to(p.dtype)
            )
            out.append((n.replace(".base_layer.", "."), w))
    return out


class LoraPolicy(HFPolicy):
    """An HFPolicy with peft LoRA layers injected (made by wrap)."""

    peft: Any
    lora: LoraOptions
    adapter_names: frozenset[str]

    def named_params(self):
        """The adapters only: what the optimizer updates and its checkpoint holds."""
        # By name, not requires_grad: the trainer clears that flag between steps (trainer.py, the step's save)
        return [
            (n, p) for n, p in self.module.named_parameters() if n in self.adapter_names
        ]

    def engine_params(self):
        """The merged weights under the model's HF names (what engines load)."""
        return _merged(self.module)

    def _engine_params(self):
        return self.engine_params()

    def adapter_state(self) -> OrderedDict:
        """peft's own adapter state dict (the keys save_pretrained writes), from the parameters as they stand."""
        from peft.utils import get_peft_model_state_dict

        full = {_PEFT_PREFIX + n: p.detach() for n, p in self.module.named_parameters()}
        sd = get_peft_model_state_dict(
            self.peft, state_dict=full, adapter_name=ADAPTER_NAME
        )
        return OrderedDict(
            (k, v.to(torch.float32).contiguous().cpu()) for k, v in sorted(sd.items())
        )

    def save_adapter(self, out_dir: str) -> str:
        """out_dir/adapter in peft's save_pretrained layout; returns the directory."""
        from safetensors.torch import save_file

        d = os.path.join(out_dir, ADAPTER_DIR)
        os.makedirs(d, exist_ok=True)
        self.peft.peft_config[ADAPTER_NAME].save_pretrained(d)
        tmp = os.path.join(d, f"adapter_model.safetensors.tmp-{os.getpid()}")
        save_file(self.adapter_state(), tmp, metadata={"format": "pt"})
        os.replace(tmp, os.path.join(d, "adapter_model.safetensors"))
        return d

    def load_adapter_file(self, f: str) -> None:
        from peft.utils import set_peft_model_state_dict
        from safetensors.torch import load_file

        res = set_peft_model_state_dict(
            self.peft, load_file(f), adapter_name=ADAPTER_NAME
        )
        missing = [k for k in res.missing_keys if ".lora_" in k]
        if missing:
            raise CheckpointError(
                f"{f}: no tensors for {len(missing)} adapter parameter(s) (e.g. {missing[0]}): written with other "
                "lora_rank / target_modules than this run's"
            )

    def save(
        self,
        out_dir: str,
        version: int,
        run_id: str,
        step: int,
        dtype=None,
        extra_meta=None,
    ):
        super().save(
            out_dir,
            version,
            run_id,
            step,
            dtype,
            {**(extra_meta or {}), "rlq_lora": "1"},
        )
        self.save_adapter(out_dir)
        return {}  # the adapters are saved fp32: no masters needed

    def load_masters(self, masters) -> None:
        return None

    def describe(self) -> dict:
        return {**super().describe(), "lora_rank": self.lora.rank}

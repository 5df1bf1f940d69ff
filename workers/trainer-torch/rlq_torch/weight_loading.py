"""The weights a step starts from: held in memory, reloaded from checkpoint_uri_in (with this rank's optimizer shard), or initialised; and the frozen reference policy."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from . import fsdp as fsdp_mod
from . import gpt
from .models import (
    CheckpointError,
    EmbeddedPolicy,
    checkpoint_kind,
    checkpoint_version,
    load_hf_dir,
    load_policy,
    path_from_uri,
    read_optimizer,
)
from .train_config import TrainConfig, bad_request


@dataclass
class Held:
    policy: Any
    moments: dict[str, tuple[torch.Tensor, torch.Tensor]]
    iteration: int
    version: int
    path: str | None
    critic: Any = (
        None  # ppo: the value model, its Adam moments and iteration (critic.py)
    )
    critic_moments: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
    critic_iteration: int = 0


class WeightLoading:
    """TorchTrainer's loading half (a mixin: it uses self.device, self.dist, self.held, self.ref_cache, self.memory and the DDP caches)."""

    def _init_policy(self, t: TrainConfig):
        """Version 0 without a checkpoint: hf_checkpoint, else the embedded model from seed."""
        if t.hf_checkpoint:
            policy = load_hf_dir(path_from_uri(t.hf_checkpoint), self.device)
            if t.lora is not None:
                from .lora import wrap

                return wrap(policy, t.lora, t.seed)
            return policy
        if t.model is None:
            raise bad_request(
                "checkpoint_uri_in is null and the config has no model to initialise (set model: {...}, hf_checkpoint or ref_load, "
                "or start the server with --model-config / --hf-checkpoint)"
            )
        return EmbeddedPolicy(t.model, gpt.init_weights(t.model, t.seed), self.device)

    def held_serves(self, req: dict[str, Any]) -> bool:
        """The held weights are the step's start: the version and checkpoint it names (``_start`` keeps them)."""
        h, uri = self.held, req["checkpoint_uri_in"]
        return (
            h is not None
            and uri is not None
            and h.path == os.path.realpath(path_from_uri(uri))
            and h.version == req["weight_version_in"]
        )

    def _start(self, req: dict[str, Any], t: TrainConfig, report) -> Held:
        uri = req["checkpoint_uri_in"]
        v_in = req["weight_version_in"]
        if uri is None:
            report("init")
            self.held = None
            self._ddp_cache = None
            self._critic_ddp_cache = None
            return Held(self._init_policy(t), {}, 0, 0, None)
        path = os.path.realpath(path_from_uri(uri))
        h = self.held
        if h is not None and self.held_serves(req):
            return h
        self.held = None
        self._ddp_cache = None
        self._critic_ddp_cache = None
        if h is not None:
            del h
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        pending = getattr(self, "async_ckpt", None)
        if pending is not None:
            pending.wait()  # a checkpoint this process is still writing (trainer_checkpoint.py) is read once it is whole
        report("load_checkpoint")
        kind, dir_ = checkpoint_kind(uri)
        stored = checkpoint_version(kind, dir_)
        if stored is not None and stored != v_in:
            raise bad_request(
                f"checkpoint {uri} holds weight version {stored}, the request says weight_version_in {v_in}"
            )
        if t.lora is not None:
            from . import lora

            policy, fresh = lora.load(dir_, t, self.device, v_in)
        else:
            policy, fresh = load_policy(dir_, self.device), False
        if self.fsdp:
            self._ddp(
                policy
            )  # shard first: the moments read below are this rank's shards of the parameters
        owner = self.dist.owners(policy.named_params())
        names = [
            n for n, _ in policy.named_params() if owner[n] == self.dist.rank
        ]  # sharded: this rank's moments only
        opt = (
            None
            if fresh
            else read_optimizer(
                dir_,
                names,
                shard=(self.dist.rank, self.dist.world),
                sharding=fsdp_mod.optimizer_sharding(self.dist)
                if self.fsdp
                else "zero1",
            )
        )
        moments: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        iteration = 0
        if opt is not None:
            iteration, raw, masters = opt
            params = dict(policy.named_params())
            for n in names:
                m, v = raw[n]
                shard = fsdp_mod.local(params[n])
                if list(m.shape) != list(shard.shape):
                    raise CheckpointError(
                        f"optimizer state for {n} has shape {list(m.shape)}, the weights {list(shard.shape)}"
                    )
                moments[n] = (
                    m.to(self.device, torch.float32),
                    v.to(self.device, torch.float32),
                )
            policy.load_masters(masters)
        return Held(policy, moments, iteration, v_in, path)

    def _reference(self, t: TrainConfig, start: Held):
        """The frozen reference policy for KL terms: ref_load, else hf_checkpoint, else the seed initialisation."""
        if t.ref_load:
            key = f"path:{os.path.realpath(path_from_uri(t.ref_load))}"
        elif t.hf_checkpoint:
            key = f"path:{os.path.realpath(path_from_uri(t.hf_checkpoint))}"
        elif t.model is not None:
            key = f"seed:{t.seed}:{gpt.config_json(t.model)}"
        else:
            raise bad_request(
                "use_kl_loss / kl_coef need a reference model: set ref_load"
            )
        ref = self.ref_cache.get(key)
        if ref is None:
            if key.startswith("path:"):
                ref = load_policy(key[5:], self.device)
            else:
                ref = EmbeddedPolicy(
                    t.model, gpt.init_weights(t.model, t.seed), self.device
                )
            for _, p in ref.named_params():
                p.requires_grad_(False)
            self.ref_cache.clear()
            self.ref_cache[key] = ref
        # Colocated mode: the offload after the last step moved it to CPU memory (offload.py).
        self.memory.onload_reference(ref, self.device)
        return ref

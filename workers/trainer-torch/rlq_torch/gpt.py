"""rlq's embedded model (docs/embedded-model.md, src/model/) in PyTorch.

GPT-2 style: pre-LayerNorm blocks, tanh-approximated GELU MLP, learned absolute positions,
untied output head without bias, no dropout. Matrices are stored [in, out] (y = x @ W + b),
the fused QKV matrix's columns are [q | k | v] with heads contiguous, and the parameter
names and canonical order are the checkpoint's (src/model/weights.ts parameterSpecs), so
rlq's `weights.safetensors` loads and saves without any renaming.

``init_weights(config, seed)`` reproduces src/model/weights.ts initWeights: GPT-2's
N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layers), each tensor from its own
xoshiro128** stream derived from (seed, name).
"""

from __future__ import annotations

import inspect
import json
import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

MODEL_FORMAT = "rlq-gpt-v1"
CONFIG_KEYS = (
    "vocab_size",
    "context_length",
    "d_model",
    "n_heads",
    "n_layers",
    "d_mlp",
    "layer_norm_eps",
)

M32 = 0xFFFFFFFF

try:  # torch >= 2.0 wants use_reentrant spelled out; 1.13's checkpoint has no such argument
    import torch.utils.checkpoint as _ckpt

    _CKPT_REENTRANT_ARG = (
        "use_reentrant" in inspect.signature(_ckpt.checkpoint).parameters
    )
except Exception:  # noqa: BLE001
    _CKPT_REENTRANT_ARG = False


def parse_model_config(value) -> dict:
    """modelConfigSchema: validates and fills layer_norm_eps; key order as the TypeScript schema."""
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError("model config must be an object")
    out: dict = OrderedDict()
    for k in CONFIG_KEYS[:-1]:
        v = value.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"model config: {k} must be a positive integer, got {v!r}")
        out[k] = v
    eps = value.get("layer_norm_eps", 1e-5)
    if not isinstance(eps, (int, float)) or eps <= 0:
        raise ValueError(f"model config: layer_norm_eps must be > 0, got {eps!r}")
    out["layer_norm_eps"] = eps
    if out["vocab_size"] < 2 or out["vocab_size"] > 65536:
        raise ValueError("model config: vocab_size must be in [2, 65536]")
    if out["context_length"] < 2 or out["context_length"] > 4096:
        raise ValueError("model config: context_length must be in [2, 4096]")
    if out["d_model"] % out["n_heads"] != 0:
        raise ValueError("model config: d_model must be divisible by n_heads")
    return out


def js_number(x) -> str:
    """A number as JavaScript's JSON.stringify writes it (1e-05 → 0.00001)."""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int) or (
        isinstance(x, float) and x.is_integer() and abs(x) < 1e21
    ):
        return str(int(x))
    r = repr(float(x))
    if "e" in r:
        mant, exp = r.split("e")
        e = int(exp)
        if -7 < e < 21:
            from decimal import Decimal

            return format(Decimal(r), "f")
        return f"{mant}e{'+' if e > 0 else '-'}{abs(e)}"
    return r


def config_json(config: dict) -> str:
    """JSON.stringify(config) byte for byte (the checkpoint's metadata.config)."""
    return "{" + ",".join(f'"{k}":{js_number(config[k])}' for k in CONFIG_KEYS) + "}"


def parameter_specs(c: dict) -> list[tuple[str, list[int], str]]:
    v, ctx, d, m = c["vocab_size"], c["context_length"], c["d_model"], c["d_mlp"]
    specs = [
        ("tok_emb.weight", [v, d], "normal"),
        ("pos_emb.weight", [ctx, d], "normal"),
    ]
    for layer in range(c["n_layers"]):
        p = f"blocks.{layer}."
        specs += [
            (f"{p}ln1.weight", [d], "ones"),
            (f"{p}ln1.bias", [d], "zeros"),
            (f"{p}attn.qkv.weight", [d, 3 * d], "normal"),
            (f"{p}attn.qkv.bias", [3 * d], "zeros"),
            (f"{p}attn.proj.weight", [d, d], "residual"),
            (f"{p}attn.proj.bias", [d], "zeros"),
            (f"{p}ln2.weight", [d], "ones"),
            (f"{p}ln2.bias", [d], "zeros"),
            (f"{p}mlp.fc.weight", [d, m], "normal"),
            (f"{p}mlp.fc.bias", [m], "zeros"),
            (f"{p}mlp.proj.weight", [m, d], "residual"),
            (f"{p}mlp.proj.bias", [d], "zeros"),
        ]
    specs += [
        ("ln_f.weight", [d], "ones"),
        ("ln_f.bias", [d], "zeros"),
        ("head.weight", [d, v], "normal"),
    ]
    return specs


# ---------------------------------------------------------------- src/model/prng.ts


def _imul(a: int, b: int) -> int:
    return (a * b) & M32


def _rotl(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & M32


def hash_string(text: str, seed: int = 0x811C9DC5) -> int:
    """FNV-1a over UTF-16 code units (JavaScript charCodeAt)."""
    h = seed & M32
    raw = text.encode("utf-16-le")
    for i in range(0, len(raw), 2):
        h ^= raw[i] | (raw[i + 1] << 8)
        h = _imul(h, 0x01000193)
    return h


def derive_seed(seed: int, label: str) -> int:
    return hash_string(label, (hash_string(str(seed & M32)) ^ 0x9E3779B9) & M32)


class Prng:
    """xoshiro128** seeded through splitmix32 (src/model/prng.ts)."""

    def __init__(self, seed: int):
        x = seed & M32
        state = []
        for _ in range(4):
            x = (x + 0x9E3779B9) & M32
            z = x
            z = _imul(z ^ (z >> 16), 0x85EBCA6B)
            z = _imul(z ^ (z >> 13), 0xC2B2AE35)
            state.append((z ^ (z >> 16)) & M32)
        if (state[0] | state[1] | state[2] | state[3]) == 0:
            state[0] = 1
        self.s = state
        self.spare = None

    def next_uint32(self) -> int:
        s0, s1, s2, s3 = self.s
        result = _imul(_rotl(_imul(s1, 5), 7), 9)
        t = (s1 << 9) & M32
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= t
        s3 = _rotl(s3, 11)
        self.s = [s0, s1, s2, s3]
        return result

    def next_float(self) -> float:
        hi = self.next_uint32() >> 5
        lo = self.next_uint32() >> 6
        return (hi * 67108864 + lo) / 9007199254740992

    def next_normal(self) -> float:
        if self.spare is not None:
            v = self.spare
            self.spare = None
            return v
        u = self.next_float()
        while u == 0:
            u = self.next_float()
        v = self.next_float()
        r = math.sqrt(-2 * math.log(u))
        self.spare = r * math.sin(2 * math.pi * v)
        return r * math.cos(2 * math.pi * v)


_INIT_CACHE: OrderedDict[tuple[str, int], OrderedDict[str, torch.Tensor]] = (
    OrderedDict()
)
_INIT_CACHE_SIZE = (
    2  # the policy's and the reference's initialisation are usually the same one
)


def init_weights(c: dict, seed: int) -> OrderedDict[str, torch.Tensor]:
    """initWeights(config, seed): float32 tensors in canonical order (fresh copies).

    The generator runs in pure Python (bit-identical to src/model/prng.ts), about 1 s for a tiny
    model, so the last two initialisations are kept: a step's policy and its reference, or a test's
    many trainers, initialise the same (config, seed) once per process."""
    key = (json.dumps(c, sort_keys=True), int(seed))
    hit = _INIT_CACHE.get(key)
    if hit is None:
        hit = _init_weights(c, seed)
        _INIT_CACHE[key] = hit
        while len(_INIT_CACHE) > _INIT_CACHE_SIZE:
            _INIT_CACHE.popitem(last=False)
    else:
        _INIT_CACHE.move_to_end(key)
    return OrderedDict((n, t.clone()) for n, t in hit.items())


def _init_weights(c: dict, seed: int) -> OrderedDict[str, torch.Tensor]:
    residual_std = 0.02 / math.sqrt(2 * c["n_layers"])
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for name, shape, kind in parameter_specs(c):
        n = 1
        for d in shape:
            n *= d
        if kind == "ones":
            t = torch.ones(n, dtype=torch.float32)
        elif kind == "zeros":
            t = torch.zeros(n, dtype=torch.float32)
        else:
            std = 0.02 if kind == "normal" else residual_std
            rng = Prng(derive_seed(seed, f"init:{name}"))
            vals = [rng.next_normal() * std for _ in range(n)]
            t = torch.tensor(vals, dtype=torch.float64).to(torch.float32)
        out[name] = t.reshape(shape)
    return out


# ---------------------------------------------------------------- the network


class RlqGpt(nn.Module):
    """The embedded model. ``canonical`` lists (checkpoint name, parameter) in canonical order."""

    def __init__(self, config: dict, weights: dict[str, torch.Tensor]):
        super().__init__()
        self.config = parse_model_config(config)
        self._names: list[str] = []
        for name, shape, _ in parameter_specs(self.config):
            w = weights.get(name)
            if w is None:
                raise ValueError(f'weights: missing tensor "{name}"')
            if list(w.shape) != shape and w.numel() == math.prod(shape):
                w = w.reshape(shape)
            if list(w.shape) != shape:
                raise ValueError(
                    f'weights: "{name}" has shape {list(w.shape)}, expected {shape}'
                )
            p = nn.Parameter(w.detach().to(torch.float32).clone())
            self.register_parameter(name.replace(".", "__"), p)
            self._names.append(name)
        extra = set(weights) - {n for n, _, _ in parameter_specs(self.config)}
        if extra:
            raise ValueError(f"weights: unexpected tensors {sorted(extra)}")

    # Read from the module's attributes on every call, never cached: FSDP2 (fsdp.py) swaps each
    # attribute between this rank's shard and the gathered parameter around every forward and backward.
    @property
    def canonical(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, getattr(self, n.replace(".", "__"))) for n in self._names]

    @property
    def _p(self) -> dict[str, nn.Parameter]:
        return {n: getattr(self, n.replace(".", "__")) for n in self._names}

    def hidden_states(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        segments: torch.Tensor | None = None,
        checkpointing: bool = False,
    ) -> torch.Tensor:
        """[B, T] token ids → [B, T, d] after the final LayerNorm (causal; right padding is harmless).

        Packed rows (sequence packing): ``positions`` [B, T] restart at 0 for every sequence and
        ``segments`` [B, T] number the sequences; attention stays within a segment, so each packed
        sequence sees exactly what it would see alone. ``checkpointing``: recompute each block in
        the backward (torch.utils.checkpoint) instead of keeping its activations."""
        c = self.config
        p = self._p
        B, T = ids.shape
        if T > c["context_length"] and positions is None:
            raise ValueError(
                f"{T} positions exceed context_length {c['context_length']}"
            )
        eps = c["layer_norm_eps"]
        pos = (
            p["pos_emb.weight"][:T]
            if positions is None
            else F.embedding(positions, p["pos_emb.weight"])
        )
        x = F.embedding(ids, p["tok_emb.weight"]) + pos
        for layer in range(c["n_layers"]):
            if checkpointing and torch.is_grad_enabled():
                from torch.utils.checkpoint import checkpoint

                x = (
                    checkpoint(self._block, x, segments, layer, use_reentrant=False)
                    if _CKPT_REENTRANT_ARG
                    else checkpoint(self._block, x, segments, layer)
                )
            else:
                x = self._block(x, segments, layer)
        return F.layer_norm(x, (c["d_model"],), p["ln_f.weight"], p["ln_f.bias"], eps)

    def _block(
        self, x: torch.Tensor, segments: torch.Tensor | None, layer: int
    ) -> torch.Tensor:
        c = self.config
        p = self._p
        B, T, d = x.shape
        nh = c["n_heads"]
        hd = d // nh
        eps = c["layer_norm_eps"]
        q = lambda n: p[f"blocks.{layer}.{n}"]  # noqa: E731
        h = F.layer_norm(x, (d,), q("ln1.weight"), q("ln1.bias"), eps)
        qkv = (h @ q("attn.qkv.weight") + q("attn.qkv.bias")).reshape(B, T, 3, nh, hd)
        query, key, value = (
            qkv[:, :, i].transpose(1, 2) for i in range(3)
        )  # [B, H, T, hd]
        heads = causal_attention(query, key, value, segments)
        x = x + (
            heads.transpose(1, 2).reshape(B, T, d) @ q("attn.proj.weight")
            + q("attn.proj.bias")
        )
        h = F.layer_norm(x, (d,), q("ln2.weight"), q("ln2.bias"), eps)
        h = F.gelu(h @ q("mlp.fc.weight") + q("mlp.fc.bias"), approximate="tanh")
        return x + (h @ q("mlp.proj.weight") + q("mlp.proj.bias"))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self._p["head.weight"]


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention; with ``segments`` [B, T] a position attends only to earlier positions of its own segment."""
    T = q.shape[-2]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    if segments is not None:
        mask = (
            mask & (segments[:, :, None] == segments[:, None, :])[:, None]
        )  # [B, 1, T, T]
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is not None and q.is_cuda:
        return (
            sdpa(q, k, v, is_causal=True)
            if segments is None
            else sdpa(q, k, v, attn_mask=mask)
        )
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(
        scores if scores.dtype in (torch.float32, torch.float64) else scores.float(),
        dim=-1,
    )
    return probs.to(v.dtype) @ v

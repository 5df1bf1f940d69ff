"""The two model families the trainer trains, behind one small interface.

- ``EmbeddedPolicy``: rlq's embedded GPT (gpt.py), read from and written to rlq's
  ``weights.safetensors`` (format ``rlq-gpt-v1``) so the engine and the embedded trainer
  load what this trainer writes, and vice versa.
- ``HFPolicy``: any local Hugging Face causal LM directory (``transformers`` required,
  never downloads). Written as a Hugging Face model directory that SGLang's
  ``update_weights_from_disk`` and ``from_pretrained`` both load (see ``HFPolicy.save``).

Both give ``named_params()`` (checkpoint name, fp32 master parameter) in a fixed order,
``hidden_states(ids)`` ([B, T, d] after the final norm) and ``logits(hidden)``.
"""
from __future__ import annotations

import json
import os
import shutil
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple
from urllib.parse import unquote, urlparse

import torch
from torch import nn

from . import gpt
from .safetensors_io import read_metadata, read_safetensors, write_safetensors

WEIGHTS_FILE = "weights.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
HF_INDEX_FILE = "model.safetensors.index.json"
HF_FORMAT = "rlq-hf-v1"
OPTIMIZER_FORMAT = "rlq-adamw-v1"
# Files of a HF model directory that are weights (never copied into an output directory).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
_SKIP_FILES = {HF_INDEX_FILE, "pytorch_model.bin.index.json", "train-result.json"}


class CheckpointError(Exception):
    """The checkpoint cannot be read (protocol code version_unavailable)."""


def path_from_uri(uri: str) -> str:
    if uri.startswith("file:"):
        p = urlparse(uri)
        return unquote(p.path)
    return uri


def hf_available() -> bool:
    try:
        import transformers  # noqa: F401
        return True
    except Exception:
        return False


class EmbeddedPolicy:
    kind = "embedded"

    def __init__(self, config: Dict, weights: Dict[str, torch.Tensor], device: torch.device, config_text: Optional[str] = None):
        self.config = gpt.parse_model_config(config)
        self.config_text = config_text or gpt.config_json(self.config)
        self.module = gpt.RlqGpt(self.config, weights).to(device)
        self.device = device

    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    @property
    def max_positions(self) -> int:
        return self.config["context_length"]

    def named_params(self) -> List[Tuple[str, nn.Parameter]]:
        return self.module.canonical

    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        return self.module.hidden_states(ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.module.logits(hidden)

    def describe(self) -> Dict:
        return {"kind": "embedded", "config": self.config}

    def save(self, out_dir: str, version: int, run_id: str, step: int) -> Dict[str, torch.Tensor]:
        """weights.safetensors in rlq's layout; returns the fp32 masters the optimizer file must hold (none: they are the weights)."""
        meta = {"format": gpt.MODEL_FORMAT, "version": str(version), "run": run_id, "step": str(step), "config": self.config_text}
        write_safetensors(os.path.join(out_dir, WEIGHTS_FILE), [(n, p.detach()) for n, p in self.named_params()], meta)
        return {}

    def load_masters(self, masters: Dict[str, torch.Tensor]) -> None:
        pass


class HFPolicy:
    """A Hugging Face causal LM, trained in fp32 master weights, saved in its own dtype."""

    kind = "hf"

    def __init__(self, model: nn.Module, device: torch.device, save_dtype: torch.dtype, source_dir: Optional[str]):
        self.module = model.to(device)
        self.module.train()
        self.device = device
        self.save_dtype = save_dtype
        self.source_dir = source_dir
        self._params = list(self.module.named_parameters())
        cfg = self.module.config
        self._softcap = getattr(cfg, "final_logit_softcapping", None)
        self._logit_scale = getattr(cfg, "logit_scale", None)

    @property
    def vocab_size(self) -> int:
        return int(self.module.config.vocab_size)

    @property
    def max_positions(self) -> int:
        return int(getattr(self.module.config, "max_position_embeddings", 1 << 30) or (1 << 30))

    def named_params(self) -> List[Tuple[str, nn.Parameter]]:
        return self._params

    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        base = self.module.base_model
        out = base(input_ids=ids, use_cache=False)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        z = self.module.get_output_embeddings()(hidden)
        if self._logit_scale is not None:
            z = z * self._logit_scale
        if self._softcap:
            z = torch.tanh(z / self._softcap) * self._softcap
        return z

    def describe(self) -> Dict:
        return {"kind": "hf", "model_type": self.module.config.model_type, "source": self.source_dir}

    def save(self, out_dir: str, version: int, run_id: str, step: int) -> Dict[str, torch.Tensor]:
        """A HF model directory SGLang's update_weights_from_disk loads:

        - ``weights.safetensors``: every parameter under its HF name, in the model's dtype
          (``config.torch_dtype``), metadata ``format: pt`` plus rlq's version/run/step;
        - ``model.safetensors.index.json``: maps every tensor to ``weights.safetensors``; SGLang
          (filter_duplicate_safetensors_files) and transformers then read that file only, so
          ``optimizer.safetensors`` beside it is never mistaken for weights;
        - ``config.json`` and the tokenizer / generation files copied from the input directory.
        Returns the fp32 masters when the saved dtype is lower precision (they go into
        optimizer.safetensors, so a reload resumes bit-exactly)."""
        tensors = [(n, p.detach().to(self.save_dtype)) for n, p in self._params]
        meta = {"format": "pt", "rlq_format": HF_FORMAT, "version": str(version), "run": run_id, "step": str(step)}
        write_safetensors(os.path.join(out_dir, WEIGHTS_FILE), tensors, meta)
        total = sum(t.numel() * t.element_size() for _, t in tensors)
        index = {"metadata": {"total_size": total}, "weight_map": OrderedDict((n, WEIGHTS_FILE) for n, _ in tensors)}
        _write_text(os.path.join(out_dir, HF_INDEX_FILE), json.dumps(index, indent=2) + "\n")
        copied = set()
        if self.source_dir and os.path.isdir(self.source_dir):
            for name in sorted(os.listdir(self.source_dir)):
                src = os.path.join(self.source_dir, name)
                if not os.path.isfile(src) or name in _SKIP_FILES or name.endswith(_WEIGHT_SUFFIXES) or ".tmp-" in name:
                    continue
                if name.startswith("optimizer.") or os.path.getsize(src) > 64 << 20:
                    continue
                _copy_atomic(src, os.path.join(out_dir, name))
                copied.add(name)
        if "config.json" not in copied:
            _write_text(os.path.join(out_dir, "config.json"), self.module.config.to_json_string())
        if self.save_dtype == torch.float32:
            return {}
        return OrderedDict((n, p.detach()) for n, p in self._params)

    def load_masters(self, masters: Dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, p in self._params:
                m = masters.get(n)
                if m is not None:
                    p.copy_(m.to(p.device, torch.float32))


def _write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _copy_atomic(src: str, dst: str) -> None:
    tmp = f"{dst}.tmp-{os.getpid()}"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _dtype_from_config(cfg) -> torch.dtype:
    d = getattr(cfg, "torch_dtype", None) or getattr(cfg, "dtype", None)
    if isinstance(d, str):
        d = getattr(torch, d, None)
    return d if isinstance(d, torch.dtype) and d.is_floating_point else torch.float32


def load_hf_dir(path: str, device: torch.device) -> HFPolicy:
    if not hf_available():
        raise CheckpointError(f"{path} is a Hugging Face model directory but transformers is not importable here")
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(path, local_files_only=True)
    save_dtype = _dtype_from_config(cfg)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, local_files_only=True)
    return HFPolicy(model, device, save_dtype, path)


def hf_from_config(config: Dict, device: torch.device, seed: int) -> HFPolicy:
    """A randomly initialised HF model from a config dict (benchmarks and tests)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    return HFPolicy(model, device, _dtype_from_config(cfg), None)


def checkpoint_kind(uri_or_path: str) -> Tuple[str, str]:
    """(kind, directory): kind ∈ embedded | hf; raises CheckpointError when nothing loadable is there."""
    path = path_from_uri(uri_or_path)
    if os.path.isfile(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {uri_or_path}: no such directory")
    weights = os.path.join(path, WEIGHTS_FILE)
    if os.path.isfile(weights):
        try:
            meta = read_metadata(weights)
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"checkpoint {weights}: unreadable ({e})") from e
        if meta.get("format") == gpt.MODEL_FORMAT:
            return "embedded", path
        if meta.get("rlq_format") == HF_FORMAT or os.path.isfile(os.path.join(path, "config.json")):
            return "hf", path
        raise CheckpointError(f"checkpoint {weights}: metadata.format is {meta.get('format')!r}, expected {gpt.MODEL_FORMAT}")
    if os.path.isfile(os.path.join(path, "config.json")):
        return "hf", path
    raise CheckpointError(f"checkpoint {uri_or_path}: neither {WEIGHTS_FILE} nor a Hugging Face config.json")


def checkpoint_version(kind: str, path: str) -> Optional[int]:
    """The weight version recorded in the checkpoint's metadata (None: not recorded, e.g. a HF base model)."""
    weights = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(weights):
        return None
    meta = read_metadata(weights)
    v = meta.get("version")
    return int(v) if v is not None and v.lstrip("-").isdigit() else (0 if kind == "embedded" else None)


def load_policy(uri_or_path: str, device: torch.device):
    """Loads weights (not optimizer state) from a checkpoint directory, URI or weights file."""
    kind, path = checkpoint_kind(uri_or_path)
    try:
        if kind == "embedded":
            meta, tensors = read_safetensors(os.path.join(path, WEIGHTS_FILE))
            if "config" not in meta:
                raise CheckpointError(f"{path}: metadata.config is missing")
            return EmbeddedPolicy(json.loads(meta["config"]), tensors, device, meta["config"])
        return load_hf_dir(path, device)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"checkpoint {uri_or_path}: {type(e).__name__}: {e}") from e


def read_optimizer(path: str, names: List[str]):
    """(iteration, {name: (exp_avg, exp_avg_sq)}, masters) from optimizer.safetensors beside the weights, or None (warm start)."""
    f = os.path.join(path, OPTIMIZER_FILE)
    if not os.path.isfile(f):
        return None
    try:
        meta, tensors = read_safetensors(f)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{f}: unreadable ({e})") from e
    if meta.get("format") != OPTIMIZER_FORMAT:
        raise CheckpointError(f"{f}: metadata.format is not {OPTIMIZER_FORMAT}")
    moments = {}
    for n in names:
        m, v = tensors.get(f"exp_avg.{n}"), tensors.get(f"exp_avg_sq.{n}")
        if m is None or v is None:
            raise CheckpointError(f"{f}: moments for {n} missing")
        moments[n] = (m, v)
    masters = {n[len("master."):]: t for n, t in tensors.items() if n.startswith("master.")}
    return int(meta.get("iteration", "0")), moments, masters


def write_optimizer(out_dir: str, params: List[Tuple[str, nn.Parameter]], moments: Dict[str, Tuple[torch.Tensor, torch.Tensor]], iteration: int,
                    version: int, run_id: str, step: int, masters: Dict[str, torch.Tensor]) -> None:
    tensors = []
    for n, _ in params:
        m, v = moments[n]
        tensors.append((f"exp_avg.{n}", m))
        tensors.append((f"exp_avg_sq.{n}", v))
    for n, t in masters.items():
        tensors.append((f"master.{n}", t))
    meta = {"format": OPTIMIZER_FORMAT, "iteration": str(iteration), "version": str(version), "run": run_id, "step": str(step)}
    write_safetensors(os.path.join(out_dir, OPTIMIZER_FILE), tensors, meta)

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
_WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".h5",
    ".msgpack",
    ".gguf",
)
SAVE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_SKIP_FILES = {HF_INDEX_FILE, "pytorch_model.bin.index.json", "train-result.json"}


class CheckpointError(Exception):
    """The checkpoint cannot be read (protocol code version_unavailable)."""


def path_from_uri(uri: str) -> str:
    if uri.startswith("file:"):
        p = urlparse(uri)
        return unquote(p.path)
    return uri


def preload_hf() -> None:
    """Imports transformers' model classes now (seconds of Python imports), so that a process started ahead of
    its first step does not spend them inside that step. Nothing when transformers is not installed."""
    if hf_available():
        from transformers import AutoConfig, AutoModelForCausalLM  # noqa: F401


def hf_available() -> bool:
    try:
        import transformers  # noqa: F401

        return True
    except Exception:  # noqa: BLE001 - any failure to import means: not available here
        return False


class EmbeddedPolicy:
    kind = "embedded"

    def __init__(
        self,
        config: dict,
        weights: dict[str, torch.Tensor],
        device: torch.device,
        config_text: str | None = None,
    ):
        self.config = gpt.parse_model_config(config)
        self.config_text = config_text or gpt.config_json(self.config)
        self.module = gpt.RlqGpt(self.config, weights).to(device)
        self.device = device
        self.checkpointing = (
            False  # gradient checkpointing (recompute each block in the backward)
        )

    def packing_unsupported(self) -> str | None:
        """Packed rows: causal_attention masks by segment and positions restart per sequence (gpt.py)."""
        return None

    def set_gradient_checkpointing(self, on: bool) -> None:
        self.checkpointing = on

    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    @property
    def max_positions(self) -> int:
        return self.config["context_length"]

    def named_params(self) -> list[tuple[str, nn.Parameter]]:
        return self.module.canonical

    def hidden_states(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        segments: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.module.hidden_states(
            ids, positions, segments, checkpointing=self.checkpointing
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.module.logits(hidden)

    def describe(self) -> dict:
        return {"kind": "embedded", "config": self.config}

    def save(
        self,
        out_dir: str,
        version: int,
        run_id: str,
        step: int,
        dtype: str | None = None,
        extra_meta: dict[str, str] | None = None,
    ) -> dict[str, torch.Tensor]:
        """weights.safetensors in rlq's layout (always F32: ``dtype`` is for HF output); returns the fp32 masters the optimizer file must hold (none: they are the weights).

        ``extra_meta``: more metadata (trainer_checkpoint.py's marker); without it the file is byte-identical to rlq's writer's."""
        meta = {
            "format": gpt.MODEL_FORMAT,
            "version": str(version),
            "run": run_id,
            "step": str(step),
            "config": self.config_text,
            **(extra_meta or {}),
        }
        write_safetensors(
            os.path.join(out_dir, WEIGHTS_FILE),
            [(n, p.detach()) for n, p in self.named_params()],
            meta,
        )
        return {}

    def load_masters(self, masters: dict[str, torch.Tensor]) -> None:
        pass


# Attention implementations for which transformers (masking_utils, modeling_flash_attention_utils) finds the sequences
# of a packed row from position_ids restarting at 0, when no attention_mask and no cache are passed: a
# block-diagonal causal mask for sdpa / eager / flex, varlen kernels for flash attention.
PACKING_ATTENTION = (
    "sdpa",
    "eager",
    "flex_attention",
    "flash_attention_2",
    "flash_attention_3",
    "flash_attention_4",
)
# The probe's two sequences (token ids, reduced modulo the vocabulary), packed as one row against the second alone.
_PROBE = ([3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5])
# A packed row's hidden states may differ from the sequence alone by float rounding only (fp32, no autocast);
# attention or a recurrent state that crosses into the next sequence moves them by far more.
PACKING_PROBE_TOLERANCE = 1e-4


class HFPolicy:
    """A Hugging Face causal LM, trained in fp32 master weights, saved in its own dtype."""

    kind = "hf"

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        save_dtype: torch.dtype,
        source_dir: str | None,
    ):
        self.module = model.to(device)
        self.module.train()
        self.device = device
        self.save_dtype = save_dtype
        self.source_dir = source_dir
        cfg = self.module.config
        self._softcap = getattr(cfg, "final_logit_softcapping", None)
        self._logit_scale = getattr(cfg, "logit_scale", None)

    @property
    def vocab_size(self) -> int:
        return int(self.module.config.vocab_size)

    @property
    def max_positions(self) -> int:
        return int(
            getattr(self.module.config, "max_position_embeddings", 1 << 30) or (1 << 30)
        )

    @property
    def _params(self) -> list[tuple[str, nn.Parameter]]:
        """Read from the module on every call (FSDP2 swaps its parameters between shards and whole ones; fsdp.py)."""
        return list(self.module.named_parameters())

    def named_params(self) -> list[tuple[str, nn.Parameter]]:
        return self._params

    def _engine_params(self) -> list[tuple[str, torch.Tensor]]:
        """The weights an engine loads, under their HF names (lora.py: the merged ones)."""
        return self._params

    def set_gradient_checkpointing(self, on: bool) -> None:
        if on:
            self.module.gradient_checkpointing_enable()
        elif getattr(self.module, "is_gradient_checkpointing", False):
            self.module.gradient_checkpointing_disable()

    def hidden_states(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        segments: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[B, T, d] after the final norm. A packed row ([1, T]) passes ``positions`` (restarting at 0 for each
        sequence) as position_ids and no attention_mask: transformers then masks attention to stay within each
        sequence (PACKING_ATTENTION); ``segments`` are implied by the positions."""
        base = self.module.base_model
        if positions is None:
            out = base(input_ids=ids, use_cache=False)
        else:
            out = base(input_ids=ids, position_ids=positions, use_cache=False)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def packing_unsupported(self) -> str | None:
        """None when packed rows give each sequence exactly what it gives alone, else why not (checked once per model).

        The attention implementation must be one transformers packs (PACKING_ATTENTION), and a probe must
        agree: the hidden states of a sequence packed after another equal those of the sequence alone. The probe
        catches what the implementation's name cannot: an architecture whose mask ignores position_ids, or a
        recurrent state (Mamba-style layers) carried from one sequence into the next. It calls the whole module,
        so it runs before FSDP shards it (TorchTrainer._ddp)."""
        if getattr(self, "_packing_unsupported", None) is None:
            self._packing_unsupported = (self._probe_packing(),)
        return self._packing_unsupported[0]

    def _probe_packing(self) -> str | None:
        cfg = self.module.config
        impl = getattr(cfg, "_attn_implementation", None)
        what = f"{cfg.model_type} with attention implementation {impl!r}"
        if impl not in PACKING_ATTENTION:
            return f"{what}: transformers packs rows for {', '.join(PACKING_ATTENTION)} only"
        a, b = ([t % self.vocab_size for t in seq] for seq in _PROBE)
        dev = self.device
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                ids = torch.tensor([a + b], dtype=torch.long, device=dev)
                pos = torch.tensor(
                    [list(range(len(a))) + list(range(len(b)))],
                    dtype=torch.long,
                    device=dev,
                )
                packed = self.hidden_states(ids, pos)[0, len(a) :].float()
                alone = self.hidden_states(
                    torch.tensor([b], dtype=torch.long, device=dev)
                )[0].float()
        except (
            TypeError,
            ValueError,
        ) as e:  # e.g. a model whose forward takes no position_ids
            return f"{what}: a packed forward fails ({type(e).__name__}: {e})"
        finally:
            self.module.train(was_training)
        diff = float((packed - alone).abs().max() / alone.abs().max().clamp_min(1e-30))
        if not diff <= PACKING_PROBE_TOLERANCE:
            return (
                f"{what}: a sequence packed after another does not give what it gives alone (max relative difference {diff:.3g}), "
                "so its attention mask or state crosses sequences"
            )
        return None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        z = self.module.get_output_embeddings()(hidden)
        if self._logit_scale is not None:
            z = z * self._logit_scale
        if self._softcap:
            z = torch.tanh(z / self._softcap) * self._softcap
        return z

    def describe(self) -> dict:
        return {
            "kind": "hf",
            "model_type": self.module.config.model_type,
            "source": self.source_dir,
        }

    def save(
        self,
        out_dir: str,
        version: int,
        run_id: str,
        step: int,
        dtype: str | None = None,
        extra_meta: dict[str, str] | None = None,
    ) -> dict[str, torch.Tensor]:
        """A HF model directory SGLang's update_weights_from_disk loads (``extra_meta``: more weights-file metadata):

        - ``weights.safetensors``: every parameter under its HF name, in the model's dtype
          (config.json's ``dtype`` / ``torch_dtype``), metadata ``format: pt`` plus rlq's version/run/step;
        - ``model.safetensors.index.json``: maps every tensor to ``weights.safetensors``; SGLang
          (filter_duplicate_safetensors_files) and transformers then read that file only, so
          ``optimizer.safetensors`` beside it is never mistaken for weights;
        - ``config.json`` and the tokenizer / generation files copied from the input directory.
        ``dtype`` (hf_save_dtype: bf16 | fp16 | fp32) overrides the model's own dtype for this and
        later saves; config.json then records it as ``dtype`` and ``torch_dtype``.
        Returns the fp32 masters when the saved dtype is lower precision (they go into
        optimizer.safetensors, so a reload resumes bit-exactly)."""
        if dtype is not None:
            self.save_dtype = SAVE_DTYPES[dtype]
        tensors = [
            (n, p.detach().to(self.save_dtype)) for n, p in self._engine_params()
        ]
        meta = {
            "format": "pt",
            "rlq_format": HF_FORMAT,
            "version": str(version),
            "run": run_id,
            "step": str(step),
            **(extra_meta or {}),
        }
        write_safetensors(os.path.join(out_dir, WEIGHTS_FILE), tensors, meta)
        total = sum(t.numel() * t.element_size() for _, t in tensors)
        index = {
            "metadata": {"total_size": total},
            "weight_map": OrderedDict((n, WEIGHTS_FILE) for n, _ in tensors),
        }
        _write_text(
            os.path.join(out_dir, HF_INDEX_FILE), json.dumps(index, indent=2) + "\n"
        )
        copied = set()
        if self.source_dir and os.path.isdir(self.source_dir):
            for name in sorted(os.listdir(self.source_dir)):
                src = os.path.join(self.source_dir, name)
                if (
                    not os.path.isfile(src)
                    or name in _SKIP_FILES
                    or name.endswith(_WEIGHT_SUFFIXES)
                    or ".tmp-" in name
                ):
                    continue
                if (
                    name.startswith(("optimizer.", "optimizer-"))
                    or os.path.getsize(src) > 64 << 20
                ):
                    continue
                _copy_atomic(src, os.path.join(out_dir, name))
                copied.add(name)
        if "config.json" not in copied or dtype is not None:
            if "config.json" in copied:
                with open(os.path.join(out_dir, "config.json")) as f:
                    cfg = json.load(f)
            else:
                cfg = json.loads(self.module.config.to_json_string())
            if dtype is not None:
                # Both names: transformers 5 reads `dtype` first (and writes only it), readers on transformers 4 read `torch_dtype`.
                name = {
                    torch.bfloat16: "bfloat16",
                    torch.float16: "float16",
                    torch.float32: "float32",
                }[self.save_dtype]
                cfg["dtype"] = cfg["torch_dtype"] = name
            _write_text(
                os.path.join(out_dir, "config.json"),
                json.dumps(cfg, indent=2, sort_keys=True) + "\n",
            )
        if self.save_dtype == torch.float32:
            return {}
        return OrderedDict((n, p.detach()) for n, p in self._params)

    def load_masters(self, masters: dict[str, torch.Tensor]) -> None:
        from .fsdp import local

        with torch.no_grad():
            for n, p in self._params:
                m = masters.get(n)
                if m is not None:
                    p = local(
                        p
                    )  # FSDP: this rank's shard, as the masters file holds it
                    p.copy_(m.to(p.device, torch.float32))


class VLMPolicy(HFPolicy):
    """A HF vision-language model (Qwen2-VL style): the text model's hidden states given the prompt's images.

    ``vision_inputs`` (vlm.VisionInputs) is the model's processor, loaded from the model directory."""

    def __init__(self, model, device, save_dtype, source_dir, vision_inputs):
        super().__init__(model, device, save_dtype, source_dir)
        self.vision_inputs = vision_inputs

    @property
    def vocab_size(self) -> int:
        return int(self.module.config.get_text_config().vocab_size)

    @property
    def max_positions(self) -> int:
        return int(
            getattr(
                self.module.config.get_text_config(), "max_position_embeddings", 1 << 30
            )
            or (1 << 30)
        )

    def _probe_packing(self) -> str | None:
        # Qwen2-VL's rotary positions (mrope) are three rows (time, height, width) that get_rope_index
        # computes per sequence from its image grids; packed rows would need them per sequence, which
        # hidden_states does not build yet.
        return (
            f"{self.module.config.model_type}: its multimodal rotary positions (mrope) are computed per sequence "
            "from the images' grids, and rlq does not build them for packed rows yet"
        )

    def hidden_states(self, ids, positions=None, segments=None, vision=None):
        """[B, T, d]: the model's own forward over right-padded rows, images merged in at their tokens;
        the model computes the mrope positions from input_ids and image_grid_thw (get_rope_index)."""
        if positions is not None:
            raise ValueError(
                "a vision-language model takes no packed rows (packing_unsupported)"
            )
        kw = dict(vision or {})
        if vision is not None:
            # 1 at image tokens, 0 elsewhere, as the processor's mm_token_type_ids: get_rope_index reads the
            # images' spans from it (right padding is text, after every real token).
            kw["mm_token_type_ids"] = (
                ids == int(self.module.config.image_token_id)
            ).to(torch.int32)
        out = self.module.model(input_ids=ids, use_cache=False, **kw)
        return out.last_hidden_state


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
    d = getattr(cfg, "dtype", None) or getattr(
        cfg, "torch_dtype", None
    )  # transformers 5 names it dtype (torch_dtype warns), 4 torch_dtype
    if isinstance(d, str):
        d = getattr(torch, d, None)
    return d if isinstance(d, torch.dtype) and d.is_floating_point else torch.float32


def load_hf_dir(path: str, device: torch.device) -> HFPolicy:
    if not hf_available():
        raise CheckpointError(
            f"{path} is a Hugging Face model directory but transformers is not importable here"
        )
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(path, local_files_only=True)
    save_dtype = _dtype_from_config(cfg)
    if hasattr(cfg, "vision_config"):
        from transformers import AutoModelForImageTextToText

        from .vlm import VisionInputs, load_processor

        model = AutoModelForImageTextToText.from_pretrained(
            path, dtype=torch.float32, local_files_only=True
        )
        return VLMPolicy(
            model, device, save_dtype, path, VisionInputs(load_processor(path))
        )
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, local_files_only=True
    )
    return HFPolicy(model, device, save_dtype, path)


def hf_from_config(
    config: dict,
    device: torch.device,
    seed: int,
    attn_implementation: str | None = None,
) -> HFPolicy:
    """A randomly initialised HF model from a config dict (benchmarks and tests), saved in the config's dtype.

    The dtype is read before the model is built: from_config(dtype=float32) sets the config's dtype to float32."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config)
    save_dtype = _dtype_from_config(cfg)
    torch.manual_seed(seed)
    kw = (
        {}
        if attn_implementation is None
        else {"attn_implementation": attn_implementation}
    )
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **kw)
    return HFPolicy(model, device, save_dtype, None)


def checkpoint_kind(uri_or_path: str) -> tuple[str, str]:
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
        except Exception as e:
            raise CheckpointError(f"checkpoint {weights}: unreadable ({e})") from e
        if meta.get("format") == gpt.MODEL_FORMAT:
            return "embedded", path
        if meta.get("rlq_format") == HF_FORMAT or os.path.isfile(
            os.path.join(path, "config.json")
        ):
            return "hf", path
        raise CheckpointError(
            f"checkpoint {weights}: metadata.format is {meta.get('format')!r}, expected {gpt.MODEL_FORMAT}"
        )
    if os.path.isfile(os.path.join(path, "config.json")):
        return "hf", path
    raise CheckpointError(
        f"checkpoint {uri_or_path}: neither {WEIGHTS_FILE} nor a Hugging Face config.json"
    )


def checkpoint_version(kind: str, path: str) -> int | None:
    """The weight version recorded in the checkpoint's metadata (None: not recorded, e.g. a HF base model)."""
    weights = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(weights):
        return None
    meta = read_metadata(weights)
    v = meta.get("version")
    return (
        int(v)
        if v is not None and v.lstrip("-").isdigit()
        else (0 if kind == "embedded" else None)
    )


def load_policy(uri_or_path: str, device: torch.device):
    """Loads weights (not optimizer state) from a checkpoint directory, URI or weights file."""
    kind, path = checkpoint_kind(uri_or_path)
    try:
        if kind == "embedded":
            meta, tensors = read_safetensors(os.path.join(path, WEIGHTS_FILE))
            if "config" not in meta:
                raise CheckpointError(f"{path}: metadata.config is missing")
            return EmbeddedPolicy(
                json.loads(meta["config"]), tensors, device, meta["config"]
            )
        return load_hf_dir(path, device)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(
            f"checkpoint {uri_or_path}: {type(e).__name__}: {e}"
        ) from e


def shard_file(rank: int, world: int) -> str:
    return f"optimizer-{rank + 1:05d}-of-{world:05d}.safetensors"


def optimizer_files(path: str) -> list[str]:
    """optimizer.safetensors, or the complete set of shards optimizer-KKKKK-of-NNNNN.safetensors written by N ranks."""
    one = os.path.join(path, OPTIMIZER_FILE)
    if os.path.isfile(one):
        return [one]
    shards = sorted(
        n
        for n in os.listdir(path)
        if n.startswith("optimizer-") and n.endswith(".safetensors") and "-of-" in n
    )
    if not shards:
        return []
    try:
        world = int(shards[0].split("-of-")[1].split(".")[0])
    except ValueError as e:
        raise CheckpointError(
            f"{path}: unreadable optimizer shard name {shards[0]}"
        ) from e
    want = [shard_file(r, world) for r in range(world)]
    if shards != want:
        raise CheckpointError(
            f"{path}: optimizer shards {shards} are not the complete set of {world} ({want})"
        )
    return [os.path.join(path, n) for n in want]


def read_optimizer(
    path: str,
    names: list[str],
    shard: tuple[int, int] | None = None,
    sharding: str = "zero1",
):
    """(iteration, {name: (exp_avg, exp_avg_sq)}, masters) from the optimizer state beside the weights, or None (warm start).

    Sharded state (written by N ranks) is read shard by shard; ``shard=(rank, world)`` with the same
    world size reads only this rank's own shard (the partition is a function of the model and N).
    ``sharding="fsdp"``: each shard holds this rank's flat pieces of every parameter (fsdp.py), only
    readable by a group of the same size and mode. A directory whose weights say their optimizer state is a
    torch.distributed.checkpoint (trainer_checkpoint.py) is read from that, one rank only."""
    from . import trainer_checkpoint

    weights = os.path.join(path, WEIGHTS_FILE)
    if trainer_checkpoint.has_dcp(
        path, read_metadata(weights) if os.path.isfile(weights) else {}
    ):
        if shard is not None and shard[1] > 1:
            raise CheckpointError(
                f"{path}: its optimizer state is a one-rank {trainer_checkpoint.DCP_DIR} checkpoint; "
                f"a group of {shard[1]} ranks resumes from optimizer.safetensors or its shards only"
            )
        return trainer_checkpoint.read(path, names)
    files = optimizer_files(path)
    if not files:
        return None
    if sharding.startswith("fsdp") and (shard is None or len(files) != shard[1]):
        raise CheckpointError(
            f"{path}: {len(files)} optimizer file(s); a --sharding {sharding} group of {shard[1] if shard else 1} ranks resumes "
            "only from the shards of a group of its own size"
        )
    if shard is not None and len(files) == shard[1] > 1:
        files = [files[shard[0]]]
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, str] = {}
    for f in files:
        try:
            m, ts = read_safetensors(f)
        except Exception as e:
            raise CheckpointError(f"{f}: unreadable ({e})") from e
        if m.get("format") != OPTIMIZER_FORMAT:
            raise CheckpointError(f"{f}: metadata.format is not {OPTIMIZER_FORMAT}")
        if m.get("sharding", "zero1") != sharding:
            raise CheckpointError(
                f"{f}: optimizer state written by a --sharding {m.get('sharding', 'zero1')} trainer; this one shards {sharding}"
            )
        if meta and m.get("iteration") != meta.get("iteration"):
            raise CheckpointError(
                f"{f}: iteration {m.get('iteration')} differs from the other shards' {meta.get('iteration')}"
            )
        meta = m
        tensors.update(ts)
    f = files[0]
    moments = {}
    for n in names:
        m, v = tensors.get(f"exp_avg.{n}"), tensors.get(f"exp_avg_sq.{n}")
        if m is None or v is None:
            raise CheckpointError(f"{f}: moments for {n} missing")
        moments[n] = (m, v)
    masters = {
        n[len("master.") :]: t for n, t in tensors.items() if n.startswith("master.")
    }
    return int(meta.get("iteration", "0")), moments, masters


def write_optimizer(
    out_dir: str,
    params: list[tuple[str, nn.Parameter]],
    moments: dict[str, tuple[torch.Tensor, torch.Tensor]],
    iteration: int,
    version: int,
    run_id: str,
    step: int,
    masters: dict[str, torch.Tensor],
    shard: tuple[int, int] | None = None,
    sharding: str | None = None,
) -> None:
    """optimizer.safetensors; with ``shard=(rank, world)`` this rank's part, optimizer-KKKKK-of-NNNNN.safetensors."""
    tensors = []
    for n, _ in params:
        m, v = moments[n]
        tensors.append((f"exp_avg.{n}", m))
        tensors.append((f"exp_avg_sq.{n}", v))
    for n, t in masters.items():
        tensors.append((f"master.{n}", t))
    meta = {
        "format": OPTIMIZER_FORMAT,
        "iteration": str(iteration),
        "version": str(version),
        "run": run_id,
        "step": str(step),
    }
    if shard is not None:
        meta.update({"shard": str(shard[0]), "num_shards": str(shard[1])})
    if (
        sharding is not None
    ):  # only fsdp's flat shards say so: zero1 files stay byte-identical to earlier ones
        meta["sharding"] = sharding
    write_safetensors(
        os.path.join(out_dir, OPTIMIZER_FILE if shard is None else shard_file(*shard)),
        tensors,
        meta,
    )

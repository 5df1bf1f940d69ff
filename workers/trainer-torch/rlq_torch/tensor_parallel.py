"""Tensor and context parallelism for Hugging Face Qwen2/Llama models, on PyTorch's own stack.

slime's ``tensor_model_parallel_size`` and ``context_parallel_size`` (Megatron's names) map onto a device
mesh of three dimensions, ``("dp", "cp", "tp")``, innermost ``tp`` (the ranks that talk most sit next to
each other, as torchtitan lays its mesh out: torchtitan/distributed/parallel_dims.py):

- **TP** (``tp``): DTensor's ``parallelize_module`` on every decoder layer, Megatron's cut as Hugging Face's
  own ``base_model_tp_plan`` names it (transformers/models/qwen2/configuration_qwen2.py): q/k/v and
  gate/up column-wise, o/down row-wise, so each layer does one all-reduce after attention and one after
  the MLP. With ``sequence_parallel`` (Megatron's ``--sequence-parallel``) the norms and the residual
  stream are cut along the sequence instead of replicated (``SequenceParallel``), and the two all-reduces
  become an all-gather before and a reduce-scatter after each block, as torchtitan's
  ``apply_tp`` does (torchtitan/models/llama3/infra/parallelize.py). The embedding and ``lm_head`` stay
  whole on every TP rank, and the final hidden states are gathered whole, so the trainer's log-probability
  code sees every position and the full vocabulary;
- **CP** (``cp``): ``torch.distributed.tensor.experimental.context_parallel``, ring attention over the
  sequence: inside the context every CP rank holds 1/cp of the tokens (load-balanced head-tail) and
  SDPA exchanges keys and values around the ring. Its dispatch covers only the flash, efficient and
  cuDNN SDPA kernels (torch/distributed/tensor/experimental/_context_parallel/_attention.py), all CUDA:
  on CPU the math kernel ``aten._scaled_dot_product_flash_attention_for_cpu`` reaches DTensor with no
  sharding strategy, so ``cp_unavailable()`` refuses a CPU device by name;
- **FSDP2** (``fully_shard``) shards the parameters over ``dp`` and ``cp`` together (the ranks that see
  different tokens), one unit per decoder layer, the parameters then DTensors on the 2-D mesh
  ``(dp·cp, tp)``. Its gradient reduce-scatter over dp·cp also sums the CP ranks' partial gradients, so
  CP needs FSDP2 (torchtitan shards over ``dp_shard_cp`` for the same reason);
- whole weights for a save or an engine push: ``full_state_dict`` (every rank calls it; DTensor's
  ``full_tensor``), the Hugging Face names and shapes, so the engines and the safetensors writer see what
  one rank would have;
- the trainer's own checkpoint: DCP (``torch.distributed.checkpoint``) with
  ``get_state_dict``/``set_state_dict``, which reshards on load, so a run saved at TP=2 resumes at TP=1 or
  another mesh.

The trainer server's RL step (trainer.py, ``--sharding fsdp``) runs TP through four hooks: ``step_refusal``
(what the step cannot run, as bad_request), ``tp_shard_mesh`` (fsdp.wrap: the TP cut, then FSDP2 over the
world // tp data-parallel ranks; ``Dist.slot`` gives tp consecutive ranks the same micro-batches),
``whole_params`` (fsdp.full_params: the weights written and pushed whole) and ``piece_share`` (the
gradient norm's all-reduced sum of squares counts each piece once). CP and SequenceParallel run in
tp_train.py only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

MESH_DIMS = ("dp", "cp", "tp")
SUPPORTED_ARCHS = ("Qwen2ForCausalLM", "LlamaForCausalLM")


@dataclass(frozen=True)
class ParallelDims:
    """How a group of ``world`` ranks is cut: dp · cp · tp == world."""

    world: int
    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.cp)


def check_dims(d: ParallelDims) -> None:
    """A clear refusal for sizes that do not cut the group."""
    for name, v in (
        ("tensor_model_parallel_size", d.tp),
        ("context_parallel_size", d.cp),
    ):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if d.world % (d.tp * d.cp):
        raise ValueError(
            f"tensor_model_parallel_size ({d.tp}) x context_parallel_size ({d.cp}) must divide the trainer's "
            f"world size ({d.world}); start the trainer with --nproc a multiple of {d.tp * d.cp}"
        )
    if d.sequence_parallel and d.tp == 1:
        raise ValueError(
            "sequence_parallel needs tensor_model_parallel_size > 1 (it cuts the norms across the TP ranks)"
        )


@dataclass(frozen=True)
class ParallelSizes:
    """What a step's config asks for (run-config keys tensor_model_parallel_size, context_parallel_size, sequence_parallel)."""

    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False


def parse_config(c: dict, defaults: dict) -> ParallelSizes:
    """The three keys from a step's config (ValueError naming the key and what to write)."""
    out = {}
    for key in ("tensor_model_parallel_size", "context_parallel_size"):
        v = c.get(key, defaults.get(key, 1))
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(
                f"config.{key} = {v!r}: expected a positive integer (1: not split)"
            )
        out[key] = v
    sp = c.get("sequence_parallel", defaults.get("sequence_parallel", False))
    if not isinstance(sp, bool):
        raise ValueError(f"config.sequence_parallel = {sp!r}: expected true or false")
    if sp and out["tensor_model_parallel_size"] == 1:
        raise ValueError(
            "config.sequence_parallel needs tensor_model_parallel_size > 1 (it cuts the norms across the TP ranks)"
        )
    return ParallelSizes(
        out["tensor_model_parallel_size"], out["context_parallel_size"], sp
    )


def step_refusal(p: ParallelSizes | None, dist) -> str | None:
    """Why the trainer server's RL step cannot run these sizes on this group, or None.

    TP runs in the step on an FSDP2 group (``--sharding fsdp``): tp consecutive ranks share each
    micro-batch (``Dist.slot``), FSDP2 shards over the world // tp data-parallel ranks. CP does not: the
    step packs and indexes whole sequences (rows, columns, segments), which ring attention would cut."""
    if p is None or (p.tp == 1 and p.cp == 1):
        return None
    if p.cp > 1:
        return (
            f"context_parallel_size {p.cp}: the trainer server's RL step does not split sequences (it indexes whole "
            "rows at the response positions); CP runs in rlq_torch/tp_train.py on CUDA (docs/trainer-torch.md, "
            "Tensor and context parallel). Set context_parallel_size 1"
        )
    if p.sequence_parallel:
        # Hugging Face builds the attention mask from the embeddings' sequence length, which SequenceParallel
        # cuts to 1/tp before the blocks gather it whole (the mask and the scores then disagree in size)
        return (
            "sequence_parallel: the trainer server's RL step passes Hugging Face an attention mask, built from the "
            "sequence length SequenceParallel cuts; set sequence_parallel false (tensor_model_parallel_size alone runs)"
        )
    if not dist.active or dist.sharding != "fsdp2" or dist.world % p.tp:
        return (
            f"tensor_model_parallel_size {p.tp} needs a trainer group of a multiple of {p.tp} ranks sharded with "
            f"FSDP2 (server.py --nproc {2 * p.tp} --sharding fsdp); this one has {dist.world} rank(s), "
            f"--sharding {dist.sharding if dist.active else 'none'}"
        )
    return None


def tp_shard_mesh(
    model: torch.nn.Module,
    device: torch.device,
    tp: int,
    sequence_parallel: bool = False,
):
    """The trainer's hook (fsdp.wrap): TP applied to the Hugging Face model in place; returns the mesh FSDP2
    shards over (the world // tp data-parallel ranks). Refuses a model TP cannot cut as bad_request."""
    from .train_config import bad_request

    world = torch.distributed.get_world_size()
    d = ParallelDims(world, tp, 1, sequence_parallel)
    try:
        check_dims(d)
        check_model(model, d)
    except ValueError as e:
        raise bad_request(str(e)) from e
    mesh = build_mesh(device.type, d)
    apply_tp(model, mesh["tp"], sequence_parallel)
    return mesh["dp_cp"]


@contextmanager
def whole_params(module: torch.nn.Module) -> Iterator[None]:
    """Inside: every DTensor parameter of ``module`` (the TP shards FSDP2's unshard leaves) replaced by its whole
    tensor, so the writers and the push read the Hugging Face shapes; a collective on every rank. No-op without TP."""
    swapped = []
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is not None and hasattr(p, "full_tensor"):
                whole = torch.nn.Parameter(
                    p.detach().full_tensor(), requires_grad=p.requires_grad
                )
                m._parameters[name] = whole
                swapped.append((m, name, p))
    try:
        yield
    finally:
        for m, name, p in swapped:
            m._parameters[name] = p


def piece_share(p: torch.Tensor, world: int) -> float:
    """The share of a parameter's local piece in an all-reduced sum over ``world`` ranks that counts each piece once:
    a DTensor cut into k distinct pieces (its Shard dimensions) has each piece on world / k ranks."""
    if not hasattr(p, "placements"):
        return 1.0 / world
    pieces = 1
    for i, pl in enumerate(p.placements):
        # FSDP2's dim-0 cut of a TP shard is a _StridedShard, which is_shard() does not count
        if not pl.is_replicate() and not pl.is_partial():
            pieces *= p.device_mesh.size(i)
    return pieces / world


def check_model(model: torch.nn.Module, d: ParallelDims) -> None:
    """The model's heads and widths must split evenly over TP; only the architectures with a plan here."""
    arch = type(model).__name__
    if d.tp == 1 and d.cp == 1:
        return
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(
            f"tensor/context parallel supports {', '.join(SUPPORTED_ARCHS)}; this model is {arch}: "
            "train it with tensor_model_parallel_size 1 and context_parallel_size 1"
        )
    c = model.config
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        v = getattr(c, name)
        if v % d.tp:
            raise ValueError(
                f"tensor_model_parallel_size {d.tp} must divide the model's {name} ({v}); choose a divisor of {v}"
            )


def cp_unavailable(device: torch.device) -> str | None:
    """None when context_parallel can run on this device, else why not (torch 2.13's ring attention is CUDA only)."""
    if device.type != "cuda":
        return (
            "context_parallel_size > 1 needs CUDA: torch's ring attention (context_parallel) covers only the "
            "flash, efficient and cuDNN SDPA kernels; on CPU SDPA runs aten._scaled_dot_product_flash_attention_for_cpu, "
            "which has no DTensor sharding strategy (NotImplementedError). Use context_parallel_size 1 on CPU"
        )
    return None


def build_mesh(device_type: str, d: ParallelDims):
    """The ("dp", "cp", "tp") mesh over the whole group, with the flattened "dp_cp" the FSDP2 shards go over."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (d.dp, d.cp, d.tp), mesh_dim_names=MESH_DIMS)
    mesh["dp", "cp"]._flatten("dp_cp")
    return mesh


def _layer_plan(sequence_parallel: bool) -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if not sequence_parallel:
        return {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(),
        }
    # The residual stream between blocks is this rank's part of the sequence (dim 1) as a plain tensor; the
    # norms see it as a Shard(1) DTensor, each block gathers it whole on entry and reduce-scatters its output
    # (torchtitan's plan, in Hugging Face's module names).
    gather = PrepareModuleInput(
        input_kwarg_layouts={"hidden_states": Shard(1)},
        desired_input_kwarg_layouts={"hidden_states": Replicate()},
    )
    return {
        "input_layernorm": SequenceParallel(use_local_output=True),
        "self_attn": gather,
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "post_attention_layernorm": SequenceParallel(use_local_output=True),
        "mlp": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
    }


def apply_tp(model: torch.nn.Module, tp_mesh, sequence_parallel: bool = False) -> None:
    """Megatron's tensor-parallel cut of every decoder layer, in place (a Hugging Face *ForCausalLM)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleOutput,
        SequenceParallel,
        parallelize_module,
    )

    base = model.model
    if sequence_parallel:
        # the embedding is whole on every rank; its output is cut along the sequence for the first norm
        parallelize_module(
            base.embed_tokens,
            tp_mesh,
            PrepareModuleOutput(
                output_layouts=Replicate(),
                desired_output_layouts=Shard(1),
                use_local_output=True,
            ),
        )
        # the final norm runs on this rank's part of the sequence, then the hidden states are gathered whole, so
        # the base model's output (what the trainer indexes at the response positions) is the same as at TP=1
        parallelize_module(base.norm, tp_mesh, SequenceParallel(use_local_output=True))
        parallelize_module(
            base.norm,
            tp_mesh,
            PrepareModuleOutput(
                output_layouts=Shard(1),
                desired_output_layouts=Replicate(),
                use_local_output=True,
            ),
        )
    plan = _layer_plan(sequence_parallel)
    for layer in base.layers:
        parallelize_module(layer, tp_mesh, plan)


def apply_fsdp(
    model: torch.nn.Module, mesh, reshard_after_forward: bool = True
) -> None:
    """FSDP2 over the dp·cp ranks: one unit per decoder layer and one for the rest (a 2-D mesh with TP)."""
    from torch.distributed.fsdp import fully_shard

    # The TP-cut parameters are already DTensors on mesh["tp"]; fully_shard over the dp·cp sub-mesh of the
    # same parent makes them DTensors on (dp·cp, tp), FSDP2's 2-D composition (torch/distributed/fsdp/_fully_shard).
    shard_mesh = mesh["dp_cp"]
    for layer in model.model.layers:
        fully_shard(layer, mesh=shard_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=shard_mesh, reshard_after_forward=reshard_after_forward)


def parallelize(model: torch.nn.Module, mesh, d: ParallelDims, fsdp: bool) -> None:
    """TP first, then FSDP2 (the order torch's 2-D composition needs: fully_shard sees the TP DTensors)."""
    check_model(model, d)
    if d.tp > 1:
        apply_tp(model, mesh["tp"], d.sequence_parallel)
    if fsdp or d.cp > 1 or d.dp > 1:
        apply_fsdp(model, mesh)


@contextmanager
def cp_context(
    cp_mesh,
    buffers: Sequence[torch.Tensor],
    seq_dims: Sequence[int],
    checked: bool = True,
) -> Iterator[None]:
    """Inside: each buffer is this CP rank's part of the sequence and SDPA is ring attention (a no-op at cp 1).

    The model must run Hugging Face's "sdpa" attention with no padding mask: the ring covers causal SDPA only."""
    if cp_mesh.size() == 1:
        yield
        return
    why = checked and cp_unavailable(buffers[0].device)
    if why:
        raise RuntimeError(why)
    from torch.distributed.tensor.experimental import context_parallel

    with context_parallel(
        cp_mesh, buffers=list(buffers), buffer_seq_dims=list(seq_dims)
    ):
        yield


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective over its mesh), itself for a plain tensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def full_state_dict(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter whole, by its Hugging Face name: what the engines load and the safetensors file holds.

    A collective over the whole mesh: every rank must call it, in the same order (named_parameters is)."""
    out = []
    for name, p in model.named_parameters():
        out.append((name, full_tensor(p.detach())))
    return out


def grad_norm(params: Sequence[torch.nn.Parameter]) -> float:
    """The global gradient 2-norm over parameters some of which are DTensors (a collective) and some replicated."""
    sq = 0.0
    for p in params:
        if p.grad is not None:
            n = torch.linalg.vector_norm(p.grad.detach().float())
            sq += float(full_tensor(n)) ** 2
    return sq**0.5


def clip_grads(params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
    """clip_grad_norm_ for a mix of DTensor and plain gradients (torch's stacks the norms, which needs one kind)."""
    total = grad_norm(params)
    if max_norm > 0 and total > max_norm:
        scale = max_norm / (total + 1e-6)
        for p in params:
            if p.grad is not None:
                p.grad.detach().mul_(scale)
    return total


def full_grads(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter's gradient whole (a collective), for parity checks."""
    return [
        (n, full_tensor(p.grad))
        for n, p in model.named_parameters()
        if p.grad is not None
    ]


def save_dcp(
    path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> None:
    """The trainer's own sharded checkpoint: each rank writes its shards, DCP records the global layout."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(
        model, [optimizer] if optimizer is not None else []
    )
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)


def load_dcp(
    path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> None:
    """Load a checkpoint written by any mesh into this one: DCP reads the parts of each tensor this rank holds."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    opts = [optimizer] if optimizer is not None else []
    model_sd, optim_sd = get_state_dict(model, opts)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        model, opts, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )

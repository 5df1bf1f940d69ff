"""A few AdamW steps of a Hugging Face Qwen2/Llama model on a (dp, cp, tp) mesh: the parity and timing driver.

One rank (no process group) is the reference; under torchrun every rank runs the same steps on its part of
the batch (dp), of the sequence (cp) and of each layer (tp). The loss is next-token cross-entropy summed
over every token of the global batch and divided by their number, so each rank's share is its own token
sum over the global count, times dp·cp because FSDP2 averages the gradients over those ranks.

    torchrun --nproc_per_node 4 -m rlq_torch.tp_train --tp 2 --fsdp --steps 3 --out r.pt

Rank 0 writes ``--out`` (torch.save): the loss and the whole gradients of every step, the final whole
weights, the step times. ``--save-dcp`` writes the sharded checkpoint (weights and optimizer), ``--save-hf``
the whole weights as the engines load them (safetensors), ``--resume-dcp`` starts from a checkpoint written
by any mesh.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlq_torch import tensor_parallel as tp_mod  # noqa: E402

VOCAB = 128


def tiny_config(
    arch: str = "qwen2", layers: int = 2, hidden: int = 64, kv_heads: int = 2
):
    """A random model small enough for CI: 4 query heads and 2 key/value heads (both cut by TP=2)."""
    from transformers import LlamaConfig, Qwen2Config

    cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}[arch]
    return cls(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )


def make_model(
    arch: str,
    layers: int,
    hidden: int,
    device: torch.device,
    model_dir: str | None = None,
    kv_heads: int = 2,
):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1234)  # every rank builds the same weights before they are cut
    if model_dir:
        m = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
    else:
        m = AutoModelForCausalLM.from_config(
            tiny_config(arch, layers, hidden, kv_heads),
            dtype=torch.float32,
            attn_implementation="sdpa",
        )
    return m.to(device)


def make_batches(
    steps: int, batch: int, seq: int, vocab: int, seed: int = 7
) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(steps)]


def step_loss(
    model,
    ids: torch.Tensor,
    global_tokens: int,
    scale: float,
    mesh,
    checked: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's scaled loss (for backward) and its unscaled token sum (for the reported loss)."""
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    positions = (
        torch.arange(ids.shape[1], device=ids.device)
        .unsqueeze(0)
        .expand_as(ids)
        .contiguous()
    )
    cp_mesh = mesh["cp"] if mesh is not None else None
    ids, labels = ids.clone(), labels.clone()
    if cp_mesh is not None and cp_mesh.size() > 1:
        with tp_mod.cp_context(
            cp_mesh, [ids, labels, positions], [1, 1, 1], checked=checked
        ):
            logits = model(input_ids=ids, position_ids=positions).logits
            s = torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1),
                labels.flatten(),
                ignore_index=-100,
                reduction="sum",
            )
            (s * (scale / global_tokens)).backward()
        return s.detach(), s.detach()
    logits = model(input_ids=ids, position_ids=positions).logits
    s = torch.nn.functional.cross_entropy(
        logits.float().flatten(0, 1),
        labels.flatten(),
        ignore_index=-100,
        reduction="sum",
    )
    (s * (scale / global_tokens)).backward()
    return s.detach(), s.detach()


def train(args, rank: int, world: int, device: torch.device) -> dict:
    dims = tp_mod.ParallelDims(world, args.tp, args.cp, args.sequence_parallel)
    tp_mod.check_dims(dims)
    model = make_model(
        args.arch, args.layers, args.hidden, device, args.model_dir, args.kv_heads
    )
    mesh = None
    if world > 1:
        if (
            dims.cp > 1
            and not args.unchecked_cp
            and (why := tp_mod.cp_unavailable(device))
        ):
            raise RuntimeError(why)
        mesh = tp_mod.build_mesh(device.type, dims)
        tp_mod.parallelize(model, mesh, dims, fsdp=args.fsdp)
    params = [p for p in model.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01, foreach=False)
    resumed_step = 0.0
    if args.resume_dcp:
        tp_mod.load_dcp(args.resume_dcp, model, opt)
        resumed_step = float(
            opt.state[params[0]]["step"]
        )  # AdamW's step count came back with the moments
    vocab = model.config.vocab_size
    batches = make_batches(args.steps, args.batch, args.seq, vocab)
    dp_rank = mesh["dp"].get_local_rank() if mesh is not None else 0
    dp = dims.dp if mesh is not None else 1
    scale = float(dp * dims.cp) if mesh is not None else 1.0
    out: dict = {
        "losses": [],
        "grads": [],
        "step_s": [],
        "grad_norms": [],
        "resumed_step": resumed_step,
    }
    for ids in batches:
        t0 = time.perf_counter()
        mine = ids[dp_rank::dp].to(device)
        global_tokens = ids.shape[0] * (ids.shape[1] - 1)
        opt.zero_grad(set_to_none=True)
        s, _ = step_loss(
            model, mine, global_tokens, scale, mesh, checked=not args.unchecked_cp
        )
        if mesh is not None:
            # the whole batch's token sum: over dp and cp (tp ranks hold the same sum)
            torch.distributed.all_reduce(s, group=mesh["dp_cp"].get_group())
        out["grad_norms"].append(tp_mod.clip_grads(params, args.clip))
        grads = tp_mod.full_grads(model) if args.keep_grads else []
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        out["step_s"].append(time.perf_counter() - t0)
        out["losses"].append(float(s) / global_tokens)
        if rank == 0 and grads:
            out["grads"].append({n: g.detach().cpu().clone() for n, g in grads})
    weights = tp_mod.full_state_dict(
        model
    )  # a collective: every rank gathers the TP and FSDP shards
    if rank == 0:
        out["weights"] = {n: w.detach().cpu().clone() for n, w in weights}
        if args.push_engines:
            out["push"] = push(args, weights)
    if args.save_dcp:
        tp_mod.save_dcp(args.save_dcp, model, opt)
    if args.save_hf and rank == 0:
        from safetensors.torch import save_file

        os.makedirs(args.save_hf, exist_ok=True)
        save_file(
            {n: w.contiguous() for n, w in out["weights"].items()},
            os.path.join(args.save_hf, "model.safetensors"),
        )
    return out


def push(args, weights: list[tuple[str, torch.Tensor]]) -> dict:
    """Rank 0 sends the gathered whole weights to the engines, as the trainer server's trainer_push does
    (weight_push.DistributedPusher: a process group of its own beside the training mesh)."""
    from rlq_torch.weight_push import DistributedPusher

    pusher = DistributedPusher(
        args.push_engines.split(","),
        master_address="127.0.0.1",
        master_port=args.push_master_port,
        backend=args.push_backend,
    )
    try:
        return pusher.push(weights, args.steps)
    finally:
        pusher.close()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="AdamW steps of a HF model on a (dp, cp, tp) mesh"
    )
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--cp", type=int, default=1)
    ap.add_argument(
        "--fsdp",
        action="store_true",
        help="FSDP2 over the dp·cp ranks (always on with dp or cp > 1)",
    )
    ap.add_argument("--sequence-parallel", action="store_true")
    ap.add_argument("--arch", choices=["qwen2", "llama"], default="qwen2")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument(
        "--kv-heads",
        type=int,
        default=2,
        help="key/value heads of the random model (4: plain multi-head attention)",
    )
    ap.add_argument(
        "--model-dir",
        default=None,
        help="a Hugging Face directory instead of the tiny random model",
    )
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--keep-grads",
        action="store_true",
        help="gather every step's whole gradients (parity)",
    )
    ap.add_argument("--out", default=None)
    ap.add_argument("--save-dcp", default=None)
    ap.add_argument("--save-hf", default=None)
    ap.add_argument("--resume-dcp", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--push-engines",
        default="",
        help="SGLang URLs rank 0 pushes the final weights to",
    )
    ap.add_argument("--push-master-port", type=int, default=29600)
    ap.add_argument("--push-backend", default="gloo")
    ap.add_argument(
        "--unchecked-cp",
        action="store_true",
        help="testing aid: run context parallel where cp_unavailable() says it cannot, to see torch's own error",
    )
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device(args.device)
    if world > 1:
        # two ranks may share one GPU (a one-GPU machine): NCCL refuses that, gloo moves CUDA tensors through the host
        backend = (
            "nccl"
            if device.type == "cuda" and torch.cuda.device_count() >= world
            else "gloo"
        )
        torch.distributed.init_process_group(backend)
    try:
        out = train(args, rank, world, device)
        if rank == 0 and args.out:
            torch.save(out, args.out)
        if world > 1:
            # Every rank done (rank 0's save included) before the group goes: a rank that tears
            # gloo down while another still runs can abort the process.
            torch.distributed.barrier()
    finally:
        if world > 1:
            torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

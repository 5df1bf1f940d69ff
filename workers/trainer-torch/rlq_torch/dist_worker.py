"""One rank of the trainer's process group, started by torchrun (``server.py --nproc N`` launches it).

    torchrun --nproc_per_node N --max_restarts 0 rlq_torch/dist_worker.py --device cpu|cuda ...

Every rank builds the same ``TorchTrainer`` with its ``Dist(rank, world)``. Rank 0 holds the one
connection to the HTTP front (server.py), the single process that serves the protocol for all
ranks: it receives a step (request, decoded batch, parsed config), hands it to every rank with
``broadcast_object_list``, and sends progress, then the result or the error, back to the front.
A cancel from the front is agreed by all ranks at their next micro-batch round (dist.py).

Failures: any exception other than a cancel ends this rank (exit code 1) after rank 0 reported
it; torchrun (``--max_restarts 0``) then stops the other ranks and exits, and the front marks the
group dead and starts a fresh one for the next step. A killed rank makes its peers' collectives
fail (gloo: connection closed), which is the same path. A step is never half-committed: files
are written only after the last optimizer step, weights last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from multiprocessing.connection import Client

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)


def log(msg: str) -> None:
    sys.stderr.write(
        f"[trainer-torch rank {os.environ.get('RANK', '?')} {time.strftime('%H:%M:%S')}] {msg}\n"
    )
    sys.stderr.flush()


def watch_front(pid: int) -> None:
    """Every rank ends when the front (server.py) is gone, even SIGKILLed: no orphaned process group."""
    if pid <= 0:
        return
    import threading

    def loop() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                log(f"the front (pid {pid}) is gone: exiting")
                os._exit(1)
            except PermissionError:
                pass

    threading.Thread(target=loop, name="front-watch", daemon=True).start()


def push_weights(trainer, pusher, enabled: bool, result, progress) -> None:
    """With trainer_push, every rank calls it after a step and rank 0 (the one with a pusher) pushes the version
    it holds. A failed push does not fail the committed step: it is reported in the result (weight_push.push_held)."""
    if not enabled:
        return
    full = (
        trainer.full_weights() if hasattr(trainer, "full_weights") else None
    )  # a collective when the parameters are sharded
    if pusher is None:
        return
    from rlq_torch.weight_push import push_held

    progress(1, 1, "weight_push")
    result["weight_push"] = push_held(
        pusher, trainer, result["weight_version_out"], log, named=full
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="a rank of rlq's PyTorch trainer (started by torchrun from server.py --nproc N)"
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--bf16", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--defaults", default="{}", help="the server's defaults (JSON)")
    ap.add_argument("--timeout-s", type=float, default=600, help="collective timeout")
    ap.add_argument(
        "--debug-rank-delay-s",
        type=float,
        default=0.0,
        help="testing aid: each micro-batch round waits this long",
    )
    ap.add_argument(
        "--sharding",
        choices=["zero1", "fsdp", "fsdp1"],
        default="zero1",
        help="zero1: DDP + sharded optimizer state; fsdp: FSDP2 fully_shard where torch has it, else FSDP1; fsdp1: FullyShardedDataParallel",
    )
    ap.add_argument(
        "--push-engines",
        default="",
        help="weight_sync trainer_push: rank 0 pushes each trained version to these SGLang URLs",
    )
    ap.add_argument("--push-master-address", default="127.0.0.1")
    ap.add_argument("--push-master-port", type=int, default=29600)
    ap.add_argument("--push-backend", default="nccl")
    ap.add_argument("--push-api-key-env", default=None)
    ap.add_argument("--push-admin-api-key-env", default=None)
    ap.add_argument(
        "--push-via",
        choices=["distributed", "tensor", "vllm-nccl", "vllm-gloo"],
        default="distributed",
    )
    ap.add_argument("--push-tp-size", type=int, default=1)
    args = ap.parse_args(argv)

    from rlq_torch.torch_setup import configure_torch

    configure_torch(args)
    import torch
    import torch.distributed as tdist

    from rlq_torch.dist import Dist
    from rlq_torch.models import CheckpointError, preload_hf
    from rlq_torch.trainer import Cancelled, StepError, TorchTrainer

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(local_rank)
    tdist.init_process_group(
        "nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout_s)
    )
    rank, world = tdist.get_rank(), tdist.get_world_size()
    from rlq_torch.fsdp import resolve

    d = Dist(rank, world, sharding=resolve(args.sharding))
    device = f"cuda:{local_rank}" if cuda else "cpu"
    trainer = TorchTrainer(
        device,
        json.loads(args.defaults),
        bf16=None if args.bf16 == "auto" else args.bf16 == "on",
        log=log,
        dist=d,
    )

    # trainer_push: rank 0 of this group is rank 0 of the push group too (its own group, weight_push.py), as in
    # slime's update_weight_from_distributed, where one trainer rank broadcasts the gathered weights to the engines.
    pusher = None
    if rank == 0 and args.push_engines:
        from rlq_torch.weight_push import push_api_key, pusher_from_args

        pusher = pusher_from_args(args, push_api_key(args, os.environ))
    watch_front(int(os.environ.get("RLQ_FRONT_PID", "0")))
    preload_hf()  # before the hello: the group starts ahead of the first step, which then finds them imported
    conn = None
    if rank == 0:
        host, port = os.environ["RLQ_FRONT_ADDR"].rsplit(":", 1)
        conn = Client(
            (host, int(port)), authkey=bytes.fromhex(os.environ["RLQ_FRONT_KEY"])
        )
    pids = d.all_gather(
        {
            "rank": rank,
            "pid": os.getpid(),
            "host": os.uname().nodename,
            "device": device,
        }
    )
    if conn is not None:
        conn.send(("hello", pids))
    log(f"up: world {world}, {device}, torch {torch.__version__}")

    cancel = {"flag": False}

    def cancel_requested() -> bool:
        while conn is not None and not cancel["flag"] and conn.poll(0):
            m = conn.recv()
            if m and m[0] == "cancel":
                cancel["flag"] = True
        return cancel["flag"]

    d.cancel_requested = cancel_requested
    while True:
        box = [None]
        if rank == 0:
            try:
                box[0] = conn.recv()
                if (
                    box[0] and box[0][0] == "step"
                ):  # every rank learns whether rank 0 pushes (fsdp gathers the weights for it)
                    box[0] = (*box[0], pusher is not None)
            except (EOFError, OSError):
                box[0] = ("shutdown",)  # the front went away: stop the group
        tdist.broadcast_object_list(box, src=0)
        msg = box[0]
        if msg[0] == "shutdown":
            break
        if msg[0] != "step":
            continue
        _, req, batch, t, o, pushing = msg
        cancel["flag"] = False

        def progress(done: int, total: int, phase: str) -> None:
            if conn is not None:
                conn.send(("progress", done, total, phase))
            if args.debug_rank_delay_s > 0 and (
                phase.startswith("train") or phase.startswith("old_logprobs")
            ):
                time.sleep(args.debug_rank_delay_s)

        try:
            result = trainer.train_step(req, batch, t, o, progress, lambda: None)
            push_weights(trainer, pusher, pushing, result, progress)
            if conn is not None:
                conn.send(("result", result, trainer.weight_version))
        except Cancelled:
            trainer.held = None
            if conn is not None:
                conn.send(("cancelled",))
        except Exception as e:  # noqa: BLE001
            code, retryable = ("internal", True)
            if isinstance(e, StepError):
                code, retryable = e.code, e.retryable
            elif isinstance(e, CheckpointError):
                code = "version_unavailable"  # as server.py answers it with one rank
            elif "out of memory" in str(e).lower():
                code = "oom"
            what = f"rank {rank}: {type(e).__name__}: {e}"
            if code == "internal" and any(
                k in str(e)
                for k in (
                    "gloo",
                    "Connection closed",
                    "Connection reset",
                    "NCCL",
                    "Timed out",
                )
            ):
                what = f"the process group failed (a peer rank died, hung or lost its connection): {what}"
            traceback.print_exc()
            if conn is not None:
                try:
                    conn.send(("error", code, what, retryable))
                except OSError:
                    pass
            # The peers may be inside a collective this rank will never join: end the group (torchrun stops the rest).
            sys.stderr.flush()
            os._exit(1)
    if conn is not None:
        conn.close()
    if pusher is not None:
        pusher.close()
    # Not destroy_process_group() nor a normal interpreter exit: torch 1.13's ProcessGroupGloo destructor
    # joins a gloo thread that waits for the GIL the exiting main thread holds, and the rank hangs for ever.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The other nodes of a multi-node trainer: runs this node's ranks of the front's process group.

On the first node (it serves the protocol and holds global rank 0):

    python3 workers/trainer-torch/server.py --device cuda --nproc 8 --nnodes 2 --master-addr 10.0.0.1 --master-port 29511

on each other node (node ranks 1 .. nnodes-1):

    python3 workers/trainer-torch/node.py --device cuda --nproc 8 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29511

It runs torchrun for its local ranks (``rlq_torch/dist_worker.py``, static rendezvous at the
master address), and starts it again whenever it ends: a process group that failed (a rank
died anywhere) is rebuilt when the front starts its next group. SIGTERM stops it and its ranks.
The model, batches and configuration come from the front with every step (rank 0 broadcasts
them); checkpoints are written by rank 0 (weights) and by every rank (its optimizer shard), so
``output_dir`` must be on storage all nodes share.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def log(msg: str) -> None:
    sys.stderr.write(f"[trainer-torch node {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description="this node's ranks of a multi-node rlq PyTorch trainer (the front is server.py --nnodes N)"
    )
    ap.add_argument("--nnodes", type=int, required=True)
    ap.add_argument(
        "--node-rank",
        type=int,
        required=True,
        help="1 .. nnodes-1 (node 0 is the front's)",
    )
    ap.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="ranks on this node (one per GPU); the same on every node",
    )
    ap.add_argument("--master-addr", required=True)
    ap.add_argument("--master-port", type=int, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--bf16", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--dist-timeout-s", type=float, default=600)
    ap.add_argument(
        "--sharding",
        choices=["zero1", "fsdp", "fsdp1"],
        default="zero1",
        help="the front's --sharding (every rank must agree)",
    )
    ap.add_argument(
        "--once", action="store_true", help="run the group once, do not restart it"
    )
    args = ap.parse_args(argv)
    if not 1 <= args.node_rank < args.nnodes:
        ap.error(f"--node-rank must be in 1..{args.nnodes - 1} (node 0 is server.py's)")

    from rlq_torch.dist_front import torchrun_command

    bf16 = (
        args.bf16
        if args.bf16 != "auto"
        else ("on" if args.device.startswith("cuda") else "off")
    )
    worker_args = [
        "--device",
        "cuda" if args.device.startswith("cuda") else "cpu",
        "--bf16",
        bf16,
        "--timeout-s",
        str(args.dist_timeout_s),
        "--sharding",
        args.sharding,
    ]
    if args.threads:
        worker_args += ["--threads", str(args.threads)]
    if args.deterministic:
        worker_args.append("--deterministic")
    logs = tempfile.mkdtemp(prefix="rlq-torchrun-node-")
    state = {"proc": None, "stop": False}

    def stop(*_):
        state["stop"] = True
        p = state["proc"]
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads or 1))
    env.pop("RLQ_FRONT_PID", None)
    while not state["stop"]:
        cmd = torchrun_command(
            args.nnodes,
            args.node_rank,
            args.nproc,
            args.master_addr,
            args.master_port,
            logs,
            worker_args,
        )
        log(
            f"node {args.node_rank}/{args.nnodes}: starting {args.nproc} rank(s), rendezvous {args.master_addr}:{args.master_port}"
        )
        state["proc"] = subprocess.Popen(
            cmd, env=env, stdout=sys.stderr, stderr=sys.stderr, start_new_session=True
        )
        rc = state["proc"].wait()
        try:
            os.killpg(
                state["proc"].pid, signal.SIGKILL
            )  # no rank outlives its torchrun
        except ProcessLookupError:
            pass
        log(f"node {args.node_rank}: the group ended (torchrun exit code {rc})")
        if args.once:
            break
        time.sleep(1.0)
    import shutil

    shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    main()

"""The HTTP front's side of a multi-process trainer (``server.py --nproc N``).

``DistTrainer`` has the ``TorchTrainer`` interface server.py uses (``train_step``,
``weight_version``, ``defaults``, ``device``, ``bf16``, ``held``), and runs each step on a
process group that torchrun starts (``rlq_torch/dist_worker.py``): one process, the front, serves
the protocol for all ranks. The group starts when the server does (``start_group_in_background``),
so the first step does not wait for torchrun and the ranks' imports, and is kept warm; the
weights and the sharded optimizer state stay in the ranks' memory between steps.

When the group fails (a rank killed or crashed, a lost peer, a collective timeout), the step
in flight fails with the retryable ``internal`` code, the group is torn down (its whole
process session), and the next step starts a fresh one, which reloads from the step's
committed input checkpoint (the version handshake): rlq's retry then trains the step again to
the same weights.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Listener
from typing import Any

import torch

from .trainer import Cancelled, StepError

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(
    nnodes: int,
    node_rank: int,
    nproc: int,
    master_addr: str,
    master_port: int,
    log_dir: str,
    worker_args: list[str],
) -> list[str]:
    """torchrun for this node's ranks (static rendezvous at master_addr:master_port; node 0 holds global rank 0)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--node_rank",
        str(node_rank),
        f"--nproc_per_node={nproc}",
        "--master_addr",
        master_addr,
        f"--master_port={master_port}",
        "--max_restarts",
        "0",
        # torchrun checks its ranks every monitor interval (default 5 s): a dead rank, or ranks that exited
        # at shutdown, are noticed within 1 s instead, so a failed group is torn down (and retried) sooner.
        "--monitor_interval",
        "1",
        # torch 1.13's torchrun cannot parse its own default "--redirects 0" under Python 3.11 (IntFlag no longer
        # iterates NONE): redirect the ranks' (unused) stdout to the log dir and tee their stderr to ours.
        "--redirects",
        "1",
        "--tee",
        "2",
        "--log_dir",
        log_dir,
        WORKER,
        *worker_args,
    ]


class DistTrainer:
    def __init__(
        self,
        nproc: int,
        device: str,
        defaults: dict[str, Any],
        bf16: bool | None,
        log: Callable[[str], None],
        threads: int | None = None,
        deterministic: bool = False,
        timeout_s: float = 600,
        start_timeout_s: float = 600,
        debug_rank_delay_s: float = 0.0,
        master_port: int | None = None,
        nnodes: int = 1,
        master_addr: str = "127.0.0.1",
        push_args: list[str] | None = None,
        sharding: str = "zero1",
    ):
        self.nproc = nproc
        self.nnodes = nnodes
        self.master_addr = master_addr
        self.device = torch.device(device)
        self.defaults = defaults
        self.bf16 = (self.device.type == "cuda") if bf16 is None else bf16
        self.held = None  # server.py clears it after an OOM; the ranks drop their own
        self.log = log
        self.threads = threads
        self.deterministic = deterministic
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.debug_rank_delay_s = debug_rank_delay_s
        self.master_port = master_port
        self.sharding = sharding  # zero1 | fsdp | fsdp1 (fsdp.py)
        self.push_args = list(
            push_args or []
        )  # weight_sync trainer_push: rank 0 pushes after each step (dist_worker.py)
        self.proc: subprocess.Popen | None = None
        self.conn = None
        self.ranks: list[dict[str, Any]] = []
        self._version: int | None = None
        self._lock = threading.Lock()

    @property
    def weight_version(self) -> int | None:
        return (
            self._version
            if self.proc is not None and self.proc.poll() is None
            else None
        )

    def describe(self) -> dict[str, Any]:
        from .fsdp import resolve

        fsdp = (
            resolve(self.sharding) if self.sharding != "zero1" else None
        )  # which FSDP the ranks run
        return {
            "world_size": self.nproc * self.nnodes,
            "nnodes": self.nnodes,
            "sharding": self.sharding,
            "fsdp": fsdp,
            "ranks": list(self.ranks),
            "group_up": self.proc is not None and self.proc.poll() is None,
        }

    # ----------------------------------------------------------- the group

    def _start_group(self) -> None:
        key = secrets.token_bytes(32)
        listener = Listener(("127.0.0.1", 0), authkey=key)
        addr = listener.address
        worker_args = [
            "--device",
            "cuda" if self.device.type == "cuda" else "cpu",
            "--bf16",
            "on" if self.bf16 else "off",
            "--defaults",
            json.dumps(self.defaults),
            "--timeout-s",
            str(self.timeout_s),
        ]
        if self.threads:
            worker_args += ["--threads", str(self.threads)]
        if self.deterministic:
            worker_args.append("--deterministic")
        if self.debug_rank_delay_s > 0:
            worker_args += ["--debug-rank-delay-s", str(self.debug_rank_delay_s)]
        worker_args += ["--sharding", self.sharding, *self.push_args]
        port = self.master_port or _free_port()
        cmd = torchrun_command(
            self.nnodes,
            0,
            self.nproc,
            self.master_addr,
            port,
            self._log_dir(),
            worker_args,
        )
        env = dict(
            os.environ,
            RLQ_FRONT_ADDR=f"{addr[0]}:{addr[1]}",
            RLQ_FRONT_KEY=key.hex(),
            RLQ_FRONT_PID=str(os.getpid()),
            OMP_NUM_THREADS=str(self.threads or 1),
        )
        self.log(
            f"starting a process group of {self.nproc * self.nnodes} ranks ({self.nnodes} node(s), torchrun, master {self.master_addr}:{port})"
        )
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=sys.stderr, stderr=sys.stderr, start_new_session=True
        )
        got: dict[str, Any] = {}

        def accept() -> None:
            try:
                got["conn"] = listener.accept()
            except Exception as e:  # noqa: BLE001
                got["error"] = e

        th = threading.Thread(target=accept, daemon=True)
        th.start()
        deadline = time.time() + self.start_timeout_s
        while th.is_alive() and time.time() < deadline and self.proc.poll() is None:
            th.join(0.1)
        if "conn" not in got:
            rc = self.proc.poll()
            self._teardown()
            listener.close()
            why = (
                f"torchrun exited with {rc}"
                if rc is not None
                else f"rank 0 did not connect within {self.start_timeout_s:.0f} s"
            )
            raise StepError(
                "internal",
                f"the process group of {self.nproc} ranks did not start: {why}",
                True,
            )
        listener.close()
        self.conn = got["conn"]
        while not self.conn.poll(1.0):
            if self.proc.poll() is not None:
                raise self._group_failed("while starting")
        msg = self.conn.recv()
        self.ranks = msg[1] if msg and msg[0] == "hello" else []
        self.log(
            f"process group up: {len(self.ranks)} ranks, pids {[r['pid'] for r in self.ranks]}"
        )

    def _log_dir(self) -> str:
        import tempfile

        if getattr(self, "_logs", None) is None:
            self._logs = tempfile.mkdtemp(prefix="rlq-torchrun-")
        return self._logs

    def _teardown(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
        self.conn = None
        p = self.proc
        self.proc = None
        self._version = None
        self.ranks = []
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        elif p is not None:
            try:  # torchrun is gone; make sure no rank outlives it
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _group_failed(self, when: str) -> StepError:
        p = self.proc
        rc = None
        if p is not None:
            try:
                rc = p.wait(15)  # torchrun notices the dead rank and stops the others
            except subprocess.TimeoutExpired:
                rc = None
        self._teardown()
        return StepError(
            "internal",
            f"the process group failed {when} (torchrun exit code {rc}): a rank died or lost its peers; "
            "the group restarts and a retry trains the step again from its input checkpoint",
            True,
        )

    def close(self) -> None:
        """Stops the group (server shutdown). Not under the step lock: a step in flight is abandoned, as a SIGKILL would."""
        if self.conn is not None and not self._lock.locked():
            try:
                self.conn.send(("shutdown",))
            except OSError:
                pass
            if self.proc is not None:
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        self._teardown()
        if getattr(self, "_logs", None):
            import shutil

            shutil.rmtree(self._logs, ignore_errors=True)
            self._logs = None

    def start_group_in_background(self) -> None:
        """Starts the group on a thread, holding the step lock, so a step that arrives meanwhile waits
        for it. A start that fails is logged and left to the first step, which starts the group again
        and reports the failure as that step's error."""

        def start() -> None:
            with self._lock:
                if self.proc is not None:
                    return
                try:
                    self._start_group()
                except Exception as e:  # noqa: BLE001 (the first step starts it again and reports it)
                    self.log(
                        f"the process group did not start ahead of the first step: {e}"
                    )
                    self._teardown()

        threading.Thread(target=start, name="rlq-group-start", daemon=True).start()

    # ----------------------------------------------------------- a step

    def train_step(
        self,
        req: dict[str, Any],
        batch,
        t,
        o,
        progress: Callable[[int, int, str], None],
        check: Callable[[], None],
    ) -> dict[str, Any]:
        with self._lock:
            if self.proc is None or self.proc.poll() is not None or self.conn is None:
                self._teardown()
                self._start_group()
            try:
                self.conn.send(("step", req, batch, t, o))
            except OSError as e:
                raise self._group_failed("before the step") from e
            cancel_sent = False
            while True:
                if not cancel_sent:
                    try:
                        check()
                    except Cancelled:
                        try:
                            self.conn.send(("cancel",))
                        except OSError as e:
                            raise self._group_failed("while cancelling") from e
                        cancel_sent = True
                try:
                    ready = self.conn.poll(0.05)
                    msg = self.conn.recv() if ready else None
                except (EOFError, OSError) as e:
                    raise self._group_failed("during the step") from e
                if msg is None:
                    if self.proc.poll() is not None:
                        raise self._group_failed("during the step")
                    continue
                kind = msg[0]
                if kind == "progress":
                    progress(msg[1], msg[2], msg[3])
                elif kind == "result":
                    self._version = msg[2]
                    return msg[1]
                elif kind == "cancelled":
                    self._version = None
                    raise Cancelled()
                elif kind == "error":
                    _, code, message, retryable = msg
                    self._group_failed("")  # the ranks exit after an error: reap them
                    raise StepError(code, message, retryable)

"""The trainer's own checkpoint through torch.distributed.checkpoint, saved asynchronously (server.py --trainer-checkpoint dcp).

The default checkpoint is ``optimizer.safetensors`` (models.write_optimizer), written before the weights
on the step's critical path: for a 0.6B model its moments and fp32 masters are 7 GB written and fsync'd
every step. With ``dcp`` the same state (``exp_avg.<name>``, ``exp_avg_sq.<name>``, ``master.<name>``,
the iteration) goes into ``optimizer.dcp/`` by ``torch.distributed.checkpoint.async_save``: the tensors
are copied into host buffers of this module's own (pinned on cuda) while the weights file is written, and
written (and fsync'd) by a background thread, or by DCP's checkpoint daemon (``--dcp-executor process``), once
the weights file is on disk and the step has answered. The weights file still answers the step only once it is
complete (server.py's contract: rlq commits what the result names); the optimizer state's write starts after it,
so the two never share the disk.

What keeps a resume exact:

- one save in flight at a time: the next save, and any load of a checkpoint from disk, wait for it first
  (``AsyncCheckpoints.wait``);
- the weights file's metadata says ``rlq_optimizer: dcp``, so a directory whose DCP save never finished
  (the trainer stopped while writing: DCP writes ``.metadata`` last) fails the load by name
  (``CheckpointError``, the protocol's version_unavailable) instead of warm-starting with zero moments.

One rank only, and not with ``checkpoints: fetch`` (its transfer moves ``optimizer.safetensors``): those
steps keep the safetensors file.
"""

from __future__ import annotations

import os
import time
import warnings

import torch
from torch.distributed.checkpoint.staging import AsyncStager

DCP_DIR = "optimizer.dcp"
OPTIMIZER_META_KEY = "rlq_optimizer"
CHECKPOINT_FORMATS = ("safetensors", "dcp")
# Who writes a DCP save: a thread of this process (DCP's default), or DCP's checkpoint daemon, a process of its own
# started at the first save, so the write's serialisation never holds this process's GIL while it trains.
DCP_EXECUTORS = ("thread", "process")
# One process with no process group is what no_dist=True means; DCP still warns about it on every call, from its own thread.
warnings.filterwarnings(
    "ignore",
    message="torch.distributed is disabled, unavailable or uninitialized",
    category=UserWarning,
)


class AsyncCheckpoints:
    """The one asynchronous DCP save in flight, if any, and the host buffers its state is staged into."""

    def __init__(self, executor: str = "thread"):
        if executor not in DCP_EXECUTORS:
            raise ValueError(
                f"DCP executor {executor!r}: expected one of {', '.join(DCP_EXECUTORS)}"
            )
        self.executor = executor
        self._pending = None  # (directory, future)
        self._host: dict[str, torch.Tensor] = {}
        self._staged = None  # the staged state, between stage() and start()
        # The last save's parts (seconds): the wait for the previous write, and the copy into the host buffers.
        self.timing: dict[str, float] = {}

    def wait(self) -> None:
        """Blocks until the save in flight is on disk; raises what its write raised."""
        pending, self._pending = self._pending, None
        if pending is not None:
            getattr(
                pending[1], "upload_completion", pending[1]
            ).result()  # a Future, or an AsyncSaveResponse (async staging)

    def save(self, out_dir: str, moments, masters, iteration: int) -> None:
        """Starts saving the optimizer state into out_dir/optimizer.dcp (after the previous save finished)."""
        self.stage(moments, masters, iteration)
        self.start(out_dir)

    def stage(self, moments, masters, iteration: int) -> None:
        """Waits for the previous write, then copies the state into the host buffers: once this returns the step may
        change its tensors. The buffers are allocated at the first save and refilled after (the moments and masters
        are the same tensors every step): pinned on cuda, so the copy runs at the link's rate, and in shared memory for
        the process executor, so the daemon maps them instead of receiving a copy."""
        began = time.perf_counter()
        self.wait()
        waited = time.perf_counter()
        state = {}
        for n, (m, v) in moments.items():
            state[f"exp_avg.{n}"] = m
            state[f"exp_avg_sq.{n}"] = v
        for n, t in masters.items():
            state[f"master.{n}"] = t
        on_cuda = any(t.is_cuda for t in state.values())
        if set(self._host) != set(state):
            self._host = {}
        for k, t in state.items():
            h = self._host.get(k)
            if h is None or h.shape != t.shape or h.dtype != t.dtype:
                h = self._host[k] = self._buffer(t, on_cuda)
            h.copy_(t.detach(), non_blocking=on_cuda)
        if on_cuda:
            torch.cuda.synchronize()
        self._staged = {
            **self._host,
            "iteration": torch.tensor(iteration, dtype=torch.int64),
        }
        self.timing = {
            "save_wait_s": waited - began,
            "save_stage_s": time.perf_counter() - waited,
        }

    def _buffer(self, t: torch.Tensor, on_cuda: bool) -> torch.Tensor:
        if self.executor == "process":
            return torch.empty(t.shape, dtype=t.dtype).share_memory_()
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=on_cuda)

    def start(self, out_dir: str) -> None:
        """Starts writing the staged state into out_dir/optimizer.dcp; returns at once."""
        import torch.distributed.checkpoint as dcp

        state, self._staged = self._staged, None
        if state is None:
            raise RuntimeError("AsyncCheckpoints.start without a staged state")
        path = os.path.join(out_dir, DCP_DIR)
        self._pending = (
            path,
            dcp.async_save(
                state,
                storage_writer=_writer(path),
                async_stager=_AlreadyStaged(),
                **self._how(),
            ),
        )

    def _how(self) -> dict:
        """async_save's arguments for the executor: the daemon needs a process group (its rank and world come from
        one), so a trainer of one process makes a group of one, on a store in memory."""
        if self.executor == "thread":
            return {"no_dist": True}
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict_saver import (
            AsyncCheckpointerType,
        )

        if not dist.is_initialized():
            dist.init_process_group(
                "gloo", store=dist.HashStore(), rank=0, world_size=1
            )
        return {"async_checkpointer_type": AsyncCheckpointerType.PROCESS}


class _AlreadyStaged(AsyncStager):
    """DCP's stager protocol for a state already in host buffers of its own (AsyncCheckpoints.stage): DCP's
    DefaultStager would copy it once more, and a DefaultStager kept for its pinned buffers failed its second use on
    torch 2.11 (KeyError: <class 'type'>), so the buffers are this module's and DCP only writes them."""

    _synchronize_after_execute = False

    def stage(self, state_dict, **kwargs):
        return state_dict

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass


def _writer(path: str):
    """DCP's file writer with one file and one thread per share of the state: its default single thread writes
    the optimizer state far below a disk's rate, and the next step's save waits for that write."""
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(
        path, sync_files=True, thread_count=max(1, min(8, os.cpu_count() or 1))
    )


def has_dcp(path: str, weights_meta) -> bool:
    """Whether the checkpoint directory's optimizer state is (or was meant to be) a DCP checkpoint."""
    return (
        os.path.isdir(os.path.join(path, DCP_DIR))
        or weights_meta.get(OPTIMIZER_META_KEY) == "dcp"
    )


def read(path: str, names):
    """(iteration, {name: (exp_avg, exp_avg_sq)}, masters) from path/optimizer.dcp, as models.read_optimizer returns them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    from .models import CheckpointError

    d = os.path.join(path, DCP_DIR)
    if not os.path.isfile(os.path.join(d, ".metadata")):
        raise CheckpointError(
            f"{path}: the optimizer state in {DCP_DIR}/ is incomplete (its asynchronous save never finished: the trainer "
            "stopped while writing it), so this step cannot resume exactly; resume from an earlier step's checkpoint"
        )
    meta = FileSystemReader(d).read_metadata().state_dict_metadata
    state = {}
    for key, m in meta.items():
        dtype = getattr(getattr(m, "properties", None), "dtype", None)
        if not hasattr(m, "size") or dtype is None:
            continue
        state[key] = torch.zeros(tuple(m.size), dtype=dtype)
    dcp.load(state, checkpoint_id=d, no_dist=True)
    moments = {}
    for n in names:
        m, v = state.get(f"exp_avg.{n}"), state.get(f"exp_avg_sq.{n}")
        if m is None or v is None:
            raise CheckpointError(f"{d}: moments for {n} missing")
        moments[n] = (m, v)
    masters = {
        k[len("master.") :]: t for k, t in state.items() if k.startswith("master.")
    }
    if "iteration" not in state:
        raise CheckpointError(f"{d}: no iteration recorded")
    return int(state["iteration"]), moments, masters

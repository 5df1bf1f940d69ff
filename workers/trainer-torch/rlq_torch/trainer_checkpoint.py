"""The trainer's own checkpoint through torch.distributed.checkpoint, saved asynchronously (server.py --trainer-checkpoint dcp).

The default checkpoint is ``optimizer.safetensors`` (models.write_optimizer), written before the weights
on the step's critical path: for a 0.6B model its moments and fp32 masters are 7 GB written and fsync'd
every step. With ``dcp`` the same state (``exp_avg.<name>``, ``exp_avg_sq.<name>``, ``master.<name>``,
the iteration) goes into ``optimizer.dcp/`` by ``torch.distributed.checkpoint.async_save``: the tensors
are staged to host memory before it returns, and written (and fsync'd) by a background thread after the
step has answered. The weights file still answers the step only once it is complete (server.py's contract:
rlq commits what the result names).

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
import warnings

import torch

DCP_DIR = "optimizer.dcp"
OPTIMIZER_META_KEY = "rlq_optimizer"
CHECKPOINT_FORMATS = ("safetensors", "dcp")
# One process with no process group is what no_dist=True means; DCP still warns about it on every call, from its own thread.
warnings.filterwarnings(
    "ignore",
    message="torch.distributed is disabled, unavailable or uninitialized",
    category=UserWarning,
)


class AsyncCheckpoints:
    """The one asynchronous DCP save in flight, if any."""

    def __init__(self):
        self._pending = None  # (directory, future)
        self._stager = None

    def _staging(self, on_cuda: bool):
        """DCP's stager, kept across saves: on cuda it copies into pinned host buffers it reuses for the same tensors
        (the moments and masters are the same tensors every step), synchronously, so the step may change them after."""
        if not self._stager:
            from torch.distributed.checkpoint.staging import (
                DefaultStager,
                StagingOptions,
            )

            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=on_cuda,
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=False,
                )
            )
        return self._stager

    def wait(self) -> None:
        """Blocks until the save in flight is on disk; raises what its write raised."""
        pending, self._pending = self._pending, None
        if pending is not None:
            getattr(
                pending[1], "upload_completion", pending[1]
            ).result()  # a Future, or an AsyncSaveResponse (async staging)

    def save(self, out_dir: str, moments, masters, iteration: int) -> None:
        """Starts saving the optimizer state into out_dir/optimizer.dcp (after the previous save finished)."""
        import torch.distributed.checkpoint as dcp

        self.wait()
        state = {"iteration": torch.tensor(iteration, dtype=torch.int64)}
        for n, (m, v) in moments.items():
            state[f"exp_avg.{n}"] = m
            state[f"exp_avg_sq.{n}"] = v
        for n, t in masters.items():
            state[f"master.{n}"] = t
        path = os.path.join(out_dir, DCP_DIR)
        on_cuda = any(t.is_cuda for t in state.values())
        writer = _writer(path)
        if self._stager is not False:
            try:
                fut = dcp.async_save(
                    state,
                    storage_writer=writer,
                    no_dist=True,
                    async_stager=self._staging(on_cuda),
                )
                self._pending = (path, fut)
                return
            except Exception as e:  # noqa: BLE001 - staging runs here, before any write: DCP's default stager still can
                warnings.warn(
                    f"DCP's pinned-memory stager failed ({type(e).__name__}: {e}); staging to pageable memory from now on",
                    stacklevel=2,
                )
                self._stager = False
        self._pending = (
            path,
            dcp.async_save(state, storage_writer=_writer(path), no_dist=True),
        )


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

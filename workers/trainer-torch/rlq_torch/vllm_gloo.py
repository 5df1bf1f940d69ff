"""A "gloo" weight transfer backend for vLLM 0.32.0: the trainer pushes weights into a vLLM server over
PyTorch's gloo process group, so weight_sync trainer_push runs where vLLM runs on CPU.

vLLM's own backends (vllm/distributed/weight_transfer/factory.py: nccl, sparse_nccl, nccl_m2n, ipc,
sharded_rdt, modelexpress) all need CUDA. This one keeps their HTTP protocol
(vllm/entrypoints/rl/online/api_router.py) and swaps only the transport: where the dense NCCL backend
(nccl_engine.py) broadcasts over a PyNcclCommunicator, this one broadcasts over a
torch.distributed.ProcessGroupGloo whose rendezvous is a torch.distributed.TCPStore hosted by the
trainer (rank 0). The worker side receives each tensor into CPU memory and hands it to the model's
load_weights inside vLLM's layerwise reload, as NCCLWeightTransferEngine.receive_weights does
unpacked; the trainer side mirrors NCCLTrainerWeightTransferEngine: trainer_init posts
/init_weight_transfer_engine while it opens the group, send_weights posts /update_weights while it
broadcasts.

Both sides live in this one module. vLLM learns the name "gloo" from `register()`, which must run in
the process that builds the worker (the engine core on CPU, which vLLM starts with the spawn method:
platforms/cpu.py sets VLLM_WORKER_MULTIPROC_METHOD=spawn). Two ways:

- `python -m rlq_torch.vllm_serve <vLLM's server flags> --weight-transfer-config '{"backend": "gloo"}'`
  (vllm_serve.py): it registers at import, and a spawned child imports the parent's main module again
  (multiprocessing's spawn re-runs `-m` main modules as __mp_main__), so the engine core registers too;
- as a vLLM general plugin: an installed distribution whose entry point in the group
  `vllm.general_plugins` names `rlq_torch.vllm_gloo:register`; vLLM loads those in every process
  (vllm/plugins/__init__.py load_general_plugins).
"""

from __future__ import annotations

import datetime
import threading
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.weight_transfer import WeightTransferConfig

BACKEND = "gloo"
# The TCPStore's keys live under this prefix: the port is the trainer's alone, but a prefix keeps
# a stray client of another protocol from reading ours as its own.
STORE_PREFIX = "rlq-vllm-gloo"
DEFAULT_TIMEOUT_S = 600.0


def register() -> None:
    """Make "gloo" a weight transfer backend in this process (worker and trainer registries).

    Safe to call more than once: vLLM loads general plugins once per process but a process may also
    import vllm_serve, and register_engine refuses a name it already holds."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(
            BACKEND, __name__, "GlooWeightTransferEngine"
        )
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(
            BACKEND, __name__, "GlooTrainerWeightTransferEngine"
        )


def open_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    timeout_s: float,
) -> dist.ProcessGroupGloo:
    """The trainer<->workers gloo group, outside torch.distributed's default group (a trainer rank
    already has one, its training group; a vLLM worker has its own). Rank 0 hosts the TCPStore;
    the others connect to it, retrying until `timeout_s`."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(
        master_address,
        master_port,
        world_size,
        rank == 0,
        timeout,
        wait_for_workers=False,
    )
    return dist.ProcessGroupGloo(
        dist.PrefixStore(STORE_PREFIX, store), rank, world_size, timeout
    )


def broadcast(group: dist.ProcessGroupGloo, tensor: torch.Tensor) -> None:
    """One tensor from rank 0 to every rank of `group`, in place; returns once it has landed."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    group.broadcast([tensor], opts).wait()


@dataclass(kw_only=True)
class GlooWeightTransferInitInfo(WeightTransferInitInfo):
    """What a worker needs to join the group: the trainer's store address, this engine's first rank
    (the workers of one engine take rank_offset..rank_offset+N-1) and the group's size."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer side: the sender (rank 0) hosts the store at master_address:master_port; world_size
    counts the trainer and every worker of the engine."""

    backend: ClassVar[str] = BACKEND

    master_address: str
    master_port: int
    world_size: int
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    """One round: the tensors the trainer broadcasts, in order (dtype names as torch spells them)."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not (len(self.names) == len(self.dtype_names) == len(self.shapes)):
            raise ValueError(
                f"names, dtype_names and shapes must be as long as each other: got {len(self.names)}, "
                f"{len(self.dtype_names)} and {len(self.shapes)}"
            )


class GlooWeightTransferEngine(
    WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]
):
    """Worker side: joins the trainer's gloo group at /init_weight_transfer_engine, then per
    /update_weights receives each tensor and loads it through the model's load_weights, inside the
    layerwise reload that /start_weight_update and /finish_weight_update open and close."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo

    def __init__(
        self,
        config: WeightTransferConfig,
        vllm_config: VllmConfig,
        device: torch.device,
        model: torch.nn.Module,
    ) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: dist.ProcessGroupGloo | None = None

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        # A unique rank across data-parallel replicas, as nccl_common.worker_init_process_group computes it.
        p = self.parallel_config
        rank = p.data_parallel_index * p.world_size + p.rank + init_info.rank_offset
        self.group = open_group(
            init_info.master_address,
            init_info.master_port,
            rank,
            init_info.world_size,
            init_info.timeout_s,
        )

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import (
            initialize_layerwise_reload,
        )

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
        )

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which a torch without an
        # accelerator refuses ("Cannot access accelerator device when none is available"). A gloo
        # broadcast has landed when its wait() returns; only a model on a GPU has copies to wait for.
        self.receive_weights(self.parse_update_info(update_info))
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError(
                "gloo weight transfer is not initialized: POST /init_weight_transfer_engine first"
            )
        from vllm.model_executor.model_loader.mtp_validation import (
            disable_mtp_completeness_check,
        )

        with disable_mtp_completeness_check():
            for name, dtype_name, shape in zip(
                update_info.names, update_info.dtype_names, update_info.shapes
            ):
                # gloo moves CPU tensors; load_weights copies into the parameter wherever it lives.
                weight = torch.empty(shape, dtype=getattr(torch, dtype_name))
                broadcast(self.group, weight)
                self.model.load_weights([(name, weight)])

    def shutdown(self) -> None:
        self.group = None


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer side, NCCLTrainerWeightTransferEngine's round trip over gloo: the sender (rank 0) posts
    /start_weight_update, then /update_weights on a side thread while it broadcasts every tensor
    (the worker answers once it has received them all), then /finish_weight_update. Non-sender
    ranks only iterate the source, to stay in whatever collective materializes it."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(
        self,
        *,
        client: VLLMWeightSyncClient,
        source: WeightSource | None,
        is_sender: bool = True,
    ) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.group: dist.ProcessGroupGloo | None = None

    @classmethod
    def trainer_init(
        cls,
        init_info: GlooTrainerInitInfo,
        *,
        client: VLLMWeightSyncClient,
        source: WeightSource | None = None,
    ) -> GlooTrainerWeightTransferEngine:
        if source is None:
            raise ValueError("gloo trainer weight transfer requires a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        if not engine.is_sender:
            return engine
        worker_info = GlooWeightTransferInitInfo(
            master_address=init_info.master_address,
            master_port=init_info.master_port,
            rank_offset=1,
            world_size=init_info.world_size,
            timeout_s=init_info.timeout_s,
        )
        # The workers answer /init_weight_transfer_engine only once the group is whole, and the
        # group is whole only once this process joins it too: both at once. The join runs on a
        # daemon thread so that an engine that refuses at once (no weight transfer configured) is
        # reported at once, not after the join's timeout; the abandoned join ends at its timeout.
        joined = ThreadPoolExecutor(max_workers=1)
        try:
            answered = joined.submit(
                client.init_weight_transfer_engine, asdict(worker_info)
            )
            opened: Future[dist.ProcessGroupGloo] = Future()

            def join() -> None:
                try:
                    opened.set_result(
                        open_group(
                            init_info.master_address,
                            init_info.master_port,
                            0,
                            init_info.world_size,
                            init_info.timeout_s,
                        )
                    )
                except BaseException as e:  # noqa: BLE001 - handed to the caller through `opened`
                    opened.set_exception(e)

            threading.Thread(target=join, name="rlq-gloo-join", daemon=True).start()
            wait([answered, opened], return_when=FIRST_EXCEPTION)
            if answered.done() and answered.exception() is not None:
                answered.result()  # the engine's refusal says why; this side only saw nobody join
            engine.group = opened.result()
            answered.result()
        finally:
            joined.shutdown(wait=False)
        return engine

    def send_weights(self) -> None:
        assert self.source is not None  # trainer_init refuses a missing source
        source = self.source
        meta = source.metadata()
        if not self.is_sender:
            for _ in source:
                pass
            return
        update_info = GlooWeightTransferUpdateInfo(
            names=[m.name for m in meta],
            dtype_names=[str(m.dtype).split(".")[-1] for m in meta],
            shapes=[list(m.shape) for m in meta],
        )
        self.client.start_weight_update()
        exe = ThreadPoolExecutor(max_workers=1)
        try:
            received = exe.submit(self.client.update_weights, asdict(update_info))
            self._broadcast(source, meta, received)
            received.result()
        finally:
            # Not joined: after a failed broadcast the worker still waits in its receive, and its
            # request answers only when gloo's timeout ends it.
            exe.shutdown(wait=False)
        self.client.finish_weight_update()

    def _broadcast(
        self, source: WeightSource, meta: list[ParamMeta], received: Any
    ) -> None:
        """Every tensor of `source` from rank 0, checked against what the worker was told to expect:
        a tensor of another shape or dtype would leave the two sides reading the stream differently."""
        assert self.group is not None, "trainer_init() must run before send_weights()"
        sent = 0
        for name, tensor in source:
            if received.done():
                received.result()  # the worker refused the round: its answer says why
            expected = meta[sent] if sent < len(meta) else None
            if expected is None or (
                name,
                tensor.dtype,
                tuple(tensor.shape),
            ) != (expected.name, expected.dtype, tuple(expected.shape)):
                raise ValueError(
                    f"WeightSource yielded {name!r} {tensor.dtype} {tuple(tensor.shape)} at index {sent}, "
                    f"where metadata() declared {expected}: both must list the same tensors in the same order"
                )
            # gloo moves CPU tensors: a trainer on CUDA sends a host copy.
            broadcast(self.group, tensor.detach().to("cpu").contiguous())
            sent += 1
        if sent != len(meta):
            raise ValueError(
                f"WeightSource yielded {sent} tensors where metadata() declared {len(meta)}"
            )

    def shutdown(self) -> None:
        self.group = None

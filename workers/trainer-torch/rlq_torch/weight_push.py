"""Push trained weights into SGLang servers (rlq's weight_sync: trainer_push), and into vLLM through its
weight transfer (VllmPusher below: vLLM's nccl backend on GPUs, rlq's gloo backend, vllm_gloo.py, on CPU).

What SGLang expects, read from its http_server.py and io_struct.py
(InitWeightsUpdateGroupReqInput, UpdateWeightsFromDistributedReqInput,
UpdateWeightsFromTensorReqInput) and from how slime drives it
(slime/backends/megatron_utils/update_weight/update_weight_from_distributed.py,
slime/backends/sglang_utils/sglang_engine.py, at 624b824):

1. once: POST /init_weights_update_group {master_address, master_port, rank_offset,
   world_size, group_name, backend} on every engine while the trainer joins the same
   process group as rank 0 (the call blocks until everyone has joined). The group is not
   the process's default group (a trainer rank already has one, its training group): it is
   built as SGLang's init_custom_process_group builds it (init_push_group below), so both
   sides agree on the rendezvous store's keys;
2. per version: POST /pause_generation, POST /flush_cache, then per bucket
   POST /update_weights_from_distributed {names, dtypes, shapes, group_name,
   weight_version, flush_cache} on every engine while the trainer broadcasts each
   tensor of the bucket from rank 0, in order; then POST /continue_generation,
   always (slime's update_weights: pause -> flush -> send -> continue).
3. same host: POST /update_weights_from_tensor {serialized_named_tensors, load_format,
   flush_cache, weight_version} with the tensors pickled by torch's ForkingPickler and
   base64-encoded (SGLang's MultiprocessingSerializer(output_str=True)): the engine maps
   the trainer's shared memory instead of copying through a socket.

Every call carries `Authorization: Bearer <key>`, the key push_api_key picks: every route
above is an admin route (`@auth_level(AuthLevel.ADMIN_OPTIONAL)` in
python/sglang/srt/entrypoints/http_server.py), which an SGLang started with --admin-api-key
opens to that key alone, refusing its --api-key (python/sglang/srt/utils/auth.py
decide_request_auth); without an admin key the engines' --api-key opens them.
The version is sent with the last bucket only, so an engine reports the new version
only once every tensor has landed. A failed call raises PushError (the step's weights
are committed on disk anyway: rlq's controller then falls back to reading the version
the engines report, and the run pauses if they never report it).
"""

from __future__ import annotations

import base64
import datetime
import http.client
import io
import json
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist


class PushError(RuntimeError):
    """A weight push failed: which engine, which call, what it answered."""

    code = "weight_push_failed"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.uint8: "uint8",
    torch.bool: "bool",
}


def dtype_name(dtype: torch.dtype) -> str:
    """SGLang parses `dtypes` with getattr(torch, name): 'bfloat16', 'float32', ..."""
    if dtype not in DTYPE_NAMES:
        raise PushError(f"cannot push a tensor of dtype {dtype}")
    return DTYPE_NAMES[dtype]


def post(
    url: str,
    body: dict[str, Any],
    api_key: str | None,
    timeout_s: float,
    sent: threading.Event | None = None,
) -> dict[str, Any]:
    """POST JSON; `sent` is set once the request is on the wire (before the answer is awaited)."""
    u = urllib.parse.urlsplit(url)
    data = json.dumps(body).encode()
    headers = {"content-type": "application/json", "content-length": str(len(data))}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    conn_type = (
        http.client.HTTPSConnection
        if u.scheme == "https"
        else http.client.HTTPConnection
    )
    conn = conn_type(u.hostname, u.port, timeout=timeout_s)
    try:
        try:
            # The query stays: vLLM's /pause takes its mode there (?mode=abort).
            target = f"{u.path or '/'}?{u.query}" if u.query else u.path or "/"
            conn.request("POST", target, body=data, headers=headers)
        finally:
            if sent is not None:
                sent.set()
        res = conn.getresponse()
        text = res.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as e:
        raise PushError(f"POST {url}: {e}") from e
    finally:
        conn.close()
    if res.status in (401, 403):
        raise PushError(
            f"POST {url}: HTTP {res.status}: {text[:200]}: the engine refused the push's key: an SGLang started with --admin-api-key "
            "takes only that key on its weight-update routes; name its environment variable with --push-admin-api-key-env",
            res.status,
        )
    if res.status < 200 or res.status >= 300:
        raise PushError(f"POST {url}: HTTP {res.status}: {text[:300]}", res.status)
    try:
        out = json.loads(text) if text.strip() else {}
    except ValueError:
        # Some endpoints answer plain text: SGLang's /flush_cache says "Cache flushed..." (http_server.py flush_cache).
        return {"text": text}
    if isinstance(out, dict) and out.get("success") is False:
        raise PushError(f"POST {url}: {out.get('message', 'success: false')}")
    return out if isinstance(out, dict) else {"answer": out}


def flush_cache(
    url: str,
    api_key: str | None,
    timeout_s: float,
    tries: int = 60,
    wait_s: float = 1.0,
) -> None:
    """POST /flush_cache until it takes: SGLang answers HTTP 400 (plain text) while requests are
    still running (http_server.py flush_cache; scheduler.py flush_cache refuses when the queues
    are not empty), and slime's sglang_engine.py flush_cache retries it (60 times, 1 s apart)."""
    for attempt in range(tries):
        try:
            post(url, {}, api_key, timeout_s)
            return
        except PushError as e:
            if e.status != 400 or attempt == tries - 1:
                raise
        time.sleep(wait_s)


def _in_threads(
    calls: Sequence[tuple[str, dict[str, Any]]], api_key: str | None, timeout_s: float
) -> list[Any]:
    """POST to every engine at once and return once every request is on the wire.

    The calls that join a process group or receive a broadcast answer only after this
    process has done its part, and torch's rendezvous may hold the GIL while it waits
    (torch 1.13's TCPStore does): the requests must be out before that starts.
    """
    results: list[Any] = [None] * len(calls)
    sent = [threading.Event() for _ in calls]

    def run(i: int, url: str, body: dict[str, Any]) -> None:
        try:
            results[i] = post(url, body, api_key, timeout_s, sent[i])
        except BaseException as e:  # noqa: BLE001 - re-raised by _join
            results[i] = e
            sent[i].set()

    threads = [
        threading.Thread(target=run, args=(i, u, b), daemon=True)
        for i, (u, b) in enumerate(calls)
    ]
    for t in threads:
        t.start()
    for e in sent:
        e.wait(timeout_s)
    return [threads, results]


def _join(started: list[Any]) -> list[dict[str, Any]]:
    threads, results = started
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def init_push_group(
    backend: str,
    master_address: str,
    master_port: int,
    world_size: int,
    rank: int,
    group_name: str,
    timeout: datetime.timedelta,
):
    """A process group of its own (not the default one), built the way SGLang's init_custom_process_group
    (python/sglang/srt/utils.py) and slime's init_process_group (slime/utils/distributed_utils.py) build it:
    the store a tcp:// rendezvous makes (rank 0 hosts a TCPStore), under PrefixStore(group_name), then torch's
    own group constructor.

    The store is made here, not by ``rendezvous("tcp://...")``: inside a torchrun rank (--nproc > 1) that
    would connect as a client to a store it expects torchrun's agent to host (TORCHELASTIC_USE_AGENT_STORE),
    which nobody hosts at the push port, and rank 0 and the engines would wait for each other until the timeout."""
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed import TCPStore
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
    )

    store = PrefixStore(
        group_name,
        TCPStore(
            master_address,
            master_port,
            world_size,
            rank == 0,
            timeout,
            multi_tenant=True,
        ),
    )
    version = tuple(
        int(x) for x in torch.__version__.split("+")[0].split(".")[:2] if x.isdigit()
    )
    options = {
        "backend_options" if version >= (2, 6) else "pg_options": None
    }  # renamed in torch 2.6
    made = _new_process_group_helper(
        world_size,
        rank,
        [],
        Backend(backend),
        store,
        group_name=group_name,
        timeout=timeout,
        **options,
    )
    group = (
        made[0] if isinstance(made, tuple) else made
    )  # torch >= 2.1 answers (group, store)
    ranks = (
        c10d._world.pg_group_ranks if hasattr(c10d, "_world") else c10d._pg_group_ranks
    )  # torch >= 2.0 | 1.13
    ranks[group] = {i: i for i in range(world_size)}
    return group


class DistributedPusher:
    """Rank 0 of a process group whose other ranks are the engines' (one per engine GPU).

    Works in a process that has no process group (server.py with one rank) and in rank 0 of the
    trainer's training group (``--nproc N``, dist_worker.py): the push group is never the default one."""

    def __init__(
        self,
        engines: Sequence[str],
        *,
        master_address: str,
        master_port: int,
        engine_world_sizes: Sequence[int] | None = None,
        backend: str = "nccl",
        group_name: str = "rlq-weight-push",
        api_key: str | None = None,
        timeout_s: float = 600.0,
        bucket_bytes: int = 512 << 20,
    ):
        if not engines:
            raise PushError("no engine to push to")
        self.engines = [u.rstrip("/") for u in engines]
        self.sizes = list(engine_world_sizes or [1] * len(self.engines))
        if len(self.sizes) != len(self.engines):
            raise PushError(
                f"engine_world_sizes has {len(self.sizes)} entries for {len(self.engines)} engines"
            )
        self.master_address = master_address
        self.master_port = master_port
        self.backend = backend
        self.group_name = group_name
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.bucket_bytes = bucket_bytes
        self.world_size = 1 + sum(self.sizes)
        self.group = None

    def connect(self) -> None:
        """init_weights_update_group on every engine while this process joins as rank 0."""
        calls = []
        offset = 1
        for url, size in zip(self.engines, self.sizes):
            calls.append(
                (
                    f"{url}/init_weights_update_group",
                    {
                        "master_address": self.master_address,
                        "master_port": self.master_port,
                        "rank_offset": offset,
                        "world_size": self.world_size,
                        "group_name": self.group_name,
                        "backend": self.backend,
                    },
                )
            )
            offset += size
        started = _in_threads(calls, self.api_key, self.timeout_s)
        if any(isinstance(r, BaseException) for r in started[1]):
            _join(started)  # an engine refused or is unreachable: no group to wait for
        self.group = init_push_group(
            self.backend,
            self.master_address,
            self.master_port,
            self.world_size,
            0,
            self.group_name,
            datetime.timedelta(seconds=self.timeout_s),
        )
        _join(started)

    def _all(self, path: str, body: dict[str, Any]) -> None:
        _join(
            _in_threads(
                [(f"{u}{path}", body) for u in self.engines],
                self.api_key,
                self.timeout_s,
            )
        )

    def push(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> dict[str, Any]:
        """pause -> flush -> buckets of update_weights_from_distributed + broadcast -> continue (always)."""
        if self.group is None:
            self.connect()
        # gloo (CPU) has no bfloat16 broadcast ("Invalid scalar type" in torch 1.13): bf16 goes as
        # float32, exactly (the engine's load_weights copies it into its bf16 parameter).
        items = [
            (
                n,
                (
                    t.detach().float()
                    if self.backend == "gloo" and t.dtype == torch.bfloat16
                    else t.detach()
                ).contiguous(),
            )
            for n, t in named_tensors
        ]
        buckets: list[list[tuple[str, torch.Tensor]]] = [[]]
        size = 0
        for n, t in items:
            nbytes = t.numel() * t.element_size()
            if buckets[-1] and size + nbytes > self.bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].append((n, t))
            size += nbytes
        self._all("/pause_generation", {})
        try:
            for u in self.engines:
                flush_cache(f"{u}/flush_cache", self.api_key, self.timeout_s)
            for i, bucket in enumerate(buckets):
                is_last = i == len(buckets) - 1
                body = {
                    "names": [n for n, _ in bucket],
                    "dtypes": [dtype_name(t.dtype) for _, t in bucket],
                    "shapes": [list(t.shape) for _, t in bucket],
                    "group_name": self.group_name,
                    "flush_cache": is_last,
                    **({"weight_version": str(version)} if is_last else {}),
                }
                started = _in_threads(
                    [
                        (f"{u}/update_weights_from_distributed", body)
                        for u in self.engines
                    ],
                    self.api_key,
                    self.timeout_s,
                )
                for _, t in bucket:
                    dist.broadcast(t, src=0, group=self.group)
                _join(started)
        finally:
            self._all("/continue_generation", {})
        return {
            "version": version,
            "tensors": len(items),
            "buckets": len(buckets),
            "engines": list(self.engines),
        }

    def close(self) -> None:
        if self.group is not None:
            dist.destroy_process_group(self.group)
        self.group = None


def serialize_named_tensors(named_tensors: Sequence[tuple[str, torch.Tensor]]) -> str:
    """SGLang's MultiprocessingSerializer.serialize(obj, output_str=True): ForkingPickler, then base64.

    CPU tensors travel as shared memory the receiver maps by name (torch's file_system
    sharing strategy, set here); CUDA tensors as CUDA IPC handles. The sender must keep the
    tensors alive until the engine has answered.
    """
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing as tmp

    tmp.set_sharing_strategy("file_system")
    buf = io.BytesIO()
    ForkingPickler(buf).dump([(n, t.detach().contiguous()) for n, t in named_tensors])
    return base64.b64encode(buf.getvalue()).decode()


def push_from_tensor(
    engine: str,
    named_tensors: Sequence[tuple[str, torch.Tensor]],
    version: int,
    *,
    tp_size: int = 1,
    api_key: str | None = None,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Same host: pause -> flush -> update_weights_from_tensor -> continue, as slime's update_weight_from_tensor."""
    url = engine.rstrip("/")
    keep = [(n, t.detach().contiguous()) for n, t in named_tensors]
    blob = serialize_named_tensors(keep)
    post(f"{url}/pause_generation", {}, api_key, timeout_s)
    try:
        flush_cache(f"{url}/flush_cache", api_key, timeout_s)
        post(
            f"{url}/update_weights_from_tensor",
            {
                "serialized_named_tensors": [blob] * tp_size,
                "load_format": None,
                "flush_cache": True,
                "weight_version": str(version),
            },
            api_key,
            timeout_s,
        )
    finally:
        post(f"{url}/continue_generation", {}, api_key, timeout_s)
    del keep
    return {"version": version, "tensors": len(named_tensors), "engines": [url]}


class TensorPusher:
    """Same host (trainer and engine share the GPUs' host): update_weights_from_tensor on each
    engine in turn, inside pause/continue (push_from_tensor), as slime's update_weight_from_tensor
    does for colocated engines. Nothing to connect and no process group."""

    def __init__(
        self,
        engines: Sequence[str],
        *,
        tp_size: int = 1,
        api_key: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        self.engines = [u.rstrip("/") for u in engines]
        self.tp_size = tp_size
        self.api_key = api_key
        self.timeout_s = timeout_s

    def push(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> dict[str, Any]:
        items = list(named_tensors)
        for url in self.engines:
            push_from_tensor(
                url,
                items,
                version,
                tp_size=self.tp_size,
                api_key=self.api_key,
                timeout_s=self.timeout_s,
            )
        return {
            "version": version,
            "tensors": len(items),
            "engines": list(self.engines),
            "via": "tensor",
        }

    def close(self) -> None:
        pass


# vLLM 0.32.0 (vllm/distributed/weight_transfer/factory.py): the weight transfer backends it
# registers need CUDA: nccl, sparse_nccl and nccl_m2n broadcast through PyNcclCommunicator, ipc passes
# CUDA IPC handles, sharded_rdt pulls over Ray RDT with NIXL-registered memory, modelexpress goes
# through an external service. rlq adds "gloo" (vllm_gloo.py), which runs on CPU. The workers build
# the engine only when vLLM is started with --weight-transfer-config (v1/worker/gpu_worker.py
# load_model), which the CPU worker inherits.
VLLM_CPU_REFUSAL = (
    "--push-via vllm-nccl needs CUDA in the trainer and in vLLM: vLLM 0.32.0's nccl backend broadcasts through "
    "PyNcclCommunicator (vllm/distributed/weight_transfer/nccl_engine.py), and this trainer has no CUDA device; "
    "without GPUs push with --push-via vllm-gloo into a vLLM started as `python -m rlq_torch.vllm_serve ... "
    '--weight-transfer-config \'{"backend": "gloo"}\'` (docs/engines.md), or use weight_sync: disk'
)

# --push-via -> the weight transfer backend it names in vLLM (--weight-transfer-config's "backend").
VLLM_BACKENDS = {"vllm-nccl": "nccl", "vllm-gloo": "gloo"}


def how_to_start(backend: str) -> str:
    """The vLLM command line that takes pushes of `backend`, for error messages."""
    config = f'--weight-transfer-config \'{{"backend": "{backend}"}}\''
    if backend == "gloo":
        return (
            f"PYTHONPATH=workers/trainer-torch VLLM_SERVER_DEV_MODE=1 python -m rlq_torch.vllm_serve --model M ... {config} "
            "(rlq_torch/vllm_serve.py registers the gloo backend in vLLM's processes)"
        )
    return f"VLLM_SERVER_DEV_MODE=1 vllm serve M ... {config}"


class VllmSyncClient:
    """vLLM's VLLMWeightSyncClient protocol (vllm/distributed/weight_transfer/base.py) over rlq's
    `post`, so the calls carry the key (vLLM's own HTTPVLLMWeightSyncClient sends none) and
    /finish_weight_update carries rlq's version (NCCLTrainerWeightTransferEngine.send_weights calls
    it without one). The routes are vllm/entrypoints/rl/online/api_router.py's (dev mode)."""

    def __init__(self, url: str, api_key: str | None, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.version: str | None = None

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return post(f"{self.url}{path}", body, self.api_key, self.timeout_s)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._post("/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        """POST /start_weight_update, ending first a session a killed trainer left open: vLLM refuses a
        start while one is active ("already active. Call finish_weight_update first", gpu_worker.py
        _start_weight_update), answered as a bare HTTP 500. That session is closed without a version
        (async_llm.py finish_weight_update sets one only when given), so the engine keeps its label,
        and the push that follows writes every tensor again."""
        try:
            self._post("/start_weight_update", {})
        except PushError as e:
            if e.status != 500:
                raise
            try:
                self._post("/finish_weight_update", {"weight_version": None})
            except PushError:
                raise e from None  # no session was open: the start failed for its own reason
            self._post("/start_weight_update", {})

    def update_weights(self, update_info: Any) -> None:
        self._post("/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._post(
            "/finish_weight_update",
            {
                "weight_version": weight_version
                if weight_version is not None
                else self.version
            },
        )


def get_json(url: str, api_key: str | None, timeout_s: float) -> dict[str, Any]:
    u = urllib.parse.urlsplit(url)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    conn_type = (
        http.client.HTTPSConnection
        if u.scheme == "https"
        else http.client.HTTPConnection
    )
    conn = conn_type(u.hostname, u.port, timeout=timeout_s)
    try:
        conn.request(
            "GET", f"{u.path}?{u.query}" if u.query else u.path, headers=headers
        )
        res = conn.getresponse()
        text = res.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as e:
        raise PushError(f"GET {url}: {e}") from e
    finally:
        conn.close()
    if res.status >= 300:
        raise PushError(
            f"GET {url}: HTTP {res.status}: {text[:500]}", status=res.status
        )
    return json.loads(text)


class VllmPusher:
    """trainer_push into vLLM 0.32.0 through its weight transfer (vllm/distributed/weight_transfer/): one
    transfer group per engine, this process its rank 0 and the engine's workers ranks 1..N (N from GET
    /get_world_size). Per version and engine: POST /pause?mode=abort (in-flight requests end with
    their tokens, which rlq continues; new ones wait), /start_weight_update, /update_weights while
    this process broadcasts, /finish_weight_update {weight_version}, POST /resume (always), then GET
    /weight_info must read the version back.

    `backend` picks the transport, nothing else: "nccl" is vLLM's own NCCLTrainerWeightTransferEngine
    (CUDA on both sides, VLLM_CPU_REFUSAL; not run in this project's CPU-only tests), "gloo" is rlq's
    GlooTrainerWeightTransferEngine (vllm_gloo.py), which needs the engines started with the gloo
    backend registered (how_to_start)."""

    def __init__(
        self,
        engines: Sequence[str],
        *,
        backend: str,
        master_address: str,
        master_port: int,
        api_key: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        if not engines:
            raise PushError("no engine to push to")
        if backend not in VLLM_BACKENDS.values():
            raise PushError(
                f"vLLM weight transfer backend {backend!r}: rlq pushes with {sorted(VLLM_BACKENDS.values())}"
            )
        self.backend = backend
        self.clients = [VllmSyncClient(u, api_key, timeout_s) for u in engines]
        self.master_address = master_address
        self.master_port = master_port
        self.api_key = api_key
        self.timeout_s = timeout_s
        # Per engine: its transfer group, and the version this process last pushed into it.
        self.transfers: list[Any | None] = [None] * len(engines)
        self.pushed: list[str | None] = [None] * len(engines)

    def _init_info(self, port: int, world_size: int) -> Any:
        """The trainer init info of `backend` (vLLM dispatches on its class's `backend`)."""
        if self.backend == "gloo":
            from rlq_torch.vllm_gloo import GlooTrainerInitInfo, register

            register()
            return GlooTrainerInitInfo(
                master_address=self.master_address,
                master_port=port,
                world_size=world_size,
                timeout_s=self.timeout_s,
                rank=0,
            )
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(
            master_address=self.master_address,
            master_port=port,
            world_size=world_size,
            rank=0,
        )

    def _join(self, i: int, source: Any) -> Any:
        """Open engine i's transfer group (this process rank 0, the engine's workers after it)."""
        from vllm.distributed.weight_transfer.factory import (
            WeightTransferTrainerFactory,
        )

        client = self.clients[i]
        workers = int(
            get_json(f"{client.url}/get_world_size", self.api_key, self.timeout_s)[
                "world_size"
            ]
        )
        info = self._init_info(self.master_port + i, 1 + workers)
        try:
            return WeightTransferTrainerFactory.trainer_init(
                info, client=client, source=source
            )
        except PushError as e:
            if e.status is None:
                raise
            # vLLM answers 500 with no reason in the body ("Weight transfer not configured" or
            # "Invalid weight transfer backend" is in its log, v1/worker/gpu_worker.py).
            raise PushError(
                f"{e}: the engine did not open its weight transfer; a vLLM server takes pushed weights only when started "
                f"with a weight transfer backend, here: {how_to_start(self.backend)}",
                e.status,
            ) from e

    def _drop(self, i: int) -> None:
        transfer, self.transfers[i] = self.transfers[i], None
        if transfer is not None:
            transfer.shutdown()

    def _transfer(self, i: int, source: Any) -> Any:
        """Engine i's transfer, joined again where the engine no longer holds the version this process
        last pushed into it: a server restarted since comes back at its launch weights ("default") and
        without the group, and a broadcast into the old group would reach no one. The new trainer_init
        replaces whatever group the engine's workers held (gpu_worker.py init_weight_transfer_engine
        calls the engine's init_transfer_engine again), so a trainer restarted against engines that
        still hold its predecessor's group joins them too."""
        transfer = self.transfers[i]
        if transfer is not None:
            client = self.clients[i]
            now = get_json(
                f"{client.url}/weight_info", self.api_key, self.timeout_s
            ).get("weight_version")
            if now != self.pushed[i]:
                self._drop(i)
                transfer = None
        if transfer is None:
            transfer = self._join(i, source)
            self.transfers[i] = transfer
        return transfer

    def _push_one(self, i: int, source: Any, version: int) -> None:
        client = self.clients[i]
        client.version = str(version)
        transfer = self._transfer(i, source)
        transfer.source = source
        post(f"{client.url}/pause?mode=abort", {}, self.api_key, self.timeout_s)
        try:
            transfer.send_weights()
        finally:
            post(f"{client.url}/resume", {}, self.api_key, self.timeout_s)
        now = get_json(f"{client.url}/weight_info", self.api_key, self.timeout_s).get(
            "weight_version"
        )
        if now != str(version):
            raise PushError(
                f"{client.url}: pushed version {version} but /weight_info reports {now!r}"
            )
        self.pushed[i] = str(version)

    def push(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> dict[str, Any]:
        """Push `version` into every engine, each on its own: an engine that is down or fails does not
        keep the others from the version (rlq admits each engine once it reports the run's version).
        Its group is dropped, to be joined again at the next push; the failures are raised together
        once every engine has been tried."""
        # Before any call, so that nothing on the engines changes.
        if self.backend == "nccl" and not torch.cuda.is_available():
            raise PushError(VLLM_CPU_REFUSAL)
        try:
            import vllm.distributed.weight_transfer.factory  # noqa: F401
        except ImportError as e:
            raise PushError(
                f"trainer_push into vLLM uses vLLM's trainer-side weight transfer: install vLLM in the trainer's environment ({e})"
            ) from e
        items = [(n, t.detach().contiguous()) for n, t in named_tensors]
        source = _named_source(items)
        failed: list[str] = []
        for i, client in enumerate(self.clients):
            try:
                self._push_one(i, source, version)
            except (PushError, RuntimeError, ValueError) as e:
                self._drop(i)
                failed.append(f"{client.url}: {e}")
        pushed = [c.url for c, v in zip(self.clients, self.pushed) if v == str(version)]
        if failed:
            raise PushError(
                f"version {version} reached {pushed or 'no engine'}; not "
                + "; ".join(failed)
            )
        return {
            "version": version,
            "tensors": len(items),
            "engines": pushed,
            "via": f"vllm-{self.backend}",
        }

    def close(self) -> None:
        for i in range(len(self.transfers)):
            self._drop(i)


def _named_source(items: Sequence[tuple[str, torch.Tensor]]) -> Any:
    """vLLM's WeightSource over tensors this process holds whole (metadata and iteration agree)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class NamedSource(WeightSource):
        def metadata(self) -> list[Any]:
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in items]

        def __iter__(self):
            return iter(items)

    return NamedSource()


def push_api_key(args: Any, environ: Mapping[str, str]) -> str | None:
    """The key the pusher sends: the engines' --admin-api-key (--push-admin-api-key-env names its
    variable) where they have one, else their --api-key (--push-api-key-env; unset: no key). Only
    the variables' names travel on command lines."""
    admin = getattr(args, "push_admin_api_key_env", None)
    if admin:
        if not environ.get(admin):
            raise PushError(
                f"--push-admin-api-key-env {admin}: the environment variable is not set"
            )
        return environ[admin]
    plain = getattr(args, "push_api_key_env", None)
    return environ.get(plain) if plain else None


def pusher_from_args(args: Any, api_key: str | None) -> Any | None:
    """The trainer server's --push-* flags; None when no engine is named. --push-via tensor: the
    engines share this host (update_weights_from_tensor); distributed (default): a process group;
    vllm-nccl, vllm-gloo: vLLM servers through their weight transfer, over NCCL (GPUs) or gloo (VllmPusher)."""
    engines = [u for u in (getattr(args, "push_engines", None) or "").split(",") if u]
    if not engines:
        return None
    if getattr(args, "push_via", "distributed") in VLLM_BACKENDS:
        return VllmPusher(
            engines,
            backend=VLLM_BACKENDS[args.push_via],
            master_address=args.push_master_address,
            master_port=args.push_master_port,
            api_key=api_key,
        )
    if getattr(args, "push_via", "distributed") == "tensor":
        return TensorPusher(
            engines, tp_size=int(getattr(args, "push_tp_size", 1) or 1), api_key=api_key
        )
    return DistributedPusher(
        engines,
        master_address=args.push_master_address,
        master_port=args.push_master_port,
        backend=args.push_backend,
        api_key=api_key,
    )


def push_held(
    pusher: Any,
    trainer: Any,
    version: int,
    log: Any = print,
    named: Sequence[tuple[str, torch.Tensor]] | None = None,
) -> dict[str, Any]:
    """The trainer server's hook after a step: push the weights it holds as `version`.

    A failed push does not fail the committed step (its checkpoint is on disk): it is logged and
    reported in the step result; rlq's controller waits for the engines to report `version` and
    pauses the run with the reason if they never do.
    """
    held = getattr(trainer, "held", None)
    if held is None or held.version != version:
        return {"error": f"the trainer holds no weights of version {version} to push"}
    try:
        if (
            named is None
        ):  # replicated weights: this process holds them whole (with FSDP the caller gathers them)
            policy = held.policy
            named = (
                policy.engine_params()  # LoRA: the merged weights (lora.py)
                if hasattr(policy, "engine_params")
                else policy.named_params()
                if hasattr(policy, "named_params")
                else policy.module.named_parameters()
            )
        out = pusher.push(named, version)
        # The distributed pusher sends buckets; the tensor pusher one serialized blob per engine (no buckets).
        how = (
            f"in {out['buckets']} bucket(s)"
            if "buckets" in out
            else f"via {out.get('via', 'tensor')}"
        )
        log(
            f"pushed version {version}: {out['tensors']} tensors {how} to {', '.join(out['engines'])}"
        )
        return out
    except PushError as e:
        log(f"weight push of version {version} failed: {e}")
        return {"error": str(e)}

#!/usr/bin/env python3
"""rlq's reference PyTorch trainer: an HTTP server speaking docs/trainer-protocol.md.

    python3 workers/trainer-torch/server.py --port 8700 --device cuda|cpu [--host 127.0.0.1]

and in the run config: ``trainer: { kind: remote, url: http://HOST:8700 }``.
Across hosts (docs/deploy.md): ``--host 0.0.0.0 --token-file /run/secrets/rlq-trainer`` (or
RLQ_TRAINER_TOKEN) makes every request need ``Authorization: Bearer <token>``; with
``checkpoints: fetch`` in the run config the checkpoints live under ``--checkpoint-dir`` on this
host and are served at ``/v1/checkpoint-files/RUN/STEP/ATTEMPT/NAME`` (see transfer.py).
See docs/trainer-torch.md. Standard library HTTP (http.server + threads), PyTorch for the
model, numpy for the loss math (rlq_torch/algorithms.py, parity-tested against rlq). The wire side
(error codes, the job record, request validation, the batch fetch) is in protocol.py.

One train step runs at a time on a worker thread (one device); requests for other steps
queue behind it. Per (run_id, step): idempotent (a finished step answers its result
whatever the attempt), a new attempt supersedes a running one, cancel stops at the next
micro-batch. progress_seq moves at every micro-batch, phase change and optimizer step.
"""

from __future__ import annotations

import argparse
import collections
import hmac
import json
import os
import signal
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlparse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import transfer
from protocol import (
    HTTP_STATUS,
    PROTOCOL_VERSION,
    RETRYABLE,
    Cancelled,
    Job,
    ProtocolError,
    fetch_batch,
    log,
    validate_request,
)
from transfer import TransferError


def push_worker_args(args) -> list:
    """The --push-* flags as dist_worker.py takes them (rank 0 pushes; the key stays in the environment, by name)."""
    if not args.push_engines:
        return []
    out = [
        "--push-engines",
        args.push_engines,
        "--push-master-address",
        args.push_master_address,
        "--push-master-port",
        str(args.push_master_port),
        "--push-backend",
        args.push_backend,
        "--push-via",
        args.push_via,
        "--push-tp-size",
        str(args.push_tp_size),
    ]
    out += (
        ["--push-api-key-env", args.push_api_key_env] if args.push_api_key_env else []
    )
    return out + (
        ["--push-admin-api-key-env", args.push_admin_api_key_env]
        if args.push_admin_api_key_env
        else []
    )


class TrainerService:
    """The jobs, the queue and the worker thread; HTTP handlers call in here."""

    def __init__(self, args):
        import torch
        from rlq_torch.trainer import TorchTrainer

        self.torch = torch
        self.args = args
        defaults: dict[str, Any] = {
            "max_tokens_per_gpu": args.max_tokens_per_gpu,
            "hf_checkpoint": args.hf_checkpoint,
        }
        if args.model_config:
            text = args.model_config
            if os.path.isfile(text):
                with open(text) as f:
                    text = f.read()
            defaults["model"] = json.loads(text)
        device = args.device
        if device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch.cuda.is_available() is false")
        bf16 = None if args.bf16 == "auto" else args.bf16 == "on"
        if (
            args.nproc * args.nnodes > 1
        ):  # one process (this one) serves the protocol; torchrun runs the ranks (rlq_torch/dist_front.py)
            from rlq_torch.dist_front import DistTrainer

            self.trainer = DistTrainer(
                args.nproc,
                device,
                defaults,
                bf16,
                log,
                threads=args.threads,
                deterministic=args.deterministic,
                timeout_s=args.dist_timeout_s,
                debug_rank_delay_s=args.debug_rank_delay_s,
                master_port=args.master_port,
                nnodes=args.nnodes,
                master_addr=args.master_addr,
                push_args=push_worker_args(args),
                sharding=args.sharding,
            )
            self.pusher = None  # the front holds no weights: rank 0 of the group pushes (dist_worker.py)
            self.trainer.start_group_in_background()
        else:
            self.trainer = TorchTrainer(
                device,
                defaults,
                bf16=bf16,
                log=log,
                checkpoint_format=args.trainer_checkpoint,
                dcp_executor=args.dcp_executor,
            )
            from rlq_torch.weight_push import (  # weight_sync: trainer_push (docs/engines.md)
                push_api_key,
                pusher_from_args,
            )

            self.pusher = pusher_from_args(args, push_api_key(args, os.environ))
        self.device_name = (
            str(self.trainer.device)
            if self.trainer.device.type != "cuda"
            else f"cuda:{torch.cuda.current_device()}"
        )
        if args.nproc * args.nnodes > 1:
            self.device_name = f"{self.trainer.device.type} x{args.nproc * args.nnodes}"
        self.jobs: dict[tuple, Job] = {}
        self.queue: collections.deque = collections.deque()
        self.cv = threading.Condition()
        self.current: Job | None = None
        self.token: str | None = (
            None  # main() sets it from --token-file / RLQ_TRAINER_TOKEN
        )
        self.checkpoint_dir = os.path.join(
            os.path.expanduser("~"), ".cache", "rlq-trainer"
        )
        threading.Thread(target=self._worker, name="train-worker", daemon=True).start()

    # ----------------------------------------------------------- requests

    def health(self) -> dict[str, Any]:
        with self.cv:
            busy = self.current is not None or bool(self.queue)
        import torch
        from rlq_torch.capabilities import capabilities

        out = {
            "ok": True,
            "weight_version": self.trainer.weight_version,
            "busy": busy,
            "device": self.device_name,
            "protocol_version": PROTOCOL_VERSION,
            "torch": torch.__version__,
            "capabilities": capabilities(self.args.nproc * self.args.nnodes),
        }
        if hasattr(self.trainer, "describe"):
            out["distributed"] = self.trainer.describe()
        return out

    def submit(self, body: Any):
        req = validate_request(body)
        from rlq_torch.trainer import StepError, parse_algorithm, parse_train_config

        try:
            t = parse_train_config(req["config"], self.trainer.defaults)
            o = parse_algorithm(req["config"])
        except StepError as e:
            raise ProtocolError(e.code, str(e)) from e
        uri = req["checkpoint_uri_in"]
        if (
            uri is not None
            and req["checkpoint_transfer"] == "shared"
            and not os.path.exists(self._path(uri))
        ):
            raise ProtocolError(
                "version_unavailable", f"checkpoint_uri_in {uri} does not exist"
            )
        key = (req["run_id"], req["step"])
        with self.cv:
            cur = self.jobs.get(key)
            if cur is not None:
                st = cur.status()
                if st["state"] == "done" or cur.attempt == req["attempt"]:
                    return (
                        200,
                        st,
                    )  # idempotent: the finished result, or this attempt as it stands
                if st["state"] == "running":
                    self._cancel(cur, f"superseded by attempt {req['attempt']}")
            job = Job(req)
            job.parsed = (t, o)
            self.jobs[key] = job
            self.queue.append(job)
            self.cv.notify_all()
            log(
                f"step {req['run_id']}/{req['step']} attempt {req['attempt']}: queued (v{req['weight_version_in']})"
            )
            return 202, job.status()

    def get(self, run_id: str, step: int) -> dict[str, Any]:
        with self.cv:
            job = self.jobs.get((run_id, step))
        if job is None:
            raise ProtocolError("not_found", f"no step {run_id}/{step}")
        return job.status()

    def cancel(self, run_id: str, step: int, body: Any) -> dict[str, Any]:
        with self.cv:
            job = self.jobs.get((run_id, step))
            if job is None:
                raise ProtocolError("not_found", f"no step {run_id}/{step}")
            attempt = body.get("attempt") if isinstance(body, dict) else None
            if attempt is None or str(attempt) == job.attempt:
                self._cancel(job, "cancelled by the client")
            return job.status()

    def _cancel(self, job: Job, why: str) -> None:
        job.cancel.set()
        with job.lock:
            if job.state == "running":
                job.state = "cancelled"
                job.progress_seq += 1
                log(f"step {job.run_id}/{job.step} attempt {job.attempt}: {why}")

    @staticmethod
    def _path(uri: str) -> str:
        return unquote(urlparse(uri).path) if uri.startswith("file:") else uri

    # ----------------------------------------------------------- the worker

    def _worker(self) -> None:
        while True:
            with self.cv:
                while not self.queue:
                    self.cv.wait()
                job = self.queue.popleft()
                if job.cancel.is_set():
                    continue
                self.current = job
            try:
                self._run(job)
            finally:
                with self.cv:
                    self.current = None

    def _run(self, job: Job) -> None:
        from rlq_torch.batch import BatchError, decode_batch
        from rlq_torch.models import CheckpointError
        from rlq_torch.trainer import Cancelled as TrainCancelled
        from rlq_torch.trainer import StepError

        torch = self.torch
        req = job.req
        t, o = job.parsed

        def check() -> None:
            if job.cancel.is_set():
                raise TrainCancelled()

        fetch_mode = req["checkpoint_transfer"] == "fetch"
        try:
            job.bump(0, 1, "fetch_batch")
            data = fetch_batch(req["batch_url"], job, token=req["batch_token"])
            try:
                batch = decode_batch(data)
            except BatchError as e:
                raise ProtocolError(
                    "batch_fetch_failed",
                    f"batch_url did not answer a valid RLQB batch: {e}",
                ) from e
            if batch.run_id != req["run_id"] or batch.step != req["step"]:
                raise ProtocolError(
                    "bad_request",
                    f"the batch is for {batch.run_id}/{batch.step}, the request for {req['run_id']}/{req['step']}",
                )
            job.bump(0, 1, "batch_fetched")
            if (
                self.args.debug_delay_s > 0
            ):  # testing aid: a slow step that still reports progress
                end = time.time() + self.args.debug_delay_s
                while time.time() < end:
                    check()
                    time.sleep(0.05)
                    job.bump(0, 1, "debug_delay")
            t0 = time.time()
            if (
                fetch_mode
            ):  # no shared filesystem: this host's copies of the input and the output
                local = transfer.localize(req, self.checkpoint_dir, job.bump, check)
                result = self.trainer.train_step(local, batch, t, o, job.bump, check)
                result = transfer.publish(result, req, local)
            else:
                result = self.trainer.train_step(req, batch, t, o, job.bump, check)
            if self.pusher is not None:
                from rlq_torch.efficiency import add_push_time
                from rlq_torch.weight_push import push_held

                job.bump(1, 1, "weight_push")
                pushed_at = time.perf_counter()
                result["weight_push"] = push_held(
                    self.pusher, self.trainer, result["weight_version_out"], log
                )
                add_push_time(result["metrics"], time.perf_counter() - pushed_at)
            job.finish("done", result=result)
            log(
                f"step {job.run_id}/{job.step} attempt {job.attempt}: done in {time.time() - t0:.2f}s "
                f"(v{result['weight_version_out']}, {result['num_samples']} samples, pg_loss {result['metrics'].get('pg_loss', 0):.4g})"
            )
        except (Cancelled, TrainCancelled):
            log(
                f"step {job.run_id}/{job.step} attempt {job.attempt}: stopped (cancelled)"
            )
        except ProtocolError as e:
            self._fail(job, e.code, str(e))
        except TransferError as e:
            self._fail(job, e.code, str(e))
        except StepError as e:
            self._fail(job, e.code, str(e), e.retryable)
        except CheckpointError as e:
            self._fail(job, "version_unavailable", str(e))
        except Exception as e:  # noqa: BLE001
            oom_type = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
            if (
                oom_type is not None and isinstance(e, oom_type)
            ) or "out of memory" in str(e).lower():
                self.trainer.held = None
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                self._fail(job, "oom", f"out of device memory: {e}")
            else:
                traceback.print_exc()
                self._fail(job, "internal", f"{type(e).__name__}: {e}")

    def _fail(
        self, job: Job, code: str, message: str, retryable: bool | None = None
    ) -> None:
        log(
            f"step {job.run_id}/{job.step} attempt {job.attempt}: failed {code}: {message}"
        )
        job.finish(
            "failed",
            error={
                "code": code,
                "message": message,
                "retryable": RETRYABLE.get(code, True)
                if retryable is None
                else retryable,
            },
        )


class Handler(BaseHTTPRequestHandler):
    service: TrainerService = None  # type: ignore[assignment]
    protocol_version = "HTTP/1.1"

    def log_message(
        self, fmt, *args
    ):  # quiet: one line per step is logged by the service
        if os.environ.get("RLQ_TRAINER_HTTP_LOG"):
            log(fmt % args)

    def _send(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n > 0 else b""
        if not raw:
            return {}
        try:
            return json.loads(raw.decode("utf-8"))
        except Exception as e:
            raise ProtocolError("bad_request", f"the body is not JSON: {e}") from e

    def _route(self, method: str) -> None:
        try:
            token = self.service.token
            if token is not None and not hmac.compare_digest(
                (self.headers.get("authorization") or "").encode(),
                f"Bearer {token}".encode(),
            ):
                raise ProtocolError(
                    "unauthorized",
                    "this trainer needs Authorization: Bearer <token> (the run config's trainer.api_key)",
                )
            path = urlparse(self.path).path
            parts = [unquote(p) for p in path.strip("/").split("/")]
            if (
                method == "GET"
                and len(parts) == 6
                and parts[:2] == ["v1", "checkpoint-files"]
            ):
                try:
                    return transfer.serve_file(
                        self, self.service.checkpoint_dir, parts[2:]
                    )
                except TransferError as e:
                    raise ProtocolError(e.code, str(e)) from e
            if method == "GET" and path == "/v1/health":
                return self._send(200, self.service.health())
            if method == "POST" and path == "/v1/steps":
                status, st = self.service.submit(self._body())
                return self._send(status, st)
            if len(parts) in (4, 5) and parts[0] == "v1" and parts[1] == "steps":
                try:
                    step = int(parts[3])
                except ValueError:
                    raise ProtocolError(
                        "not_found", f"no such step {parts[3]!r}"
                    ) from None
                if len(parts) == 4 and method == "GET":
                    return self._send(200, self.service.get(parts[2], step))
                if len(parts) == 5 and parts[4] == "cancel" and method == "POST":
                    return self._send(
                        200, self.service.cancel(parts[2], step, self._body())
                    )
            raise ProtocolError("not_found", f"{method} {path}")
        except ProtocolError as e:
            self._send(HTTP_STATUS[e.code], e.body())
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            self._send(
                500,
                {
                    "error": {
                        "code": "internal",
                        "message": f"{type(e).__name__}: {e}",
                        "retryable": True,
                    }
                },
            )

    def do_GET(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description="rlq's PyTorch trainer (docs/trainer-protocol.md)"
    )
    ap.add_argument(
        "--port",
        type=int,
        default=8700,
        help="0: pick a free port (printed as 'listening PORT')",
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu")
    ap.add_argument(
        "--trainer-checkpoint",
        choices=["safetensors", "dcp"],
        default="safetensors",
        help="the trainer's own checkpoint (optimizer state, fp32 masters): optimizer.safetensors written before the weights (default), "
        "or optimizer.dcp/ saved asynchronously by torch.distributed.checkpoint after the step answers (one rank; steps with "
        "checkpoints: fetch keep the file; docs/trainer-torch.md)",
    )
    ap.add_argument(
        "--dcp-executor",
        choices=["thread", "process"],
        default="thread",
        help="with --trainer-checkpoint dcp: who writes the optimizer state, a thread of the trainer (default) or DCP's "
        "checkpoint daemon, a process of its own (its write never holds the trainer's GIL; docs/trainer-torch.md)",
    )
    ap.add_argument(
        "--bf16",
        choices=["auto", "on", "off"],
        default="auto",
        help="bf16 autocast (auto: on for cuda)",
    )
    ap.add_argument(
        "--max-tokens-per-gpu",
        type=int,
        default=None,
        help="micro-batch budget in padded tokens when the config has no max_tokens_per_gpu",
    )
    ap.add_argument(
        "--model-config",
        default=None,
        help="embedded model config (JSON text or file) used at version 0 when the config has no model",
    )
    ap.add_argument(
        "--hf-checkpoint",
        default=None,
        help="local Hugging Face model directory used at version 0 when the config has no checkpoint",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (fixed for bit-reproducible CPU runs)",
    )
    ap.add_argument(
        "--deterministic",
        action="store_true",
        help="on cuda: torch deterministic algorithms (slower); always on for cpu",
    )
    ap.add_argument(
        "--push-engines",
        default="",
        help="weight_sync trainer_push: engine URLs (SGLang, or vLLM with --push-via vllm-*) to push each trained version to (comma-separated)",
    )
    ap.add_argument(
        "--push-master-address",
        default="127.0.0.1",
        help="this host's address as the engines reach it (the push group's rank 0)",
    )
    ap.add_argument("--push-master-port", type=int, default=29600)
    ap.add_argument("--push-backend", default="nccl", help="nccl (GPU) or gloo (CPU)")
    ap.add_argument(
        "--push-api-key-env",
        default=None,
        help="environment variable holding the engines' --api-key",
    )
    ap.add_argument(
        "--push-admin-api-key-env",
        default=None,
        help="environment variable holding the engines' --admin-api-key: SGLang with one takes only it on the push routes",
    )
    ap.add_argument(
        "--push-via",
        choices=["distributed", "tensor", "vllm-nccl", "vllm-gloo"],
        default="distributed",
        help='distributed: update_weights_from_distributed over a process group; tensor: update_weights_from_tensor (engines on this host); vllm-nccl: vLLM\'s weight transfer engine over NCCL (GPU); vllm-gloo: over gloo (CPU; vLLM started through rlq_torch.vllm_serve with --weight-transfer-config \'{"backend": "gloo"}\')',
    )
    ap.add_argument(
        "--push-tp-size",
        type=int,
        default=1,
        help="--push-via tensor: the engines' tensor-parallel size (one serialized copy per TP rank)",
    )
    ap.add_argument(
        "--token-file",
        default=None,
        help="bearer token every request must carry (default: $RLQ_TRAINER_TOKEN; none: no check)",
    )
    ap.add_argument(
        "--checkpoint-dir",
        default=None,
        help="with checkpoints: fetch, where checkpoints live on this host (default ~/.cache/rlq-trainer)",
    )
    ap.add_argument(
        "--debug-delay-s",
        type=float,
        default=0.0,
        help="testing aid: every step waits this long (reporting progress) before training",
    )
    ap.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="ranks (processes, one per GPU) torchrun starts for data-parallel training; 1: in this process",
    )
    ap.add_argument(
        "--nnodes",
        type=int,
        default=1,
        help="nodes in the process group: the others run workers/trainer-torch/node.py",
    )
    ap.add_argument(
        "--master-addr",
        default="127.0.0.1",
        help="with --nnodes > 1: this node's address the other nodes reach",
    )
    ap.add_argument(
        "--master-port",
        type=int,
        default=None,
        help="rendezvous port (required with --nnodes > 1; default: a free port)",
    )
    ap.add_argument(
        "--sharding",
        choices=["zero1", "fsdp", "fsdp1"],
        default="zero1",
        help="with --nproc > 1: zero1 replicates the parameters (DDP) and shards the optimizer state; fsdp shards parameters, "
        "gradients and optimizer state with FSDP2's fully_shard where torch has it (>= 2.4), else FullyShardedDataParallel "
        "(torch >= 2.0); fsdp1 forces FullyShardedDataParallel (rlq_torch/fsdp.py)",
    )
    ap.add_argument(
        "--dist-timeout-s",
        type=float,
        default=600,
        help="collective timeout of the process group (a hung rank fails the step after this)",
    )
    ap.add_argument(
        "--debug-rank-delay-s",
        type=float,
        default=0.0,
        help="testing aid: with --nproc > 1, every micro-batch round waits this long",
    )
    args = ap.parse_args(argv)
    if args.nnodes > 1 and args.master_port is None:
        ap.error(
            "--nnodes > 1 needs --master-port (the other nodes' node.py must be given the same one)"
        )
    if args.trainer_checkpoint == "dcp" and args.nproc * args.nnodes > 1:
        ap.error(
            "--trainer-checkpoint dcp is for one rank; with --nproc/--nnodes leave it out (optimizer.safetensors shards)"
        )
    if args.sharding in ("fsdp", "fsdp1"):
        if args.nproc * args.nnodes < 2:
            ap.error(
                f"--sharding {args.sharding} shards over ranks: it needs --nproc (x --nnodes) >= 2"
            )
        from rlq_torch.fsdp import fsdp_unavailable

        why = fsdp_unavailable()
        if why:
            ap.error(why)

    from rlq_torch.torch_setup import configure_torch

    configure_torch(args)
    import torch

    Handler.service = TrainerService(args)
    token = os.environ.get("RLQ_TRAINER_TOKEN") or None
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            token = f.read().rstrip("\r\n") or None
        if token is None:
            raise SystemExit(f"--token-file {args.token_file} is empty")
    Handler.service.token = token
    Handler.service.checkpoint_dir = os.path.abspath(
        args.checkpoint_dir
        or os.path.join(os.path.expanduser("~"), ".cache", "rlq-trainer")
    )
    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    httpd.daemon_threads = True
    port = httpd.server_address[1]
    log(
        f"torch {torch.__version__} on {Handler.service.device_name}, bf16 {'on' if Handler.service.trainer.bf16 else 'off'}"
    )
    sys.stdout.write(f"listening {port}\n")
    sys.stdout.flush()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if hasattr(Handler.service.trainer, "close"):
            Handler.service.trainer.close()  # stop the process group (--nproc > 1)


if __name__ == "__main__":
    main()

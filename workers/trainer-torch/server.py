#!/usr/bin/env python3
"""rlq's reference PyTorch trainer: an HTTP server speaking docs/trainer-protocol.md.

    python3 workers/trainer-torch/server.py --port 8700 --device cuda|cpu [--host 127.0.0.1]

and in the run config: ``trainer: { kind: remote, url: http://HOST:8700 }``.
See docs/trainer-torch.md. Standard library HTTP (http.server + threads), PyTorch for the
model, numpy for the loss math (rlq_torch/algorithms.py, parity-tested against rlq).

One train step runs at a time on a worker thread (one device); requests for other steps
queue behind it. Per (run_id, step): idempotent (a finished step answers its result
whatever the attempt), a new attempt supersedes a running one, cancel stops at the next
micro-batch. progress_seq moves at every micro-batch, phase change and optimizer step.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Optional
from urllib.parse import unquote, urlparse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

PROTOCOL_VERSION = 1
HTTP_STATUS = {"bad_request": 400, "not_found": 404, "version_unavailable": 409, "batch_fetch_failed": 502, "oom": 507, "internal": 500}
RETRYABLE = {"bad_request": False, "not_found": False, "version_unavailable": True, "batch_fetch_failed": True, "oom": True, "internal": True}


def log(msg: str) -> None:
    sys.stderr.write(f"[trainer-torch {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


class ProtocolError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code

    def body(self) -> Dict[str, Any]:
        return {"error": {"code": self.code, "message": str(self), "retryable": RETRYABLE[self.code]}}


class Job:
    """One attempt of one (run_id, step)."""

    def __init__(self, req: Dict[str, Any]):
        self.req = req
        self.run_id: str = req["run_id"]
        self.step: int = req["step"]
        self.attempt: str = req["attempt"]
        self.state = "running"
        self.progress = {"done": 0, "total": 1, "phase": "queued"}
        self.progress_seq = 0
        self.result: Optional[Dict[str, Any]] = None
        self.error: Optional[Dict[str, Any]] = None
        self.cancel = threading.Event()
        self.lock = threading.Lock()

    def bump(self, done: int, total: int, phase: str) -> None:
        with self.lock:
            self.progress = {"done": int(done), "total": max(int(total), 1), "phase": phase}
            self.progress_seq += 1

    def finish(self, state: str, result=None, error=None) -> None:
        with self.lock:
            if self.state != "running":
                return  # already cancelled: the cancel wins
            self.state = state
            self.result = result
            self.error = error
            self.progress_seq += 1
            if state == "done":
                self.progress = {"done": self.progress["total"], "total": self.progress["total"], "phase": "done"}

    def status(self) -> Dict[str, Any]:
        with self.lock:
            return {"run_id": self.run_id, "step": self.step, "attempt": self.attempt, "state": self.state, "progress": dict(self.progress),
                    "progress_seq": self.progress_seq, "result": self.result, "error": self.error}


def validate_request(b: Any) -> Dict[str, Any]:
    if not isinstance(b, dict):
        raise ProtocolError("bad_request", "the body must be a JSON object")

    def need(key, types, what):
        v = b.get(key)
        if not isinstance(v, types) or isinstance(v, bool):
            raise ProtocolError("bad_request", f"{key} must be {what}, got {v!r}")
        return v

    run_id = need("run_id", str, "a non-empty string")
    if not run_id or "/" in run_id:
        raise ProtocolError("bad_request", "run_id must be a non-empty string without '/'")
    step = need("step", int, "an integer >= 0")
    attempt = need("attempt", str, "a string")
    v_in = need("weight_version_in", int, "an integer >= 0")
    if step < 0 or v_in < 0 or not attempt:
        raise ProtocolError("bad_request", "step and weight_version_in must be >= 0 and attempt non-empty")
    uri = b.get("checkpoint_uri_in")
    if uri is not None and (not isinstance(uri, str) or not uri):
        raise ProtocolError("bad_request", "checkpoint_uri_in must be a URI string or null")
    if uri is None and v_in != 0:
        raise ProtocolError("bad_request", f"checkpoint_uri_in is null but weight_version_in is {v_in} (null is only valid for version 0)")
    out = need("output_dir", str, "an absolute path")
    if not os.path.isabs(out):
        raise ProtocolError("bad_request", f"output_dir must be an absolute path, got {out!r}")
    url = need("batch_url", str, "an http(s) URL")
    if urlparse(url).scheme not in ("http", "https"):
        raise ProtocolError("bad_request", f"batch_url must be an http(s) URL, got {url!r}")
    config = b.get("config")
    if not isinstance(config, dict):
        raise ProtocolError("bad_request", "config must be an object")
    return {"run_id": run_id, "step": step, "attempt": attempt, "weight_version_in": v_in, "checkpoint_uri_in": uri, "output_dir": out,
            "batch_url": url, "config": config}


def fetch_batch(url: str, job: Job, tries: int = 5) -> bytes:
    """One GET; retried on connection errors (not on an HTTP error answer)."""
    delay = 0.2
    for k in range(tries):
        if job.cancel.is_set():
            raise Cancelled()
        try:
            with urllib.request.urlopen(url, timeout=120) as r:
                if r.status != 200:
                    raise ProtocolError("batch_fetch_failed", f"batch_url answered HTTP {r.status}")
                return r.read()
        except urllib.error.HTTPError as e:
            raise ProtocolError("batch_fetch_failed", f"batch_url answered HTTP {e.code}") from e
        except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError, OSError) as e:
            if k == tries - 1:
                raise ProtocolError("batch_fetch_failed", f"batch_url unreachable after {tries} tries: {e}") from e
            time.sleep(delay)
            delay *= 2
    raise ProtocolError("batch_fetch_failed", "unreachable")


class Cancelled(Exception):
    pass


class TrainerService:
    """The jobs, the queue and the worker thread; HTTP handlers call in here."""

    def __init__(self, args):
        import torch

        from rlq_torch.trainer import TorchTrainer

        self.torch = torch
        self.args = args
        defaults: Dict[str, Any] = {"max_tokens_per_gpu": args.max_tokens_per_gpu, "hf_checkpoint": args.hf_checkpoint}
        if args.model_config:
            text = args.model_config
            defaults["model"] = json.loads(open(text).read() if os.path.isfile(text) else text)
        device = args.device
        if device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch.cuda.is_available() is false")
        self.trainer = TorchTrainer(device, defaults, bf16=None if args.bf16 == "auto" else args.bf16 == "on", log=log)
        self.device_name = str(self.trainer.device) if self.trainer.device.type != "cuda" else f"cuda:{torch.cuda.current_device()}"
        self.jobs: Dict[tuple, Job] = {}
        self.queue: collections.deque = collections.deque()
        self.cv = threading.Condition()
        self.current: Optional[Job] = None
        threading.Thread(target=self._worker, name="train-worker", daemon=True).start()

    # ----------------------------------------------------------- requests

    def health(self) -> Dict[str, Any]:
        with self.cv:
            busy = self.current is not None or bool(self.queue)
        import torch
        return {"ok": True, "weight_version": self.trainer.weight_version, "busy": busy, "device": self.device_name,
                "protocol_version": PROTOCOL_VERSION, "torch": torch.__version__}

    def submit(self, body: Any):
        req = validate_request(body)
        from rlq_torch.trainer import StepError, parse_algorithm, parse_train_config

        try:
            t = parse_train_config(req["config"], self.trainer.defaults)
            o = parse_algorithm(req["config"])
        except StepError as e:
            raise ProtocolError(e.code, str(e)) from e
        uri = req["checkpoint_uri_in"]
        if uri is not None and not os.path.exists(self._path(uri)):
            raise ProtocolError("version_unavailable", f"checkpoint_uri_in {uri} does not exist")
        key = (req["run_id"], req["step"])
        with self.cv:
            cur = self.jobs.get(key)
            if cur is not None:
                st = cur.status()
                if st["state"] == "done" or cur.attempt == req["attempt"]:
                    return 200, st  # idempotent: the finished result, or this attempt as it stands
                if st["state"] == "running":
                    self._cancel(cur, f"superseded by attempt {req['attempt']}")
            job = Job(req)
            job.parsed = (t, o)
            self.jobs[key] = job
            self.queue.append(job)
            self.cv.notify_all()
            log(f"step {req['run_id']}/{req['step']} attempt {req['attempt']}: queued (v{req['weight_version_in']})")
            return 202, job.status()

    def get(self, run_id: str, step: int) -> Dict[str, Any]:
        with self.cv:
            job = self.jobs.get((run_id, step))
        if job is None:
            raise ProtocolError("not_found", f"no step {run_id}/{step}")
        return job.status()

    def cancel(self, run_id: str, step: int, body: Any) -> Dict[str, Any]:
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

        try:
            job.bump(0, 1, "fetch_batch")
            data = fetch_batch(req["batch_url"], job)
            try:
                batch = decode_batch(data)
            except BatchError as e:
                raise ProtocolError("batch_fetch_failed", f"batch_url did not answer a valid RLQB batch: {e}") from e
            if batch.run_id != req["run_id"] or batch.step != req["step"]:
                raise ProtocolError("bad_request", f"the batch is for {batch.run_id}/{batch.step}, the request for {req['run_id']}/{req['step']}")
            job.bump(0, 1, "batch_fetched")
            if self.args.debug_delay_s > 0:  # testing aid: a slow step that still reports progress
                end = time.time() + self.args.debug_delay_s
                while time.time() < end:
                    check()
                    time.sleep(0.05)
                    job.bump(0, 1, "debug_delay")
            t0 = time.time()
            result = self.trainer.train_step(req, batch, t, o, job.bump, check)
            job.finish("done", result=result)
            log(f"step {job.run_id}/{job.step} attempt {job.attempt}: done in {time.time() - t0:.2f}s "
                f"(v{result['weight_version_out']}, {result['num_samples']} samples, pg_loss {result['metrics'].get('pg_loss', 0):.4g})")
        except (Cancelled, TrainCancelled):
            log(f"step {job.run_id}/{job.step} attempt {job.attempt}: stopped (cancelled)")
        except ProtocolError as e:
            self._fail(job, e.code, str(e))
        except StepError as e:
            self._fail(job, e.code, str(e), e.retryable)
        except CheckpointError as e:
            self._fail(job, "version_unavailable", str(e))
        except Exception as e:  # noqa: BLE001
            oom_type = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
            if (oom_type is not None and isinstance(e, oom_type)) or "out of memory" in str(e).lower():
                self.trainer.held = None
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                self._fail(job, "oom", f"out of device memory: {e}")
            else:
                traceback.print_exc()
                self._fail(job, "internal", f"{type(e).__name__}: {e}")

    def _fail(self, job: Job, code: str, message: str, retryable: Optional[bool] = None) -> None:
        log(f"step {job.run_id}/{job.step} attempt {job.attempt}: failed {code}: {message}")
        job.finish("failed", error={"code": code, "message": message, "retryable": RETRYABLE.get(code, True) if retryable is None else retryable})


class Handler(BaseHTTPRequestHandler):
    service: TrainerService = None  # type: ignore[assignment]
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: one line per step is logged by the service
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
        except Exception as e:  # noqa: BLE001
            raise ProtocolError("bad_request", f"the body is not JSON: {e}") from e

    def _route(self, method: str) -> None:
        try:
            path = urlparse(self.path).path
            parts = [unquote(p) for p in path.strip("/").split("/")]
            if method == "GET" and path == "/v1/health":
                return self._send(200, self.service.health())
            if method == "POST" and path == "/v1/steps":
                status, st = self.service.submit(self._body())
                return self._send(status, st)
            if len(parts) in (4, 5) and parts[0] == "v1" and parts[1] == "steps":
                try:
                    step = int(parts[3])
                except ValueError:
                    raise ProtocolError("not_found", f"no such step {parts[3]!r}")
                if len(parts) == 4 and method == "GET":
                    return self._send(200, self.service.get(parts[2], step))
                if len(parts) == 5 and parts[4] == "cancel" and method == "POST":
                    return self._send(200, self.service.cancel(parts[2], step, self._body()))
            raise ProtocolError("not_found", f"{method} {path}")
        except ProtocolError as e:
            self._send(HTTP_STATUS[e.code], e.body())
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            self._send(500, {"error": {"code": "internal", "message": f"{type(e).__name__}: {e}", "retryable": True}})

    def do_GET(self):  # noqa: N802
        self._route("GET")

    def do_POST(self):  # noqa: N802
        self._route("POST")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="rlq's PyTorch trainer (docs/trainer-protocol.md)")
    ap.add_argument("--port", type=int, default=8700, help="0: pick a free port (printed as 'listening PORT')")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu")
    ap.add_argument("--bf16", choices=["auto", "on", "off"], default="auto", help="bf16 autocast (auto: on for cuda)")
    ap.add_argument("--max-tokens-per-gpu", type=int, default=None, help="micro-batch budget in padded tokens when the config has no max_tokens_per_gpu")
    ap.add_argument("--model-config", default=None, help="embedded model config (JSON text or file) used at version 0 when the config has no model")
    ap.add_argument("--hf-checkpoint", default=None, help="local Hugging Face model directory used at version 0 when the config has no checkpoint")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (fixed for bit-reproducible CPU runs)")
    ap.add_argument("--deterministic", action="store_true", help="on cuda: torch deterministic algorithms (slower); always on for cpu")
    ap.add_argument("--debug-delay-s", type=float, default=0.0, help="testing aid: every step waits this long (reporting progress) before training")
    args = ap.parse_args(argv)

    if args.deterministic and args.device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cpu" or args.deterministic:
        try:
            torch.use_deterministic_algorithms(True, warn_only=True)
        except TypeError:
            torch.use_deterministic_algorithms(True)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    Handler.service = TrainerService(args)
    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    httpd.daemon_threads = True
    port = httpd.server_address[1]
    log(f"torch {torch.__version__} on {Handler.service.device_name}, bf16 {'on' if Handler.service.trainer.bf16 else 'off'}")
    sys.stdout.write(f"listening {port}\n")
    sys.stdout.flush()
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

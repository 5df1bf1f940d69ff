"""Test helpers: a tiny embedded model, random batches, a local batch server, the trainer process."""

import importlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The command that builds the environment the suite runs in (torch, transformers, numpy, ... from python/requirements.lock).
INSTALL = "bash scripts/python-env.sh"


def require(*modules: str) -> None:
    """Raises (the test module then fails, it is never skipped) when a package the tests need is not importable,
    naming the command that installs it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any failure to import is reported with its cause
            raise ImportError(
                f"{name} is not importable with {sys.executable} ({type(e).__name__}: {e}). Install the suite's packages: "
                f"`{INSTALL}` in the repository root builds .venv, then run the suite with .venv/bin/python"
            ) from e


require("numpy")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from rlq_torch.batch import Batch, Sample, encode_batch  # noqa: E402

TINY_MODEL = {
    "vocab_size": 258,
    "context_length": 64,
    "d_model": 32,
    "n_heads": 4,
    "n_layers": 2,
    "d_mlp": 64,
}


def make_batch(
    run_id: str,
    step: int,
    groups: int = 4,
    per_group: int = 4,
    seed: int = 0,
    vocab: int = 258,
) -> Batch:
    rng = np.random.default_rng(seed)
    samples = []
    for g in range(groups):
        prompt = rng.integers(32, 127, size=int(rng.integers(3, 8))).astype(np.int32)
        for k in range(per_group):
            r = int(rng.integers(1, 12))
            resp = rng.integers(32, 127, size=r).astype(np.int32)
            resp[-1] = 257 if rng.random() < 0.5 else resp[-1]
            mask = np.ones(r, dtype=np.uint8)
            if r > 3:
                mask[1] = 0
            samples.append(
                Sample(
                    np.concatenate([prompt, resp]),
                    len(prompt),
                    mask,
                    (-rng.uniform(0.5, 6.0, size=r)).astype(np.float32),
                    np.zeros(r, dtype=np.int32),
                    float(rng.integers(0, 2)),
                    g,
                    k,
                )
            )
    return Batch(run_id, step, samples)


class BatchServer:
    """Serves registered byte strings at /NAME (optionally after a delay, or a status code)."""

    def __init__(self):
        self.routes = {}
        self.hits = {}
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                name = self.path.strip("/")
                outer.hits[name] = outer.hits.get(name, 0) + 1
                spec = outer.routes.get(name)
                if spec is None:
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                data, delay, status = spec
                time.sleep(delay)
                self.send_response(status)
                self.send_header("content-type", "application/octet-stream")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def add(self, name: str, data, delay: float = 0.0, status: int = 200) -> str:
        if isinstance(data, Batch):
            data = encode_batch(data)
        self.routes[name] = (data, delay, status)
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class TrainerProcess:
    def __init__(self, *extra: str, port: int = 0, env=None):
        args = [
            sys.executable,
            os.path.join(ROOT, "server.py"),
            "--port",
            str(port),
            "--device",
            "cpu",
            "--threads",
            "1",
            "--model-config",
            json.dumps(TINY_MODEL),
            *extra,
        ]
        # stderr (the server's log) goes to a file: a pipe nobody drains fills up, and a helper process the server
        # starts (torch's shared-memory manager, --push-via tensor) keeps a pipe open after the server is killed.
        self._log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=None if env is None else {**os.environ, **env},
        )
        line = self.proc.stdout.readline()
        if not line.startswith("listening"):
            self.close()
            raise RuntimeError(f"trainer did not start: {line!r} {self.stderr_text}")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def call(self, method: str, path: str, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def wait(
        self,
        run_id: str,
        step: int,
        states=("done", "failed", "cancelled"),
        timeout: float = 120,
    ):
        deadline = time.time() + timeout
        while time.time() < deadline:
            code, st = self.call("GET", f"/v1/steps/{run_id}/{step}")
            if code == 200 and st["state"] in states:
                return st
            time.sleep(0.05)
        raise TimeoutError(f"step {run_id}/{step} did not reach {states}: {st}")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if (
            not self._log.closed
        ):  # close() may run twice (a test's own, then its cleanup)
            self._log.seek(0)
            self.stderr_text = (
                self._log.read()
            )  # what the server logged (one line per step)
            self._log.close()
        self.proc.stdout.close()


def step_in_process(
    trainer,
    batch: Batch,
    config: dict,
    out_dir: str,
    *,
    step: int = 0,
    checkpoint_uri: str | None = None,
    defaults: dict | None = None,
    progress=None,
) -> dict:
    """One ``TorchTrainer.train_step`` called in this process with the request the server hands it
    (run_id from the batch, weight_version_in = step, no batch_url: the batch is passed in), so a
    test exercises the step without the HTTP protocol. ``defaults`` is the trainer's config
    defaults (parse_train_config's second argument); ``progress`` gets (done, total, phase)."""
    from rlq_torch.trainer import parse_algorithm, parse_train_config

    req = {
        "run_id": batch.run_id,
        "step": step,
        "attempt": "0",
        "weight_version_in": step,
        "checkpoint_uri_in": checkpoint_uri,
        "output_dir": out_dir,
        "config": config,
    }
    return trainer.train_step(
        req,
        batch,
        parse_train_config(config, defaults or {}),
        parse_algorithm(config),
        progress or (lambda done, total, phase: None),
        lambda: None,
    )


def request(
    run_id, step, attempt, out_dir, batch_url, config=None, v_in=None, uri=None
):
    return {
        "run_id": run_id,
        "step": step,
        "attempt": str(attempt),
        "weight_version_in": step if v_in is None else v_in,
        "checkpoint_uri_in": uri,
        "output_dir": out_dir,
        "batch_url": batch_url,
        "config": {
            "lr": 1e-3,
            "advantage_estimator": "grpo",
            "eps_clip": 0.2,
            **(config or {}),
        },
    }

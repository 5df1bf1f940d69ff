"""The trainer protocol's wire side (docs/trainer-protocol.md): error codes, one step attempt's job
record with its progress, request validation, and the batch fetch. server.py serves it over HTTP."""

from __future__ import annotations

import os
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlparse

PROTOCOL_VERSION = 1
HTTP_STATUS = {
    "unauthorized": 401,
    "bad_request": 400,
    "not_found": 404,
    "version_unavailable": 409,
    "batch_fetch_failed": 502,
    "oom": 507,
    "internal": 500,
}
RETRYABLE = {
    "unauthorized": False,
    "bad_request": False,
    "not_found": False,
    "version_unavailable": True,
    "batch_fetch_failed": True,
    "oom": True,
    "internal": True,
}


def log(msg: str) -> None:
    sys.stderr.write(f"[trainer-torch {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


class ProtocolError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.code,
                "message": str(self),
                "retryable": RETRYABLE[self.code],
            }
        }


class Job:
    """One attempt of one (run_id, step)."""

    def __init__(self, req: dict[str, Any]):
        self.req = req
        self.run_id: str = req["run_id"]
        self.step: int = req["step"]
        self.attempt: str = req["attempt"]
        self.state = "running"
        self.progress = {"done": 0, "total": 1, "phase": "queued"}
        self.progress_seq = 0
        self.result: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.cancel = threading.Event()
        self.lock = threading.Lock()

    def bump(self, done: int, total: int, phase: str) -> None:
        with self.lock:
            self.progress = {
                "done": int(done),
                "total": max(int(total), 1),
                "phase": phase,
            }
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
                self.progress = {
                    "done": self.progress["total"],
                    "total": self.progress["total"],
                    "phase": "done",
                }

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {
                "run_id": self.run_id,
                "step": self.step,
                "attempt": self.attempt,
                "state": self.state,
                "progress": dict(self.progress),
                "progress_seq": self.progress_seq,
                "result": self.result,
                "error": self.error,
            }


def validate_request(b: Any) -> dict[str, Any]:
    if not isinstance(b, dict):
        raise ProtocolError("bad_request", "the body must be a JSON object")

    def need(key, types, what):
        v = b.get(key)
        if not isinstance(v, types) or isinstance(v, bool):
            raise ProtocolError("bad_request", f"{key} must be {what}, got {v!r}")
        return v

    run_id = need("run_id", str, "a non-empty string")
    if not run_id or "/" in run_id:
        raise ProtocolError(
            "bad_request", "run_id must be a non-empty string without '/'"
        )
    step = need("step", int, "an integer >= 0")
    attempt = need("attempt", str, "a string")
    v_in = need("weight_version_in", int, "an integer >= 0")
    if step < 0 or v_in < 0 or not attempt:
        raise ProtocolError(
            "bad_request",
            "step and weight_version_in must be >= 0 and attempt non-empty",
        )
    uri = b.get("checkpoint_uri_in")
    if uri is not None and (not isinstance(uri, str) or not uri):
        raise ProtocolError(
            "bad_request", "checkpoint_uri_in must be a URI string or null"
        )
    if uri is None and v_in != 0:
        raise ProtocolError(
            "bad_request",
            f"checkpoint_uri_in is null but weight_version_in is {v_in} (null is only valid for version 0)",
        )
    out = need("output_dir", str, "an absolute path")
    if not os.path.isabs(out):
        raise ProtocolError(
            "bad_request", f"output_dir must be an absolute path, got {out!r}"
        )
    url = need("batch_url", str, "an http(s) URL")
    if urlparse(url).scheme not in ("http", "https"):
        raise ProtocolError(
            "bad_request", f"batch_url must be an http(s) URL, got {url!r}"
        )
    config = b.get("config")
    if not isinstance(config, dict):
        raise ProtocolError("bad_request", "config must be an object")
    transfer = b.get("checkpoint_transfer", "shared")
    if transfer not in ("shared", "fetch"):
        raise ProtocolError(
            "bad_request",
            f"checkpoint_transfer must be 'shared' or 'fetch', got {transfer!r}",
        )
    token = b.get("batch_token")
    if token is not None and not isinstance(token, str):
        raise ProtocolError("bad_request", "batch_token must be a string")
    in_files = b.get("checkpoint_in_files") or {}
    if not isinstance(in_files, dict):
        raise ProtocolError(
            "bad_request", "checkpoint_in_files must be an object {name: sha256}"
        )
    return {
        "run_id": run_id,
        "step": step,
        "attempt": attempt,
        "weight_version_in": v_in,
        "checkpoint_uri_in": uri,
        "output_dir": out,
        "batch_url": url,
        "config": config,
        "batch_token": token,
        "checkpoint_transfer": transfer,
        "checkpoint_in_url": b.get("checkpoint_in_url"),
        "checkpoint_in_files": in_files,
    }


def fetch_batch(url: str, job: Job, tries: int = 5, token: str | None = None) -> bytes:
    """One GET (with the attempt's batch token); retried on connection errors (not on an HTTP error answer)."""
    delay = 0.2
    for k in range(tries):
        if job.cancel.is_set():
            raise Cancelled()
        try:
            rq = urllib.request.Request(
                url, headers={"Authorization": f"Bearer {token}"} if token else {}
            )
            with urllib.request.urlopen(rq, timeout=120) as r:
                if r.status != 200:
                    raise ProtocolError(
                        "batch_fetch_failed", f"batch_url answered HTTP {r.status}"
                    )
                return r.read()
        except urllib.error.HTTPError as e:
            raise ProtocolError(
                "batch_fetch_failed", f"batch_url answered HTTP {e.code}"
            ) from e
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
            if k == tries - 1:
                raise ProtocolError(
                    "batch_fetch_failed",
                    f"batch_url unreachable after {tries} tries: {e}",
                ) from e
            time.sleep(delay)
            delay *= 2
    raise ProtocolError("batch_fetch_failed", "unreachable")


class Cancelled(Exception):
    pass

"""Checkpoints without a shared filesystem (``checkpoint_transfer: fetch``, docs/trainer-protocol.md).

rlq names every checkpoint by its own path ``.../RUN/step-S/attempt-X``. On this host it lives at
``CHECKPOINT_DIR/RUN/step-S/attempt-X``. The input checkpoint is this host's own copy when it wrote
it (the previous step), else downloaded from the worker (``checkpoint_in_url``, with the attempt's
batch token) into ``CHECKPOINT_DIR/in/<sha256 of its weights>`` and verified file by file against
``checkpoint_in_files``. The output is written here and served at
``GET /v1/checkpoint-files/RUN/step-S/attempt-X/NAME``; the result names rlq's path and lists
``checkpoint_files`` (name -> sha256), which every rlq host verifies after downloading.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote, urlparse

FILES = ("weights.safetensors", "optimizer.safetensors")


class TransferError(Exception):
    """A protocol error code (docs/trainer-protocol.md) and its message; server.py answers it."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _rlq_path(uri: str) -> str:
    return unquote(urlparse(uri).path) if uri.startswith("file:") else uri


def mirror(root: str, rlq_dir: str) -> str:
    """This host's directory for rlq's ``.../RUN/step-S/attempt-X``."""
    attempt = os.path.basename(rlq_dir)
    step = os.path.basename(os.path.dirname(rlq_dir))
    run = os.path.basename(os.path.dirname(os.path.dirname(rlq_dir)))
    return os.path.join(root, run, step, attempt)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def localize(
    req: dict[str, Any],
    root: str,
    bump: Callable[[int, int, str], None],
    check: Callable[[], None],
) -> dict[str, Any]:
    """The request with this host's paths for checkpoint_uri_in and output_dir."""
    local = dict(req)
    local["output_dir"] = mirror(root, req["output_dir"])
    uri = req["checkpoint_uri_in"]
    if uri is None:
        return local
    files: dict[str, str] = req["checkpoint_in_files"] or {}
    own = mirror(root, _rlq_path(uri))
    if os.path.exists(os.path.join(own, "weights.safetensors")) and (
        "weights.safetensors" not in files
        or sha256_file(os.path.join(own, "weights.safetensors"))
        == files["weights.safetensors"]
    ):
        local["checkpoint_uri_in"] = "file://" + quote(own)
        return local
    base = req.get("checkpoint_in_url")
    if not base or "weights.safetensors" not in files:
        raise TransferError(
            "version_unavailable",
            f"checkpoint_uri_in {uri} is not on this host ({own}) and the worker does not serve it "
            "(checkpoints: fetch needs the worker that runs the step to have it, or this trainer to have written it)",
        )
    dest = os.path.join(root, "in", files["weights.safetensors"])
    if not all(os.path.exists(os.path.join(dest, n)) for n in files):
        bump(0, 1, "fetch_checkpoint")
        tmp = dest + f".part-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp, exist_ok=True)
        for name, want in files.items():
            if name not in FILES:
                continue
            check()
            rq = urllib.request.Request(
                f"{base}/{quote(name)}",
                headers={"Authorization": f"Bearer {req['batch_token']}"}
                if req["batch_token"]
                else {},
            )
            h = hashlib.sha256()
            try:
                with (
                    urllib.request.urlopen(rq, timeout=600) as r,
                    open(os.path.join(tmp, name), "wb") as f,
                ):
                    for chunk in iter(lambda: r.read(1 << 20), b""):
                        h.update(chunk)
                        f.write(chunk)
            except OSError as e:
                raise TransferError(
                    "version_unavailable", f"checkpoint_in_url {base}/{name}: {e}"
                ) from e
            if h.hexdigest() != want:
                raise TransferError(
                    "version_unavailable",
                    f"checkpoint_in_url {base}/{name}: sha256 {h.hexdigest()}, expected {want}",
                )
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    local["checkpoint_uri_in"] = "file://" + quote(dest)
    return local


def publish(
    result: dict[str, Any], req: dict[str, Any], local: dict[str, Any]
) -> dict[str, Any]:
    """The result as rlq expects it: its own output_dir, and the files' sha256 to verify."""
    out = local["output_dir"]
    files = {
        n: sha256_file(os.path.join(out, n))
        for n in FILES
        if os.path.exists(os.path.join(out, n))
    }
    return {
        **result,
        "checkpoint_uri": "file://" + quote(os.path.abspath(req["output_dir"])),
        "checkpoint_files": files,
    }


def serve_file(handler, root: str, parts) -> None:
    """GET /v1/checkpoint-files/RUN/STEP/ATTEMPT/NAME (after the handler's token check)."""
    if (
        any(p in ("", ".", "..") or "/" in p or "\\" in p for p in parts)
        or parts[3] not in FILES
    ):
        raise TransferError(
            "bad_request",
            f"no checkpoint file {'/'.join(parts)}: expected RUN/step-S/attempt-X/{'|'.join(FILES)}",
        )
    path = os.path.join(root, *parts)
    if not os.path.isfile(path):
        raise TransferError(
            "not_found", f"no checkpoint file {'/'.join(parts)} on this trainer"
        )
    size = os.path.getsize(path)
    handler.send_response(200)
    handler.send_header("content-type", "application/octet-stream")
    handler.send_header("content-length", str(size))
    handler.end_headers()
    with open(path, "rb") as f:
        shutil.copyfileobj(f, handler.wfile, 1 << 20)

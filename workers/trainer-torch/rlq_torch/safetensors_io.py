"""safetensors read/write with no dependency beyond torch.

Format: u64 LE header length N, N bytes of JSON header (space-padded to a multiple of 8),
then the raw little-endian tensor bytes. The writer lays tensors out in the order given and
writes the header as compact JSON with ``__metadata__`` first, exactly like rlq's TypeScript
writer (src/model/safetensors.ts), so the same tensors give byte-identical files whichever
side wrote them. It streams tensor by tensor (no second copy of a large model in memory)
and writes through a temporary name that is renamed into place.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
from collections.abc import Iterable

import torch

DTYPES = {
    "F32": torch.float32,
    "F64": torch.float64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I32": torch.int32,
    "I64": torch.int64,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}


def _raw_bytes(t: torch.Tensor) -> bytes:
    """The tensor's bytes (little-endian, as it lies in a CPU tensor's memory).

    Read with ctypes, not ``.numpy()``: ``Tensor.numpy()`` marks the storage it shares as not
    resizable (numpy keeps a pointer into it), and FSDP frees and re-allocates a gathered
    parameter's storage by resizing it, so saving the gathered weights that way made the next
    reshard fail with "Trying to resize storage that is not resizable" (torch 2.11, FSDP1 and FSDP2)."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return (
        ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())
        if t.numel()
        else b""
    )


def header_bytes(
    tensors: Iterable[tuple[str, torch.Tensor]], metadata: dict[str, str] | None
) -> tuple[bytes, list]:
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    order = []
    for name, t in tensors:
        if name == "__metadata__" or name in header:
            raise ValueError(f'safetensors: duplicate or reserved name "{name}"')
        if t.dtype not in NAMES:
            raise ValueError(f"safetensors: unsupported dtype {t.dtype} for {name}")
        n = t.numel() * t.element_size()
        header[name] = {
            "dtype": NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
        order.append((name, t))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False)
    raw = text.encode("utf-8")
    raw += b" " * ((8 - len(raw) % 8) % 8)
    return raw, order


def write_safetensors(
    path: str,
    tensors: Iterable[tuple[str, torch.Tensor]],
    metadata: dict[str, str] | None = None,
) -> None:
    """Atomic write (temporary name + rename) of tensors in the given order."""
    head, order = header_bytes(tensors, metadata)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for _, t in order:
            f.write(_raw_bytes(t))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_safetensors(
    path: str, names: set | None = None
) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(metadata, name → CPU tensor) for every tensor (or those in ``names``)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", data, 0)
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length exceeds the file size")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    start = 8 + n
    meta = {
        k: v
        for k, v in (header.pop("__metadata__", None) or {}).items()
        if isinstance(v, str)
    }
    out: dict[str, torch.Tensor] = {}
    for name, e in header.items():
        if names is not None and name not in names:
            continue
        dtype = DTYPES.get(e.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: {name} has unsupported dtype {e.get('dtype')}")
        b, end = e["data_offsets"]
        shape = [int(d) for d in e["shape"]]
        count = 1
        for d in shape:
            count *= d
        elem = torch.tensor([], dtype=dtype).element_size()
        if end - b != count * elem or start + end > len(data):
            raise ValueError(
                f"{path}: {name} data_offsets do not match its shape or the file size"
            )
        buf = bytearray(data[start + b : start + end])
        if count == 0:
            t = torch.zeros(shape, dtype=dtype)
        elif dtype == torch.bool:
            t = torch.frombuffer(buf, dtype=torch.uint8).to(torch.bool).reshape(shape)
        else:
            t = torch.frombuffer(buf, dtype=dtype).reshape(shape)
        out[name] = t
    return meta, out


def read_metadata(path: str) -> dict[str, str]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
    return {
        k: v
        for k, v in (header.get("__metadata__") or {}).items()
        if isinstance(v, str)
    }

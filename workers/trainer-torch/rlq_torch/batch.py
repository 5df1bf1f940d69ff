"""RLQB v1, the trainer protocol's binary batch format (docs/trainer-protocol.md).

Little-endian: "RLQB", u32 version = 1, u32 header length H, H bytes of UTF-8 JSON
{run_id, step, num_samples, arrays: [{name, dtype, length}]}, then each array in header
order, each starting at an 8-byte aligned offset. ``encode_batch`` mirrors
src/trainer/batch-codec.ts byte for byte (used by the tests).

A batch whose prompts have images (multimodal_keys) carries each distinct image once, as the
bytes the rollout sent the engine, named by their sha256 in the header's ``images`` list;
``sample_image_offsets`` / ``sample_images`` give each sample's images in placeholder order.
The trainer checks each image's sha256 when it builds the model inputs (vlm.py), so a wrong
image is an error that names the sample.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"RLQB"
DTYPES = {
    "int32": np.dtype("<i4"),
    "uint8": np.dtype("u1"),
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
}
ARRAYS = [
    ("token_offsets", "int32"),
    ("prompt_lengths", "int32"),
    ("tokens", "int32"),
    ("response_offsets", "int32"),
    ("loss_mask", "uint8"),
    ("rollout_log_probs", "float32"),
    ("token_versions", "int32"),
    ("rewards", "float64"),
    ("group_index", "int32"),
    ("sample_index", "int32"),
]


# Optional, present together when a sample has images (M distinct images, K image uses in all).
IMAGE_ARRAYS = [
    (
        "image_bytes",
        "uint8",
    ),  # [sum of image sizes] the images' bytes, one after another
    (
        "image_offsets",
        "int32",
    ),  # [M + 1] image m is image_bytes[image_offsets[m]:image_offsets[m + 1]]
    (
        "sample_image_offsets",
        "int32",
    ),  # [N + 1] sample i's images are sample_images[o[i]:o[i + 1]]
    ("sample_images", "int32"),  # [K] an index into the header's images
]


@dataclass
class BatchImage:
    """One image of a sample, as the rollout sent it to the engine."""

    sha256: str  # hex, as drawn_prompts.images records it
    mime: str
    data: bytes


class BatchError(ValueError):
    """Not a valid RLQB batch."""


@dataclass
class Sample:
    tokens: np.ndarray  # int32 [prompt + response]
    prompt_length: int
    loss_mask: np.ndarray  # uint8 [response]
    rollout_log_probs: np.ndarray  # float32 [response]
    token_versions: np.ndarray  # int32 [response]
    reward: float
    group_index: int
    sample_index: int
    # The loss mask before rlq zeroed off-policy / stale tokens: the loss
    # denominators sum it (DESIGN §1). None: the same as loss_mask.
    denom_mask: np.ndarray | None = None
    # use_opd: the teacher's log-probs of the response tokens (src/engines/teacher.ts). None: no OPD.
    teacher_log_probs: np.ndarray | None = None
    # multimodal_keys: the sample's images in placeholder order (prompt first). None: a text sample.
    images: list[BatchImage] | None = None
    # Set by vlm.expand_sample: the model's vision inputs (pixel_values, image_grid_thw) for the
    # expanded tokens, the sample as the batch had it, and where its response tokens sit in this one.
    vision: dict | None = None
    unexpanded: Sample | None = None
    response_index: np.ndarray | None = None

    @property
    def response_length(self) -> int:
        return int(self.loss_mask.shape[0])


@dataclass
class Batch:
    run_id: str
    step: int
    samples: list[Sample]


def _align(x: int) -> int:
    return (x + 7) & ~7


def decode_batch(data: bytes) -> Batch:
    if len(data) < 12 or data[:4] != MAGIC:
        raise BatchError("bad magic (expected RLQB)")
    version, hlen = struct.unpack_from("<II", data, 4)
    if version != 1:
        raise BatchError(f"unsupported RLQB version {version}")
    if 12 + hlen > len(data):
        raise BatchError("header length exceeds the batch size")
    try:
        header = json.loads(data[12 : 12 + hlen].decode("utf-8"))
        n = int(header["num_samples"])
        specs = header["arrays"]
        run_id = str(header["run_id"])
        step = int(header["step"])
    except Exception as e:  # noqa: BLE001
        raise BatchError(f"bad header: {e}") from e
    off = _align(12 + hlen)
    got: dict[str, np.ndarray] = {}
    for a in specs:
        dt = DTYPES.get(a.get("dtype"))
        if dt is None:
            raise BatchError(f"array {a.get('name')}: unknown dtype {a.get('dtype')}")
        length = int(a["length"])
        end = off + length * dt.itemsize
        if length < 0 or end > len(data):
            raise BatchError(f"array {a.get('name')} runs past the end of the batch")
        got[a["name"]] = np.frombuffer(data, dtype=dt, count=length, offset=off).copy()
        off = _align(end)
    for name, _ in ARRAYS:
        if name not in got:
            raise BatchError(f"array {name} is missing")
    to, ro = got["token_offsets"], got["response_offsets"]
    if to.shape[0] != n + 1 or ro.shape[0] != n + 1:
        raise BatchError(
            "token_offsets / response_offsets must have num_samples + 1 entries"
        )
    T, R = int(to[-1]) if n >= 0 else 0, int(ro[-1])
    checks = {
        "prompt_lengths": n,
        "tokens": T,
        "loss_mask": R,
        "rollout_log_probs": R,
        "token_versions": R,
        "rewards": n,
        "group_index": n,
        "sample_index": n,
    }
    if "denom_mask" in got:  # optional (older clients do not send it)
        checks["denom_mask"] = R
    if "teacher_log_probs" in got:  # optional: use_opd batches only
        checks["teacher_log_probs"] = R
    for name, want in checks.items():
        if got[name].shape[0] != want:
            raise BatchError(
                f"array {name} has length {got[name].shape[0]}, expected {want}"
            )
    if to[0] != 0 or ro[0] != 0 or np.any(np.diff(to) < 0) or np.any(np.diff(ro) < 0):
        raise BatchError("offsets must start at 0 and never decrease")
    images = _decode_images(header, got, n)
    samples = []
    for i in range(n):
        tok = got["tokens"][to[i] : to[i + 1]]
        r0, r1 = int(ro[i]), int(ro[i + 1])
        pl = int(got["prompt_lengths"][i])
        if pl < 0 or pl + (r1 - r0) != tok.shape[0]:
            raise BatchError(
                f"sample {i}: prompt_length {pl} + response {r1 - r0} != {tok.shape[0]} tokens"
            )
        dm = got["denom_mask"][r0:r1] if "denom_mask" in got else None
        tl = got["teacher_log_probs"][r0:r1] if "teacher_log_probs" in got else None
        samples.append(
            Sample(
                tok,
                pl,
                got["loss_mask"][r0:r1],
                got["rollout_log_probs"][r0:r1],
                got["token_versions"][r0:r1],
                float(got["rewards"][i]),
                int(got["group_index"][i]),
                int(got["sample_index"][i]),
                dm,
                tl,
                images[i] if images is not None else None,
            )
        )
    return Batch(run_id, step, samples)


def _decode_images(
    header: dict, got: dict[str, np.ndarray], n: int
) -> list[list[BatchImage] | None] | None:
    """Each sample's images (None for a sample with none), or None for a batch without images."""
    present = [name for name, _ in IMAGE_ARRAYS if name in got]
    if not present:
        return None
    if len(present) != len(IMAGE_ARRAYS):
        missing = [name for name, _ in IMAGE_ARRAYS if name not in got]
        raise BatchError(f"image arrays come together: {', '.join(missing)} missing")
    refs = header.get("images")
    if not isinstance(refs, list) or not all(
        isinstance(r, dict) and isinstance(r.get("sha256"), str) for r in refs
    ):
        raise BatchError(
            'a batch with image arrays needs a header "images" list of {sha256, mime}'
        )
    io, so, si, raw = (
        got["image_offsets"],
        got["sample_image_offsets"],
        got["sample_images"],
        got["image_bytes"],
    )
    if io.shape[0] != len(refs) + 1 or so.shape[0] != n + 1:
        raise BatchError(
            "image_offsets must have len(images) + 1 entries, sample_image_offsets num_samples + 1"
        )
    if io[0] != 0 or so[0] != 0 or np.any(np.diff(io) < 0) or np.any(np.diff(so) < 0):
        raise BatchError("image offsets must start at 0 and never decrease")
    if int(io[-1]) != raw.shape[0] or int(so[-1]) != si.shape[0]:
        raise BatchError(
            "image_offsets / sample_image_offsets do not end at their arrays' lengths"
        )
    if si.size and (int(si.min()) < 0 or int(si.max()) >= len(refs)):
        raise BatchError("sample_images names an image the header does not list")
    distinct = [
        BatchImage(
            str(r["sha256"]),
            str(r.get("mime", "")),
            raw[int(io[m]) : int(io[m + 1])].tobytes(),
        )
        for m, r in enumerate(refs)
    ]
    return [
        [distinct[int(k)] for k in si[int(so[i]) : int(so[i + 1])]] or None
        for i in range(n)
    ]


def encode_batch(batch: Batch) -> bytes:
    s = batch.samples
    n = len(s)
    to = np.zeros(n + 1, dtype="<i4")
    ro = np.zeros(n + 1, dtype="<i4")
    for i, x in enumerate(s):
        to[i + 1] = to[i] + len(x.tokens)
        ro[i + 1] = ro[i] + x.response_length
    cat = lambda f, dt: (
        np.concatenate([np.asarray(f(x), dtype=dt) for x in s])
        if s
        else np.zeros(0, dtype=dt)
    )  # noqa: E731
    arrays = [
        to,
        np.array([x.prompt_length for x in s], dtype="<i4"),
        cat(lambda x: x.tokens, "<i4"),
        ro,
        cat(lambda x: x.loss_mask, "u1"),
        cat(lambda x: x.rollout_log_probs, "<f4"),
        cat(lambda x: x.token_versions, "<i4"),
        np.array([x.reward for x in s], dtype="<f8"),
        np.array([x.group_index for x in s], dtype="<i4"),
        np.array([x.sample_index for x in s], dtype="<i4"),
        cat(lambda x: x.loss_mask if x.denom_mask is None else x.denom_mask, "u1"),
    ]
    names = ARRAYS + [("denom_mask", "uint8")]
    if any(x.teacher_log_probs is not None for x in s):
        if any(x.teacher_log_probs is None for x in s):
            raise BatchError("teacher_log_probs: every sample or none")
        arrays.append(cat(lambda x: x.teacher_log_probs, "<f4"))
        names = names + [("teacher_log_probs", "float32")]
    refs: list[dict[str, str]] = []
    if any(x.images for x in s):
        index: dict[str, int] = {}
        blobs: list[bytes] = []
        uses: list[int] = []
        so = np.zeros(n + 1, dtype="<i4")
        for i, x in enumerate(s):
            for img in x.images or []:
                if img.sha256 not in index:
                    index[img.sha256] = len(refs)
                    refs.append({"sha256": img.sha256, "mime": img.mime})
                    blobs.append(img.data)
                uses.append(index[img.sha256])
            so[i + 1] = len(uses)
        io = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype("<i4")
        arrays += [
            np.frombuffer(b"".join(blobs), dtype="u1"),
            io,
            so,
            np.array(uses, dtype="<i4"),
        ]
        names = names + IMAGE_ARRAYS
    header = json.dumps(
        {
            "run_id": batch.run_id,
            "step": batch.step,
            "num_samples": n,
            **({"images": refs} if refs else {}),
            "arrays": [
                {"name": name, "dtype": dt, "length": int(a.shape[0])}
                for (name, dt), a in zip(names, arrays)
            ],
        },
        separators=(",", ":"),
    ).encode("utf-8")
    out = bytearray(MAGIC + struct.pack("<II", 1, len(header)) + header)
    out += b"\0" * (_align(len(out)) - len(out))
    for a in arrays:
        out += a.tobytes()
        out += b"\0" * (_align(len(out)) - len(out))
    return bytes(out)

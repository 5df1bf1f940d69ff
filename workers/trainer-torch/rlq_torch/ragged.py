"""Ragged per-sample arrays: one flat float64 array plus offsets (see algorithms.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .algo_options import AlgorithmError


class Ragged:
    """[B][T_i] as one flat float64 array and offsets (B + 1)."""

    __slots__ = ("flat", "offsets", "_seg")

    def __init__(self, flat: np.ndarray, offsets: np.ndarray):
        self.flat = np.asarray(flat, dtype=np.float64)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self._seg: np.ndarray | None = None
        if self.flat.shape[0] != int(self.offsets[-1]):
            raise AlgorithmError(
                "algo_shape_mismatch",
                f"ragged: {self.flat.shape[0]} values for offsets ending at {int(self.offsets[-1])}",
            )

    @staticmethod
    def from_lists(rows: Sequence[Sequence[float]]) -> Ragged:
        lengths = [len(r) for r in rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(lengths) if rows else []
        flat = (
            np.array([x for r in rows for x in r], dtype=np.float64)
            if offsets[-1] > 0
            else np.zeros(0)
        )
        return Ragged(flat, offsets)

    def like(self, flat: np.ndarray) -> Ragged:
        r = Ragged(flat, self.offsets)
        r._seg = self._seg
        return r

    @property
    def num_samples(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def seg(self) -> np.ndarray:
        """Sample index of every token."""
        if self._seg is None:
            self._seg = np.repeat(np.arange(self.num_samples), self.lengths)
        return self._seg

    def seg_sum(self, x: np.ndarray | None = None) -> np.ndarray:
        """[B] per-sample sums of a flat array (tokens added in order)."""
        v = self.flat if x is None else x
        return np.bincount(self.seg, weights=v, minlength=self.num_samples).astype(
            np.float64
        )

    def broadcast(self, per_sample: np.ndarray) -> np.ndarray:
        """[B] → flat [R], each sample's value on each of its tokens."""
        return np.asarray(per_sample, dtype=np.float64)[self.seg]

    def first(self, x: np.ndarray) -> np.ndarray:
        """[B] the first token's value per sample (0 for an empty sample)."""
        out = np.zeros(self.num_samples)
        nonempty = self.lengths > 0
        out[nonempty] = x[self.offsets[:-1][nonempty]]
        return out

    def tolist(self, x: np.ndarray | None = None) -> list[list[float]]:
        v = self.flat if x is None else x
        return [
            [float(t) for t in v[self.offsets[i] : self.offsets[i + 1]]]
            for i in range(self.num_samples)
        ]

    def slice(self, lo: int, hi: int) -> Ragged:
        """Samples [lo, hi)."""
        a, b = int(self.offsets[lo]), int(self.offsets[hi])
        return Ragged(self.flat[a:b].copy(), self.offsets[lo : hi + 1] - a)


def _assert_like(x: Ragged, like: Ragged, name: str, like_name: str) -> None:
    if x.num_samples != like.num_samples or not np.array_equal(x.offsets, like.offsets):
        raise AlgorithmError(
            "algo_shape_mismatch", f"{name} is not shaped like {like_name}"
        )


def masked_mean_per_sample(r: Ragged, x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """[B] Σ x m / max(Σ m, 1) (slime's masked_mean; a fully masked row gives 0)."""
    return r.seg_sum(x * m) / np.maximum(r.seg_sum(m), 1.0)

"""Baselines of the scoring benchmark: synthetic metadata, a numpy and a plain-Python selection.

Both baselines implement NOTE [ Scoring rules ] (``tritondtr/policy/spec.py``) for k = 1 and
every built-in heuristic. numpy computes in float32 in the twin's order, so its victim equals the
twin's bit for bit. The Python loop computes in Python floats (float64), as the original DTR
simulator does; its victim may differ from the twin's only where two scores are equal after
rounding to float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tritondtr import Heuristic, MetadataTable
from tritondtr.policy.scoring import RESIDENT_EVICTABLE, random_base

__all__ = [
    "BYTES_READ",
    "PyColumns",
    "score_numpy",
    "select_numpy",
    "select_python",
    "synthetic_columns",
    "synthetic_table",
]

COLUMNS = ("cost", "size", "last_access", "nbhd_cost", "state")

BYTES_READ: dict[Heuristic, int] = {
    Heuristic.DTR: 25,  # cost 4 + size 8 + last_access 8 + nbhd_cost 4 + state 1
    Heuristic.DTR_EQ: 25,
    Heuristic.DTR_LOCAL: 21,  # no nbhd_cost
    Heuristic.MSPS: 17,  # no last_access
    Heuristic.LRU: 9,  # last_access + state
    Heuristic.SIZE: 9,  # size + state
    Heuristic.RANDOM: 1,  # state only: the score is a hash of the slot id
}
"""Device bytes a selection must read per slot: the columns its formula uses. The torch twin on
a table's columns reads evictable_size (4) instead of size and state (9): 20 bytes for dtr."""

_M32 = 0xFFFFFFFF


def synthetic_columns(
    n: int, *, seed: int = 0, evictable: float = 1.0
) -> tuple[dict[str, torch.Tensor], int]:
    """A table of ``n`` slots with plausible metadata, as CPU columns, and the clock ``now``.

    cost: log-normal around 1e4 (ns); size: 256 B to 448 MiB; last_access uniform in
    [0, now] (a few have zero staleness); nbhd_cost: 0 for 70 % of slots; state: a
    fraction ``evictable`` is ``RESIDENT_EVICTABLE``, the rest locked or evicted.
    Reproducible from ``seed``. Returns (columns as in :meth:`MetadataTable.columns`, now).
    """
    if not 0.0 <= evictable <= 1.0:
        raise ValueError(f"evictable must be a fraction in [0, 1], got {evictable}")
    g = torch.Generator().manual_seed(seed)
    now = 8 * n
    cost = torch.empty(n, dtype=torch.float32).log_normal_(math.log(1e4), 2.0, generator=g)
    size = torch.randint(1, 8, (n,), generator=g) << torch.randint(8, 27, (n,), generator=g)
    last_access = torch.randint(0, now + 1, (n,), generator=g)
    nbhd = torch.empty(n, dtype=torch.float32).log_normal_(math.log(1e4), 2.0, generator=g)
    nbhd_cost = torch.where(torch.rand(n, generator=g) < 0.3, nbhd, torch.zeros_like(nbhd))
    other = 2 + torch.randint(0, 2, (n,), generator=g, dtype=torch.int8)  # locked / evicted
    cand = torch.rand(n, generator=g) < evictable
    state = torch.where(cand, torch.ones_like(other), other)
    cols = {
        "cost": cost,
        "size": size,
        "last_access": last_access,
        "nbhd_cost": nbhd_cost,
        "state": state,
    }
    return cols, now


def synthetic_table(cols: dict[str, torch.Tensor]) -> MetadataTable:
    """A CPU :class:`MetadataTable` holding ``cols`` in slots 0..N-1 (its columns: the five,
    plus the derived ``evictable_size``; NOTE [ Evictable size ], [ Clock bounds ])."""
    table = MetadataTable(cols["cost"].numel(), device="cpu")
    table.add_many(**{k: v.numpy() for k, v in cols.items()})
    return table


# ------------------------------------------------------------------------------ numpy
def score_numpy(h: Heuristic, c: dict[str, np.ndarray], now: int, seed: int = 0) -> np.ndarray:
    """Scores of all slots, [N] float32 (int64 for lru/size); non-candidates +inf (int64 max)."""
    cand = c["state"] == RESIDENT_EVICTABLE
    if h in (Heuristic.LRU, Heuristic.SIZE):
        key = c["last_access"] if h is Heuristic.LRU else -c["size"]
        return np.where(cand, key, np.iinfo(np.int64).max)
    if h is Heuristic.RANDOM:
        x = (np.arange(cand.size, dtype=np.int64) ^ random_base(seed, now)) & _M32
        x ^= x >> 16
        x = (x * 0x7FEB352D) & _M32
        x ^= x >> 15
        x = (x * 0x846CA68B) & _M32
        x ^= x >> 16
        score = (x >> 8).astype(np.float32) * np.float32(1.0 / (1 << 24))
        return np.where(cand, score, np.float32(np.inf))
    if h is Heuristic.MSPS:
        den = c["size"].astype(np.float32)
    else:
        den = c["size"].astype(np.float32) * (now - c["last_access"]).astype(np.float32)
    num = c["cost"] if h is Heuristic.DTR_LOCAL else c["cost"] + c["nbhd_cost"]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        score = num / den
    score = np.where(cand & (den > 0), score, np.float32(np.inf))
    score[np.isnan(score)] = np.inf
    return score


def select_numpy(h: Heuristic, c: dict[str, np.ndarray], now: int, seed: int = 0) -> list[int]:
    """The victim (k = 1) as ``[slot]``, or ``[]`` when nothing is evictable."""
    score = score_numpy(h, c, now, seed)
    i = int(np.argmin(score))  # the first minimum: lowest slot id among ties
    if c["state"][i] == RESIDENT_EVICTABLE:
        return [i]
    # The minimum is +inf (or int64 max): every candidate ties with the non-candidates.
    cand = np.flatnonzero(c["state"] == RESIDENT_EVICTABLE)
    return cand[:1].tolist()


# ------------------------------------------------------------------------ plain Python
@dataclass(frozen=True)
class PyColumns:
    """The table as Python lists, and the candidate pool: the ids of the evictable slots,
    ascending (the DTR simulator keeps this pool up to date as storages come and go, so
    building it is not part of a decision)."""

    cost: list[float]
    size: list[int]
    last_access: list[int]
    nbhd_cost: list[float]
    cand: list[int]

    @classmethod
    def of(cls, c: dict[str, torch.Tensor]) -> PyColumns:
        cand = torch.nonzero(c["state"] == RESIDENT_EVICTABLE).squeeze(1).tolist()
        return cls(*(c[k].tolist() for k in COLUMNS[:4]), cand=cand)


def _py_key(h: Heuristic, p: PyColumns, now: int, seed: int) -> Callable[[int], float]:
    """The heuristic as one Python function of a slot id: one call per candidate, its
    arithmetic inline, as the DTR simulator's ``Heuristic.evaluate`` (which also reads
    storage objects and their neighbourhoods, so it is slower than this)."""
    cost, size, last, nbhd = p.cost, p.size, p.last_access, p.nbhd_cost
    inf = math.inf

    if h in (Heuristic.DTR, Heuristic.DTR_EQ):

        def dtr(i: int) -> float:
            den = size[i] * (now - last[i])
            if not den > 0:
                return inf
            v = (cost[i] + nbhd[i]) / den
            return inf if v != v else v

        return dtr
    if h is Heuristic.DTR_LOCAL:

        def dtr_local(i: int) -> float:
            den = size[i] * (now - last[i])
            if not den > 0:
                return inf
            v = cost[i] / den
            return inf if v != v else v

        return dtr_local
    if h is Heuristic.MSPS:

        def msps(i: int) -> float:
            den = size[i]
            if not den > 0:
                return inf
            v = (cost[i] + nbhd[i]) / den
            return inf if v != v else v

        return msps
    if h is Heuristic.LRU:
        return lambda i: last[i]
    if h is Heuristic.SIZE:
        return lambda i: -size[i]
    base = random_base(seed, now)

    def rand(i: int) -> float:
        x = (i ^ base) & _M32
        x ^= x >> 16
        x = (x * 0x7FEB352D) & _M32
        x ^= x >> 15
        x = (x * 0x846CA68B) & _M32
        x ^= x >> 16
        return (x >> 8) / (1 << 24)

    return rand


def select_python(h: Heuristic, p: PyColumns, now: int, seed: int = 0) -> list[int]:
    """The victim (k = 1) by a Python scan over the candidate pool, one heuristic call per
    candidate, as the original DTR simulator evicts."""
    key = _py_key(h, p, now, seed)
    best_i, best = -1, math.inf
    for i in p.cand:
        v = key(i)
        if best_i < 0 or v < best:  # strict: the lowest slot id wins ties
            best_i, best = i, v
    return [best_i] if best_i >= 0 else []

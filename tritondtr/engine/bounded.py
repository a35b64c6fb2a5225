"""Bounded choice: the exact next victim of a ratio heuristic without rescoring every slot.

# NOTE [ Bounded choice ]
# Most decisions of a DTR run need one victim, a few ops after the last full scoring, with a
# handful of slots changed since (the op's inputs and outputs). For ``dtr``, ``dtr_eq``,
# ``dtr_local`` and ``msps`` a scoring can then serve many later decisions exactly:
# 1. A full scoring at clock t0 (every slot's exact score: :meth:`BoundedChoice.scores`, the
#    torch twin's bit for bit in a few numpy passes, or ``MetadataTable.score`` for a forced
#    ``triton`` backend) keeps the top ``LIST`` (32) candidates in (score, slot) order (the
#    *list*), and for every other candidate i its float32 score h_i and its staleness
#    s_i = t0 - last_access_i. Tables on the CPU only: on a GPU the scores would cross to the
#    host at every full scoring, and the kernel's batched choice (NOTE [ Exact batched
#    choice ]) stays.
# 2. Until the next full scoring the engine records every slot whose score may have dropped
#    for another reason than the clock: created, accessed, recomputed, cost set, unlocked,
#    unpinned, or its ``nbhd_cost`` lowered by the neighbourhood (the *changed* slots).
#    Locking, pinning, evicting and releasing only remove candidates; a raised ``nbhd_cost``
#    only raises a score (NOTE [ Scoring rules ] 3: the score grows with the numerator).
# 3. An unchanged candidate's score at t >= t0 is, in real numbers, its score at t0 times
#    s_i / (s_i + t - t0) (same cost, neighbourhood, size and last access; for ``msps``, which
#    has no staleness, times 1). So B(d) = min h_i * s_i / (s_i + d) over the unchanged
#    candidates outside the list bounds all their scores from below while t - t0 <= d. B is
#    computed in float64 for d = 0, 1, 2, 4, 8, ... when first needed, and kept.
# 4. A choice at t scores exactly, in float32 as NOTE [ Scoring rules ] says, the *pool*: the
#    list, the changed slots, and the candidates rule 3 says nothing of (score not finite or
#    staleness 0 at t0). If the pool's best (score, slot) is a candidate whose score is below
#    B(d) * (1 - 1e-5), d the smallest of those clocks >= t - t0, it is the victim a full
#    scoring would choose: float32 rounding moves each score by at most a few units in the
#    last place (~2.4e-7 relative each), far below the margin. Otherwise, or when the pool
#    would hold more than ``MAX_POOL`` (1024) slots, the engine scores every slot again (a
#    *miss*).
# 5. Within an eviction loop (t = t0, d = 0) evictions only remove candidates and raise
#    neighbourhood costs, so the list serves victims until its best is no longer below B(0):
#    this replaces the batched list of NOTE [ Exact batched choice ] for these heuristics.
# 6. Sizes: a list of 32 rather than the batched list's 8, and pools of up to 1024 slots: a
#    pool costs ~13 us of fixed numpy calls whatever its size up to ~1k slots (2-core AMD
#    EPYC), a miss a pass over every slot; longer lists and larger pools turn most misses into
#    hits at the same cost (the victims are exact either way).
# Measured: see docs/benchmarks.md, Measurements behind the NOTEs, Bounded choice.
"""

from __future__ import annotations

import numpy as np

from ..policy.heuristics import Heuristic
from .table import MetadataTable

__all__ = ["BOUNDED", "LIST", "MAX_POOL", "BoundedChoice"]

BOUNDED = (Heuristic.DTR, Heuristic.DTR_EQ, Heuristic.DTR_LOCAL, Heuristic.MSPS)
LIST = 32  # rule 1's list length (rule 6)
MAX_POOL = 1024  # more slots to score than this: a full scoring instead (rules 4, 6)
_MARGIN = 1.0 - 1e-5  # rule 4
_INF = float("inf")


class BoundedChoice:
    """The state of NOTE [ Bounded choice ] for one engine: the last full scoring's list and
    bounds, and the slots changed since. The engine calls :meth:`changed` on every mutation of
    rule 2, :meth:`choose` for a decision and :meth:`start` after a full scoring."""

    def __init__(self, table: MetadataTable, heuristic: Heuristic) -> None:
        self.table = table
        self.stale = heuristic is not Heuristic.MSPS  # rule 3: msps has no staleness
        self.local = heuristic is Heuristic.DTR_LOCAL
        self.dirty: set[int] = set()  # rule 2: changed since the scoring
        self.t0 = -1  # no scoring yet
        self.list: list[int] = []
        self.extra: list[int] = []  # rule 4: candidates rule 3 cannot bound
        self._r: np.ndarray | None = None  # h * s (h for msps), +inf where not bounded, f64
        self._s: np.ndarray | None = None  # staleness at t0, float64
        self._bounds: dict[int, float] = {}
        self.hits = 0
        self.misses = 0

    def changed(self, slot: int) -> None:
        self.dirty.add(slot)

    def scores(self, now: int, idx: np.ndarray | None = None) -> np.ndarray:
        """The float32 scores of NOTE [ Scoring rules ] 2-4 at ``now`` of the slots ``idx``
        [m] int64 (every slot, [capacity], when None); +inf for non-candidates. The torch
        twin's scores bit for bit (tests/engine/test_engine.py), for these heuristics only."""
        t = self.table
        if idx is None:
            evs, cost, nbhd = t.host_evictable_size, t.host_cost, t.host_nbhd_cost
            last = t.host_last_access
        else:
            evs, cost = t.host_evictable_size[idx], t.host_cost[idx]
            nbhd = t.host_nbhd_cost[idx] if not self.local else None
            last = t.host_last_access[idx] if self.stale else None
        # evictable_size is NaN for non-candidates (NOTE [ Evictable size ])
        den = evs * (now - last).astype(np.float32) if self.stale else evs
        num = cost if self.local else cost + nbhd
        # divided only where den > 0 (a candidate of >= 1 byte and staleness >= 1, so den >=
        # 1: no overflow, no NaN; NaN den, a non-candidate, compares False): no warning to
        # silence, and every other score stays +inf
        score = np.full(evs.size, _INF, np.float32)
        np.divide(num, den, out=score, where=den > 0)
        return score

    def start(self, now: int, scores: np.ndarray, k: int = LIST) -> int | None:
        """A full scoring at ``now``: ``scores`` [capacity] float32 of every slot
        (non-candidates +inf). Keeps rule 1's list of ``k`` and returns the victim, the first
        (score, slot) candidate, or None if there is no candidate (NOTE [ Scoring rules ]
        5 and 7: all-infinite scores go to the lowest candidate slot)."""
        t = self.table
        n = scores.size
        cand = t.host_state[:n] == 1
        self.dirty.clear()
        if not cand.any():
            self.t0 = -1
            return None
        k = min(k, n)
        kth = np.partition(scores, k - 1)[k - 1]
        top = np.flatnonzero(scores < kth)
        top = np.concatenate([top, np.flatnonzero(scores == kth)[: k - top.size]])
        top = top[np.lexsort((top, scores[top]))]  # (score, slot) order
        top = top[cand[top]]
        if not top.size or not scores[top[0]] < _INF:  # every candidate at +inf
            self.t0 = -1
            return int(np.flatnonzero(cand)[0])
        h = scores.astype(np.float64)
        if self.stale:
            s = (now - t.host_last_access[:n]).astype(np.float64)
            with np.errstate(invalid="ignore"):
                r = h * s
            unbounded = cand & ~(np.isfinite(r) & (s > 0))
        else:
            s, r = None, h
            unbounded = cand & ~np.isfinite(h)
        extra = np.flatnonzero(unbounded)
        if extra.size > MAX_POOL:
            self.t0 = -1  # rule 4 would score too many: every choice is a full scoring
            return int(top[0])
        r = np.where(cand & ~unbounded, r, _INF)
        r[top] = _INF
        self.t0, self.list, self.extra = now, top.tolist(), extra.tolist()
        self._r, self._s, self._bounds = r, s, {}
        return int(top[0])

    def _bound(self, d: int) -> float:
        """B(d) of rule 3, d a power of two or 0."""
        b = self._bounds.get(d)
        if b is None:
            r = self._r
            b = float((r / (self._s + d)).min()) if self.stale else float(r.min())
            self._bounds[d] = b
        return b

    def choose(self, now: int) -> int | None:
        """The exact victim at ``now`` by rule 4, or None for a miss (score everything)."""
        d = now - self.t0
        if self.t0 < 0 or d < 0:
            return None
        if len(self.dirty) > MAX_POOL:  # scoring the pool would cost a full scoring
            return self._miss()
        pool = self.dirty.union(self.list, self.extra)
        idx = np.fromiter(pool, np.int64, len(pool))
        idx.sort()
        if not idx.size:
            return self._miss()
        score = self.scores(now, idx)
        i = int(np.argmin(score))  # the first minimum: the lowest slot among ties
        best = float(score[i])
        if not best < _INF:
            return self._miss()
        bound = self._bound(0 if d == 0 else 1 << (d - 1).bit_length())
        if not best < bound * _MARGIN:  # a NaN bound is a miss too
            return self._miss()
        self.hits += 1
        return int(idx[i])

    def _miss(self) -> None:
        self.misses += 1
        return None

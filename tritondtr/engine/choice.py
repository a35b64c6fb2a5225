"""The engine's victim choice: three strategies behind one interface, each serving as many
choices as it can from its last scoring of every slot.

* :class:`BatchedChoice`, exact (NOTE [ Exact batched choice ]): the default.
* :class:`StaleChoice`, an approximation (NOTE [ Stale batched choice ]): ``reuse > 0``.
* :class:`BoundedStrategy`, exact (NOTE [ Bounded choice ] in bounded.py): the ratio
  heuristics on CPU tables.

:meth:`Engine.choose <tritondtr.engine.Engine.choose>` asks :meth:`~VictimChoice.cached` first
and counts a hit unless it answers :data:`MISS`; then it counts a scoring and asks
:meth:`~VictimChoice.fresh`. Both are given the engine: a strategy reads its state, writes only
its own, and keeps no reference to it (a closed session's engine goes by reference counting).

# NOTE [ Exact batched choice ]
# ``choose(now)`` returns exactly what a full re-scoring (``select(now, 1)``) would return, yet
# one scoring serves several evictions:
# 1. A scoring keeps the top ``batch`` candidates in (score, slot) order, with the
#    ``nbhd_cost`` each had then; a shorter list means it held every candidate.
# 2. Within an eviction loop nothing but evictions happens and the clock does not advance.
#    Evicting a storage only grows the evicted set, so every other slot's ``nbhd_cost`` can
#    only go up (exact/ancestors: reachable regions only grow; eqclass: classes only merge and
#    gain members); values are exact functions of the evicted set (NOTE [ Neighbourhood
#    staging ] rule 4), so this holds bit for bit, and the built-in scores are non-decreasing
#    in ``nbhd_cost`` (float32 rounding and division by a positive denominator are monotone).
# 3. Serve the first cached slot v that is still a candidate, if its ``nbhd_cost``, recomputed
#    now for v alone, is what it was at the scoring. Then v is exact: every uncached
#    candidate u had (score, u) > (score, v) then and its score only went up since; every
#    cached slot before v is no longer a candidate. If v's value changed, the cache is
#    dropped and everything is re-scored.
# 4. Any other mutation that can lower a score or add a candidate (new, access, remat,
#    set_cost, add_parents, unlock, unpin, release of an evicted slot) or a different ``now``
#    drops the cache. lock, pin and release of a resident slot only remove candidates (and
#    change nobody's ``nbhd_cost``), which rule 3 already handles.
# 5. A user heuristic that keeps a neighbourhood cost may not be monotone in it: for those,
#    every choice re-scores (batch 1).

# NOTE [ Stale batched choice ]
# An approximation, off unless ``reuse > 0``: the list of rule 1 keeps serving choices for up
# to ``reuse`` ticks of the clock and across mutations, so several eviction loops share one
# scoring. A cached slot is served if it is still a candidate, its last access and its
# neighbourhood cost are what they were at the scoring; otherwise it is skipped. What this
# gets wrong: the order among unchanged candidates as staleness grows, and candidates created
# since the scoring (not considered until the list is used up or too old). Its effect on the
# victims, and its price: docs/benchmarks.md, Measurements behind the NOTEs, Stale batched
# choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

import numpy as np

from .. import policy
from ..policy.heuristics import CustomHeuristic, Heuristic
from .bounded import BoundedChoice
from .neighborhood import Neighborhood
from .residency import RESIDENT
from .table import MetadataTable

__all__ = ["MISS", "BatchedChoice", "BoundedStrategy", "Scoring", "StaleChoice", "VictimChoice"]


class _Miss:
    """The type of :data:`MISS`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISS"


MISS: Final = _Miss()
"""What :meth:`VictimChoice.cached` answers when only a fresh scoring can choose."""


class Engine(Protocol):
    """What a strategy reads of its :class:`~tritondtr.engine.Engine` (and never writes)."""

    table: MetadataTable
    nbhd: Neighborhood
    heuristic: Heuristic | CustomHeuristic
    backend: policy.Backend
    seed: int
    batch: int  # victims a scoring keeps
    reuse: int  # clock ticks a scoring may serve (the stale choice)
    epoch: int  # mutations that can lower a score or add a candidate, so far
    residency: bytearray  # FREE / RESIDENT / EVICTED per slot
    locks: list[int]  # lock count per slot
    pinned: bytearray  # 1 where pinned


class VictimChoice(Protocol):
    """How :meth:`Engine.choose` finds the next victim."""

    def cached(self, engine: Engine, now: int) -> int | _Miss | None:
        """The victim from the last scoring (None: no candidate is left), or :data:`MISS`."""
        ...

    def fresh(self, engine: Engine, now: int) -> int | None:
        """Score every slot at ``now``, keep what serves later choices, return the victim."""
        ...


@dataclass(slots=True)
class Scoring:
    """What one scoring left for later choices (NOTE [ Exact batched choice ] rule 1)."""

    epoch: int  # the engine's mutation count when it ran
    now: int  # the clock it scored at
    ids: list[int]  # the best ``batch`` candidates, best first
    nbhd_cost: list[float]  # their ``nbhd_cost`` then (float32 values)
    pos: int  # the first of ``ids`` that may still serve
    last_access: list[int] | None  # their last access then (the stale choice's only)


class BatchedChoice:
    """NOTE [ Exact batched choice ]: the top ``engine.batch`` of one scoring serve the
    choices of one eviction loop (same clock, nothing but evictions in between)."""

    def __init__(self) -> None:
        self.last: Scoring | None = None

    def cached(self, engine: Engine, now: int) -> int | _Miss | None:
        c, e = self.last, engine
        if c is None or c.epoch != e.epoch or c.now != now:
            return MISS  # rule 4
        ids, snap, pos = c.ids, c.nbhd_cost, c.pos
        st, locks, pinned, nb = e.residency, e.locks, e.pinned, e.nbhd
        while pos < len(ids):
            v = ids[pos]
            if st[v] != RESIDENT or locks[v] or pinned[v]:
                pos += 1
                continue
            if not nb.tracking or float(np.float32(nb.value(v))) == snap[pos]:  # rule 3
                c.pos = pos
                return v
            return MISS
        if len(ids) < e.batch:  # rule 1: the scoring held every candidate, none is left
            c.pos = pos
            return None
        return MISS

    def fresh(self, engine: Engine, now: int) -> int | None:
        e = engine
        e.nbhd.flush()
        ids = e.table.select(e.heuristic, now, e.batch, backend=e.backend, seed=e.seed).tolist()
        host = e.table
        snap = host.host_nbhd_cost[ids].tolist() if ids else []
        last = host.host_last_access[ids].tolist() if e.reuse and ids else None
        self.last = Scoring(e.epoch, now, ids, snap, 0, last)
        return ids[0] if ids else None


class StaleChoice(BatchedChoice):
    """NOTE [ Stale batched choice ]: as :class:`BatchedChoice`, and across mutations and up
    to ``engine.reuse`` clock ticks, a cached slot whose inputs to its score are unchanged."""

    def cached(self, engine: Engine, now: int) -> int | _Miss | None:
        c, e = self.last, engine
        if c is None or (c.epoch == e.epoch and c.now == now):
            return super().cached(e, now)
        if not 0 <= now - c.now <= e.reuse:
            return MISS
        ids, snap, last, pos = c.ids, c.nbhd_cost, c.last_access, c.pos
        st, locks, pinned, nb = e.residency, e.locks, e.pinned, e.nbhd
        host_last = e.table.host_last_access
        while pos < len(ids):
            v = ids[pos]
            pos += 1
            if st[v] != RESIDENT or locks[v] or pinned[v] or host_last[v] != last[pos - 1]:
                continue
            if nb.tracking and float(np.float32(nb.value(v))) != snap[pos - 1]:
                continue
            c.pos = pos
            return v
        c.pos = pos
        return MISS


class BoundedStrategy:
    """NOTE [ Bounded choice ]: a full scoring's list, and lower bounds of every other score
    as the clock advances (``bounded``, its :class:`~.bounded.BoundedChoice`)."""

    def __init__(self, bounded: BoundedChoice) -> None:
        self.bounded = bounded

    def cached(self, engine: Engine, now: int) -> int | _Miss | None:
        if type(now) is not int:  # the paper's replay runs a float clock; scores see int
            now = policy.check_now(now)
        engine.nbhd.flush()
        v = self.bounded.choose(now)
        return MISS if v is None else v

    def fresh(self, engine: Engine, now: int) -> int | None:
        if type(now) is not int:
            now = policy.check_now(now)
        e, b = engine, self.bounded
        if e.backend is policy.Backend.TORCH:  # the twin's scores, in numpy: cheaper
            return b.start(now, b.scores(now))
        return b.start(now, e.table.score(e.heuristic, now, backend=e.backend).numpy())

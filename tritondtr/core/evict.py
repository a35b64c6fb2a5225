"""Eviction: choosing victims through the engine and dropping them, for the budget or for
``stress``.

:class:`Evictor` is the part of :class:`~tritondtr.core.Core` that makes room: the first
victim of an eviction loop is one exact top-1 scoring, later ones the engine's batched choice;
storages no wrapper holds are scored by their evicted ancestors; when nothing is left, the
backward pass's storages are unpinned; then :class:`BudgetError`.

# NOTE [ One victim first ]
# 1. ``Engine.choose`` scores once for its top ``batch`` (8) candidates and serves later
#    choices of the same eviction loop from that list (NOTE [ Exact batched choice ] in
#    engine/choice.py). Most :meth:`make_room` calls evict one storage only: the op in flight is
#    over the budget by less than one victim.
# 2. So the first eviction of a :meth:`make_room` asks ``engine.select(now, 1)``: by
#    definition the exact victim ``choose`` would give. Further evictions of the same call
#    use ``choose`` and its batched list. Victims, and so the values, peaks and
#    rematerializations, are those of ``choose`` alone; only the number of scorings changes.
#    Measured: docs/benchmarks.md, Measurements behind the NOTEs, One victim first.
# 3. For the heuristics of NOTE [ Bounded choice ] (engine tables on the CPU) ``choose``
#    itself serves every victim, the first included, from bounds that outlive the eviction
#    loop; rule 2 is for the others.
"""

from __future__ import annotations

import time

import torch

from ..engine.residency import RESIDENT
from .errors import BudgetError
from .unheld import DESCENDANTS

__all__ = ["Evictor"]

_profiling = torch.autograd._profiler_enabled


class Evictor:
    """Victim choice and eviction of :class:`~tritondtr.core.Core` (NOTE [ Budget accounting ]
    rule 3, NOTE [ Backward storages ], NOTE [ One victim first ]); uses the core's lists,
    engine and counters."""

    def evict_one(self, first: bool = False) -> bool:
        """Evict the engine's next victim; False if nothing is evictable. ``first``: the
        first eviction of a :meth:`make_room` (NOTE [ One victim first ])."""
        self.sync()
        if self.engine is None:  # nothing tracked yet (no device): nothing to evict
            return False
        if self.deferred:  # NOTE [ Deferred locks ] rule 2 in core.py
            self.lock_inputs()
        prof = _profiling()
        clock = self.clock  # NOTE [ Device time ] in runtime/events.py; rule 3: host tables
        if clock is not None and self.engine.table.device.type == "cpu":
            clock = None
        t0 = time.perf_counter() if clock is None else clock.start()
        if prof:
            with torch.profiler.record_function("tritondtr::select"):
                v = self._choose(first)
        else:
            v = self._choose(first)
        if clock is None:
            self.stats.select_s += time.perf_counter() - t0
        else:
            clock.stop(t0, "select_s")
        self.stats.device_syncs = self.engine.table.device_syncs  # NOTE [ Decisions on the host ]
        if v is None:
            if not self._unpin_backward():
                return False
            return self.evict_one(first)
        if prof:  # NOTE [ Offload ] in core.py: dropped, or copied to the host
            with torch.profiler.record_function("tritondtr::evict"):
                self.evict(self.sid_of[v])
        else:
            self.evict(self.sid_of[v])
        self.stats.evictions += 1
        return True

    def _choose(self, first: bool) -> int | None:
        eng = self.engine
        if first and not self.reuse and not eng.bounded:
            ids = eng.select(self.now, 1)
            v = ids[0] if ids else None
        else:
            v = eng.choose(self.now)
        scorer = self.scorer  # NOTE [ Unheld storages ] in unheld.py (rule 5: not once forced)
        if v is None or not scorer.unheld or self.pins.forced:
            return v
        return scorer.victim(eng, v, self.now) if eng.heuristic in DESCENDANTS else v

    def _unpin_backward(self) -> bool:
        """NOTE [ Backward storages ] rules 2 to 5 in backward.py: the storages kept out of
        the engine are let in, then the pins unpin what they may; False if nothing was."""
        pins = self.pins
        if pins.out:  # rule 5
            self.admit_backward()
        return pins.unpin(self.engine, self.eslot, self.anchored)

    def over_budget(self) -> bool:
        """Would :meth:`make_room` evict now? (NOTE [ Budget accounting ] rule 2)"""
        return not self.closed and self.bytes.over()

    def make_room(self, op: str) -> None:
        """NOTE [ Budget accounting ] rules 2 and 3, before ``op`` runs."""
        if not self.over_budget():
            return
        acc = self.bytes
        budget = acc.budget
        if self.lazy:
            raise AssertionError(
                "bug of tritondtr: over budget while the engine is deferred "
                "(NOTE [ Lazy engine ] rule 2)"
            )
        if self.engine is None:  # nothing tracked yet: outside bytes alone exceed it
            raise BudgetError(op, acc.resident, budget, self.describe_pinned())
        first = True
        while acc.resident > budget:
            if not self.evict_one(first):
                raise BudgetError(op, acc.resident, budget, self.describe_pinned())
            first = False

    def evict_all(self) -> int:
        """Evict every candidate now (stress, tests); returns how many."""
        self.sync()
        eng, n = self.engine, 0
        while eng is not None:
            v = eng.choose(self.now)
            if v is None:
                break
            self.evict(self.sid_of[v])
            n += 1
        self.stats.evictions += n
        return n

    def describe_pinned(self) -> str:
        eng = self.engine
        locked = pinned = nl = np_ = 0
        for slot, sid in enumerate(self.sid_of):
            if sid < 0 or self.state[sid] != RESIDENT:
                continue
            if eng.lock_count(slot):
                locked += self.size[sid]
                nl += 1
            elif not eng.is_candidate(slot):
                pinned += self.size[sid]
                np_ += 1
        for sid in self.pins.out:  # NOTE [ Backward storages ] rule 5 in backward.py
            if self.state[sid] == RESIDENT:
                if sid in self.pins.out_locks:
                    locked += self.size[sid]
                    nl += 1
                else:
                    pinned += self.size[sid]
                    np_ += 1
        text = (
            f"{nl} storages locked as inputs of the op in flight ({locked} bytes), "
            f"{np_} pinned ({pinned} bytes)"
        )
        if self.bytes.outside:
            text += f", {self.bytes.outside} bytes outside the tracked storages (FSDP2 parameters)"
        return text

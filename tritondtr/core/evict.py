"""Eviction: choosing victims through the engine and dropping them, for the budget or for
``stress``.

:class:`Evictor` is the part of :class:`~tritondtr.core.Core` that makes room: the first
victim of an eviction loop is one exact top-1 scoring, later ones the engine's batched choice;
storages no wrapper holds are scored by their evicted ancestors; when nothing is left, the
backward pass's storages are unpinned; then :class:`BudgetError`.

# NOTE [ Backward storages ]
# 1. Storages created while autograd runs a backward pass are pinned when created: gradients
#    flow through them right away, and evicting them mostly causes rematerialization cascades
#    (far fewer rematerializations when they stay; measured: see docs/benchmarks.md,
#    Measurements behind the NOTEs, Backward storages).
# 2. They are the lowest priority, not never: when nothing else can be evicted and the budget
#    is exceeded, they are unpinned and become ordinary candidates, in two stages:
# 3. First only those none of whose inputs is an evicted backward storage: one recomputation
#    brings them back. The others (a gradient whose incoming gradient was released, the
#    running sum of a shared weight's gradient) can only be recomputed by running again the
#    part of the backward pass that led to them, itself recomputing the forward activations
#    it reads: the neighbourhood costs do not tell them apart (they all touch the one large
#    evicted component the released gradients form), and evicting one made single
#    recomputations of over 1,000 rematerializations. Only when the first stage unpins
#    nothing are the others unpinned too. Measured on the twin: see docs/benchmarks.md,
#    Measurements behind the NOTEs, Backward storages.
# 4. Between the two stages, a middle one: those whose recomputation needs at most
#    ``_BW_WALK`` (8) evicted backward storages (a walk up their evicted backward
#    ancestors, stopped at resident ones). A gradient read by one cheap op from a resident
#    gradient (``mm`` of ``mul(g, mask)`` while ``g`` stays) comes back with a few
#    recomputations; the running sum of the residual stream's gradient, whose addends were
#    released, comes back only by running the backward pass again from the loss. Without
#    this stage both were unpinned at once when the first stage found nothing, and TinyGPT
#    at 10 % of its peak evicted the residual gradient and thrashed (11,000 to 13,000
#    rematerializations a step on the twin; measured: docs/history/simulator-log.md, Tight
#    budgets on TinyGPT).
# 5. Until then they stay out of the engine: no table row, no neighbourhood node, no access,
#    lock or release event (the core keeps them in ``bw_out``, their last use in ``seen``,
#    their locks in ``out_locks``). They were most of the engine's storages in a training
#    step (LSTM, GRU loop and TreeLSTM of the benchmarks: 356 of 515, 522 of 808, 232 of
#    375 at 50 %), each a row, an eviction into the evicted classes when released and a
#    release when forgotten, for storages that are never candidates. They enter it
#    (:meth:`Core.admit`, as :meth:`Core.sync` enters a storage: pinned if resident,
#    evicted if not, its last use, its locks, edges from its inputs and to its readers in
#    the engine) when rule 2 first needs them: all of them, in creation order, and every
#    later one as it is made until the step ends (the freeze at the optimizer's first
#    parameter write); one alone when it is recomputed (a released gradient an evicted
#    storage reads) or anchored. Not under ``stress``, which keeps no map of readers (the
#    edges to them). What differs from entering them when made: the evicted
#    classes never hold released backward storages that were not admitted, so a resident
#    storage's neighbourhood cost does not count them, and union-find classes are not
#    merged through them. On the policy sweep's 15 recorded steps every run at 40 to 90 %
#    of the peak is unchanged; 11 of the 45 at 10 to 30 % change, one worse (+1.7 points of
#    extra compute), the others better or within 0.3 points (docs/history/simulator-log.md,
#    Backward storages out of the engine).

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

from ..engine.residency import EVICTED, RESIDENT
from .errors import BudgetError
from .unheld import DESCENDANTS

__all__ = ["Evictor"]

_profiling = torch.autograd._profiler_enabled
_BW_WALK = 8  # NOTE [ Backward storages ] rule 4: evicted backward ancestors, at most


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
        if prof:
            with torch.profiler.record_function("tritondtr::evict"):
                self.drop(self.sid_of[v])
        else:
            self.drop(self.sid_of[v])
        self.stats.evictions += 1
        return True

    def _choose(self, first: bool) -> int | None:
        eng = self.engine
        if first and not self.reuse and not eng.bounded:
            ids = eng.select(self.now, 1)
            v = ids[0] if ids else None
        else:
            v = eng.choose(self.now)
        scorer = self.scorer  # NOTE [ Unheld storages ] in unheld.py
        if v is not None and scorer.unheld and not self.bw_forced and eng.heuristic in DESCENDANTS:
            return scorer.victim(eng, v, self.now)
        return v

    def _unpin_backward(self) -> bool:
        """NOTE [ Backward storages ] rules 2 to 5; False if nothing was unpinned."""
        if self.bw_out:  # rule 5
            self.admit_backward()
        state, pinned, in_bw = self.state, self.pinned, self.in_bw
        anchored = self.anchored  # NOTE [ Anchored storages ] rule 4
        live = []
        for sid in self.bw:
            if in_bw[sid] and state[sid] == RESIDENT and not pinned[sid] and sid not in anchored:
                live.append(sid)
            else:
                in_bw[sid] = 0
        backward, inputs = self.backward, self.inputs
        cheap = [
            sid for sid in live if not any(state[i] == EVICTED and backward[i] for i in inputs[sid])
        ]
        if not cheap:  # rule 4
            cheap = [sid for sid in live if self._few_backward_ancestors(sid)]
        if cheap:  # rule 3
            keep = set(cheap)
            self.bw = [sid for sid in live if sid not in keep]
        else:
            cheap, self.bw = live, []
        eng, eslot = self.engine, self.eslot
        for sid in cheap:
            eng.unpin(eslot[sid])
            in_bw[sid] = 0
        self.stats.backward_unpins += bool(cheap)
        self.bw_forced = self.bw_forced or bool(cheap)  # NOTE [ Unheld storages ] rule 5
        return bool(cheap)

    def _few_backward_ancestors(self, sid: int) -> bool:
        """NOTE [ Backward storages ] rule 4: does recomputing ``sid`` need at most
        ``_BW_WALK`` evicted backward storages?"""
        state, backward, inputs = self.state, self.backward, self.inputs
        seen, todo = set(), [sid]
        while todo:
            for i in inputs[todo.pop()]:
                if state[i] == EVICTED and backward[i] and i not in seen:
                    if len(seen) == _BW_WALK:
                        return False
                    seen.add(i)
                    todo.append(i)
        return True

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
            self.drop(self.sid_of[v])
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
        for sid in self.bw_out:  # NOTE [ Backward storages ] rule 5
            if self.state[sid] == RESIDENT:
                if sid in self.out_locks:
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

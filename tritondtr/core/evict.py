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

# NOTE [ Unheld storages ]
# 1. A resident storage that no wrapper holds (``held`` 0) is resident only because a
#    recomputation needed it as an input (NOTE [ A recomputation is not a use ] in remat.py).
#    The program never reads it again: it matters only to the recomputations of its evicted
#    descendants, and evicting it adds to those its own recomputation: its cost and the cost
#    of its evicted ancestors (each once), not the cost of the descendants themselves, which
#    they pay whether it stays or not.
# 2. So under ``dtr_eq`` and ``dtr``, whose neighbourhood also counts the evicted
#    descendants' side, such a storage is scored (cost + its evicted ancestors' costs) /
#    (size x staleness), in float64 from the core's costs and sizes and the engine's last
#    accesses (the engine's victim is scored the same way to compare); every other storage
#    keeps the engine's score. The victim is the lowest of the engine's victim and those
#    scores (ties: the lowest engine slot). Every evicted ancestor is in the evicted
#    neighbourhood (the class of an evicted parent, or the exact e*, holds all evicted
#    storages reachable through it), so the rule only lowers the scores of these storages: it
#    never picks a held storage the engine did not.
# 3. Why: the union-find classes never split (NOTE [ Eqclass rules ] rule 3), and the intermediates
#    a long recomputation leaves behind border a class that grew over most of the evicted graph (108
#    ms of cost in the 158 ms step of the zoo LSTM at scale 16 and 50 % of its peak, on the twin,
#    2-core AMD EPYC guest). Stale and never read, they kept their place at ~20x the score of the
#    held storages recomputed beside them, which were evicted instead: the same chain prefix was
#    then recomputed 3-4 times. Measured on the twin: docs/history/simulator-log.md, Unheld
#    storages.
# 4. The candidates are the storages recomputed while no wrapper held them (``Core.unheld``, fed by
#    ``Rematerializer.recompute``; entries no longer resident and unheld are dropped at each choice
#    the rule makes, and when forgotten), the engine's victim included when it is one of them. They
#    are visited in order of their own score (cost / (size x staleness)): once one cannot beat the
#    best so far, none of the rest can; a walk up the ancestors stops as soon as its sum cannot
#    either, or after 32 evicted ancestors (the engine's score stands: such a recomputation is no
#    longer cheap), and one choice visits at most 512 ancestors in all, the rest keeping the
#    engine's score (on a 200-layer transformer at 20 % walks over most of the evicted graph took ~5
#    ms a choice; with both caps 0.17 ms, on the twin, 2-core AMD EPYC guest; the recorded steps'
#    walks stay far below them).
# 5. Not once the budget has forced backward storages out in this step (NOTE [ Backward
#    storages ] rule 2), until the step ends (the freeze at the optimizer's first parameter
#    write, NOTE [ Parameter writes ]): recomputations then re-run parts of the backward pass
#    again and again, and what one leaves unheld the next one reads; evicting it by its
#    ancestors only made more, if cheaper, recomputations (the zoo's TreeLSTM at scale 16
#    and 50 %: 1,919 -> 2,696 on the twin; 5.8x -> 8.4x its not-binding step on the
#    runtime). Measured: docs/history/simulator-log.md, Unheld storages.
# 6. A walk's result is kept (``anc_sums``): the exact sum, or, for a walk stopped at its
#    limit, a lower bound (the costs of the ancestors it visited), or "capped" (more than 32
#    evicted ancestors). A sum depends only on which storages are evicted: it stays exact
#    while every ancestor it counted stays evicted and every resident input it stopped at
#    stays resident; a bound stays a bound while every ancestor it counted stays evicted
#    (more evictions only add). So the core reports each storage that is rematerialized
#    (``anc_inside``: the sums counting it are dropped) or evicted (``anc_border``: the exact
#    sums it bounded become bounds), and a choice walks only where no kept sum decides:
#    a kept bound above the limit, or a capped storage, is out without a walk; an exact sum
#    is used as it is. Victims are those of walking every time; the one difference is rule
#    4's 512-ancestor budget per choice, which counts walked ancestors only (of the recorded
#    steps, it binds on the GRU loop at 30 % and below). Measured: docs/benchmarks.md,
#    Measurements behind the NOTEs, Kept ancestor sums.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass

import torch

from ..engine.residency import EVICTED, RESIDENT
from ..policy.heuristics import Heuristic
from .errors import BudgetError

__all__ = ["AncestorSum", "Evictor", "SumKind"]

_profiling = torch.autograd._profiler_enabled
_INF = float("inf")
_DESCENDANTS = (Heuristic.DTR, Heuristic.DTR_EQ)  # NOTE [ Unheld storages ] rule 2
_MAX_WALK = 32  # ibid. rule 4: more evicted ancestors than this, and the engine's score stands
_MAX_VISITS = 512  # ibid.: ancestors visited per choice, all walks together
_BW_WALK = 8  # NOTE [ Backward storages ] rule 4: evicted backward ancestors, at most


class SumKind(enum.Enum):
    """What a kept ancestor sum is (NOTE [ Unheld storages ] rule 6)."""

    BOUND = "bound"  # at most the sum: the walk stopped at its limit
    EXACT = "exact"  # the sum
    CAPPED = "capped"  # more than _MAX_WALK evicted ancestors: the engine's score stands


_BOUND, _EXACT, _CAPPED = SumKind.BOUND, SumKind.EXACT, SumKind.CAPPED


@dataclass(slots=True)
class AncestorSum:
    """A storage's kept ancestor sum (NOTE [ Unheld storages ] rule 6): the summed cost (ns)
    of the evicted storages its recomputation needs, or a bound of it, and which it is."""

    cost: float
    kind: SumKind


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
        if v is not None and self.unheld and not self.bw_forced and eng.heuristic in _DESCENDANTS:
            return self._unheld_victim(v)
        return v

    def _unheld_victim(self, v: int) -> int:
        """NOTE [ Unheld storages ]: the engine slot of the victim, ``v`` or a resident
        storage no wrapper holds whose ancestors-only score is lower."""
        eng, now, cost, size = self.engine, self.now, self.cost, self.size
        t = eng.table
        last = t.host_last_access.item
        u = self.sid_of[v]
        den = size[u] * (now - last(v))
        best = (cost[u] + t.host_nbhd_cost.item(v)) / den if den > 0 else _INF
        pick = v
        state, held, eslot = self.state, self.held, self.eslot
        evictable = t.host_evictable_size.item  # NaN unless a candidate (NOTE [ Evictable size ])
        keep, todo = {}, []
        for sid in self.unheld:
            if state[sid] != RESIDENT or held[sid]:
                continue
            keep[sid] = None
            slot = eslot[sid]
            e = evictable(slot)
            if e != e:  # not a candidate: locked or pinned
                continue
            d = size[sid] * (now - last(slot))
            if d > 0:
                todo.append((cost[sid] / d, slot, sid, d))
        todo.sort()  # rule 4: the lowest own scores first, so the best falls early
        visits, sums = _MAX_VISITS, self.anc_sums
        for low, slot, sid, d in todo:
            if low > best or visits <= 0:  # rule 4: no other can beat the best, or no time
                break
            own = cost[sid]
            limit = best * d - own
            known = sums.get(sid)  # rule 6
            if known is not None and (known.kind is _CAPPED or known.cost > limit):
                continue
            if known is not None and known.kind is _EXACT:
                anc = known.cost
            else:
                anc, n = self._ancestors_cost(sid, limit, min(_MAX_WALK, visits))
                visits -= n
                if anc is None:
                    continue
            score = (own + anc) / d
            if score < best or (score == best and slot < pick):
                best, pick = score, slot
        self.unheld = keep
        return pick

    def _ancestors_cost(self, sid: int, limit: float, most: int) -> tuple[float | None, int]:
        """The summed costs of the evicted storages ``sid``'s recomputation needs (each once)
        and how many were visited; the sum is None once it exceeds ``limit`` or the walk
        passes ``most`` storages (NOTE [ Unheld storages ] rule 4). What the walk learnt is
        kept in ``anc_sums`` (rule 6)."""
        state, inputs, cost = self.state, self.inputs, self.cost
        total, seen, border, todo = 0.0, set(), [], []
        for i in inputs[sid]:
            s = state[i]
            if s == EVICTED:
                todo.append(i)
            elif s == RESIDENT:
                border.append(i)
        found = None
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            total += cost[i]
            if total > limit or len(seen) > most:
                kind = _CAPPED if len(seen) > _MAX_WALK else _BOUND
                break
            for j in inputs[i]:
                s = state[j]
                if s == EVICTED:
                    if j not in seen:
                        todo.append(j)
                elif s == RESIDENT:
                    border.append(j)
        else:
            found, kind = total, _EXACT
        self.anc_sums[sid] = AncestorSum(total, kind)
        inside = self.anc_inside
        for i in seen:
            inside.setdefault(i, []).append(sid)
        if kind == _EXACT:
            edge = self.anc_border
            for i in border:
                edge.setdefault(i, []).append(sid)
        return found, len(seen)

    def forget_ancestors(self, sid: int, evicted: bool) -> None:
        """NOTE [ Unheld storages ] rule 6: ``sid`` left the evicted state (``evicted``
        False: rematerialized or forgotten) or entered it (True); drop or weaken the sums
        that depended on its state."""
        sums = self.anc_sums
        if evicted:
            for u in self.anc_border.pop(sid, ()):
                known = sums.get(u)
                if known is not None and known.kind is _EXACT:
                    known.kind = _BOUND
        else:
            for u in self.anc_inside.pop(sid, ()):
                sums.pop(u, None)

    def check_ancestor_sums(self) -> None:
        """Raise AssertionError if a sum kept by NOTE [ Unheld storages ] rule 6 disagrees
        with a fresh walk: an exact sum must be the sum, a bound at most the sum, a capped
        storage must have more than ``_MAX_WALK`` evicted ancestors."""
        state, inputs, cost = self.state, self.inputs, self.cost
        for sid, known in self.anc_sums.items():
            value, kind = known.cost, known.kind
            seen, todo, total = set(), [i for i in inputs[sid] if state[i] == EVICTED], 0.0
            while todo:
                i = todo.pop()
                if i not in seen:
                    seen.add(i)
                    total += cost[i]
                    todo.extend(j for j in inputs[i] if state[j] == EVICTED)
            if kind == _EXACT:
                assert math.isclose(value, total, rel_tol=1e-12), (
                    f"storage {sid}: kept ancestors' cost {value} != {total}"
                )
            elif kind == _BOUND:
                assert value <= total * (1 + 1e-12), f"storage {sid}: bound {value} > {total}"
            else:
                assert len(seen) > _MAX_WALK, f"storage {sid}: capped with {len(seen)} ancestors"

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

"""The unheld scorer of a DTR core: resident storages no wrapper holds, scored by the evicted
ancestors their eviction would add to a recomputation (NOTE [ Unheld storages ]).

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
# 4. The candidates are the storages recomputed while no wrapper held them
#    (``UnheldScorer.unheld``, fed by ``Rematerializer.recompute``; entries no longer resident
#    and unheld are dropped at each choice the rule makes, and when forgotten), the engine's
#    victim included when it is one of them. They are visited in order of their own score
#    (cost / (size x staleness)): once one cannot beat the best so far, none of the rest can;
#    a walk up the ancestors stops as soon as its sum cannot either, or after 32 evicted
#    ancestors (the engine's score stands: such a recomputation is no longer cheap), and one
#    choice visits at most 512 ancestors in all, the rest keeping the engine's score (on a
#    200-layer transformer at 20 % walks over most of the evicted graph took ~5 ms a choice;
#    with both caps 0.17 ms, on the twin, 2-core AMD EPYC guest; the recorded steps' walks
#    stay far below them).
# 5. Not once the budget has forced backward storages out in this step (NOTE [ Backward
#    storages ] rule 2), until the step ends (the freeze at the optimizer's first parameter
#    write, NOTE [ Parameter writes ]): recomputations then re-run parts of the backward pass
#    again and again, and what one leaves unheld the next one reads; evicting it by its
#    ancestors only made more, if cheaper, recomputations (the zoo's TreeLSTM at scale 16
#    and 50 %: 1,919 -> 2,696 on the twin; 5.8x -> 8.4x its not-binding step on the
#    runtime). Measured: docs/history/simulator-log.md, Unheld storages.
# 6. A walk's result is kept (``sums``): the exact sum, or, for a walk stopped at its
#    limit, a lower bound (the costs of the ancestors it visited), or "capped" (more than 32
#    evicted ancestors). A sum depends only on which storages are evicted: it stays exact
#    while every ancestor it counted stays evicted and every resident input it stopped at
#    stays resident; a bound stays a bound while every ancestor it counted stays evicted
#    (more evictions only add). So the core reports each storage that is rematerialized
#    (``inside``: the sums counting it are dropped) or evicted (``border``: the exact
#    sums it bounded become bounds), and a choice walks only where no kept sum decides:
#    a kept bound above the limit, or a capped storage, is out without a walk; an exact sum
#    is used as it is. Victims are those of walking every time; the one difference is rule
#    4's 512-ancestor budget per choice, which counts walked ancestors only (of the recorded
#    steps, it binds on the GRU loop at 30 % and below). Measured: docs/benchmarks.md,
#    Measurements behind the NOTEs, Kept ancestor sums.
# 7. With a link, a storage with a host copy (backed or offloaded) costs the lower of its
#    recomputation and its copy back, here as in the engine (NOTE [ Asynchronous offload ]
#    rule 3 in offload.py: ``price_copies``); a storage gains or loses its copy only while
#    resident or as it leaves, so rule 6's sums stay true.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from ..engine.residency import EVICTED, RESIDENT
from ..policy.heuristics import Heuristic

__all__ = ["DESCENDANTS", "AncestorSum", "SumKind", "UnheldScorer"]

_INF = float("inf")
DESCENDANTS = (Heuristic.DTR, Heuristic.DTR_EQ)  # rule 2: the heuristics it serves
_MAX_WALK = 32  # rule 4: more evicted ancestors than this, and the engine's score stands
_MAX_VISITS = 512  # ibid.: ancestors visited per choice, all walks together


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


class UnheldScorer:
    """Rules 1 to 6 of NOTE [ Unheld storages ] for one core: the one writer of the storages
    recomputed while unheld (``unheld``) and of the kept ancestor sums (``sums``, with
    ``inside``: evicted sid -> the sums that count it, and ``border``: resident sid -> the
    exact sums it bounds). Reads the core's per-storage lists, given at construction (lists
    the core appends to and never replaces)."""

    def __init__(self, state, held, inputs, cost, size, eslot, sid_of) -> None:
        self.state, self.held, self.inputs = state, held, inputs
        self.cost, self.size, self.eslot, self.sid_of = cost, size, eslot, sid_of
        self.unheld: dict[int, None] = {}  # rule 4: in the order they were recomputed
        self.sums: dict[int, AncestorSum] = {}  # sid -> its kept sum (rule 6)
        self.inside: dict[int, list[int]] = {}
        self.border: dict[int, list[int]] = {}
        self.copied = None  # with a link: the core's host-copy flags (NOTE [ Asynchronous
        self.copy_link = None  # offload ] rule 3 in offload.py), and the link

    def price_copies(self, host, link) -> None:
        """From now on a storage with a host copy costs the lower of its recomputation and
        its copy back, as the engine prices it (NOTE [ Asynchronous offload ] rule 3)."""
        self.copied, self.copy_link = (None, None) if link is None else (host, link)

    def _cost(self, sid: int) -> float:
        c = self.cost[sid]
        if self.copied is not None and self.copied[sid]:
            return min(c, self.copy_link.duration(self.size[sid]))
        return c

    def recomputed(self, sid: int) -> None:
        """``sid`` was recomputed while no wrapper holds it (rule 4)."""
        self.unheld[sid] = None

    def forget(self, sid: int) -> None:
        """``sid`` left the core (rules 4 and 6; the sums that count it go by
        :meth:`forget_ancestors`)."""
        self.unheld.pop(sid, None)
        if self.sums or self.inside or self.border:
            self.sums.pop(sid, None)
            self.inside.pop(sid, None)
            self.border.pop(sid, None)

    def victim(self, eng, v: int, now: int) -> int:
        """The engine slot of the victim: ``v``, the engine's, or a resident storage no
        wrapper holds whose ancestors-only score is lower (rules 2 and 4)."""
        cost, size = self.cost, self.size
        t = eng.table
        last = t.host_last_access.item
        u = self.sid_of[v]
        den = size[u] * (now - last(v))
        own_u = cost[u] if self.copied is None else self._cost(u)
        best = (own_u + t.host_nbhd_cost.item(v)) / den if den > 0 else _INF
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
                own = cost[sid] if self.copied is None else self._cost(sid)
                todo.append((own / d, slot, sid, d))
        todo.sort()  # rule 4: the lowest own scores first, so the best falls early
        visits, sums = _MAX_VISITS, self.sums
        for low, slot, sid, d in todo:
            if low > best or visits <= 0:  # rule 4: no other can beat the best, or no time
                break
            own = cost[sid] if self.copied is None else self._cost(sid)
            limit = best * d - own
            known = sums.get(sid)  # rule 6
            if known is not None and (known.kind is _CAPPED or known.cost > limit):
                continue
            if known is not None and known.kind is _EXACT:
                anc = known.cost
            else:
                anc, n = self.ancestors_cost(sid, limit, min(_MAX_WALK, visits))
                visits -= n
                if anc is None:
                    continue
            score = (own + anc) / d
            if score < best or (score == best and slot < pick):
                best, pick = score, slot
        self.unheld = keep
        return pick

    def ancestors_cost(self, sid: int, limit: float, most: int) -> tuple[float | None, int]:
        """The summed costs of the evicted storages ``sid``'s recomputation needs (each once)
        and how many were visited; the sum is None once it exceeds ``limit`` or the walk
        passes ``most`` storages (NOTE [ Unheld storages ] rule 4). What the walk learnt is
        kept in ``sums`` (rule 6)."""
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
            total += cost[i] if self.copied is None else self._cost(i)
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
        self.sums[sid] = AncestorSum(total, kind)
        inside = self.inside
        for i in seen:
            inside.setdefault(i, []).append(sid)
        if kind == _EXACT:
            edge = self.border
            for i in border:
                edge.setdefault(i, []).append(sid)
        return found, len(seen)

    def forget_ancestors(self, sid: int, evicted: bool) -> None:
        """Rule 6: ``sid`` left the evicted state (``evicted`` False: rematerialized, its cost
        changed, or forgotten) or entered it (True); drop or weaken the sums that depended
        on its state."""
        sums = self.sums
        if evicted:
            for u in self.border.pop(sid, ()):
                known = sums.get(u)
                if known is not None and known.kind is _EXACT:
                    known.kind = _BOUND
        else:
            for u in self.inside.pop(sid, ()):
                sums.pop(u, None)

    def check(self) -> None:
        """Raise AssertionError if a sum kept by NOTE [ Unheld storages ] rule 6 disagrees
        with a fresh walk: an exact sum must be the sum, a bound at most the sum, a capped
        storage must have more than ``_MAX_WALK`` evicted ancestors."""
        state, inputs, cost = self.state, self.inputs, self.cost
        for sid, known in self.sums.items():
            value, kind = known.cost, known.kind
            seen, todo, total = set(), [i for i in inputs[sid] if state[i] == EVICTED], 0.0
            while todo:
                i = todo.pop()
                if i not in seen:
                    seen.add(i)
                    total += cost[i] if self.copied is None else self._cost(i)
                    todo.extend(j for j in inputs[i] if state[j] == EVICTED)
            if kind == _EXACT:
                assert math.isclose(value, total, rel_tol=1e-12), (
                    f"storage {sid}: kept ancestors' cost {value} != {total}"
                )
            elif kind == _BOUND:
                assert value <= total * (1 + 1e-12), f"storage {sid}: bound {value} > {total}"
            else:
                assert len(seen) > _MAX_WALK, f"storage {sid}: capped with {len(seen)} ancestors"

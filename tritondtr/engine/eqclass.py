"""Equivalence classes of evicted storages: the union-find approximation of e* (paper §4.1).

:class:`EqClasses` keeps, over the graph of a :class:`~tritondtr.engine.neighborhood.Neighborhood`
(its containers shared, not copied), a union-find forest of evicted storages with exact class
values and, at every root, the class's frontier: the resident slots adjacent to its live
members, with edge counts. It also keeps the value of every resident slot (NOTE [ Incremental
class values ]); the neighbourhood's facade reports the events and writes the staged values.

# NOTE [ Eqclass rules ] (simrd's RuntimeV2Optimized + DTREqClass, made exact)
# 1. Evicting t gives t a fresh class {t} of value cost(t), then merges it with the class of
#    every evicted neighbour (parents and children), summing values.
# 2. The value of a resident t is the sum of the values of the DISTINCT classes of its
#    currently evicted neighbours; t's own cost is not included (the score adds it).
# 3. Rematerializing (or releasing) an evicted t subtracts cost(t) from its class and t
#    leaves it; its node stays in the tree, so the class is not split (links are not removed).
#    A rematerialized t gets a fresh class when it is evicted again.
# 4. Consequence (an invariant checked by ``check_invariants``): a class's value is exactly
#    the sum of the current costs of its live (evicted) members. Changing the cost of an
#    evicted member adds the difference to its class.
# 5. A new edge between two evicted slots merges nothing: classes merge only on eviction.
# 6. Unions are by node count; a class with no live member is dead and its nodes are reused.

# NOTE [ Incremental class values ]
# Rule 2 recomputed per slot costs O(deg) finds, and a change of a class's value reaches its whole
# frontier (docs/benchmarks.md, Measurements behind the NOTEs, Incremental class values). So the
# value of every resident r is kept, exactly, as value(r) = base[r] + sum of pend[c] over the
# classes c whose frontier holds r, integers in units of 2**-149 like the class values (NOTE [
# Neighbourhood staging ] rule 5).
# 1. A change that adds the same d to every frontier member of class c (rule 3's cost(t)
#    subtracted, rule 4's difference, a union's other value) adds d to val[c] and to pend[c]
#    and records c: O(1), whatever the frontier.
# 2. r entering c's frontier (its count 0 -> 1) gains val[c]: base[r] += val[c] - pend[c];
#    leaving it (1 -> 0) loses val[c]: base[r] += pend[c] - val[c]. r is marked dirty.
# 3. Union of classes x (whose frontier dict is kept, the larger) and y: members of x alone
#    gain val[y], so pend = pend[x] + val[y] (rule 1). Each member r of y's frontier is moved
#    into x's: in both, its value is unchanged: base[r] += pend[y] - val[y]; in y alone it
#    gains val[x]: base[r] += pend[y] + val[x] - pend, and is marked dirty. O(smaller frontier).
# 4. ``stage`` adds pend[c] to base[r] of every r in the frontier of each recorded class, marks
#    them dirty and zeroes pend[c]: base[r] is then the value. Nothing else is recomputed: a
#    rematerialized slot starts from base 0 and enters the frontiers of its neighbours' classes.
#    A recorded class whose pend[c] came back to 0 marks its frontier too: a union since the
#    last stage moved part of a shared member's value from base[r] into pend[c] (rule 3), so
#    pend[c] back at 0 is a change of that member's value (tests/engine/test_neighborhood.py, the
#    union whose pending change cancels).
# 5. Every step is integer arithmetic, so the values are those of rule 2 bit for bit, in any
#    order of events (``check_invariants`` compares every resident slot with rule 2).
"""

from __future__ import annotations

import math
from array import array

import numpy as np

from .residency import EVICTED, RESIDENT

__all__ = ["EqClasses"]

_SCALE = 149  # NOTE [ Neighbourhood staging ] rule 5: float32 values are multiples of 2**-149
_UNIT = 2.0**-_SCALE


_ldexp = math.ldexp


def _fixed(cost: float) -> int:
    return int(_ldexp(cost, _SCALE))


def _unfixed(value: int) -> float:
    return math.ldexp(float(value), -_SCALE) if value > 0 else 0.0


class EqClasses:
    """Union-find classes of evicted slots (NOTE [ Eqclass rules ]).

    Per slot: ``ecn[s]`` its live node, -1 when s is not evicted; ``base[s]`` for a resident
    s (NOTE [ Incremental class values ]). Per node (arrays indexed by node id): ``parent``
    (the forest), ``val`` (at roots: the exact class value in units of 2**-149), ``pend`` (at
    roots: the value change its frontier has not yet taken), ``slot``, ``members`` (at roots:
    every node of the class), ``front`` (at roots: resident slot -> number of edges to live
    members), ``live`` (at roots: number of live members). ``dirty``: the neighbourhood's set
    of resident slots whose table value is stale (shared). ``dirty_classes``: classes whose
    ``pend`` the next :meth:`stage` hands to their frontier.
    """

    def __init__(
        self,
        state: bytearray,
        cost: array,
        parents: list[list[int]],
        children: list[list[int]],
        dirty: set[int],
    ) -> None:
        self.state, self.cost = state, cost
        self.parents, self.children = parents, children
        self.dirty = dirty
        self.ecn: list[int] = []
        self.base: list[int] = []
        self.parent: list[int] = []
        self.val: list[int] = []
        self.pend: list[int] = []
        self.slot: list[int] = []
        self.members: list[list[int] | None] = []
        self.front: list[dict[int, int] | None] = []
        self.live: list[int] = []
        self.free: list[int] = []
        self.dirty_classes: list[int] = []

    def grow(self, n: int) -> None:
        """``n`` more slots."""
        self.ecn.extend([-1] * n)
        self.base.extend([0] * n)

    # ------------------------------------------------------------ union-find
    def find(self, x: int) -> int:
        parent = self.parent
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    def _enter(self, root: int, r: int) -> None:
        """One more edge between class ``root`` and the resident slot ``r`` (NOTE
        [ Incremental class values ] rule 2)."""
        front = self.front[root]
        c = front.get(r, 0)
        front[r] = c + 1
        if not c:
            self.base[r] += self.val[root] - self.pend[root]
            self.dirty.add(r)

    def _new_node(self, slot: int, v: int, root: int) -> int:
        """A node for the evicted ``slot`` of fixed cost ``v``: a class of its own if ``root``
        is -1, else a member of class ``root`` (whose value the caller updates)."""
        if self.free:
            n = self.free.pop()
        else:
            n = len(self.parent)
            for col in (self.parent, self.val, self.pend, self.slot, self.members, self.front):
                col.append(None)
            self.live.append(0)
        self.val[n], self.pend[n], self.slot[n] = v, 0, slot
        if root < 0:
            self.parent[n], self.members[n], self.front[n], self.live[n] = n, [n], {}, 1
        else:
            self.parent[n], self.members[n], self.front[n], self.live[n] = root, None, None, 0
            self.members[root].append(n)
            self.live[root] += 1
        self.ecn[slot] = n
        return n

    def _union(self, a: int, b: int) -> int:
        """Rule 1's merge with NOTE [ Incremental class values ] rule 3; returns the root."""
        a, b = self.find(a), self.find(b)
        if a == b:
            return a
        members, front, val, pend = self.members, self.front, self.val, self.pend
        if len(members[a]) < len(members[b]):
            a, b = b, a
        self.parent[b] = a
        self.live[a] += self.live[b]
        members[a].extend(members[b])
        fx, fy, vx, vy, px, py = front[a], front[b], val[a], val[b], pend[a], pend[b]
        if len(fx) < len(fy):  # x: the class whose frontier dict is kept (the larger)
            fx, fy, vx, vy, px, py = fy, fx, vy, vx, py, px
        p = px + vy
        both, alone = py - vy, py + vx - p
        base, dirty = self.base, self.dirty
        for r, c in fy.items():
            k = fx.get(r)
            if k is None:
                fx[r] = c
                base[r] += alone
                dirty.add(r)
            else:
                fx[r] = k + c
                base[r] += both
        val[a] = vx + vy
        pend[a] = p
        front[a] = fx
        members[b] = front[b] = None
        return a

    # ---------------------------------------------------------------- events
    def on_edge(self, slot: int, p: int) -> None:
        """A new edge ``p -> slot``: a resident end joins the frontier of the other end's
        class (rule 5: no merge)."""
        sp, ss = self.state[p], self.state[slot]
        if ss == RESIDENT and sp == EVICTED:
            self._enter(self.find(self.ecn[p]), slot)
        elif ss == EVICTED and sp == RESIDENT:
            self._enter(self.find(self.ecn[slot]), p)

    def evict(self, t: int) -> None:
        """Rule 1, keeping the frontier counters (``t`` is already marked evicted). The
        classes of t's evicted neighbours merge first, then t joins the merged class: the
        same class and values as a fresh class {t} merged with each, with no union for {t}.
        (``find`` and ``_enter`` are written out: a hot path.)"""
        st, ecn, front, parent = self.state, self.ecn, self.front, self.parent
        roots, res = [], []
        for adj in (self.parents[t], self.children[t]):
            for m in adj:
                s = st[m]
                if s == EVICTED:
                    root = ecn[m]
                    if parent[root] != root:
                        root = self.find(root)
                    f = front[root]  # t is no longer a resident neighbour
                    c = f[t] - 1
                    if c:
                        f[t] = c
                    else:
                        del f[t]
                    roots.append(root)
                elif s == RESIDENT:
                    res.append(m)
        base, dirty = self.base, self.dirty
        base[t] = 0  # a slot that is not resident keeps base 0
        v = int(_ldexp(self.cost[t], _SCALE))  # _fixed, written out
        if not roots:
            own = front[self._new_node(t, v, -1)]
            for m in res:  # a fresh class of pend 0 enters m's value
                c = own.get(m, 0)
                own[m] = c + 1
                if not c:
                    base[m] += v
                    dirty.add(m)
            return
        root = roots[0]
        for other in roots[1:]:
            if other != root:
                root = self._union(root, other)
        self._new_node(t, v, root)
        val = self.val[root] = self.val[root] + v  # rule 1 of NOTE [ Incremental class values ]
        pend = self.pend[root] = self.pend[root] + v
        if res:
            f, gain = front[root], val - pend
            for m in res:  # _enter(root, m)
                c = f.get(m, 0)
                f[m] = c + 1
                if not c:
                    base[m] += gain
                    dirty.add(m)
        if pend:
            self.dirty_classes.append(root)

    def leave(self, t: int) -> None:
        """Rule 3: evicted ``t`` leaves its class; the class's frontier loses cost(t), and its
        resident neighbours that have no other edge to the class lose the class."""
        st, n, base, dirty = self.state, self.ecn[t], self.base, self.dirty
        root = self.find(n)
        self.ecn[t] = -1
        ft = int(_ldexp(self.cost[t], _SCALE))  # _fixed, written out: a hot path
        v = self.val[root] = self.val[root] - ft
        p = self.pend[root] = self.pend[root] - ft
        gone = p - v  # NOTE [ Incremental class values ] rule 2, leaving
        live = self.live[root] = self.live[root] - 1
        front = self.front[root]
        for adj in (self.parents[t], self.children[t]):
            for m in adj:
                if st[m] == RESIDENT:
                    c = front[m] - 1
                    if c:
                        front[m] = c
                    else:
                        del front[m]
                        base[m] += gone
                        dirty.add(m)
        if live == 0:  # dead class: reuse its nodes (rule 6)
            if front or v:
                raise AssertionError(f"bug of tritondtr: dead class {root} still has a frontier")
            for node in self.members[root]:
                self.members[node] = self.front[node] = None
                self.free.append(node)
        elif p:
            self.dirty_classes.append(root)

    def join_front(self, slot: int) -> None:
        """The rematerialized ``slot`` joins the frontiers of its evicted neighbours'
        classes; its value starts from base 0 (rule 4 of NOTE [ Incremental class values ])."""
        st, find, ecn, enter = self.state, self.find, self.ecn, self._enter
        for adj in (self.parents[slot], self.children[slot]):
            for m in adj:
                if st[m] == EVICTED:
                    enter(find(ecn[m]), slot)

    def leave_front(self, slot: int) -> None:
        """The resident ``slot`` is released: it leaves the frontiers of its evicted
        neighbours' classes (nobody's value changes)."""
        st, find, ecn, front = self.state, self.find, self.ecn, self.front
        for adj in (self.parents[slot], self.children[slot]):
            for m in adj:
                if st[m] == EVICTED:
                    f = front[find(ecn[m])]
                    c = f[slot] - 1
                    if c:
                        f[slot] = c
                    else:
                        del f[slot]
        self.base[slot] = 0

    def on_cost(self, slot: int, old: float) -> None:
        """Rule 4: the cost of the evicted ``slot`` changed from ``old``."""
        root = self.find(self.ecn[slot])
        d = _fixed(self.cost[slot]) - _fixed(old)
        self.val[root] += d
        self.pend[root] += d
        self.dirty_classes.append(root)

    def stage(self) -> None:
        """Hand every recorded class's pending change to its frontier, marking it dirty
        (NOTE [ Incremental class values ] rule 4)."""
        find, front, pend, base, dirty = self.find, self.front, self.pend, self.base, self.dirty
        for root in {find(c) for c in self.dirty_classes}:
            f = front[root]
            if not f:  # None for a dead class
                pend[root] = 0
                continue
            p = pend[root]
            if p:
                pend[root] = 0
                for r in f:
                    base[r] += p
            dirty.update(f)  # even at p == 0: a union in between moved values (rule 4)
        self.dirty_classes.clear()

    # ---------------------------------------------------------------- values
    def staged(self, slots: list[int]) -> list[float] | np.ndarray:
        """Float64 values of resident ``slots`` after :meth:`stage`, exact up to the final
        rounding: numpy's int -> float64 is correctly rounded like ``float`` and the scaling is
        exact, ~1.7x faster than ``ldexp`` per slot from ~20 slots on."""
        base = self.base
        if len(slots) > 16:
            return np.fromiter(map(base.__getitem__, slots), np.float64, len(slots)) * _UNIT
        ldexp = math.ldexp
        return [ldexp(base[r], -_SCALE) for r in slots]

    def value(self, r: int) -> float:
        """Rule 2 for the resident ``r`` now, staged or not."""
        total = self.base[r]
        if self.dirty_classes:  # some class may have a pending change
            pend = self.pend
            total += sum(pend[c] for c in self._classes_of(r))
        return _unfixed(total)

    def rule2(self, r: int) -> float:
        """Rule 2 for the resident ``r``, from the class values alone (the reference)."""
        return _unfixed(self._rule2(r))

    def _rule2(self, r: int) -> int:
        val = self.val
        return sum(val[c] for c in self._classes_of(r))

    def _classes_of(self, r: int) -> set[int]:
        """The distinct classes of ``r``'s evicted neighbours."""
        st, ecn, find = self.state, self.ecn, self.find
        return {
            find(ecn[m])
            for adj in (self.parents[r], self.children[r])
            for m in adj
            if st[m] == EVICTED
        }

    # ------------------------------------------------------------- debugging
    def check_invariants(self) -> None:
        """Class nodes match the evicted slots; values are live cost sums (rule 4);
        frontier counters are exact; kept values are rule 2's (NOTE [ Incremental class
        values ])."""
        st, ecn = self.state, self.ecn
        live: dict[int, list[int]] = {}
        for s in range(len(st)):
            assert (ecn[s] >= 0) == (st[s] == EVICTED), f"slot {s}: class node vs state"
            if ecn[s] >= 0:
                assert self.slot[ecn[s]] == s, f"slot {s}: node points elsewhere"
                live.setdefault(self.find(ecn[s]), []).append(s)
        for root, slots in live.items():
            assert self.live[root] == len(slots), f"class {root}: live count"
            want = sum(_fixed(self.cost[s]) for s in slots)
            assert self.val[root] == want, f"class {root}: value is not the live cost sum"
            front: dict[int, int] = {}
            for s in slots:
                for m in (*self.parents[s], *self.children[s]):
                    if st[m] == RESIDENT:
                        front[m] = front.get(m, 0) + 1
            assert self.front[root] == front, f"class {root}: frontier counters"
            if self.pend[root]:
                assert root in {self.find(c) for c in self.dirty_classes}, (
                    f"class {root}: a pending change that no stage will hand on"
                )
        pending = {r: 0 for r in range(len(st))}
        for root in live:
            for r in self.front[root]:
                pending[r] += self.pend[root]
        for s in range(len(st)):
            if st[s] != RESIDENT:
                assert self.base[s] == 0, f"slot {s}: not resident, base {self.base[s]}"
            else:
                got = self.base[s] + pending[s]
                assert got == self._rule2(s), f"slot {s}: kept value is not rule 2's"

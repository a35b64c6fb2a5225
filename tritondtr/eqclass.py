"""Equivalence classes of evicted storages: the union-find approximation of e* (paper §4.1).

:class:`EqClasses` keeps, over the graph of a :class:`~tritondtr.neighborhood.Neighborhood`
(its containers shared, not copied), a union-find forest of evicted storages with exact class
values and, at every root, the class's frontier: the resident slots adjacent to its live
members, with edge counts. The neighbourhood's facade reports the events and reads values.

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
"""

from __future__ import annotations

import math
from array import array

from .residency import EVICTED, RESIDENT

__all__ = ["EqClasses"]

_SCALE = 149  # NOTE [ Neighbourhood staging ] rule 5: float32 values are multiples of 2**-149


def _fixed(cost: float) -> int:
    return int(math.ldexp(cost, _SCALE))


def _unfixed(value: int) -> float:
    return math.ldexp(float(value), -_SCALE) if value > 0 else 0.0


class EqClasses:
    """Union-find classes of evicted slots (NOTE [ Eqclass rules ]).

    Per slot: ``ecn[s]`` its live node, -1 when s is not evicted. Per node (arrays indexed
    by node id): ``parent`` (the forest), ``val`` (at roots: the exact class value in units
    of 2**-149), ``slot``, ``members`` (at roots: every node of the class), ``front`` (at
    roots: resident slot -> number of edges to live members), ``live`` (at roots: number of
    live members). ``dirty_classes``: classes whose frontier the next stage marks dirty.
    """

    def __init__(
        self, state: bytearray, cost: array, parents: list[list[int]], children: list[list[int]]
    ) -> None:
        self.state, self.cost = state, cost
        self.parents, self.children = parents, children
        self.ecn: list[int] = []
        self.parent: list[int] = []
        self.val: list[int] = []
        self.slot: list[int] = []
        self.members: list[list[int] | None] = []
        self.front: list[dict[int, int] | None] = []
        self.live: list[int] = []
        self.free: list[int] = []
        self.dirty_classes: list[int] = []

    def grow(self, n: int) -> None:
        """``n`` more slots."""
        self.ecn.extend([-1] * n)

    # ------------------------------------------------------------ union-find
    def find(self, x: int) -> int:
        parent = self.parent
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    def front_add(self, root: int, r: int, d: int) -> None:
        """Add ``d`` edges between class ``root`` and the resident slot ``r``."""
        front = self.front[root]
        c = front.get(r, 0) + d
        if c:
            front[r] = c
        else:
            del front[r]

    def _new_node(self, slot: int) -> int:
        if self.free:
            n = self.free.pop()
            self.parent[n] = n
            self.val[n] = _fixed(self.cost[slot])
            self.slot[n] = slot
            self.members[n] = [n]
            self.front[n] = {}
            self.live[n] = 1
        else:
            n = len(self.parent)
            self.parent.append(n)
            self.val.append(_fixed(self.cost[slot]))
            self.slot.append(slot)
            self.members.append([n])
            self.front.append({})
            self.live.append(1)
        self.ecn[slot] = n
        return n

    def _union(self, a: int, b: int) -> int:
        a, b = self.find(a), self.find(b)
        if a == b:
            return a
        members, front = self.members, self.front
        if len(members[a]) < len(members[b]):
            a, b = b, a
        self.parent[b] = a
        self.val[a] += self.val[b]
        self.live[a] += self.live[b]
        members[a].extend(members[b])
        fa, fb = front[a], front[b]
        if len(fa) < len(fb):
            fa, fb = fb, fa
        for r, c in fb.items():
            fa[r] = fa.get(r, 0) + c
        front[a] = fa
        members[b] = front[b] = None
        return a

    # ---------------------------------------------------------------- events
    def on_edge(self, slot: int, p: int, dirty: set[int]) -> None:
        """A new edge ``p -> slot``: a resident end joins the frontier of the other end's
        class (rule 5: no merge)."""
        sp, ss = self.state[p], self.state[slot]
        if ss == RESIDENT and sp == EVICTED:
            self.front_add(self.find(self.ecn[p]), slot, 1)
            dirty.add(slot)
        elif ss == EVICTED and sp == RESIDENT:
            self.front_add(self.find(self.ecn[slot]), p, 1)
            dirty.add(p)

    def evict(self, t: int) -> None:
        """Rule 1, keeping the frontier counters (``t`` is already marked evicted)."""
        st, find, ecn = self.state, self.find, self.ecn
        n = self._new_node(t)
        own = self.front[n]
        roots = []
        for adj in (self.parents[t], self.children[t]):
            for m in adj:
                s = st[m]
                if s == EVICTED:
                    root = find(ecn[m])
                    self.front_add(root, t, -1)  # t is no longer a resident neighbour
                    roots.append(root)
                elif s == RESIDENT:
                    own[m] = own.get(m, 0) + 1
        root = n
        for other in roots:
            root = self._union(root, other)
        self.dirty_classes.append(root)

    def leave(self, t: int, dirty: set[int]) -> None:
        """Rule 3: evicted ``t`` leaves its class; its resident neighbours become dirty."""
        st, n = self.state, self.ecn[t]
        root = self.find(n)
        self.ecn[t] = -1
        self.val[root] -= _fixed(self.cost[t])
        self.live[root] -= 1
        front = self.front[root]
        for adj in (self.parents[t], self.children[t]):
            for m in adj:
                if st[m] == RESIDENT:
                    c = front[m] - 1
                    if c:
                        front[m] = c
                    else:
                        del front[m]
                    dirty.add(m)
        if self.live[root] == 0:  # dead class: reuse its nodes (rule 6)
            if front or self.val[root]:
                raise AssertionError(f"bug of tritondtr: dead class {root} still has a frontier")
            for node in self.members[root]:
                self.members[node] = self.front[node] = None
                self.free.append(node)
        else:
            self.dirty_classes.append(root)

    def join_front(self, slot: int, d: int) -> None:
        """The resident ``slot`` gains (``d = 1``, rematerialized) or loses (``d = -1``,
        released) its edges to the classes of its evicted neighbours."""
        st, find, ecn = self.state, self.find, self.ecn
        for adj in (self.parents[slot], self.children[slot]):
            for m in adj:
                if st[m] == EVICTED:
                    self.front_add(find(ecn[m]), slot, d)

    def on_cost(self, slot: int, old: float) -> None:
        """Rule 4: the cost of the evicted ``slot`` changed from ``old``."""
        root = self.find(self.ecn[slot])
        self.val[root] += _fixed(self.cost[slot]) - _fixed(old)
        self.dirty_classes.append(root)

    def stage(self, dirty: set[int]) -> None:
        """Mark dirty the frontier of every recorded class (NOTE [ Neighbourhood staging ])."""
        find, front = self.find, self.front
        for root in {find(c) for c in self.dirty_classes}:
            if front[root]:  # None for a dead class
                dirty.update(front[root])
        self.dirty_classes.clear()

    # ---------------------------------------------------------------- values
    def value(self, r: int) -> float:
        """Rule 2 for the resident ``r``: float64, exact up to the final rounding."""
        st, ecn, parent, val = self.state, self.ecn, self.parent, self.val
        first, seen, total = -1, None, 0
        for adj in (self.parents[r], self.children[r]):
            for m in adj:
                if st[m] != EVICTED:
                    continue
                c = ecn[m]
                if parent[c] != c:
                    c = self.find(c)
                if first < 0:
                    first, total = c, val[c]
                elif c != first:
                    if seen is None:
                        seen = {first}
                    if c not in seen:  # distinct classes only (rule 2)
                        seen.add(c)
                        total += val[c]
        return _unfixed(total)

    # ------------------------------------------------------------- debugging
    def check_invariants(self) -> None:
        """Class nodes match the evicted slots; values are live cost sums (rule 4);
        frontier counters are exact."""
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
                for m in self.parents[s] + self.children[s]:
                    if st[m] == RESIDENT:
                        front[m] = front.get(m, 0) + 1
            assert self.front[root] == front, f"class {root}: frontier counters"

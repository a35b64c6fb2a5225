"""Evicted-neighbourhood maintenance: keeps the table's ``nbhd_cost`` column current.

The graph is over storages (slot ids): ``parents[t]`` are the storages of the inputs of the
op(s) that produced t, ``children`` the reverse. In the modes of :class:`NbhdMode`:

* ``exact``: e*(t) = evicted storages reachable from t through evicted parents, union those
  reachable through evicted children (directions are not mixed within one path);
  ``nbhd_cost(t)`` is the cost of e*(t).
* ``ancestors``: only the evicted-ancestor part.
* ``eqclass``: the union-find approximation (paper §4.1), see NOTE [ Eqclass rules ].

# NOTE [ Neighbourhood staging ]
# 1. Events only record where something changed; nothing is recomputed then. exact/ancestors:
#    the slot is a "start" (evict, remat, cost change, both ends of a new edge). eqclass: the
#    changed class is recorded, and the resident neighbours that lose a class are marked dirty.
# 2. ``flush()`` first turns the records into dirty resident slots: exact: one multi-source
#    search down (children) and one up (parents) from all starts through evicted slots, with
#    one shared ``seen`` set, marking the resident slots met (and resident starts); ancestors:
#    the search down only; eqclass: the frontier of every recorded class (the resident slots
#    adjacent to its live members, kept as counters). It then recomputes each dirty slot once
#    and writes the table column. The engine flushes before every selection.
# 3. Deferring is exact: if a resident r's value changed, some path from r (through slots
#    evicted now, or evicted at the last flush) reaches a touched slot; the touched slot
#    closest to r is a start whose prefix towards r was evicted all along, so the search
#    from it meets r. Releasing a slot drops edges, so a release marks eagerly, before.
# 4. Only resident slots hold a meaningful ``nbhd_cost``: an evicted slot keeps its last
#    resident value (it is never a candidate), a rematerialized slot is marked dirty, and a
#    freed slot is zeroed by the table.
# 5. Values are exact functions of the evicted set: exact/ancestors sum with ``math.fsum``
#    (the correctly rounded float64 of the exact sum of the float32 costs), eqclass keeps class
#    values as exact integers in units of 2**-149 (every float32 is an integer multiple of it).
#    The float64 is then rounded to float32 by the table. Hence a value never depends on the
#    order of events or of summation, tests can compare exactly, and evicting a storage never
#    lowers any resident slot's value (NOTE [ Exact batched choice ] in engine.py relies on it).
# 6. No recursion anywhere: searches use explicit stacks, ``find`` compresses iteratively.

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
from collections.abc import Sequence

import numpy as np

from .heuristics import NbhdMode
from .table import MetadataTable

__all__ = ["EVICTED", "FREE", "RESIDENT", "Neighborhood"]

FREE, RESIDENT, EVICTED = 0, 1, 2
_STATE_NAMES = ("free", "resident", "evicted")
_SCALE = 149  # NOTE [ Neighbourhood staging ] rule 4: float32 values are multiples of 2**-149


# NOTE [ Batched regions ]
# 1. A flush with at least _BATCH_MIN dirty slots (exact/ancestors) computes them together.
#    Every evicted slot e has a closure mask per direction (a Python int over slot ids):
#    its own bit OR the masks of its evicted successors (parents for "up", children for
#    "down"). A resident's region is the OR of its evicted neighbours' masks over both
#    directions: a union, as e* is.
# 2. Masks are cached across flushes. The staging searches (NOTE [ Neighbourhood staging ])
#    visit exactly the evicted slots whose closure may have changed: the search down from the
#    touched slots drops their "up" masks, the search up their "down" masks, and the touched
#    slots lose both. A flush computes only the missing masks, by one iterative DFS
#    post-order that stops at cached slots.
# 3. The value is the correctly rounded exact sum of the costs selected by the mask, as in
#    the per-slot search (``math.fsum``), so both paths give identical values. Distinct masks
#    are summed at once as one int64 product: a float32 cost is a 24-bit integer times 2**e,
#    so scaled by the smallest e of the flush it is an exact int64 when the exponent range
#    plus 24 bits plus log2(#slots) fits in 62 bits; otherwise each mask uses ``math.fsum``.
# 4. The per-slot search costs the sum of the region sizes; the batch costs the invalidated
#    part of their union plus word-parallel ORs. It wins when regions overlap (recurrent
#    chains: on the lstm trace 51M node visits per run became a few per eviction).
# 5. A mask costs up to capacity/8 bytes and building it up to capacity/64 word operations
#    per edge, so the masks are bounded by _MAX_CACHE_BITS / capacity: the cache is dropped
#    when half full, and a flush that would need more new masks than fit (a long evicted
#    chain) uses the per-slot search, as do tables beyond _MAX_BATCH_CAPACITY slots and a
#    flush that meets a cycle (a successor that is still open in the DFS).
_BATCH_MIN = 4
_MAX_BATCH_CAPACITY = 1 << 20
_MAX_CACHE_BITS = 1 << 31  # 256 MiB of masks


def _post_order(
    roots: list[int], adj: list[list[int]], st: bytearray, done: dict[int, int], limit: int
) -> list[int] | None:
    """Evicted slots reachable from ``roots``' evicted neighbours along ``adj`` through
    evicted slots not in ``done``, in DFS post-order (a slot after its successors);
    ``None`` as soon as more than ``limit`` are found."""
    seen: set[int] = set()
    post: list[int] = []
    for r in roots:
        for p in adj[r]:
            if st[p] != EVICTED or p in seen or p in done:
                continue
            seen.add(p)
            if len(seen) > limit:
                return None
            stack = [(p, iter(adj[p]))]
            while stack:
                u, it = stack[-1]
                for v in it:
                    if st[v] == EVICTED and v not in seen and v not in done:
                        seen.add(v)
                        if len(seen) > limit:
                            return None
                        stack.append((v, iter(adj[v])))
                        break
                else:
                    stack.pop()
                    post.append(u)
    return post


def _unpack(raw: bytes) -> np.ndarray:
    """Little-endian bytes of a Python int -> its bits as uint8, bit i at index i."""
    return np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")


def _fixed(cost: float) -> int:
    return int(math.ldexp(cost, _SCALE))


def _unfixed(value: int) -> float:
    return math.ldexp(float(value), -_SCALE) if value > 0 else 0.0


class Neighborhood:
    """Keeps ``table.host_nbhd_cost`` current for resident slots in one :class:`NbhdMode`.

    The graph and the residency of every slot live here, on the host, as plain Python lists:
    ``state`` (bytearray, FREE 0 / RESIDENT 1 / EVICTED 2), ``cost`` (``array('f')``: the
    float32 costs, as in the table), ``parents`` / ``children`` (list of slot lists, without
    duplicates or self edges; empty in mode ``none``, which keeps no graph). The caller
    (:class:`tritondtr.engine.Engine`) reports every event with the ``on_*`` methods and calls
    :meth:`flush` before reading the column; see NOTE [ Neighbourhood staging ].
    """

    def __init__(self, table: MetadataTable, mode: NbhdMode | str) -> None:
        self.table = table
        self.mode = NbhdMode(mode)
        self.tracking = self.mode is not NbhdMode.NONE
        self._eq = self.mode is NbhdMode.EQCLASS
        self.state = bytearray()
        self.cost = array("f")
        self.parents: list[list[int]] = []
        self.children: list[list[int]] = []
        self.dirty: set[int] = set()  # resident slots to recompute at the next flush
        self._starts: set[int] = set()  # exact/ancestors: where searches start at flush
        self._clo_up: dict[int, int] = {}  # NOTE [ Batched regions ]: evicted slot -> mask
        self._clo_down: dict[int, int] = {}
        self._dirty_classes: list[int] = []  # eqclass: classes whose frontier gets marked
        self.recomputed = 0  # counter: nbhd values computed by flush
        # eqclass union-find over nodes (NOTE [ Eqclass rules ]); arrays indexed by node id.
        self._ecn: list[int] = []  # slot -> its live node, -1 when not evicted
        self._uf_parent: list[int] = []
        self._uf_val: list[int] = []  # at roots: exact class value, units of 2**-149
        self._uf_slot: list[int] = []
        self._uf_members: list[list[int] | None] = []  # at roots: every node of the class
        self._uf_front: list[dict[int, int] | None] = []  # at roots: resident slot -> #edges
        self._uf_live: list[int] = []  # at roots: number of live (evicted) members
        self._uf_free: list[int] = []
        if self.tracking:
            self._value = {
                NbhdMode.EXACT: self._value_exact,
                NbhdMode.ANCESTORS: self._value_ancestors,
                NbhdMode.EQCLASS: self._value_eq,
            }[self.mode]
        self.grow(table.capacity)

    def grow(self, capacity: int) -> None:
        """Extend the per-slot lists to ``capacity`` slots (the table grew)."""
        n = capacity - len(self.state)
        if n <= 0:
            return
        self.state.extend(bytes(n))
        if self.tracking:
            self.cost.extend(array("f", bytes(4 * n)))
            self.parents.extend([] for _ in range(n))
            self.children.extend([] for _ in range(n))
            self._ecn.extend([-1] * n)

    # ------------------------------------------------------------------- events
    def on_new(self, slot: int, cost: float, parents: Sequence[int] = ()) -> None:
        """``slot`` is a new resident storage produced from ``parents`` (live slots)."""
        if slot >= len(self.state):
            self.grow(self.table.capacity)
        self.state[slot] = RESIDENT
        if not self.tracking:
            return
        self.cost[slot] = cost
        if parents:
            self.add_edges(slot, parents)

    def add_edges(self, slot: int, parents: Sequence[int]) -> None:
        """Add the edges parent -> ``slot`` (duplicates and self edges are ignored)."""
        if not self.tracking:
            return
        st, ps, ch = self.state, self.parents[slot], self.children
        for p in parents:
            p = int(p)
            if p == slot or p in ps:
                continue
            ps.append(p)
            ch[p].append(slot)
            sp, ss = st[p], st[slot]
            if self._eq:  # NOTE [ Eqclass rules ] rule 5: no merge
                if ss == RESIDENT and sp == EVICTED:
                    self._front_add(self._find(self._ecn[p]), slot, 1)
                    self.dirty.add(slot)
                elif ss == EVICTED and sp == RESIDENT:
                    self._front_add(self._find(self._ecn[slot]), p, 1)
                    self.dirty.add(p)
            elif sp == EVICTED or ss == EVICTED:
                self._starts.add(slot)
                self._starts.add(p)

    def on_evict(self, slot: int) -> None:
        """A resident ``slot`` was evicted."""
        self.state[slot] = EVICTED
        if not self.tracking:
            return
        self.dirty.discard(slot)
        if self._eq:
            self._eq_evict(slot)
        else:
            self._starts.add(slot)

    def on_remat(self, slot: int) -> None:
        """An evicted ``slot`` was rematerialized (is resident again)."""
        if not self.tracking:
            self.state[slot] = RESIDENT
            return
        if self._eq:
            self._eq_leave(slot)
            self.state[slot] = RESIDENT
            st, find, ecn = self.state, self._find, self._ecn
            for adj in (self.parents[slot], self.children[slot]):
                for m in adj:
                    if st[m] == EVICTED:
                        self._front_add(find(ecn[m]), slot, 1)
        else:
            self.state[slot] = RESIDENT
            self._starts.add(slot)
        self.dirty.add(slot)

    def on_release(self, slot: int) -> None:
        """``slot`` is forgotten for good: its edges are dropped, it becomes FREE."""
        if self.tracking:
            st = self.state
            if self._eq and st[slot] == EVICTED:
                self._eq_leave(slot)
            elif not self._eq and (st[slot] == EVICTED or slot in self._starts):
                # NOTE [ Neighbourhood staging ] rule 3: mark now, the edges are about to go.
                self._starts.discard(slot)
                self._mark_from([slot], self.children)
                self._mark_from([slot], self.parents)
            elif self._eq:
                find, ecn = self._find, self._ecn
                for adj in (self.parents[slot], self.children[slot]):
                    for m in adj:
                        if st[m] == EVICTED:
                            self._front_add(find(ecn[m]), slot, -1)
            for p in self.parents[slot]:
                self.children[p].remove(slot)
            for c in self.children[slot]:
                self.parents[c].remove(slot)
            self.parents[slot] = []
            self.children[slot] = []
            self.cost[slot] = 0.0
            self.dirty.discard(slot)
        self.state[slot] = FREE

    def on_cost(self, slot: int, cost: float) -> None:
        """The compute cost of ``slot`` changed to ``cost``."""
        if not self.tracking:
            return
        old = self.cost[slot]
        self.cost[slot] = cost
        if self.state[slot] != EVICTED or self.cost[slot] == old:
            return
        if self._eq:  # NOTE [ Eqclass rules ] rule 4
            root = self._find(self._ecn[slot])
            self._uf_val[root] += _fixed(self.cost[slot]) - _fixed(old)
            self._dirty_classes.append(root)
        else:
            self._starts.add(slot)

    # ------------------------------------------------------------------ queries
    def stage(self) -> None:
        """Turn the recorded events into dirty slots (NOTE [ Neighbourhood staging ] rule 2)."""
        if self._starts:
            starts = self._starts
            st, dirty = self.state, self.dirty
            dirty.update(s for s in starts if st[s] == RESIDENT)
            self._mark_from(starts, self.children)
            if self.mode is NbhdMode.EXACT:
                self._mark_from(starts, self.parents)
            starts.clear()
        if self._dirty_classes:
            find, front, dirty = self._find, self._uf_front, self.dirty
            for root in {find(c) for c in self._dirty_classes}:
                if front[root]:  # None for a dead class
                    dirty.update(front[root])
            self._dirty_classes.clear()

    def flush(self) -> int:
        """Recompute every dirty resident slot and write the table column; returns how many."""
        self.stage()
        dirty = self.dirty
        if not dirty:
            return 0
        slots = list(dirty)
        dirty.clear()
        vals = None
        if not self._eq and len(slots) >= _BATCH_MIN:
            vals = self._batch_values(slots)
        if vals is None:
            value = self._value
            vals = [value(r) for r in slots]
        self.recomputed += len(slots)
        if len(slots) <= 32:
            set_nbhd = self.table.set_nbhd_cost
            for r, v in zip(slots, vals):
                set_nbhd(r, v)
        else:
            self.table.update_many(np.asarray(slots, np.int64), nbhd_cost=np.asarray(vals))
        return len(slots)

    def value(self, slot: int) -> float:
        """The current float64 neighbourhood cost of a resident ``slot``, computed now."""
        return self._value(slot) if self.tracking else 0.0

    def _region(self, r: int, adj: list[list[int]]) -> set[int]:
        """Evicted slots reachable from ``r`` along ``adj`` through evicted slots only."""
        st, seen, stack = self.state, set(), [r]
        while stack:
            for v in adj[stack.pop()]:
                if st[v] == EVICTED and v not in seen:
                    seen.add(v)
                    stack.append(v)
        return seen

    def _value_ancestors(self, r: int) -> float:
        up = self._region(r, self.parents)
        cost = self.cost
        return math.fsum([cost[u] for u in up]) if up else 0.0

    def _value_exact(self, r: int) -> float:
        region = self._region(r, self.parents)
        region |= self._region(r, self.children)  # disjoint in a DAG; a union in any case
        cost = self.cost
        return math.fsum([cost[u] for u in region]) if region else 0.0

    def _value_eq(self, r: int) -> float:
        st, ecn, parent, val = self.state, self._ecn, self._uf_parent, self._uf_val
        first, seen, total = -1, None, 0
        for adj in (self.parents[r], self.children[r]):
            for m in adj:
                if st[m] != EVICTED:
                    continue
                c = ecn[m]
                if parent[c] != c:
                    c = self._find(c)
                if first < 0:
                    first, total = c, val[c]
                elif c != first:
                    if seen is None:
                        seen = {first}
                    if c not in seen:  # distinct classes only (NOTE [ Eqclass rules ] rule 2)
                        seen.add(c)
                        total += val[c]
        return _unfixed(total)

    def _batch_values(self, slots: list[int]) -> list[float] | None:
        """Values of many resident slots from cached closure masks (NOTE [ Batched
        regions ]); ``None`` where the per-slot search must serve (big table, cycle)."""
        st = self.state
        if len(st) > _MAX_BATCH_CAPACITY:
            return None
        max_masks = _MAX_CACHE_BITS // len(st)
        if len(self._clo_up) + len(self._clo_down) > max_masks // 2:
            self._clo_up.clear()
            self._clo_down.clear()
        dirs = [(self.parents, self._clo_up)]
        if self.mode is NbhdMode.EXACT:
            dirs.append((self.children, self._clo_down))
        masks = [0] * len(slots)
        for adj, clo in dirs:
            limit = max_masks - len(self._clo_up) - len(self._clo_down)
            post = _post_order(slots, adj, st, clo, limit)
            if post is None:  # too many new masks: per-slot search (rule 5)
                return None
            for u in post:
                m = 1 << u
                for v in adj[u]:
                    if st[v] == EVICTED:
                        c = clo.get(v)
                        if c is None:  # v is still open: a cycle
                            return None
                        m |= c
                clo[u] = m
            for i, r in enumerate(slots):
                m = masks[i]
                for p in adj[r]:
                    if st[p] == EVICTED:
                        m |= clo[p]
                masks[i] = m
        return self._mask_sums(masks)

    def _mask_sums(self, masks: list[int]) -> list[float]:
        """The correctly rounded exact cost sum over each mask's slots (NOTE [ Batched
        regions ] rule 3): distinct masks only, one int64 product when exact, else fsum."""
        distinct = list(dict.fromkeys(m for m in masks if m))
        if not distinct:
            return [0.0] * len(masks)
        union = 0
        for m in distinct:
            union |= m
        nbytes = (union.bit_length() + 7) // 8
        cols = np.flatnonzero(_unpack(union.to_bytes(nbytes, "little")))
        # a temporary view of array('f'): the fancy index copies, so it may grow again
        cost = np.frombuffer(self.cost, np.float32)[cols].astype(np.float64)
        mant, expo = np.frexp(cost)
        nz = cost > 0
        sums: dict[int, float] = {}
        if nz.any():
            e = expo - 24
            e_min = int(e[nz].min())
            shift = np.where(nz, e - e_min, 0)
            if int(shift.max()) + 24 + len(cols).bit_length() <= 62:
                fixed = np.where(nz, (mant * (1 << 24)).astype(np.int64) << shift, 0)
                rows = max(1, (1 << 21) // (8 * nbytes))  # <= 16 MiB of int64 per chunk
                for lo in range(0, len(distinct), rows):
                    chunk = distinct[lo:lo + rows]
                    raw = b"".join(m.to_bytes(nbytes, "little") for m in chunk)
                    bits = _unpack(raw).reshape(len(chunk), 8 * nbytes)[:, cols]
                    for m, n in zip(chunk, (bits.astype(np.int64) @ fixed).tolist()):
                        sums[m] = math.ldexp(float(n), e_min)
        if len(sums) < len(distinct):  # zero costs only, or too wide a range for int64
            pos = {int(c): i for i, c in enumerate(cols.tolist())}
            for m in distinct:
                if m not in sums:
                    idx = np.flatnonzero(_unpack(m.to_bytes(nbytes, "little")))
                    sums[m] = math.fsum(cost[[pos[i] for i in idx.tolist()]].tolist())
        return [sums[m] if m else 0.0 for m in masks]

    def _mark_from(self, starts, adj: list[list[int]]) -> None:
        """Mark dirty the resident slots met searching from every start along ``adj``
        through evicted slots; one shared ``seen`` set (NOTE [ Neighbourhood staging ]).
        The evicted slots met, and the starts, lose their cached masks (NOTE [ Batched
        regions ] rule 2): searching down invalidates "up" closures and vice versa."""
        st, dirty, seen, stack = self.state, self.dirty, set(starts), list(starts)
        clo = self._clo_up if adj is self.children else self._clo_down
        pop = clo.pop
        for s in starts:
            pop(s, None)
        while stack:
            for v in adj[stack.pop()]:
                if v in seen:
                    continue
                seen.add(v)
                s = st[v]
                if s == EVICTED:
                    pop(v, None)
                    stack.append(v)
                elif s == RESIDENT:
                    dirty.add(v)

    # ------------------------------------------------------------ eqclass (union-find)
    def _find(self, x: int) -> int:
        parent = self._uf_parent
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    def _front_add(self, root: int, r: int, d: int) -> None:
        front = self._uf_front[root]
        c = front.get(r, 0) + d
        if c:
            front[r] = c
        else:
            del front[r]

    def _new_node(self, slot: int) -> int:
        if self._uf_free:
            n = self._uf_free.pop()
            self._uf_parent[n] = n
            self._uf_val[n] = _fixed(self.cost[slot])
            self._uf_slot[n] = slot
            self._uf_members[n] = [n]
            self._uf_front[n] = {}
            self._uf_live[n] = 1
        else:
            n = len(self._uf_parent)
            self._uf_parent.append(n)
            self._uf_val.append(_fixed(self.cost[slot]))
            self._uf_slot.append(slot)
            self._uf_members.append([n])
            self._uf_front.append({})
            self._uf_live.append(1)
        self._ecn[slot] = n
        return n

    def _union(self, a: int, b: int) -> int:
        a, b = self._find(a), self._find(b)
        if a == b:
            return a
        members, front = self._uf_members, self._uf_front
        if len(members[a]) < len(members[b]):
            a, b = b, a
        self._uf_parent[b] = a
        self._uf_val[a] += self._uf_val[b]
        self._uf_live[a] += self._uf_live[b]
        members[a].extend(members[b])
        fa, fb = front[a], front[b]
        if len(fa) < len(fb):
            fa, fb = fb, fa
        for r, c in fb.items():
            fa[r] = fa.get(r, 0) + c
        front[a] = fa
        members[b] = front[b] = None
        return a

    def _eq_evict(self, t: int) -> None:
        """NOTE [ Eqclass rules ] rule 1, keeping the frontier counters."""
        st, find, ecn = self.state, self._find, self._ecn
        n = self._new_node(t)
        own = self._uf_front[n]
        roots = []
        for adj in (self.parents[t], self.children[t]):
            for m in adj:
                s = st[m]
                if s == EVICTED:
                    root = find(ecn[m])
                    self._front_add(root, t, -1)  # t is no longer a resident neighbour
                    roots.append(root)
                elif s == RESIDENT:
                    own[m] = own.get(m, 0) + 1
        root = n
        for other in roots:
            root = self._union(root, other)
        self._dirty_classes.append(root)

    def _eq_leave(self, t: int) -> None:
        """NOTE [ Eqclass rules ] rule 3: evicted ``t`` leaves its class."""
        st, n = self.state, self._ecn[t]
        root = self._find(n)
        self._ecn[t] = -1
        self._uf_val[root] -= _fixed(self.cost[t])
        self._uf_live[root] -= 1
        front, dirty = self._uf_front[root], self.dirty
        for adj in (self.parents[t], self.children[t]):
            for m in adj:
                if st[m] == RESIDENT:
                    c = front[m] - 1
                    if c:
                        front[m] = c
                    else:
                        del front[m]
                    dirty.add(m)
        if self._uf_live[root] == 0:  # dead class: reuse its nodes (rule 6)
            if front or self._uf_val[root]:
                raise AssertionError(f"bug of tritondtr: dead class {root} still has a frontier")
            for node in self._uf_members[root]:
                self._uf_members[node] = self._uf_front[node] = None
                self._uf_free.append(node)
        else:
            self._dirty_classes.append(root)

    # ---------------------------------------------------------------- debugging
    def check_invariants(self) -> None:
        """Raise AssertionError naming the first violated invariant: edge symmetry, dirty
        slots resident, clean resident values current, eqclass bookkeeping."""
        self.stage()  # pending records become dirty slots; nothing is recomputed
        st, ts = self.state, self.table.host_state
        for s in range(len(st)):
            assert (st[s] == FREE) == (ts[s] == 0), f"slot {s}: residency disagrees with table"
        if not self.tracking:
            return
        for s in range(len(st)):
            ps, cs = self.parents[s], self.children[s]
            assert len(set(ps)) == len(ps) and s not in ps, f"slot {s}: duplicate/self parent"
            if st[s] == FREE:
                assert not ps and not cs, f"free slot {s} has edges"
            for p in ps:
                assert s in self.children[p], f"edge {p}->{s} missing from children[{p}]"
            for c in cs:
                assert s in self.parents[c], f"edge {s}->{c} missing from parents[{c}]"
        for s in self.dirty:
            assert st[s] == RESIDENT, f"dirty slot {s} is {_STATE_NAMES[st[s]]}"
        host = self.table.host_nbhd_cost
        for s in range(len(st)):
            if st[s] == RESIDENT and s not in self.dirty:
                want = np.float32(self._value(s))
                assert host[s] == want, f"slot {s}: nbhd_cost {host[s]} but current is {want}"
        for adj, clo in ((self.parents, self._clo_up), (self.children, self._clo_down)):
            for e, m in clo.items():
                want = sum(1 << u for u in self._region(e, adj) | {e})
                assert st[e] == EVICTED and m == want, f"slot {e}: stale cached closure mask"
        if self._eq:
            self._check_eq()

    def _check_eq(self) -> None:
        st, ecn = self.state, self._ecn
        live: dict[int, list[int]] = {}
        for s in range(len(st)):
            assert (ecn[s] >= 0) == (st[s] == EVICTED), f"slot {s}: class node vs state"
            if ecn[s] >= 0:
                assert self._uf_slot[ecn[s]] == s, f"slot {s}: node points elsewhere"
                live.setdefault(self._find(ecn[s]), []).append(s)
        for root, slots in live.items():
            assert self._uf_live[root] == len(slots), f"class {root}: live count"
            want = sum(_fixed(self.cost[s]) for s in slots)
            assert self._uf_val[root] == want, f"class {root}: value is not the live cost sum"
            front: dict[int, int] = {}
            for s in slots:
                for m in self.parents[s] + self.children[s]:
                    if st[m] == RESIDENT:
                        front[m] = front.get(m, 0) + 1
            assert self._uf_front[root] == front, f"class {root}: frontier counters"

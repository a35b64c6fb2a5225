"""Evicted-neighbourhood maintenance: keeps the table's ``nbhd_cost`` column current.

The graph is over storages (slot ids): ``parents[t]`` are the storages of the inputs of the
op(s) that produced t, ``children`` the reverse. In the modes of :class:`NbhdMode`:

* ``exact``: e*(t) = evicted storages reachable from t through evicted parents, union those
  reachable through evicted children (directions are not mixed within one path);
  ``nbhd_cost(t)`` is the cost of e*(t).
* ``ancestors``: only the evicted-ancestor part.
* ``eqclass``: the union-find approximation (paper §4.1), see NOTE [ Eqclass rules ].

This module is the facade: the graph, residency, staging and the table column. The region
searches and closure masks of exact/ancestors live in :mod:`tritondtr.engine.regions` (NOTE
[ Batched regions ]), the union-find classes of eqclass in :mod:`tritondtr.engine.eqclass` (NOTE
[ Eqclass rules ]).

# NOTE [ Neighbourhood staging ]
# 1. Events only record where something changed; nothing is recomputed then. exact/ancestors:
#    the slot is a "start" (evict, remat, cost change, both ends of a new edge). eqclass: a
#    change of a class's value is recorded in the class, for its whole frontier at once; the
#    resident slots that gain or lose a class are updated and marked dirty (NOTE
#    [ Incremental class values ] in eqclass.py).
# 2. ``flush()`` first turns the records into dirty resident slots: exact: one multi-source
#    search down (children) and one up (parents) from all starts through evicted slots, with
#    one shared ``seen`` set, marking the resident slots met (and resident starts); ancestors:
#    the search down only; eqclass: the frontier of every recorded class (the resident slots
#    adjacent to its live members, kept as counters) takes the class's recorded change. It
#    then computes each dirty slot's value once (eqclass: reads the kept value) and writes the
#    table column. The engine flushes before every selection.
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
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

from ..policy.heuristics import NbhdMode
from . import regions
from .eqclass import EqClasses
from .regions import Regions
from .residency import EVICTED, FREE, RESIDENT
from .residency import STATE_NAMES as _STATE_NAMES
from .table import MetadataTable

__all__ = ["EVICTED", "FREE", "RESIDENT", "Neighborhood"]

# Thresholds of NOTE [ Batched regions ], read at every flush so that tests can lower them.
_BATCH_MIN = regions._BATCH_MIN
_MAX_CACHE_BITS = regions._MAX_CACHE_BITS
_FEW = 16  # at most this many slots: one by one (3 slots: 1.3 us, not 3.6; 2-core EPYC)
_NO_EDGES: tuple = ()  # the edges of a slot that never had one (no list per unused slot)


class Neighborhood:
    """Keeps ``table.host_nbhd_cost`` current for resident slots in one :class:`NbhdMode`.

    The graph and the residency of every slot live here, on the host, as plain Python lists:
    ``state`` (bytearray, FREE 0 / RESIDENT 1 / EVICTED 2), ``cost`` (``array('f')``: the
    float32 costs, as in the table), ``parents`` / ``children`` (list of slot lists, without
    duplicates or self edges; ``()`` for a slot that never had an edge; empty in mode ``none``,
    which keeps no graph). The caller
    (:class:`tritondtr.engine.Engine`) reports every event with the ``on_*`` methods and calls
    :meth:`flush` before reading the column; see NOTE [ Neighbourhood staging ].
    """

    def __init__(self, table: MetadataTable, mode: NbhdMode | str) -> None:
        self.table = table
        self.mode = NbhdMode(mode)
        self.tracking = self.mode is not NbhdMode.NONE
        self.lowered: set[int] | None = None  # slots whose value went down, if kept
        self._eq = self.mode is NbhdMode.EQCLASS
        self.state = bytearray()
        self.cost = array("f")
        self.parents: list[list[int] | tuple] = []  # () until a slot has an edge
        self.children: list[list[int] | tuple] = []
        self.dirty: set[int] = set()  # resident slots to recompute at the next flush
        self._starts: set[int] = set()  # exact/ancestors: where searches start at flush
        self.recomputed = 0  # counter: nbhd values computed by flush
        graph = (self.state, self.cost, self.parents, self.children)
        self.regions = Regions(*graph, exact=self.mode is NbhdMode.EXACT)
        self.classes = EqClasses(*graph, self.dirty)
        if self.tracking:
            self._value = {
                NbhdMode.EXACT: self.regions.value_exact,
                NbhdMode.ANCESTORS: self.regions.value_ancestors,
                NbhdMode.EQCLASS: self.classes.value,
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
            self.parents.extend([_NO_EDGES] * n)  # a list only once a slot has an edge:
            self.children.extend([_NO_EDGES] * n)  # most of a doubling stays unused
            self.classes.grow(n)

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
            if ps is _NO_EDGES:
                ps = self.parents[slot] = []
            ps.append(p)
            c = ch[p]
            if c is _NO_EDGES:
                c = ch[p] = []
            c.append(slot)
            if self._eq:
                self.classes.on_edge(slot, p)
            elif st[p] == EVICTED or st[slot] == EVICTED:
                self._starts.add(slot)
                self._starts.add(p)

    def on_evict(self, slot: int) -> None:
        """A resident ``slot`` was evicted."""
        self.state[slot] = EVICTED
        if not self.tracking:
            return
        self.dirty.discard(slot)
        if self._eq:
            self.classes.evict(slot)
        else:
            self._starts.add(slot)

    def on_remat(self, slot: int) -> None:
        """An evicted ``slot`` was rematerialized (is resident again)."""
        if not self.tracking:
            self.state[slot] = RESIDENT
            return
        if self._eq:
            self.classes.leave(slot)
            self.state[slot] = RESIDENT
            self.classes.join_front(slot)
        else:
            self.state[slot] = RESIDENT
            self._starts.add(slot)
        self.dirty.add(slot)

    def on_release(self, slot: int) -> None:
        """``slot`` is forgotten for good: its edges are dropped, it becomes FREE."""
        if self.tracking:
            st = self.state
            if self._eq and st[slot] == EVICTED:
                self.classes.leave(slot)
            elif self._eq:
                self.classes.leave_front(slot)
            elif st[slot] == EVICTED or slot in self._starts:
                # NOTE [ Neighbourhood staging ] rule 3: mark now, the edges are about to go.
                self._starts.discard(slot)
                self.regions.mark_from([slot], self.children, self.dirty)
                self.regions.mark_from([slot], self.parents, self.dirty)
            parents, children = self.parents, self.children
            ps, cs = parents[slot], children[slot]
            if ps:  # kept, emptied, for the slot's next storage
                for p in ps:
                    children[p].remove(slot)
                ps.clear()
            if cs:
                for c in cs:
                    parents[c].remove(slot)
                cs.clear()
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
            self.classes.on_cost(slot, old)
        else:
            self._starts.add(slot)

    # ------------------------------------------------------------------ queries
    def stage(self) -> None:
        """Turn the recorded events into dirty slots (NOTE [ Neighbourhood staging ] rule 2)."""
        if self._starts:
            starts = self._starts
            st, dirty = self.state, self.dirty
            dirty.update(s for s in starts if st[s] == RESIDENT)
            self.regions.mark_from(starts, self.children, dirty)
            if self.mode is NbhdMode.EXACT:
                self.regions.mark_from(starts, self.parents, dirty)
            starts.clear()
        if self.classes.dirty_classes:
            self.classes.stage()

    def flush(self) -> int:
        """Recompute every dirty resident slot and write the table column; returns how many."""
        self.stage()
        dirty = self.dirty
        if not dirty:
            return 0
        slots = list(dirty)
        dirty.clear()
        vals = None
        if self._eq:  # staged: NOTE [ Incremental class values ]
            vals = self.classes.staged(slots)
        elif len(slots) >= _BATCH_MIN:
            vals = self.regions.batch_values(slots, _MAX_CACHE_BITS)
        if vals is None:
            value = self._value
            vals = [value(r) for r in slots]
        self.recomputed += len(slots)
        lowered = self.lowered  # NOTE [ Bounded choice ] rule 2
        if len(slots) <= _FEW:  # a flush before a decision: a few slots, no numpy calls
            table, old, f32 = self.table, self.table.host_nbhd_cost, np.float32
            for s, v in zip(slots, vals):
                if lowered is not None and f32(v) < old[s]:
                    lowered.add(s)
                table.set_nbhd_cost(s, v)
            return len(slots)
        if lowered is not None:
            old = self.table.host_nbhd_cost[slots]
            low = np.asarray(vals, dtype=np.float32) < old
            if low.any():
                lowered.update(np.asarray(slots)[low].tolist())
        self.table.set_nbhd_costs(slots, vals)
        return len(slots)

    def value(self, slot: int) -> float:
        """The current float64 neighbourhood cost of a resident ``slot``, computed now."""
        return self._value(slot) if self.tracking else 0.0

    # ---------------------------------------------------------------- debugging
    # Short names for tests and debugging sessions.
    def _find(self, node: int) -> int:
        return self.classes.find(node)

    @property
    def _ecn(self) -> list[int]:
        return self.classes.ecn

    @property
    def _uf_live(self) -> list[int]:
        return self.classes.live

    def _mask_sums(self, masks: list[int]) -> list[float]:
        return self.regions.mask_sums(masks)

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first violated invariant: edge symmetry, dirty
        slots resident, clean resident values current, cached masks, eqclass bookkeeping."""
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
        value = self.classes.rule2 if self._eq else self._value
        for s in range(len(st)):
            if st[s] == RESIDENT and s not in self.dirty:
                want = np.float32(value(s))
                assert host[s] == want, f"slot {s}: nbhd_cost {host[s]} but current is {want}"
        self.regions.check_invariants()
        if self._eq:
            self.classes.check_invariants()

"""Budgeted replay of a trace on the engine, with the paper simulator's semantics.

# NOTE [ Replay semantics ]
# Those of the DTR paper's simulator (simrd ``RuntimeV2EagerOptimized``), so that results
# compare with its Figure 2; docs/simulator.md lists the intended differences.
# 1. Memory is counted per storage. Running an op adds the bytes of all its fresh outputs,
#    even those already resident (they are freed again right after, so that the peak sees
#    the transient copy); views add nothing.
# 2. The clock advances by an op's cost at every computation, rematerializations included.
#    A storage's last access is set to the clock when it is created (after its op ran) and
#    when it is requested as an input of a (re)computation (before that runs); a storage
#    rematerialized as a side output keeps its old last access.
# 3. Computing an op: stamp the last access of its inputs, lock the resident ones, then
#    rematerialize each missing input in order (iteratively, with an explicit stack) and lock
#    it; evict by the heuristic until the op's outputs fit; run it; unlock the inputs.
#    Rematerializing a tensor re-runs its op, which makes every output of that op resident;
#    a view becomes usable again only once its own view op re-runs.
# 4. Eager eviction: a storage whose last reference is released is evicted at once (the
#    heuristic is not asked) and stays rematerializable for its dependents. Constants are
#    pinned and never evicted. ``output`` events make their tensor resident and pin it.
# 5. Failure: ``oom`` when an eviction is needed but nothing is evictable; ``thrash`` when the
#    rematerialization compute exceeds ``(overhead_limit - 1) x`` the baseline compute,
#    checked after every rematerialization. Overhead = clock / baseline compute, also at the
#    point of failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .program import (
    KIND_CALL,
    KIND_CONSTANT,
    KIND_OUTPUT,
    KIND_RELEASE,
    KIND_RETAIN,
    Program,
)
from .ties import PoolOrder

__all__ = ["RunStats", "replay_program"]


class _Fail(Exception):
    def __init__(self, status: str) -> None:
        self.status = status


@dataclass
class RunStats:
    """Raw counters of one budgeted replay (see :class:`tritondtr.sim.SimResult`)."""

    status: str
    clock: float
    peak_bytes: int
    evictions: int
    eager_evictions: int
    remats: int
    remat_compute: float
    selections: int
    wall_s: float


def replay_program(
    prog: Program,
    engine,
    budget: int,
    remat_limit: float,
    on_event: Callable[[int], None] | None = None,
    ties: str = "slot",
) -> RunStats:
    """Replay ``prog`` under ``budget`` bytes on a fresh ``engine`` (NOTE [ Replay semantics ]).

    ``engine`` is a :class:`tritondtr.engine.Engine` (or anything with its interface) that
    owns all metadata and chooses every victim. ``on_event(i)`` is called every 4096 events.
    ``ties``: ``"slot"`` (the engine's rule) or ``"simrd"`` (NOTE [ Tie order ]).
    """
    if ties not in ("slot", "simrd"):
        raise ValueError(f"ties must be 'slot' (the engine's rule) or 'simrd', got {ties!r}")
    run = _Run(prog, engine, budget, remat_limit)
    run.pool = PoolOrder(max(1024, prog.num_storages)) if ties == "simrd" else None
    t0 = time.perf_counter()
    status = "ok"
    try:
        run.run(on_event)
    except _Fail as f:
        status = f.status
    return RunStats(status=status, clock=run.clock, peak_bytes=run.peak,
                    evictions=run.evictions, eager_evictions=run.eager, remats=run.remats,
                    remat_compute=run.remat_compute, selections=run.selections,
                    wall_s=time.perf_counter() - t0)


class _Run:
    """Mutable state of one replay; tensors and storages are the program's dense ids."""

    def __init__(self, prog: Program, engine, budget: int, remat_limit: float) -> None:
        self.p = prog
        self.e = engine
        self.budget = budget
        self.remat_limit = remat_limit
        n_t, n_s = len(prog.sid), prog.num_storages
        self.defined = bytearray(n_t)
        self.material = bytearray(n_s)
        self.pinned = bytearray(n_s)
        self.refs = [0] * n_s
        self.slot = [-1] * n_s  # engine slot of each storage, -1 before it is created
        self.sid_of_slot: dict[int, int] = {}
        self.last = [0] * n_s  # last access (NOTE [ Replay semantics ] 2), mirrored in engine
        self.cost = [0.0] * n_s
        self.clock = 0.0
        self.mem = self.peak = 0
        self.evictions = self.eager = self.remats = self.selections = 0
        self.remat_compute = 0.0
        self.pool: PoolOrder | None = None  # NOTE [ Tie order ]

    # ------------------------------------------------------------------ events
    def run(self, on_event) -> None:
        p, e = self.p, self.e
        sid, refs, material, pinned = p.sid, self.refs, self.material, self.pinned
        for i, (k, a) in enumerate(zip(p.ev_kind, p.ev_arg)):
            if k == KIND_RELEASE:
                s = sid[a]
                refs[s] -= 1
                if refs[s] == 0 and material[s] and not pinned[s]:
                    self.eager += 1
                    self._evict(s)
            elif k == KIND_CALL:
                self._call(a)
            elif k == KIND_RETAIN:
                refs[sid[a]] += 1
            elif k == KIND_CONSTANT:
                self._call(a)
                s = sid[p.op_lo[a]]
                pinned[s] = 1
                e.pin(self.slot[s])
            elif k == KIND_OUTPUT:
                if not self.defined[a]:
                    self._materialize(a, True)
                s = sid[a]
                if not pinned[s]:
                    pinned[s] = 1
                    e.pin(self.slot[s])
            if on_event is not None and not i & 4095:
                on_event(i)

    def _call(self, o: int) -> None:
        p, e = self.p, self.e
        sid, refs = p.sid, self.refs
        lo, hi = p.op_lo[o], p.op_hi[o]
        for t in range(lo, hi):
            refs[sid[t]] += 1
        for s, parents in p.op_views[o]:  # a view op adds its cost and edges to the base
            self.cost[s] += p.op_cost[o]
            e.set_cost(self.slot[s], self.cost[s])
            if parents:
                e.add_parents(self.slot[s], [self.slot[q] for q in parents])
        defined = self.defined
        for q in p.op_inputs[o]:
            if not defined[q] or self.pool is not None:
                self._materialize(lo, False)
                break
        else:  # fast path: every input is resident (NOTE [ Replay semantics ] 3)
            now, last, slot = self.clock, self.last, self.slot
            parents = p.op_new_parents[o]  # the distinct input storages
            for s in parents:
                last[s] = now
                e.access(slot[s], now)
            need = p.op_total[o]
            if self.mem + need > self.budget:
                # Locks only matter while victims are chosen; taking them just for the
                # eviction loop is equivalent and saves two engine calls per input.
                for s in parents:
                    e.lock(slot[s])
                self._free(need)
                for s in parents:
                    e.unlock(slot[s])
            self._compute(lo, o, False)
        now, last, slot = self.clock, self.last, self.slot
        for t in range(lo, hi):
            s = sid[t]
            last[s] = now
            e.access(slot[s], now)

    # ------------------------------------------------------- (re)materializing
    def _materialize(self, target: int, remat: bool) -> None:
        """Make tensor ``target`` defined (NOTE [ Replay semantics ] 3), without recursion."""
        p, e = self.p, self.e
        sid, defined, op_of, slot = p.sid, self.defined, p.op_of, self.slot
        # A frame: [tensor, remat flag, inputs, missing inputs, next missing index].
        stack = [self._enter(target, remat)]
        while stack:
            frame = stack[-1]
            missing, j = frame[3], frame[4]
            while j < len(missing):
                q = missing[j]
                if not defined[q]:
                    break
                e.lock(slot[sid[q]])
                j += 1
            frame[4] = j
            if j < len(missing):
                stack.append(self._enter(missing[j], True))
                continue
            t, is_remat, ins = frame[0], frame[1], frame[2]
            o = op_of[t]
            need = p.op_total[o]
            if self.mem + need > self.budget:
                self._free(need)
            self._compute(t, o, is_remat)
            for q in ins:
                e.unlock(slot[sid[q]])
                if self.pool is not None and not e.lock_count(slot[sid[q]]) \
                        and not self.pinned[sid[q]]:
                    self.pool.stamp(slot[sid[q]])
            stack.pop()
            if stack:  # the parent frame's missing input is now defined: lock it
                parent = stack[-1]
                e.lock(slot[sid[parent[3][parent[4]]]])
                parent[4] += 1

    def _enter(self, t: int, remat: bool) -> list:
        p, e = self.p, self.e
        sid, defined, slot, last = p.sid, self.defined, self.slot, self.last
        ins = p.op_inputs[p.op_of[t]]
        now = self.clock
        missing = []
        for q in ins:
            s = sid[q]
            last[s] = now
            e.access(slot[s], now)
        for q in ins:
            if defined[q]:
                e.lock(slot[sid[q]])
            else:
                missing.append(q)
        return [t, remat, ins, missing, 0]

    def _compute(self, t: int, o: int, remat: bool) -> None:
        p, e = self.p, self.e
        sid, fresh, defined, material = p.sid, p.fresh, self.defined, self.material
        lo, hi = p.op_lo[o], p.op_hi[o]
        dup = 0
        born = []
        for u in range(lo, hi):
            if u != t and defined[u]:
                dup += fresh[u]
            s = sid[u]
            if not material[s]:
                born.append(s)
        cost = p.op_cost[o]
        self.clock += cost
        self.mem += p.op_total[o]
        if self.mem > self.peak:
            self.peak = self.mem
        for u in range(lo, hi):
            defined[u] = 1
            material[sid[u]] = 1
        self.mem -= dup
        now, slot = self.clock, self.slot
        for s in born:
            if slot[s] < 0:
                self.cost[s] = cost
                parents = [slot[q] for q in p.op_new_parents[o]]
                slot[s] = e.new(cost, p.st_size[s], now, parents)
                self.sid_of_slot[slot[s]] = s
                self.last[s] = now
            else:
                e.remat(slot[s], self.last[s])
        if self.pool is not None:  # siblings first, then t (NOTE [ Tie order ] 2)
            ts = sid[t]
            for s in born:
                if s != ts:
                    self.pool.stamp(slot[s])
            if ts in born:
                self.pool.stamp(slot[ts])
        if remat:
            self.remats += 1
            self.remat_compute += cost
            if self.remat_compute > self.remat_limit:
                raise _Fail("thrash")

    # ----------------------------------------------------------------- eviction
    def _free(self, need: int) -> None:
        e, budget = self.e, self.budget
        while self.mem + need > budget:
            self.selections += 1
            v = e.choose(self.clock) if self.pool is None else self.pool.choose(e, self.clock)
            if v is None:
                raise _Fail("oom")
            self.evictions += 1
            self._evict(self.sid_of_slot[v])

    def _evict(self, s: int) -> None:
        self.material[s] = 0
        self.mem -= self.p.st_size[s]
        defined = self.defined
        for u in self.p.st_tensors[s]:
            defined[u] = 0
        self.e.evict(self.slot[s])

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

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

from .deferred import LOG_NEW, UNSYNCED, EngineCalls, Frame, held_storages
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

_BLOCK = 4096  # events between two ``on_event`` calls


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
    lazy: bool = True,
) -> RunStats:
    """Replay ``prog`` under ``budget`` bytes on a fresh ``engine`` (NOTE [ Replay semantics ]).

    ``engine`` is a :class:`tritondtr.engine.Engine` (or anything with its interface) that
    owns all metadata and chooses every victim. ``on_event(i)`` is called before events
    ``i = 0, 4096, 8192, ...``. ``ties``: ``"slot"`` (the engine's rule) or ``"simrd"``
    (NOTE [ Tie order ]). ``lazy=False`` updates the engine from the first event instead of
    from the first eviction (NOTE [ Lazy replay ]; same results).
    """
    if ties not in ("slot", "simrd"):
        raise ValueError(f"ties must be 'slot' (the engine's rule) or 'simrd', got {ties!r}")
    pool = PoolOrder(max(1024, prog.num_storages)) if ties == "simrd" else None
    run = _Run(prog, engine, budget, remat_limit, pool, lazy and pool is None)
    # The replay makes no reference cycles, only short-lived tuples and lists: the cyclic
    # collector would rescan everything alive (torch's objects, the program) every few thousand
    # of them; one such pass took ~0.1 s inside a 0.015 s replay (2-core AMD EPYC guest with
    # torch loaded: docs/history/benchmarks-log.md, Simulator scaling).
    collecting = gc.isenabled()
    gc.disable()
    t0 = time.perf_counter()
    status = "ok"
    try:
        run.run(on_event)
    except _Fail as f:
        status = f.status
    finally:
        if collecting:
            gc.enable()
    return RunStats(
        status=status,
        clock=run.clock,
        peak_bytes=run.peak,
        evictions=run.evictions,
        eager_evictions=run.eager,
        remats=run.remats,
        remat_compute=run.remat_compute,
        selections=run.selections,
        wall_s=time.perf_counter() - t0,
    )


class _Run(EngineCalls):
    """Mutable state of one replay; tensors and storages are the program's dense ids."""

    def __init__(
        self,
        prog: Program,
        engine,
        budget: int,
        remat_limit: float,
        pool: PoolOrder | None,
        lazy: bool,
    ) -> None:
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
        # (UNSYNCED while the replay is lazy)
        self.sid_of_slot: dict[int, int] = {}
        self.last = [0] * n_s  # last access (NOTE [ Replay semantics ] 2), the engine's once synced
        self.cost = [0.0] * n_s
        self.clock = 0.0
        self.mem = self.peak = 0
        self.evictions = self.eager = self.remats = self.selections = 0
        self.remat_compute = 0.0
        self.pool = pool  # NOTE [ Tie order ]
        self.lazy = lazy  # NOTE [ Lazy replay ]
        self.log: list[tuple] = []

    # ------------------------------------------------------------------ events
    def run(self, on_event) -> None:
        p = self.p
        sid, refs, material, pinned = p.sid, self.refs, self.material, self.pinned
        kinds, args, call = p.ev_kind, p.ev_arg, self._call
        for i in range(0, len(kinds), _BLOCK):
            if on_event is not None:
                on_event(i)
            for k, a in zip(kinds[i : i + _BLOCK], args[i : i + _BLOCK]):
                if k == KIND_RELEASE:
                    s = sid[a]
                    r = refs[s] = refs[s] - 1
                    if not r and material[s] and not pinned[s]:
                        self.eager += 1
                        self._evict(s)
                elif k == KIND_CALL:
                    call(a)
                elif k == KIND_RETAIN:
                    refs[sid[a]] += 1
                elif k == KIND_CONSTANT:
                    call(a)
                    self._pin(sid[p.op_lo[a]])
                elif k == KIND_OUTPUT:
                    if not self.defined[a]:
                        self._materialize(a, True)
                    self._pin(sid[a])

    def _call(self, o: int) -> None:
        """The first run of op ``o`` (its CALL or CONSTANT event)."""
        p, refs = self.p, self.refs
        outs = p.op_out_st[o]
        for s in outs:
            refs[s] += 1
        views = p.op_views[o]
        if views:
            self._views(o)
        defined = self.defined
        if self.pool is not None:  # the general path keeps the tie order's stamps
            self._materialize(p.op_lo[o], False)
        else:
            for q in p.op_inputs[o]:
                if not defined[q]:
                    self._materialize(p.op_lo[o], False)
                    break
            else:
                self._first_run(o)
                if not views:
                    return  # every output storage was born now: its last access is the clock
        now, last = self.clock, self.last
        if self.lazy:
            for s in outs:
                last[s] = now
        else:
            e, slot = self.e, self.slot
            for s in outs:
                last[s] = now
                e.access(slot[s], now)

    def _first_run(self, o: int) -> None:
        """``_materialize`` + ``_compute`` for the first run of ``o`` when its inputs are
        resident: nothing of it is defined yet, its fresh outputs get new storages and its
        views land on resident ones (NOTE [ Replay semantics ] 3)."""
        p, e, lazy = self.p, self.e, self.lazy
        now, last, slot = self.clock, self.last, self.slot
        parents = p.op_new_parents[o]  # the distinct input storages
        for s in parents:
            last[s] = now
            if not lazy:
                e.access(slot[s], now)
        need = p.op_total[o]
        if self.mem + need > self.budget:
            if lazy:
                self._sync([])
                lazy = False
            # Locks only matter while victims are chosen; taking them just for the
            # eviction loop is equivalent and saves two engine calls per input.
            for s in parents:
                e.lock(slot[s])
            self._free(need)
            for s in parents:
                e.unlock(slot[s])
        cost = p.op_cost[o]
        now = self.clock = self.clock + cost
        mem = self.mem = self.mem + need
        if mem > self.peak:
            self.peak = mem
        defined, material = self.defined, self.material
        for t in range(p.op_lo[o], p.op_hi[o]):
            defined[t] = 1
        if lazy:  # _new, inlined
            log, costs = self.log, self.cost
            for s in p.op_fresh_st[o]:
                material[s] = 1
                costs[s] = cost
                last[s] = now
                slot[s] = UNSYNCED
                log.append((LOG_NEW, s, o, now))
        else:
            for s in p.op_fresh_st[o]:
                material[s] = 1
                self._new(s, o, cost, now)

    def _views(self, o: int) -> None:
        """A view op adds its cost and its other inputs as parents to the base storage."""
        cost = self.cost
        for s, parents in self.p.op_views[o]:
            cost[s] += self.p.op_cost[o]
            self._set_cost(s)
            if parents:
                self._add_parents(s, parents)

    # ------------------------------------------------------- (re)materializing
    def _materialize(self, target: int, remat: bool) -> None:
        """Make tensor ``target`` defined (NOTE [ Replay semantics ] 3), without recursion."""
        p = self.p
        sid, defined, op_of = p.sid, self.defined, p.op_of
        stack = [self._enter(target, remat)]
        while stack:
            frame = stack[-1]
            missing, j = frame.missing, frame.next
            while j < len(missing):
                q = missing[j]
                if not defined[q]:
                    break
                self._lock(sid[q])
                j += 1
            frame.next = j
            if j < len(missing):
                stack.append(self._enter(missing[j], True))
                continue
            t, is_remat, ins = frame.tensor, frame.remat, frame.inputs
            o = op_of[t]
            need = p.op_total[o]
            if self.mem + need > self.budget:
                if self.lazy:
                    self._sync(held_storages(stack, sid))
                self._free(need)
            self._compute(t, o, is_remat)
            for q in ins:
                s = sid[q]
                self._unlock(s)
                if (
                    self.pool is not None
                    and not self.e.lock_count(self.slot[s])
                    and not self.pinned[s]
                ):
                    self.pool.stamp(self.slot[s])
            stack.pop()
            if stack:  # the parent frame's missing input is now defined: lock it
                parent = stack[-1]
                self._lock(sid[parent.missing[parent.next]])
                parent.next += 1

    def _enter(self, t: int, remat: bool) -> Frame:
        p = self.p
        sid, defined, last = p.sid, self.defined, self.last
        ins = p.op_inputs[p.op_of[t]]
        now = self.clock
        missing = []
        for q in ins:
            s = sid[q]
            last[s] = now
            if not self.lazy:
                self.e.access(self.slot[s], now)
        for q in ins:
            if defined[q]:
                self._lock(sid[q])
            else:
                missing.append(q)
        return Frame(t, remat, ins, missing, 0)

    def _compute(self, t: int, o: int, remat: bool) -> None:
        p = self.p
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
                self._new(s, o, cost, now)
            else:
                self._remat(s)
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
        self._evict_slot(s)

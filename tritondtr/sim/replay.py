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
#
# NOTE [ Lazy replay ]
# 1. Nothing is evicted by the heuristic while ``memory + op bytes <= budget``, so until then
#    the engine's per-event work (table rows, neighbourhoods, locks, access times) cannot
#    change a decision. A replay starts *lazy*: it calls no engine method. A new storage gets
#    a placeholder slot; the calls that build the engine's state (new, set_cost, add_parents,
#    pin, evict, remat) are appended to a log in order, with the arguments they would have
#    had; last access times live in ``last`` only; no lock is taken.
# 2. The first op that needs room *syncs* the replay before any victim is asked for: the log
#    is replayed on the engine in order (the same calls with the same arguments, so the table,
#    the neighbourhoods and the eqclass forest come out as an eager replay leaves them), then
#    every storage whose last access is newer than what its new / remat set gets one
#    ``access``, then the locks held at that point (the inputs of the op in flight and of the
#    rematerializations under way) are taken. From then on every call goes to the engine at
#    once. A replay that never needs room (e.g. ratio 1.0 of a trace without transient
#    copies) never touches the engine.
# 3. What the sync leaves out cannot matter: ``access`` only sets ``last_access`` (the last
#    value wins, and ``last`` holds it) and touches no neighbourhood; a lock taken and
#    released before the sync leaves the state it found; the engine's choice cache starts
#    empty. The slots the engine hands out replace the placeholders.
# 4. ``ties="simrd"`` replays synced from the start (its pool reads the engine's locks);
#    ``lazy=False`` does the same, for tests that compare the two.
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

# Deferred engine calls (NOTE [ Lazy replay ] 1): (_NEW, storage, op, now), (_COST, storage,
# cost), (_EDGES, storage, parent storages), (_PIN, storage), (_EVICT, storage),
# (_REMAT, storage, now).
_NEW, _COST, _EDGES, _PIN, _EVICT, _REMAT = range(6)
_UNSYNCED = 1 << 62  # the placeholder slot of a storage created while lazy
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

    def __init__(self, prog: Program, engine, budget: int, remat_limit: float,
                 pool: PoolOrder | None, lazy: bool) -> None:
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
            for k, a in zip(kinds[i:i + _BLOCK], args[i:i + _BLOCK]):
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
        p, e = self.p, self.e
        refs, lazy = self.refs, self.lazy
        outs = p.op_out_st[o]
        for s in outs:
            refs[s] += 1
        if p.op_views[o]:
            self._views(o)
        defined = self.defined
        for q in p.op_inputs[o]:
            if not defined[q] or self.pool is not None:
                self._materialize(p.op_lo[o], False)
                lazy = self.lazy
                break
        else:  # fast path: every input is resident (NOTE [ Replay semantics ] 3)
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
            if self.pool is not None:
                self._compute(p.op_lo[o], o, False)
            else:  # _compute for a first run: nothing defined, only fresh storages are born
                self._first_run(o, need)
        now, last = self.clock, self.last
        if lazy:
            for s in outs:
                last[s] = now
        else:
            slot = self.slot
            for s in outs:
                last[s] = now
                e.access(slot[s], now)

    def _first_run(self, o: int, need: int) -> None:
        """``_compute`` for the first run of ``o`` with its inputs resident: no output is
        defined yet, its fresh outputs are born, its views land on resident storages."""
        p = self.p
        cost = p.op_cost[o]
        now = self.clock = self.clock + cost
        mem = self.mem = self.mem + need
        if mem > self.peak:
            self.peak = mem
        defined, material, new = self.defined, self.material, self._new
        for t in range(p.op_lo[o], p.op_hi[o]):
            defined[t] = 1
        for s in p.op_fresh_st[o]:
            material[s] = 1
            new(s, o, cost, now)

    def _views(self, o: int) -> None:
        """A view op adds its cost and its other inputs as parents to the base storage."""
        cost, slot, e = self.cost, self.slot, self.e
        for s, parents in self.p.op_views[o]:
            cost[s] += self.p.op_cost[o]
            if self.lazy:
                self.log.append((_COST, s, cost[s]))
                if parents:
                    self.log.append((_EDGES, s, parents))
            else:
                e.set_cost(slot[s], cost[s])
                if parents:
                    e.add_parents(slot[s], [slot[q] for q in parents])

    # ------------------------------------------------------- (re)materializing
    def _materialize(self, target: int, remat: bool) -> None:
        """Make tensor ``target`` defined (NOTE [ Replay semantics ] 3), without recursion."""
        p = self.p
        sid, defined, op_of = p.sid, self.defined, p.op_of
        # A frame: [tensor, remat flag, inputs, missing inputs, next missing index].
        stack = [self._enter(target, remat)]
        while stack:
            frame = stack[-1]
            missing, j = frame[3], frame[4]
            while j < len(missing):
                q = missing[j]
                if not defined[q]:
                    break
                self._lock(sid[q])
                j += 1
            frame[4] = j
            if j < len(missing):
                stack.append(self._enter(missing[j], True))
                continue
            t, is_remat, ins = frame[0], frame[1], frame[2]
            o = op_of[t]
            need = p.op_total[o]
            if self.mem + need > self.budget:
                if self.lazy:
                    self._sync(_held(stack, sid))
                self._free(need)
            self._compute(t, o, is_remat)
            for q in ins:
                s = sid[q]
                self._unlock(s)
                if self.pool is not None and not self.e.lock_count(self.slot[s]) \
                        and not self.pinned[s]:
                    self.pool.stamp(self.slot[s])
            stack.pop()
            if stack:  # the parent frame's missing input is now defined: lock it
                parent = stack[-1]
                self._lock(sid[parent[3][parent[4]]])
                parent[4] += 1

    def _enter(self, t: int, remat: bool) -> list:
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
        return [t, remat, ins, missing, 0]

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
            elif self.lazy:
                self.log.append((_REMAT, s, self.last[s]))
            else:
                self.e.remat(slot[s], self.last[s])
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

    def _new(self, s: int, o: int, cost: float, now: float) -> None:
        """Storage ``s`` is created by op ``o``'s first run, at ``now``."""
        self.cost[s] = cost
        self.last[s] = now
        if self.lazy:
            self.slot[s] = _UNSYNCED
            self.log.append((_NEW, s, o, now))
        else:
            slot = self.slot
            v = self.e.new(cost, self.p.st_size[s], now,
                           [slot[q] for q in self.p.op_new_parents[o]])
            slot[s] = v
            self.sid_of_slot[v] = s

    # ------------------------------------------------------------ engine calls
    def _lock(self, s: int) -> None:
        if not self.lazy:
            self.e.lock(self.slot[s])

    def _unlock(self, s: int) -> None:
        if not self.lazy:
            self.e.unlock(self.slot[s])

    def _pin(self, s: int) -> None:
        if self.pinned[s]:
            return
        self.pinned[s] = 1
        if self.lazy:
            self.log.append((_PIN, s))
        else:
            self.e.pin(self.slot[s])

    def _sync(self, held: list[int]) -> None:
        """NOTE [ Lazy replay ] 2: bring the engine up to date; ``held``: storages locked now."""
        p, e, slot, last = self.p, self.e, self.slot, self.last
        stamped = {}  # storage -> the last access its new / remat gave the engine
        for entry in self.log:
            k, s = entry[0], entry[1]
            if k == _NEW:
                o, now = entry[2], entry[3]
                v = e.new(p.op_cost[o], p.st_size[s], now, [slot[q] for q in p.op_new_parents[o]])
                slot[s] = v
                self.sid_of_slot[v] = s
                stamped[s] = now
            elif k == _EVICT:
                e.evict(slot[s])
            elif k == _REMAT:
                e.remat(slot[s], entry[2])
                stamped[s] = entry[2]
            elif k == _COST:
                e.set_cost(slot[s], entry[2])
            elif k == _EDGES:
                e.add_parents(slot[s], [slot[q] for q in entry[2]])
            else:
                e.pin(slot[s])
        for s, now in stamped.items():
            if last[s] != now:
                e.access(slot[s], last[s])
        for s in held:
            e.lock(slot[s])
        self.log = []
        self.lazy = False

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
        if self.lazy:
            self.log.append((_EVICT, s))
        else:
            self.e.evict(self.slot[s])


def _held(stack: list, sid: list) -> list[int]:
    """The storages locked by the frames of ``_materialize``'s stack (with multiplicity): each
    frame's inputs but its missing ones still to be computed (NOTE [ Lazy replay ] 2)."""
    held = []
    for frame in stack:
        pending = frame[3][frame[4]:]
        for q in frame[2]:
            if q in pending:
                pending.remove(q)
            else:
                held.append(sid[q])
    return held

"""The runtime's twin: a trace replayed through the DTR core, as the runtime runs a program.

# NOTE [ The twin ]
# 1. ``semantics="runtime"`` drives one :class:`tritondtr.core.Core`, the object the runtime's
#    session drives, with the same calls in the same order; its executor only counts. So
#    every rule of the runtime (lazy engine, backward pins, the rematerialization plan, "a
#    recomputation is not a use", lock relaxation, thrash detection, ...) is the twin's too,
#    written once.
# 2. A CALL is the session's ``_call``: ``prepare``; ``use`` of every input that is a
#    tracked storage, in input order (duplicates too); ``begin``; the locks taken are
#    released; then per output in order: a view adds nothing, an ``UNTRACKED`` placeholder
#    nothing, an output that ``writes`` input k first hands out k's storage, and every other
#    output is a ``new`` storage of the op's cost whose parents are the tracked inputs not
#    flagged ``BLANK``; then ``end``. Constants are external: never used, never counted.
# 3. Between ops: the last ``release`` of a storage's tensors releases it (its buffer is
#    freed, it stays recomputable), unless an in-place write handed it out already (the
#    trace releases the old version's tensors after the write: the runtime has no wrapper
#    of it left to release), ``forget`` forgets it, ``materialize`` makes it resident
#    (and unlocks it), ``freeze`` freezes. ``output``, ``retain`` of a released storage and
#    ``annotate`` change nothing.
# 4. For a trace recorded by ``tritondtr.trace(budget=B, heuristic=H)``, a replay at B and H
#    makes exactly the recorded run's evictions and rematerializations and reaches its peak
#    (NOTE [ Recording a trace ] rule 8; tests/sim/test_twin.py). Other traces carry fewer
#    annotations or none: the DTR authors' logs flag the storages of their backward pass,
#    from their own mark (NOTE [ DTR log import ] rule 8 in traceformat/dtrlog.py), and
#    nothing else; generated ones nothing. Their storages are never flagged ``PINNED``
#    (never_evict) and never forgotten, as in the paper's simulator.
# 5. Accounting is the runtime's: the bytes of the tracked storages resident, constants
#    excluded (NOTE [ Budget accounting ]), so a budget here is the number ``enable(budget=)``
#    takes. The clock (``compute``) adds each op's cost once and each recomputation's again.
# 6. Failure: ``oom`` when the core raises BudgetError, ``thrash`` when it raises
#    ThrashError or, with an ``overhead_limit``, when the recomputation cost exceeds
#    ``(overhead_limit - 1) x`` the trace's compute.
# 7. Work of the recorded session outside completed ops is replayed too: ``evict_all`` evicts
#    every candidate (``session.evict_all()``), and a CALL whose placeholder output is flagged
#    ``FAILED`` is an op that raised BudgetError before it ran and that the program caught
#    (NOTE [ Runtime annotations ] 1): its inputs are used and room is made as for any op, a
#    BudgetError (or ThrashError) there is the recorded outcome, not a failure of the
#    replay, and nothing else happens.
# 8. Prefetch (NOTE [ Asynchronous offload ] rule 5 in core/offload.py): as the runtime, in
#    the previous step's order of reads (``prefetch=True``, the core's NOTE [ Step plan ]:
#    the same calls, so the same prefetches), none (False), or in the trace's own order
#    (``"trace"``, standing for the previous step's: a recorded single step, replayed as a
#    step that repeats).
# 9. Refused copies (NOTE [ Asynchronous offload ] rule 7 in core/offload.py): the copies
#    the run's executor refused are refused again, by their number (``refuse``; ``simulate``
#    gives the recorded ones to a replay at the recorded budget, heuristic and link, and
#    none to any other: there the host's memory is another question).
"""

from __future__ import annotations

import bisect
import gc
import time
from collections.abc import Callable

import torch

from ..core import BudgetError, Core, ThrashError
from ..core.link import Link
from ..engine.residency import EXTERNAL, FREE, RESIDENT
from ..traceformat.trace import EventKind, InputFlag, TensorFlag, Trace
from .replay import RunStats

__all__ = ["replay_runtime"]

_CALL, _RELEASE, _RETAIN = int(EventKind.CALL), int(EventKind.RELEASE), int(EventKind.RETAIN)
_FORGET, _MATERIALIZE, _FREEZE, _EVICT_ALL = (
    int(EventKind.FORGET),
    int(EventKind.MATERIALIZE),
    int(EventKind.FREEZE),
    int(EventKind.EVICT_ALL),
)
_PINNED, _BACKWARD, _UNTRACKED, _FAILED = (int(f) for f in TensorFlag)
_BLANK = int(InputFlag.BLANK)
_BLOCK = 4096  # events between two ``on_event`` calls


class _Overhead(Exception):
    """Rule 6: the recomputations exceeded the overhead limit."""


class _Counter:
    """The twin's executor: a recomputation only adds its op's cost (rule 5); the copies
    numbered in ``refuse`` are refused (rule 9)."""

    def __init__(self, limit: float | None, refuse=()) -> None:
        self.core: Core | None = None
        self.limit = limit
        self.remat_compute = 0.0
        self.refuse = frozenset(refuse)

    def recompute(self, sid: int, consume: int = -1) -> None:
        self.remat_compute += self.core.cost[sid]
        if self.limit is not None and self.remat_compute > self.limit:
            raise _Overhead

    def free(self, sid: int) -> None:
        pass

    def keep(self, sid: int) -> None:
        pass

    def copy_out(self, sid: int) -> None:  # NOTE [ Offload ] in core/core.py: the core
        self._refused()  # counts the bytes and the link's time

    def fetch(self, sid: int, hint: bool = False) -> None:
        if hint:
            self._refused()

    def _refused(self) -> None:
        if self.refuse and self.core.copies.asked in self.refuse:
            raise RuntimeError("refused, as in the recorded run (NOTE [ The twin ] rule 9)")

    def drop_copy(self, sid: int) -> None:
        pass


def replay_runtime(
    trace: Trace,
    heuristic,
    budget: int | None,
    *,
    backend: str = "auto",
    device: torch.device | str | None = None,
    stress: bool = False,
    pin_backward: bool = True,
    remat_limit: float | None = None,
    on_event: Callable[[int], None] | None = None,
    reuse: int = 0,
    link: Link | None = None,
    always_offload: bool = False,
    ahead: bool = True,
    prefetch: bool | str = True,
    copy_scale: float | None = None,
    refuse=(),
) -> tuple[RunStats, Core]:
    """Replay ``trace`` in the runtime's semantics (NOTE [ The twin ]) under ``budget`` bytes
    of tracked storages (None: unlimited). ``remat_limit``: recomputation cost at which the
    run stops as ``thrash``; ``reuse``: the engine's NOTE [ Stale batched choice ]; ``link``:
    offload over it too, priced or ``always_offload`` (NOTE [ Offload ] in core/core.py),
    copying ahead of the budget (``ahead``) and prefetching (``prefetch``: True, False or
    ``"trace"``, rule 8; NOTE [ Asynchronous offload ] in core/offload.py), a copy's price
    scaled by ``copy_scale`` (None: chosen by rehearsal at the second step's end, as the
    runtime does; NOTE [ Copy price scale ]); ``refuse``: the numbers of the copies the
    executor refuses (rule 9).
    Returns the run's counters and the core (its ``stats``, its engine's scorings)."""
    counter = _Counter(remat_limit, refuse)
    core = Core(
        budget,
        heuristic,
        counter,
        backend=backend,
        stress=stress,
        pin_backward=pin_backward,
        reuse=reuse,
        link=link,
        always_offload=always_offload,
        ahead=ahead,
        prefetch=prefetch is True and link is not None,
        copy_scale=copy_scale,
    )
    counter.core = core
    run = _Twin(trace, core, torch.device(device or "cpu"))
    if prefetch == "trace" and link is not None:
        run.plan = _Plan(run)
        core.set_plan(run.plan)
    collecting = gc.isenabled()
    gc.disable()  # the replay makes no reference cycles (see replay.py)
    t0 = time.perf_counter()
    status = "ok"
    try:
        run.run(on_event)
    except ThrashError:
        status = "thrash"
    except BudgetError:
        status = "oom"
    except _Overhead:
        status = "thrash"
    finally:
        if collecting:
            gc.enable()
    st = core.stats
    stats = RunStats(
        status=status,
        clock=run.compute + counter.remat_compute + st.link_wait_ns,
        peak_bytes=st.peak_bytes,
        evictions=st.evictions,
        eager_evictions=st.freed,
        remats=st.rematerializations,
        remat_compute=counter.remat_compute,
        selections=st.evictions,
        wall_s=time.perf_counter() - t0,
    )
    return stats, core


class _Twin:
    """The state of one replay: per tensor, its storage's base tensor; per base tensor, the
    core id of its storage and the references its tensors hold."""

    def __init__(self, trace: Trace, core: Core, device: torch.device) -> None:
        self.t = trace
        self.core = core
        self.device = device
        n = trace.num_tensors
        self.base = [-1] * n  # -1: a constant or an untracked placeholder
        self.sid = [-1] * n  # per base tensor; -1 once forgotten
        self.refs = [0] * n  # per base tensor
        self.handed = bytearray(n)  # per base tensor: its version was written in place
        self.compute = 0.0
        self.op = -1  # the op replayed now
        self.plan: _Plan | None = None  # rule 8
        tr = trace
        self.in_ptr, self.inputs = tr.in_ptr.tolist(), tr.inputs.tolist()
        self.in_flags = tr.in_flags.tolist()
        self.out_ptr, self.size, self.alias = (
            tr.out_ptr.tolist(),
            tr.size.tolist(),
            tr.alias.tolist(),
        )
        self.flags, self.writes = tr.flags.tolist(), tr.writes.tolist()
        self.cost = tr.op_cost.tolist()
        names = tr.names
        self.name = [names[i] for i in tr.op_name.tolist()] if names else ["op"] * tr.num_ops

    def run(self, on_event) -> None:
        core, base, sid_of, refs, handed = self.core, self.base, self.sid, self.refs, self.handed
        kinds, args = self.t.kind.tolist(), self.t.arg.tolist()
        call = self._call
        for i in range(0, len(kinds), _BLOCK):
            if on_event is not None:
                on_event(i)
            for k, a in zip(kinds[i : i + _BLOCK], args[i : i + _BLOCK]):
                if k == _CALL:
                    call(a)
                elif k == _RELEASE:
                    b = base[a]
                    if b >= 0:
                        r = refs[b] = refs[b] - 1
                        if r == 0 and sid_of[b] >= 0 and not handed[b]:  # rule 3
                            core.release(sid_of[b])
                elif k == _FORGET:
                    b = base[a]
                    if b >= 0 and sid_of[b] >= 0:
                        core.forget(sid_of[b])
                        sid_of[b] = -1
                elif k == _MATERIALIZE:
                    b = base[a]
                    s = sid_of[b] if b >= 0 else -1
                    if s >= 0 and core.state[s] != RESIDENT and core.state[s] != EXTERNAL:
                        core.materialize(s)
                        core.unlock(s)
                elif k == _FREEZE:
                    if core.device is not None:
                        core.freeze()
                elif k == _EVICT_ALL:
                    if core.device is not None:
                        core.evict_all()
                elif k == _RETAIN:
                    b = base[a]
                    if b >= 0:
                        refs[b] += 1

    def _call(self, o: int) -> None:
        """NOTE [ The twin ] rule 2."""
        self.op = o
        if self.flags[self.out_ptr[o]] & _FAILED:
            return self._attempt(o)
        core, base, sid_of = self.core, self.base, self.sid
        inputs, lo = self.inputs, self.in_ptr[o]
        parents = []
        name = self.name[o]
        core.enter(name, self._used(o, parents))  # NOTE [ Op protocol ] in core/core.py
        core.release_inputs()
        parents = tuple(parents)
        cost = self.cost[o]
        self.compute += cost
        refs, flags, writes = self.refs, self.flags, self.writes
        bw = core.pin_backward
        for t in range(self.out_ptr[o], self.out_ptr[o + 1]):
            a = self.alias[t]
            if a >= 0:
                b = base[t] = base[inputs[lo + a]]
                if b >= 0:
                    refs[b] += 1
                continue
            f = flags[t]
            if f & _UNTRACKED:
                continue
            w = writes[t]
            old, alone = -1, True
            if w >= 0:
                old = sid_of[base[inputs[lo + w]]]
                core.hand_out(old)
                self.handed[base[inputs[lo + w]]] = 1  # rule 3: its tensors release nothing
                # NOTE [ Fused versions ] rule 3 in core/core.py: the op's only write?
                alone = (
                    sum(writes[u] >= 0 for u in range(self.out_ptr[o], self.out_ptr[o + 1])) == 1
                )
            if core.device is None:
                core.start(self.device)
            sid_of[t] = core.new(
                self.size[t],
                cost,
                parents,
                name,
                bool(f & _PINNED),
                bw and bool(f & _BACKWARD),
                old,
                alone,
            )
            if old >= 0 and core.state[old] == FREE:  # NOTE [ Fused versions ] rule 5
                sid_of[base[inputs[lo + w]]] = -1
            base[t] = t
            refs[t] = 1
            if self.plan is not None:
                self.plan.tensor_of[sid_of[t]] = t
        core.end(cost)

    def _used(self, o: int, parents: list[int]) -> list[int]:
        """Op ``o``'s tracked inputs, in input order, for ``Core.enter`` (NOTE [ Op protocol ]
        in core/core.py); those that are its parents (not ``BLANK``) go to ``parents``."""
        base, sid_of, state = self.base, self.sid, self.core.state
        inputs, in_flags = self.inputs, self.in_flags
        used = []
        for p in range(self.in_ptr[o], self.in_ptr[o + 1]):
            b = base[inputs[p]]
            if b < 0:
                continue
            s = sid_of[b]
            if s < 0 or state[s] == EXTERNAL:
                continue
            used.append(s)
            if not in_flags[p] & _BLANK:
                parents.append(s)
        return used

    def _attempt(self, o: int) -> None:
        """NOTE [ The twin ] rule 7: the session's ``_call`` of an op that raised BudgetError
        before it ran: ``Core.enter`` with its tracked inputs, which raises; its locks are
        released; no output, no ``end``, no compute."""
        core = self.core
        try:
            core.enter(self.name[o], self._used(o, []))
        except BudgetError:
            pass
        finally:
            core.release_inputs()


class _Plan:
    """Rule 8: the ops that read each base tensor, from the trace (the twin's bases, found
    statically: a view's is its input's, a tracked output is its own)."""

    def __init__(self, run: _Twin) -> None:
        self.run = run
        self.tensor_of: dict[int, int] = {}  # core id -> the base tensor it is now
        base, reads = [-1] * len(run.size), {}
        inputs, alias, flags = run.inputs, run.alias, run.flags
        for o in range(len(run.out_ptr) - 1):
            lo = run.in_ptr[o]
            for p in range(lo, run.in_ptr[o + 1]):
                b = base[inputs[p]]
                if b >= 0:
                    reads.setdefault(b, []).append(o)
            for t in range(run.out_ptr[o], run.out_ptr[o + 1]):
                a = alias[t]
                if a >= 0:
                    base[t] = base[inputs[lo + a]]
                elif not flags[t] & _UNTRACKED:
                    base[t] = t
        self.reads = reads

    epoch = 0  # ReadPlan.epoch: one trace, one axis

    def position(self) -> int:
        return self.run.op + 1

    def next_read(self, sid: int) -> int | None:
        t = self.tensor_of.get(sid)
        ops = self.reads.get(t) if t is not None else None
        if not ops:
            return None
        i = bisect.bisect_left(ops, self.run.op + 1)
        return ops[i] if i < len(ops) else None

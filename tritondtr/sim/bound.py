"""A lower bound on the recomputation any schedule needs under a budget, for traces of any size.

The optimum is known for chains (:mod:`.revolve`) and small graphs (:mod:`.checkmate`); for a
recorded training step of thousands of ops neither applies, but this bound does: it is what
no eviction policy, however clever, can beat.

# NOTE [ Cut bound ]
# 1. A cut is the moment an op of the trace is about to run for the first time, after room
#    was made. There, every storage made earlier that some later event still reads is
#    *live*; the op's inputs must be resident, and what else is resident must fit in the
#    budget: ``required + resident live <= budget`` (in the paper's semantics ``required``
#    also holds the op's fresh outputs and the constants still read; in the runtime's,
#    constants are not counted and outputs are counted after the check, NOTE [ Budget
#    accounting ]).
# 2. A live storage absent at the cut must be recomputed before its next read: its op runs
#    again, at the op's cost. So at least ``live + required - budget`` bytes of live storages
#    are recomputed after the cut, and the extra compute is at least the cheapest way to
#    pick that many bytes, relaxed to a fractional knapsack: live storages grouped by op (one
#    run of an op brings back all its outputs; the runtime pays per storage, which only costs
#    more), groups taken in order of cost per byte. The recomputation count is at least the
#    fewest groups that cover the bytes (largest first).
# 3. The bound is the largest over all cuts (one recomputation can serve several cuts, so
#    cuts do not add up). ``required > budget`` at some cut: no schedule fits (``infeasible``).
# 4. Reads are op inputs (through views, to their storage) and, in the runtime's semantics,
#    ``materialize``; in the paper's, the trace's ``output`` events read at the end. A storage
#    stops being read once the runtime stops counting it: ``forget``, an in-place write
#    handing its buffer to the new version, ``freeze`` (NOTE [ The twin ] rules 2-3). Leaving
#    out a read only makes the bound smaller, never wrong.
# 5. Units: the trace's (ns of compute, bytes). It is a lower bound of the optimum, not a
#    schedule; tests/test_sim_bound.py checks it against revolve's optimum on chains and
#    against every heuristic's replay on the zoo.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..traceformat.trace import EventKind, TensorFlag, Trace
from .program import compile_trace

__all__ = ["CutBound", "cut_bound"]

_CALL, _OUTPUT, _FORGET = int(EventKind.CALL), int(EventKind.OUTPUT), int(EventKind.FORGET)
_MATERIALIZE, _FREEZE = int(EventKind.MATERIALIZE), int(EventKind.FREEZE)
_UNTRACKED = int(TensorFlag.UNTRACKED)


@dataclass(frozen=True)
class CutBound:
    """NOTE [ Cut bound ] at one budget.

    ``status``: ``ok`` or ``infeasible`` (some op's required bytes exceed the budget; the
    bounds are then inf). ``extra_cost``: least recomputation compute (ns); ``remats``: least
    recomputing op runs; ``op``: the name of the op whose cut gives ``extra_cost`` (or that
    does not fit).
    """

    budget: int
    status: str
    extra_cost: float
    remats: int | float
    op: str


@dataclass(frozen=True)
class _Storages:
    """Per storage: made at event ``born`` (-1: a constant), last read at event ``last``
    (-1: never), ``size`` bytes, made by ``op``, ``droppable`` (False: a constant)."""

    born: np.ndarray
    last: np.ndarray
    size: np.ndarray
    op: np.ndarray
    droppable: np.ndarray
    cuts: list  # [(event index, op, input storages, bytes required beside them)]


def cut_bound(trace: Trace, budgets: Sequence[int], semantics: str = "runtime") -> list[CutBound]:
    """NOTE [ Cut bound ] of ``trace`` at each of ``budgets`` (bytes, as ``simulate`` takes
    them in ``semantics``). O(cuts x live storages) with numpy: seconds for 1e4 ops."""
    if semantics == "runtime":
        st = _runtime_storages(trace)
    elif semantics == "paper":
        st = _paper_storages(trace)
    else:
        raise ValueError(f"semantics must be 'paper' or 'runtime', got {semantics!r}")
    budgets = np.asarray([int(b) for b in budgets], dtype=np.float64)
    cost = trace.op_cost.astype(np.float64)
    names = trace.names
    best = np.zeros(len(budgets))
    count = np.zeros(len(budgets))
    where = [""] * len(budgets)
    infeasible = np.zeros(len(budgets), dtype=bool)
    live_all = st.last >= 0
    for e, o, ins, extra in st.cuts:
        live = live_all & (st.born < e) & (st.last >= e)
        total = float(st.size[live].sum()) + extra
        if total <= budgets.min():
            continue
        live[ins] = False  # the op's inputs: required
        drop = live & st.droppable & (st.last > e)
        free = float(st.size[drop].sum())
        required = total - free
        name = names[trace.op_name[o]] if names else f"op {o}"
        for j in np.flatnonzero(required > budgets):
            if not infeasible[j]:
                infeasible[j], where[j] = True, name
        need = total - budgets
        ok = (need > 0) & (required <= budgets)
        if not ok.any():
            continue
        groups, inv = np.unique(st.op[drop], return_inverse=True)
        gbytes = np.bincount(inv, weights=st.size[drop])
        groups, gbytes = groups[gbytes > 0], gbytes[gbytes > 0]
        gcost = cost[groups]
        order = np.argsort(gcost / gbytes, kind="stable")
        cb = np.concatenate([[0.0], np.cumsum(gbytes[order])])
        cc = np.concatenate([[0.0], np.cumsum(gcost[order])])
        lb = np.interp(need, cb, cc)
        big = np.concatenate([[0.0], np.cumsum(np.sort(gbytes)[::-1])])
        n = np.searchsorted(big, need, side="left").astype(np.float64)
        for j in np.flatnonzero(ok):
            if lb[j] > best[j]:
                best[j], where[j] = lb[j], name
            count[j] = max(count[j], n[j])
    out = []
    for j, b in enumerate(budgets):
        if infeasible[j]:
            out.append(CutBound(int(b), "infeasible", np.inf, np.inf, where[j]))
        else:
            out.append(CutBound(int(b), "ok", float(best[j]), int(count[j]), where[j]))
    return out


def _runtime_storages(trace: Trace) -> _Storages:
    """The twin's storages (NOTE [ The twin ] rule 2): fresh tracked outputs of calls."""
    in_ptr, inputs = trace.in_ptr.tolist(), trace.inputs.tolist()
    out_ptr, alias = trace.out_ptr.tolist(), trace.alias.tolist()
    flags, writes, size = trace.flags.tolist(), trace.writes.tolist(), trace.size.tolist()
    base = [-1] * trace.num_tensors
    sid = [-1] * trace.num_tensors  # per base tensor; -1 once no longer read (rule 4)
    born, last, ssize, sop, cuts = [], [], [], [], []
    frozen = 0  # storages below this id were frozen
    for e, (k, a) in enumerate(zip(trace.kind.tolist(), trace.arg.tolist())):
        if k == _CALL:
            lo = in_ptr[a]
            ins = []
            for p in range(lo, in_ptr[a + 1]):
                b = base[inputs[p]]
                s = sid[b] if b >= 0 else -1
                if s >= frozen:
                    last[s] = e
                    ins.append(s)
            cuts.append((e, a, np.asarray(ins, dtype=np.int64), 0.0))
            for t in range(out_ptr[a], out_ptr[a + 1]):
                if alias[t] >= 0:
                    base[t] = base[inputs[lo + alias[t]]]
                    continue
                if flags[t] & _UNTRACKED:
                    continue
                if writes[t] >= 0:
                    old = base[inputs[lo + writes[t]]]
                    if old >= 0:
                        sid[old] = -1  # handed out
                base[t], sid[t] = t, len(born)
                born.append(e)
                last.append(-1)
                ssize.append(size[t])
                sop.append(a)
        elif k in (_FORGET, _MATERIALIZE):
            b = base[a]
            s = sid[b] if b >= 0 else -1
            if s >= frozen:
                if k == _FORGET:
                    sid[b] = -1
                else:
                    last[s] = e
        elif k == _FREEZE:
            frozen = len(born)
    n = len(born)
    return _Storages(
        np.asarray(born, dtype=np.int64),
        np.asarray(last, dtype=np.int64),
        np.asarray(ssize, dtype=np.float64),
        np.asarray(sop, dtype=np.int64),
        np.ones(n, dtype=bool),
        cuts,
    )


def _paper_storages(trace: Trace) -> _Storages:
    """The paper replay's storages (NOTE [ Replay semantics ] rule 1): every fresh tensor,
    constants included; a call's fresh outputs are required at its cut."""
    p = compile_trace(trace)
    n = p.num_storages
    born = np.full(n, -1, dtype=np.int64)
    last = np.full(n, -1, dtype=np.int64)
    sop = np.zeros(n, dtype=np.int64)
    sid = np.asarray(p.sid, dtype=np.int64)
    fresh = trace.alias < 0
    sop[sid[fresh]] = trace.op_of_tensor()[fresh]
    droppable = ~np.asarray(p.is_const, dtype=bool)[sop]
    cuts = []
    kinds, args = trace.kind.tolist(), trace.arg.tolist()
    end = len(kinds)
    for e, (k, a) in enumerate(zip(kinds, args)):
        if k == _CALL:
            ins = [p.sid[t] for t in p.op_inputs[a]]
            last[ins] = e
            fresh_st = list(p.op_fresh_st[a])
            born[fresh_st] = e
            cuts.append((e, a, np.asarray(ins, dtype=np.int64), float(p.op_total[a])))
        elif k == _OUTPUT:
            last[p.sid[a]] = end
    return _Storages(born, last, np.asarray(p.st_size, dtype=np.float64), sop, droppable, cuts)

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
#    ``materialize``; in the paper's, the trace's ``output`` events read at the end. A call
#    flagged ``FAILED`` (it raised BudgetError before it ran, NOTE [ The twin ] rule 7) is
#    neither a cut nor a read: the budget did not hold there, by definition. A storage
#    stops being read once the runtime stops counting it: ``forget``, an in-place write
#    handing its buffer to the new version, ``freeze`` (NOTE [ The twin ] rules 2-3). Leaving
#    out a read only makes the bound smaller, never wrong.
# 5. Units: the trace's (ns of compute, bytes). It is a lower bound of the optimum, not a
#    schedule; tests/sim/test_bound.py checks it against revolve's optimum on chains and
#    against every heuristic's replay on the zoo.

# NOTE [ Support bound ]
# 1. The cut bound prices a live storage absent at a cut at its own op's cost. In the
#    runtime's semantics that is often far too cheap: the storages its op read may be gone
#    (released, handed out to an in-place write, forgotten), and then they are recomputed
#    first, and theirs before them. An RNN cell's gate, written in place five times from a
#    released matrix product, costs the whole chain, not its last ``mul_``.
# 2. So at a cut (rule 1 of NOTE [ Cut bound ], runtime semantics only) a linear program
#    decides, per storage s met, ``m_s`` (resident at the cut) and per op o, ``r_o`` (run
#    again after the cut) and ``q_o`` (run again before it), all in [0, 1]:
#    * a live storage is resident or brought back: ``m_s + r_op(s) >= 1``;
#    * an op run again needs each input storage p resident when it runs: either resident at
#      the cut, or brought back after it: ``r_o <= m_p + r_op(p)``;
#    * a storage whose buffer was gone before the cut (released, handed out, forgotten) is
#      resident at the cut only if its op ran again before it: ``m_p <= q_op(p)``; one still
#      held costs nothing to keep but its bytes;
#    * the resident bytes fit: ``sum size_s m_s <= budget - required`` (the op's inputs);
#    minimising ``sum cost_o (r_o + q_o)``. Every schedule the twin can run gives a feasible
#    point (its resident set at the cut, the ops it ran again after it, and before it for
#    what it kept), with a cost at most its recomputation (one run of an op may serve
#    several storages here; the runtime pays per storage, which only costs more), so the
#    optimum is a lower bound of the recomputation of every schedule. It is a linear
#    program, not an integer one: fractions (half a storage kept, half an op run again) can
#    put it below the best schedule, never above.
# 3. Constants, frozen storages and the op's inputs are always there (no constraint). The
#    closure of ops a cut considers stops after ``max_ops``; an op beyond it gets no
#    constraint (a weaker, still valid bound).
# 4. The bound is the largest over the cuts solved: the ``cuts`` cuts whose live bytes
#    exceed the budget the most (any subset of cuts gives a valid bound), and never below
#    the cut bound. Solved with :func:`scipy.optimize.linprog` (HiGHS), ``pip install
#    tritondtr[milp]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..traceformat.trace import EventKind, InputFlag, TensorFlag, Trace
from .checkmate import SparseRows
from .program import compile_trace

__all__ = ["CutBound", "cut_bound", "support_bound"]

_CALL, _OUTPUT, _FORGET = int(EventKind.CALL), int(EventKind.OUTPUT), int(EventKind.FORGET)
_MATERIALIZE, _FREEZE = int(EventKind.MATERIALIZE), int(EventKind.FREEZE)
_RETAIN, _RELEASE = int(EventKind.RETAIN), int(EventKind.RELEASE)
_UNTRACKED, _FAILED = int(TensorFlag.UNTRACKED), int(TensorFlag.FAILED)
_BLANK = int(InputFlag.BLANK)


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
        st = _runtime_storages(_runtime_graph(trace))
    elif semantics == "paper":
        st = _paper_storages(trace)
    else:
        raise ValueError(f"semantics must be 'paper' or 'runtime', got {semantics!r}")
    return _cut_bounds(trace, st, budgets)


def _cut_bounds(trace: Trace, st: _Storages, budgets: Sequence[int]) -> list[CutBound]:
    """NOTE [ Cut bound ] rules 1-3 over the storages ``st`` of ``trace``."""
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


def _runtime_storages(g: _Graph) -> _Storages:
    """The twin's storages (NOTE [ The twin ] rule 2): fresh tracked outputs of calls."""
    return _Storages(
        np.asarray(g.born, dtype=np.int64),
        np.asarray(g.last, dtype=np.int64),
        np.asarray(g.size, dtype=np.float64),
        np.asarray(g.op, dtype=np.int64),
        np.ones(len(g.born), dtype=bool),
        [(e, a, np.asarray(ins, dtype=np.int64), 0.0) for e, a, ins in g.cuts],
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


def support_bound(
    trace: Trace, budgets: Sequence[int], *, cuts: int = 16, max_ops: int = 4000
) -> list[CutBound]:
    """NOTE [ Support bound ] of ``trace`` at each of ``budgets`` (bytes of tracked storages,
    the runtime's semantics, as ``simulate(..., semantics="runtime")`` takes them): at least
    the cut bound, and at least the optimum of rule 2's linear program at each of the
    ``cuts`` cuts most over the budget. ``remats`` is the cut bound's. Needs scipy."""
    try:
        from scipy import optimize, sparse
    except ImportError as e:  # pragma: no cover - scipy is in the dev extra
        raise ImportError("support_bound needs scipy: pip install 'tritondtr[milp]'") from e
    g = _runtime_graph(trace)
    base = _cut_bounds(trace, _runtime_storages(g), budgets)
    cost = trace.op_cost.astype(np.float64)
    out = []
    for b, cb in zip(budgets, base):
        best = cb.extra_cost
        where = cb.op
        if cb.status == "ok":
            names = trace.names
            for o, lb in _support_cuts(g, int(b), cuts, max_ops, cost, optimize, sparse):
                if lb > best:
                    best = lb
                    where = names[trace.op_name[o]] if names else f"op {o}"
        out.append(CutBound(int(b), cb.status, float(best), cb.remats, where))
    return out


@dataclass(frozen=True)
class _Graph:
    """The twin's storages, as both bounds need them: per storage (ids in creation order)
    the event that made it (``born``), its last read (-1: never), the event its buffer was
    ``gone`` (released, handed out or forgotten; len(events): never), ``size`` and ``op``;
    per op the storages it read as parents (``op_in``, blank inputs left out); per cut
    (event, op, input storages) and how many storages were frozen there (``frozen_at``)."""

    born: list
    last: list
    gone: list
    size: list
    op: list
    frozen_at: list  # per cut: storages with a smaller id are frozen there
    op_in: list
    cuts: list


def _runtime_graph(trace: Trace) -> _Graph:
    """Walk the events as the twin does (NOTE [ The twin ] rules 2-3)."""
    in_ptr, inputs = trace.in_ptr.tolist(), trace.inputs.tolist()
    in_flags = trace.in_flags.tolist()
    out_ptr, alias = trace.out_ptr.tolist(), trace.alias.tolist()
    flags, writes, size = trace.flags.tolist(), trace.writes.tolist(), trace.size.tolist()
    kinds, args = trace.kind.tolist(), trace.arg.tolist()
    never = len(kinds)
    base = [-1] * trace.num_tensors
    sid = [-1] * trace.num_tensors  # per base tensor; -1 once no longer read
    refs = [0] * trace.num_tensors
    born, last, gone, ssize, sop = [], [], [], [], []
    op_in: list = [()] * trace.num_ops
    cuts, frozen_at = [], []
    frozen = 0
    for e, (k, a) in enumerate(zip(kinds, args)):
        if k == _CALL:
            lo, hi = in_ptr[a], in_ptr[a + 1]
            if out_ptr[a] < out_ptr[a + 1] and flags[out_ptr[a]] & _FAILED:
                continue  # NOTE [ Cut bound ] rule 4
            ins, parents = [], []
            for p in range(lo, hi):
                b = base[inputs[p]]
                s = sid[b] if b >= 0 else -1
                if s >= frozen:  # a frozen storage is outside the budget (rule 3)
                    last[s] = e
                    ins.append(s)
                    if not in_flags[p] & _BLANK:
                        parents.append(s)
            op_in[a] = tuple(dict.fromkeys(parents))
            cuts.append((e, a, tuple(dict.fromkeys(ins))))
            frozen_at.append(frozen)
            for t in range(out_ptr[a], out_ptr[a + 1]):
                if alias[t] >= 0:
                    b = base[t] = base[inputs[lo + alias[t]]]
                    if b >= 0:
                        refs[b] += 1
                    continue
                if flags[t] & _UNTRACKED:
                    continue
                if writes[t] >= 0:
                    old = base[inputs[lo + writes[t]]]
                    if old >= 0 and sid[old] >= 0:
                        gone[sid[old]] = min(gone[sid[old]], e)  # handed out
                        sid[old] = -1
                base[t], sid[t], refs[t] = t, len(born), 1
                born.append(e)
                last.append(-1)
                gone.append(never)
                ssize.append(size[t])
                sop.append(a)
        elif k in (_RELEASE, _RETAIN):
            b = base[a]
            if b >= 0:
                r = refs[b] = refs[b] + (1 if k == _RETAIN else -1)
                if r == 0 and sid[b] >= 0:
                    gone[sid[b]] = min(gone[sid[b]], e)  # freed (Core.release)
        elif k in (_FORGET, _MATERIALIZE):
            b = base[a]
            s = sid[b] if b >= 0 else -1
            if s >= 0:
                if k == _FORGET:
                    gone[s] = min(gone[s], e)
                    sid[b] = -1
                elif s >= frozen:
                    last[s] = e
        elif k == _FREEZE:
            frozen = len(born)
    return _Graph(born, last, gone, ssize, sop, frozen_at, op_in, cuts)


def _support_cuts(g: _Graph, budget: int, k: int, max_ops: int, cost, optimize, sparse):
    """Rule 2's optimum at the ``k`` cuts whose live bytes exceed ``budget`` the most:
    yields (op, bound)."""
    born = np.asarray(g.born, dtype=np.int64)
    last = np.asarray(g.last, dtype=np.int64)
    size = np.asarray(g.size, dtype=np.float64)
    over = []
    for i, (e, _, _) in enumerate(g.cuts):
        live = (born < e) & (last >= e)
        live[: g.frozen_at[i]] = False
        total = float(size[live].sum())
        if total > budget:
            over.append((total - budget, i))
    over.sort(reverse=True)
    for _, i in over[:k]:
        lb = _solve_cut(g, i, budget, max_ops, cost, born, last, optimize, sparse)
        if lb is not None:
            yield g.cuts[i][1], lb


def _solve_cut(g, i, budget, max_ops, cost, born, last, optimize, sparse):
    """The linear program of NOTE [ Support bound ] rule 2 at cut ``i``; None if it has no
    solution (the cut bound then already says infeasible or the solver failed)."""
    e, _, ins = g.cuts[i]
    frozen = g.frozen_at[i]
    required = set(ins)
    room = budget - sum(g.size[s] for s in required)
    if room < 0:
        return None
    live = [
        int(s)
        for s in np.flatnonzero((born < e) & (last >= e))
        if s >= frozen and s not in required
    ]
    mvar: dict[int, int] = {}  # storage -> column of m_s
    rvar: dict[int, int] = {}  # op -> column of r_o
    qvar: dict[int, int] = {}  # op -> column of q_o
    obj: list[float] = []

    def col(d, key, c):
        j = d.get(key)
        if j is None:
            j = d[key] = len(obj)
            obj.append(c)
        return j

    cons = SparseRows()

    def le(terms, b):  # sum coef * x <= b
        cons.add(terms, -np.inf, b)

    todo = []
    for s in live:  # a live storage is resident or brought back
        o = g.op[s]
        new = o not in rvar
        le([(col(mvar, s, 0.0), -1.0), (col(rvar, o, cost[o]), -1.0)], -1.0)
        if new:
            todo.append(o)
    expanded = set()
    while todo:
        o = todo.pop()
        if o in expanded or len(expanded) >= max_ops:
            continue
        expanded.add(o)
        r_o = rvar[o]
        for p in g.op_in[o]:
            if p < frozen or p in required:
                continue  # always there (rule 3)
            po = g.op[p]
            new = po not in rvar
            m_p = col(mvar, p, 0.0)
            le([(r_o, 1.0), (m_p, -1.0), (col(rvar, po, cost[po]), -1.0)], 0.0)
            if new:
                todo.append(po)
    for p, m_p in mvar.items():
        if g.gone[p] <= e:  # its buffer was gone: resident only if run again before
            le([(m_p, 1.0), (col(qvar, g.op[p], cost[g.op[p]]), -1.0)], 0.0)
    le([(m, float(g.size[s])) for s, m in mvar.items()], float(room))
    res = optimize.linprog(
        np.asarray(obj),
        A_ub=cons.matrix(len(obj), sparse),
        b_ub=np.asarray(cons.hi),
        bounds=(0.0, 1.0),
        method="highs",
    )
    if res.status != 0:
        return None
    return float(res.fun)

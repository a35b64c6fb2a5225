"""The optimum for small graphs: exact static checkpointing as an integer program.

After Checkmate (Jain et al., MLSys 2020): stage t computes op t for the first time and may
recompute earlier ops; binary R[t, i] (op i computed in stage t) and S[t, i] (its value kept
from stage t - 1 into stage t), FREE[t, i, k] (value i dropped right after op k of stage t)
and the memory U[t, k] right after op k of stage t. It minimises the compute of all stages
under the byte budget. Solved with :func:`scipy.optimize.milp` (HiGHS): ``pip install
tritondtr[milp]``. Practical up to about 100 ops.

# NOTE [ Checkmate model ]
# 1. The graph is a trace's ops in trace order (:meth:`OpGraph.from_trace`): one value per
#    op, of the bytes of all its fresh outputs; constants are always resident and add their
#    bytes to every U. Edges are the producers of an op's inputs.
# 2. The memory semantics are the simulator's (NOTE [ Replay semantics ]): while op k runs,
#    its inputs, its output and everything kept are resident, and U[t, k] counts exactly
#    those, so U[t, k] <= budget is the simulator's "evict until the outputs fit".
# 3. A value may be dropped after its last use in a stage unless it is kept into the next
#    one: FREE[t, i, k] <= R[t, k], <= 1 - S[t+1, i], <= 1 - R[t, j] for later users j of i
#    in stage t. FREE only lowers memory, so it is continuous: at an optimum it sits at its
#    bound, 0 or 1, and only R and S are integer.
# 4. The trace's outputs must all be resident at the end (NOTE [ Trace semantics ] 4): a
#    zero-cost, zero-size sink op reads them in a last stage.
# 5. Restrictions against the simulator's dynamic schedules: the outputs of one op are
#    evicted together, and each op runs at most once per stage. The optimum here is thus
#    an upper bound of the best dynamic schedule; tests/sim/test_optimum.py finds them equal
#    against a brute-force search of every schedule on small chains and DAGs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..traceformat.trace import EventKind, Trace

__all__ = ["CheckmateResult", "OpGraph", "solve_checkmate"]


@dataclass(frozen=True)
class OpGraph:
    """A small computation graph in trace order (NOTE [ Checkmate model ] 1).

    ``cost`` [n] float64 (ns), ``size`` [n] int64 bytes of each op's value, ``deps[k]`` the
    distinct ops whose values op k reads (all < k), ``outputs`` the ops whose values must be
    resident at the end, ``constant_bytes`` the always-resident bytes.
    """

    cost: np.ndarray
    size: np.ndarray
    deps: tuple[tuple[int, ...], ...]
    outputs: tuple[int, ...]
    constant_bytes: int = 0

    @property
    def num_ops(self) -> int:
        return int(self.cost.shape[0])

    @classmethod
    def from_trace(cls, trace: Trace) -> OpGraph:
        """The graph of a trace without views (generated traces qualify)."""
        if (trace.alias >= 0).any():
            raise ValueError(
                "solve_checkmate models traces without views (alias >= 0 found); "
                "use a generated trace or one without aliasing ops"
            )
        is_const = trace.is_constant_op()
        op_of = trace.op_of_tensor()
        node = np.cumsum(~is_const) - 1  # dense node id of every non-constant op
        fresh = np.zeros(trace.num_ops, dtype=np.int64)
        np.add.at(fresh, op_of, trace.size)
        deps = []
        for o in np.flatnonzero(~is_const).tolist():
            src = op_of[trace.inputs[trace.in_ptr[o] : trace.in_ptr[o + 1]]]
            deps.append(tuple(sorted({int(node[p]) for p in src.tolist() if not is_const[p]})))
        out_ops = op_of[trace.arg[trace.kind == EventKind.OUTPUT]]
        outputs = tuple(sorted({int(node[p]) for p in out_ops.tolist() if not is_const[p]}))
        return cls(
            cost=trace.op_cost[~is_const].astype(np.float64),
            size=fresh[~is_const],
            deps=tuple(deps),
            outputs=outputs,
            constant_bytes=int(fresh[is_const].sum()),
        )


@dataclass(frozen=True)
class CheckmateResult:
    """The solution of :func:`solve_checkmate`.

    ``status``: ``optimal``, ``infeasible`` (no schedule fits the budget) or ``time_limit``
    (``extra_cost`` is then the best schedule found, ``mip_gap`` its relative gap).
    ``extra_cost``: compute beyond one run of every op (ns); ``overhead`` = total / baseline.
    ``R``, ``S``: [stages, stages] bool schedules (the last stage is the output sink).
    """

    status: str
    budget: int
    baseline_cost: float
    extra_cost: float | None
    overhead: float | None
    R: np.ndarray | None
    S: np.ndarray | None
    mip_gap: float | None
    wall_s: float


class SparseRows:
    """Constraint rows ``lo <= sum(v * x[c] for c, v in entries) <= hi`` of a sparse
    matrix, added one at a time (the Checkmate MILP here; NOTE [ Support bound ]'s linear
    programs in bound.py)."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def add(self, entries, lo: float, hi: float) -> None:
        r = len(self.lo)
        for c, v in entries:
            self.rows.append(r)
            self.cols.append(c)
            self.vals.append(v)
        self.lo.append(lo)
        self.hi.append(hi)

    def matrix(self, ncols: int, sparse):
        """The rows as a ``scipy.sparse`` CSR array of ``ncols`` columns."""
        return sparse.csr_array((self.vals, (self.rows, self.cols)), shape=(len(self.lo), ncols))


def _scipy_milp():
    try:
        from scipy import optimize, sparse
    except ImportError:
        raise ImportError(
            "solve_checkmate needs scipy (its HiGHS MILP solver): pip install tritondtr[milp]"
        ) from None
    return optimize, sparse


def solve_checkmate(
    graph: OpGraph | Trace, budget: int, *, time_limit: float = 60.0
) -> CheckmateResult:
    """The least-compute static schedule of ``graph`` under ``budget`` bytes (constants
    included, as the simulator counts them). See NOTE [ Checkmate model ]."""
    optimize, sparse = _scipy_milp()
    g = OpGraph.from_trace(graph) if isinstance(graph, Trace) else graph
    t0 = time.perf_counter()
    n = g.num_ops
    cost = np.append(g.cost, 0.0)
    size = np.append(g.size, 0).astype(np.float64)
    deps = [*g.deps, g.outputs]  # node n is the sink
    T = n + 1
    users: list[list[int]] = [[] for _ in range(T)]
    for k, ds in enumerate(deps):
        for i in ds:
            users[i].append(k)
    nvar = 0

    def new(count: int) -> np.ndarray:
        nonlocal nvar
        nvar += count
        return np.arange(nvar - count, nvar)

    R = np.full((T, T), -1, dtype=np.int64)
    S = np.full((T, T), -1, dtype=np.int64)
    U = np.full((T, T), -1, dtype=np.int64)
    for t in range(T):
        R[t, : t + 1] = new(t + 1)
        S[t, :t] = new(t)
    n_int = nvar
    for t in range(T):
        U[t, : t + 1] = new(t + 1)
    free: dict[tuple[int, int, int], int] = {}
    for t in range(T):
        for k in range(t + 1):
            for i in (*deps[k], k):
                free[t, i, k] = int(new(1)[0])
    cons = SparseRows()
    row = cons.add

    inf = np.inf
    for t in range(T):
        for k in range(t + 1):
            for i in deps[k]:  # an input is computed in this stage or kept into it
                row([(R[t, k], 1), (R[t, i], -1), (S[t, i], -1)], -inf, 0)
        if t:
            for i in range(t):  # only a value present in the last stage can be kept
                row(
                    [(S[t, i], 1), (R[t - 1, i], -1)] + ([(S[t - 1, i], -1)] if i < t - 1 else []),
                    -inf,
                    0,
                )
        # Memory: U[t, 0] = constants + kept + op 0; then U[t, k] = U[t, k-1] + op k - freed.
        row(
            [(U[t, 0], 1), (R[t, 0], -size[0])] + [(S[t, i], -size[i]) for i in range(t)],
            g.constant_bytes,
            g.constant_bytes,
        )
        for k in range(1, t + 1):
            row(
                [(U[t, k], 1), (U[t, k - 1], -1), (R[t, k], -size[k])]
                + [(free[t, i, k - 1], size[i]) for i in (*deps[k - 1], k - 1)],
                0,
                0,
            )
        for k in range(t + 1):
            for i in (*deps[k], k):
                f = free[t, i, k]
                row([(f, 1), (R[t, k], -1)], -inf, 0)
                if t + 1 < T:
                    row([(f, 1), (S[t + 1, i], 1)], -inf, 1)
                for j in users[i]:
                    if k < j <= t:
                        row([(f, 1), (R[t, j], 1)], -inf, 1)
    c = np.zeros(nvar)
    for t in range(T):
        c[R[t, : t + 1]] = cost[: t + 1]
    lb, ub = np.zeros(nvar), np.ones(nvar)
    lb[R[np.arange(T), np.arange(T)]] = 1  # stage t computes op t
    ub[U[U >= 0]] = budget
    integrality = np.zeros(nvar)
    integrality[:n_int] = 1
    A = cons.matrix(nvar, sparse)
    res = optimize.milp(
        c,
        integrality=integrality,
        bounds=optimize.Bounds(lb, ub),
        constraints=optimize.LinearConstraint(A, cons.lo, cons.hi),
        options={"time_limit": float(time_limit), "mip_rel_gap": 0.0},
    )
    base = float(g.cost.sum())
    wall = time.perf_counter() - t0
    if res.x is None:
        status = "infeasible" if res.status == 2 else "time_limit"
        return CheckmateResult(status, int(budget), base, None, None, None, None, None, wall)
    x = np.round(res.x[:n_int]).astype(bool)
    Rm = np.zeros((T, T), dtype=bool)
    Sm = np.zeros((T, T), dtype=bool)
    Rm[R >= 0] = x[R[R >= 0]]
    Sm[S >= 0] = x[S[S >= 0]]
    total = float(res.fun)
    return CheckmateResult(
        status="optimal" if res.status == 0 else "time_limit",
        budget=int(budget),
        baseline_cost=base,
        extra_cost=total - base,
        overhead=total / base if base > 0 else float("nan"),
        R=Rm,
        S=Sm,
        mip_gap=float(getattr(res, "mip_gap", 0.0) or 0.0),
        wall_s=wall,
    )

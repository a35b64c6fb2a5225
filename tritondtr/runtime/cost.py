"""Cost models: the number the heuristics score a new storage with, per op.

# NOTE [ Cost models ]
# 1. Every storage an op creates carries the op's cost (``Core.new``); the heuristics weigh
#    it against size and staleness (``dtr``: cost / (size * staleness)). Only ratios between
#    costs matter to a decision; the unit is nanoseconds so that traces and the twin's
#    compute totals read as time.
# 2. ``measured`` (the default): the host wall time of the op's first execution (on CUDA,
#    launch time). Two runs of the same program time their ops differently, so they can
#    evict, recompute and peak differently, on one machine or across machines.
# 3. ``analytic``: :class:`AnalyticCost`, a function of the op and of its arguments' and
#    outputs' shapes and dtypes only: ``op_ns + flops / flops_per_s + bytes / bytes_per_s``
#    on a stated nominal machine. FLOPs come from PyTorch's own formulas
#    (``torch.utils.flop_counter.flop_registry``: matmuls, convolutions, attention); an op
#    without one costs its bytes read and written plus ``op_ns``. With it, a run's
#    evictions, rematerializations and peak are the same on every machine and every run,
#    and its recorded trace (whose costs are these) replays to the same counts anywhere.
# 4. A callable ``fn(op, args, kwargs, out) -> float``: ``op`` the ``OpOverload``, ``args``
#    (a tuple) and ``kwargs`` the plain tensors and values it ran on, ``out`` what it returned
#    (plain tensors). Called once per op, after its first execution, never for a
#    recomputation. It must not keep the tensors nor write to them.
# 5. A cost must be a finite float > 0 (an int is taken as a float): a non-positive cost
#    makes the heuristics' ratios meaningless, a NaN is scored as +inf (never evicted).
#    Anything else, or a callable that raises, is a :class:`CostError` naming the op and
#    the value; the op's outputs are then not tracked (as if the op had raised) and the
#    error should end the session: an in-place op has already written its argument.
# 6. Nothing but the cost model's number reaches a decision: a recomputation keeps the cost
#    its storage was created with (``Rematerializer.recompute`` never re-prices), and the
#    wall-clock counters (``recompute_s``, ``select_s``) are statistics only. So under
#    ``analytic`` or a deterministic callable, two runs make the same decisions.
# 7. The quality of each model (recomputation time actually spent at equal budgets):
#    docs/benchmarks.md, Cost models.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from .errors import CostError

__all__ = ["AnalyticCost", "CostFn", "CostModel", "describe", "resolve", "price"]

CostFn = Callable[[torch._ops.OpOverload, tuple, dict, Any], float]
"""``fn(op, args, kwargs, out) -> float``: the cost of one op in ns (NOTE [ Cost models ] 4)."""


class CostModel(str, Enum):
    """The built-in cost models (NOTE [ Cost models ] rules 2 and 3)."""

    MEASURED = "measured"
    ANALYTIC = "analytic"


try:  # PyTorch's FLOP formulas (torch >= 2.1)
    from torch.utils.flop_counter import flop_registry as _FLOP_REGISTRY
except ImportError:  # pragma: no cover - no formulas: every op costs by bytes
    _FLOP_REGISTRY = {}

_Tensor = torch.Tensor
_INF = math.inf


@dataclass(frozen=True)
class AnalyticCost:
    """The analytic cost model: ``op_ns + flops / flops_per_s + bytes / bytes_per_s``, in ns.

    The defaults describe a nominal machine, not the one the program runs on: 10 TFLOP/s,
    1 TB/s and 2 us per op (launch and dispatch), roughly a datacenter GPU of 2020 in
    float32. Only ratios between ops matter to the heuristics, so a machine with the same
    FLOP/byte balance scores alike. ``bytes`` counts every tensor argument read (its
    elements, not its whole storage) and every tensor returned.

    Args:
        flops_per_s: floating-point operations per second (> 0).
        bytes_per_s: bytes read or written per second (> 0).
        op_ns: fixed cost of any op in ns (> 0: a cost must be positive).
    """

    flops_per_s: float = 1e13
    bytes_per_s: float = 1e12
    op_ns: float = 2000.0

    def __post_init__(self) -> None:
        for name in ("flops_per_s", "bytes_per_s", "op_ns"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < _INF:
                raise ValueError(f"AnalyticCost.{name} must be a finite number > 0, got {v!r}")
            object.__setattr__(self, name, float(v))
        object.__setattr__(self, "_ns_per_flop", 1e9 / self.flops_per_s)
        object.__setattr__(self, "_ns_per_byte", 1e9 / self.bytes_per_s)

    def __call__(self, op, args, kwargs, out) -> float:
        nbytes = _nbytes(args) + _nbytes(kwargs.values()) + _nbytes((out,))
        cost = self.op_ns + nbytes * self._ns_per_byte
        formula = _formula(op)
        if formula is not None:
            cost += flops(formula, op, args, kwargs, out) * self._ns_per_flop
        return cost


def _nbytes(values) -> int:
    n = 0
    for v in values:
        if isinstance(v, _Tensor):
            n += v.nbytes
        elif type(v) in (list, tuple):
            for t in v:
                if isinstance(t, _Tensor):
                    n += t.nbytes
    return n


_FORMULAS: dict = {}  # OpOverload -> the shape formula of its packet, or None
_FLOPS: dict = {}  # (op, argument shapes and values) -> FLOPs; cleared past _FLOPS_MAX entries
_FLOPS_MAX = 1 << 16


def _formula(op):
    try:
        return _FORMULAS[op]
    except KeyError:
        pass
    # Keyed by packet in recent torch, by overload in older ones (``register_decomposition``).
    f = _FLOP_REGISTRY.get(op) or _FLOP_REGISTRY.get(getattr(op, "_overloadpacket", None))
    # Registered formulas are wrapped to map tensors to shapes (``shape_wrapper``, whose
    # output keyword changed across versions); the shape formula itself is stable. Raw
    # formulas (``get_raw``: flex attention, not an ATen op) have none: bytes only.
    f = getattr(f, "__wrapped__", None)
    _FORMULAS[op] = f
    return f


def _shape(v):
    """Tensors to their shapes, lists to tuples: the formulas' arguments, hashable."""
    if isinstance(v, _Tensor):
        return v.shape
    if type(v) in (list, tuple):
        return tuple([_shape(t) for t in v])
    return v


def flops(formula, op, args, kwargs, out) -> int:
    """FLOPs of ``op`` by PyTorch's shape formula ``formula``; 0 where it refuses the shapes
    (the op is then priced by its bytes alone). Cached per op and shapes: some formulas call
    others through PyTorch's tree-mapping wrapper, ~15 us a call."""
    a, o = _shape(args), _shape(out)
    kw = {k: _shape(v) for k, v in kwargs.items()} if kwargs else {}
    key = (op, a, tuple(kw.items()), o) if kw else (op, a, o)
    try:
        return _FLOPS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable argument: price it uncached
        key = None
    try:
        n = int(formula(*a, out_shape=o, **kw))
    except Exception:  # an assertion of PyTorch's formula on shapes it does not expect
        n = 0
    if key is not None:
        if len(_FLOPS) >= _FLOPS_MAX:
            _FLOPS.clear()
        _FLOPS[key] = n
    return n


_ANALYTIC = AnalyticCost()


def resolve(cost: CostModel | CostFn) -> CostFn | None:
    """The function the session prices ops with; None for ``measured`` (the op's time)."""
    if cost is CostModel.MEASURED:
        return None
    if cost is CostModel.ANALYTIC:
        return _ANALYTIC
    return cost


def describe(cost: CostModel | CostFn) -> str:
    """The cost model in words, for a trace's ``meta["cost_model"]``: ``measured``,
    ``analytic`` (``analytic(...)`` with other constants), or ``callable:<module>.<name>``."""
    if isinstance(cost, CostModel):
        return cost.value
    if isinstance(cost, AnalyticCost):
        return "analytic" if cost == _ANALYTIC else repr(cost).replace("AnalyticCost", "analytic")
    name = getattr(cost, "__qualname__", None) or type(cost).__qualname__
    return f"callable:{getattr(cost, '__module__', None) or '?'}.{name}"


def price(fn: CostFn, op, args: tuple, kwargs: dict, out) -> float:
    """``fn``'s cost of ``op``, checked (NOTE [ Cost models ] rule 5)."""
    try:
        c = fn(op, args, kwargs, out)
    except Exception as e:
        raise CostError(describe(fn), str(op), None, f"raised {type(e).__name__}: {e}") from e
    if type(c) is float and 0.0 < c < _INF:
        return c
    if isinstance(c, bool) or not isinstance(c, numbers.Real):
        raise CostError(describe(fn), str(op), c, f"returned a {type(c).__name__}, not a number")
    c = float(c)
    if not 0.0 < c < _INF:
        raise CostError(describe(fn), str(op), c, "returned a number that is not finite and > 0")
    return c

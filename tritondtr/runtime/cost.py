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
#    docs/benchmarks.md, "Which cost model on CPU?" and "Which cost model on CUDA?".
# 8. ``auto`` (the default) is ``measured`` on a CPU session and the H100 model (rule 9) on a
#    CUDA session: a CPU op is synchronous, so its wall time is its compute time; a CUDA op
#    returns once its kernels are queued, so its wall time is the launch (~10 us for every
#    op), and an op that synchronizes inside (``nonzero``, boolean indexing, ``unique``,
#    ``masked_select``) is charged the whole queued backlog; decisions then differ from run
#    to run. The device is the session's (``Core.device``): the device of its first tracked
#    output, so the model is chosen at the first op with a tensor output (priced by the
#    device of that output) and kept from the first tracked one on. ``analytic`` is the
#    nominal machine on CPU (rule 3) and the H100 model on CUDA.
# 9. The H100 model (:data:`H100_SXM`, a :class:`GPUCost`): ``op_ns + flops / rate +
#    bytes / bandwidth`` with NVIDIA's H100 SXM datasheet figures, dense (no sparsity):
#    FP64 34 TFLOP/s (vector) and 67 TFLOP/s (tensor cores, matmuls and convolutions), FP32
#    67 TFLOP/s, TF32 tensor cores 494.7 TFLOP/s, BF16 / FP16 tensor cores 989.4 TFLOP/s,
#    INT8 tensor cores 1979 TOPS, HBM3 3.35 TB/s; ``op_ns`` 3 us, the floor of one eager op
#    on a GPU (a launch and the smallest kernel). The rate is the op's dtype's (its first
#    floating or integer tensor argument, else its output); a float32 matmul uses TF32 when
#    ``torch.backends.cuda.matmul.allow_tf32`` is on, a float32 convolution when
#    ``torch.backends.cudnn.allow_tf32`` is (PyTorch's defaults: off and on). The flags
#    are read once, when the session chooses its model (rule 8), not per op: every storage
#    of a step is then priced under the same rule whatever the program toggles later, and
#    ranks that start alike decide alike. Only ratios matter (rule 1): another GPU with the
#    same balance decides alike; the model is not a prediction of time.
# 10. ``events`` (opt-in, CUDA sessions only): an op is first priced by the H100 model, and
#    CUDA events recorded on the current stream around its first execution measure its
#    kernels' time. The events are never waited for: the oldest pending ones are polled
#    (``Event.query()``) at the end of every op, and once an op's end event completed, its
#    elapsed time (ns, at least 1) replaces the estimate of each storage it created
#    (``Core.set_cost``: the engine's column and the bounded choice learn it as any cost
#    change; a storage fused into a later version since keeps the sum it was fused with,
#    and one forgotten since is skipped). Device time is what a recomputation costs, but
#    not reproducible: two runs can decide differently, as under ``measured``; and where the
#    GPU waits for the host (small ops), the events also span the host's launches. A trace
#    recorded under it holds each op's device time (NOTE [ Recording a trace ] rule 6), not
#    the estimates the run scored with before the times arrived, so the twin's replay of it
#    is not the run's (NOTE [ The twin ] rule 4 needs the run's costs). On a session
#    whose device is the CPU, or without CUDA, it is a ValueError: use ``measured`` (exact
#    there) or ``analytic``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import torch

from .errors import CostError

__all__ = [
    "H100_SXM",
    "AnalyticCost",
    "CostFn",
    "CostModel",
    "GPUCost",
    "describe",
    "price",
    "resolve",
]

CostFn = Callable[[torch._ops.OpOverload, tuple, dict, Any], float]
"""``fn(op, args, kwargs, out) -> float``: the cost of one op in ns (NOTE [ Cost models ] 4)."""


class CostModel(str, Enum):
    """The built-in cost models (NOTE [ Cost models ] rules 2, 3, 8 and 10)."""

    AUTO = "auto"
    MEASURED = "measured"
    ANALYTIC = "analytic"
    EVENTS = "events"


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
        nbytes = _io_bytes(args, kwargs, out)
        cost = self.op_ns + nbytes * self._ns_per_byte
        formula = _formula(op)
        if formula is not None:
            cost += flops(formula, op, args, kwargs, out) * self._ns_per_flop
        return cost


@dataclass(frozen=True)
class GPUCost:
    """The analytic cost model of a named GPU (NOTE [ Cost models ] rule 9), in ns:
    ``op_ns + flops / rate(dtype) + bytes / bytes_per_s``.

    ``rate(dtype)`` is the tensor-core rate of the op's dtype for float64, float16,
    bfloat16 and int8/uint8; for float32 the TF32 rate when the op's flag is on
    (``matmul_tf32`` for matmuls and attention, ``conv_tf32`` for convolutions), else
    ``fp32_flops_per_s``; any other dtype is priced at the float32 rate. Only ops with a
    PyTorch FLOP formula (matmuls, convolutions, attention) have FLOPs; every other op costs
    its bytes read and written plus ``op_ns``, as in :class:`AnalyticCost`.

    Args:
        name: the GPU, for :func:`describe`.
        fp64_flops_per_s, fp32_flops_per_s, tf32_flops_per_s, half_flops_per_s,
        int8_ops_per_s: dense rates per second (> 0).
        bytes_per_s: memory bandwidth, bytes per second (> 0).
        op_ns: fixed cost of any op in ns (> 0).
        matmul_tf32, conv_tf32: whether float32 matmuls / convolutions run as TF32.
    """

    name: str
    fp64_flops_per_s: float
    fp32_flops_per_s: float
    tf32_flops_per_s: float
    half_flops_per_s: float
    int8_ops_per_s: float
    bytes_per_s: float
    op_ns: float
    matmul_tf32: bool = False
    conv_tf32: bool = True

    def __post_init__(self) -> None:
        for f in _GPU_RATES:
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < _INF:
                raise ValueError(f"GPUCost.{f} must be a finite number > 0, got {v!r}")
            object.__setattr__(self, f, float(v))
        ns = {
            torch.float64: 1e9 / self.fp64_flops_per_s,
            torch.float16: 1e9 / self.half_flops_per_s,
            torch.bfloat16: 1e9 / self.half_flops_per_s,
            torch.int8: 1e9 / self.int8_ops_per_s,
            torch.uint8: 1e9 / self.int8_ops_per_s,
        }
        fp32, tf32 = 1e9 / self.fp32_flops_per_s, 1e9 / self.tf32_flops_per_s
        mm = {**ns, torch.float32: tf32 if self.matmul_tf32 else fp32}
        conv = {**ns, torch.float32: tf32 if self.conv_tf32 else fp32}
        object.__setattr__(self, "_ns_per_flop", (mm, conv, fp32))
        object.__setattr__(self, "_ns_per_byte", 1e9 / self.bytes_per_s)

    def with_flags(self) -> GPUCost:
        """This GPU under the process's TF32 flags now (NOTE [ Cost models ] rule 9)."""
        return replace(
            self,
            matmul_tf32=bool(torch.backends.cuda.matmul.allow_tf32),
            conv_tf32=bool(torch.backends.cudnn.allow_tf32),
        )

    def __call__(self, op, args, kwargs, out) -> float:
        nbytes = _io_bytes(args, kwargs, out)
        cost = self.op_ns + nbytes * self._ns_per_byte
        formula = _formula(op)
        if formula is not None:
            n = flops(formula, op, args, kwargs, out)
            if n:
                mm, conv, fp32 = self._ns_per_flop
                table = conv if "convolution" in op.__name__ else mm
                cost += n * table.get(_dtype(args, out), fp32)
        return cost


_GPU_RATES = (
    "fp64_flops_per_s",
    "fp32_flops_per_s",
    "tf32_flops_per_s",
    "half_flops_per_s",
    "int8_ops_per_s",
    "bytes_per_s",
    "op_ns",
)

H100_SXM = GPUCost(
    name="h100-sxm",
    fp64_flops_per_s=67e12,
    fp32_flops_per_s=67e12,
    tf32_flops_per_s=494.7e12,
    half_flops_per_s=989.4e12,
    int8_ops_per_s=1979e12,
    bytes_per_s=3.35e12,
    op_ns=3000.0,
)
"""NVIDIA H100 SXM, datasheet figures, dense (NOTE [ Cost models ] rule 9)."""


def _dtype(args, out):
    """The dtype an op computes in: its first tensor argument's, else its output's."""
    for a in args:
        if isinstance(a, _Tensor):
            return a.dtype
    while type(out) in (list, tuple) and out:
        out = out[0]
    return out.dtype if isinstance(out, _Tensor) else None


def _io_bytes(args, kwargs, out) -> int:
    """The bytes of every tensor argument and output, a list's tensors too (one pass: it
    runs once per tracked op under the analytic models)."""
    n = 0
    for v in (*args, *kwargs.values(), out) if kwargs else (*args, out):
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
    a = tuple([v.shape if isinstance(v, _Tensor) else _shape(v) for v in args])
    o = out.shape if isinstance(out, _Tensor) else _shape(out)
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


def resolve(cost: CostModel | CostFn, device: torch.device | None = None) -> CostFn | None:
    """The function the session prices ops with on ``device``; None for ``measured`` (the
    op's time). ``auto``, ``analytic`` and ``events`` depend on the device (NOTE [ Cost
    models ] rules 8 to 10): without one (None) they resolve as on CPU. ``events`` resolves
    to its estimate, the H100 model; on a CPU device it is a ValueError."""
    gpu = device is not None and device.type == "cuda"
    if cost is CostModel.MEASURED or (cost is CostModel.AUTO and not gpu):
        return None
    if cost is CostModel.EVENTS and not gpu:
        raise ValueError(
            f"cost='events' times ops with CUDA events, but the session's device is "
            f"{device}: use cost='measured' (exact on CPU: its ops are synchronous) or "
            "cost='analytic'"
        )
    if isinstance(cost, CostModel):
        return H100_SXM.with_flags() if gpu else _ANALYTIC
    return cost


def describe(cost: CostModel | CostFn, device: torch.device | None = None) -> str:
    """The cost model in words, for a trace's ``meta["cost_model"]``: ``measured``,
    ``analytic`` (``analytic(...)`` with other constants), ``h100-sxm(matmul_tf32=...,
    conv_tf32=...)``, ``events`` or ``callable:<module>.<name>``; ``auto`` and
    ``analytic`` as resolved on ``device`` (the session's; None: not known yet)."""
    if cost is CostModel.EVENTS:
        return cost.value
    if isinstance(cost, CostModel):
        if device is None and cost is CostModel.AUTO:
            return cost.value
        fn = resolve(cost, device)
        return CostModel.MEASURED.value if fn is None else describe(fn)
    if isinstance(cost, GPUCost):
        return f"{cost.name}(matmul_tf32={cost.matmul_tf32}, conv_tf32={cost.conv_tf32})"
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

"""The baseline run: unlimited memory, every storage freed for good at its last release.

# NOTE [ Baseline ]
# 1. Memory is counted per storage: an op adds the bytes of its fresh outputs when it runs;
#    a storage is freed for good when the last reference to any tensor viewing it is released,
#    constants included (the reference simulator's banishing runtime with no budget).
# 2. The peak is taken right after each op has added its outputs: the baseline memory that
#    budgets are ratios of (NOTE [ Replay semantics ]).
# 3. The baseline compute is the sum of all op costs (nothing is recomputed).
# 4. ``constant_bytes`` sums the constants; ``bottleneck_bytes`` is the largest single op:
#    its fresh outputs plus the fresh bytes of its input tensors (views count 0, constants
#    included), as the reference reports it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..traceformat.trace import Trace, TraceError
from .program import KIND_CALL, KIND_CONSTANT, KIND_RELEASE, KIND_RETAIN, compile_trace

__all__ = ["Baseline", "baseline"]


@dataclass(frozen=True)
class Baseline:
    """Baseline figures of a trace (NOTE [ Baseline ]); bytes and ns."""

    compute: float
    peak_bytes: int
    constant_bytes: int
    bottleneck_bytes: int

    def budget(self, ratio: float) -> int:
        """The byte budget for a memory ratio: ``int(ratio * peak_bytes)``, as the reference."""
        if not (ratio > 0 and math.isfinite(ratio)):
            raise ValueError(
                f"a ratio of the baseline peak must be a finite number > 0, got {ratio!r}"
            )
        return int(self.peak_bytes * ratio)

    def as_dict(self) -> dict:
        return asdict(self)


def baseline(trace: Trace) -> Baseline:
    """Replay ``trace`` with unlimited memory (NOTE [ Baseline ]); cached on the trace."""
    cached = getattr(trace, "_baseline", None)
    if cached is not None:
        return cached
    p = compile_trace(trace)
    # Every op runs once: the largest one and the constants need no replay.
    op_total = np.asarray(p.op_total, dtype=np.int64)
    fresh = np.where(trace.alias < 0, trace.size, 0)
    in_fresh = np.concatenate([[0], np.cumsum(fresh[trace.inputs])])[trace.in_ptr]
    bottleneck = int((op_total + np.diff(in_fresh)).max()) if op_total.size else 0
    const = int(op_total[np.asarray(p.is_const, dtype=bool)].sum()) if op_total.size else 0
    sid, st_size, op_out_st, op_parents = p.sid, p.st_size, p.op_out_st, p.op_new_parents
    refs = [0] * p.num_storages
    freed = bytearray(p.num_storages)
    mem = peak = 0
    op_kinds = (KIND_CALL, KIND_CONSTANT)
    for e, (k, a) in enumerate(zip(p.ev_kind, p.ev_arg)):
        if k == KIND_RELEASE:
            s = sid[a]
            r = refs[s] = refs[s] - 1
            if r == 0:
                mem -= st_size[s]
                freed[s] = 1
            elif r < 0:
                raise TraceError(
                    f"event {e}: tensor {a} is released more often than it is referenced"
                )
        elif k in op_kinds:
            for s in op_parents[a]:
                if freed[s]:
                    t = next(t for t in p.op_inputs[a] if sid[t] == s)
                    raise TraceError(
                        f"event {e}: op {a} reads tensor {t}, whose storage was "
                        "released for good earlier (a use after the last release)"
                    )
            mem += p.op_total[a]
            if mem > peak:
                peak = mem
            for s in op_out_st[a]:
                refs[s] += 1
        elif k == KIND_RETAIN:
            refs[sid[a]] += 1
    result = Baseline(
        compute=trace.total_cost(),
        peak_bytes=peak,
        constant_bytes=const,
        bottleneck_bytes=bottleneck,
    )
    trace._baseline = result
    return result

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

from dataclasses import asdict, dataclass

from .program import KIND_CALL, KIND_CONSTANT, KIND_RELEASE, KIND_RETAIN, compile_trace
from .trace import Trace, TraceError

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
        if not ratio > 0:
            raise ValueError(f"a memory ratio must be > 0, got {ratio!r}")
        return int(self.peak_bytes * ratio)

    def as_dict(self) -> dict:
        return asdict(self)


def baseline(trace: Trace) -> Baseline:
    """Replay ``trace`` with unlimited memory (NOTE [ Baseline ]); cached on the trace."""
    cached = getattr(trace, "_baseline", None)
    if cached is not None:
        return cached
    p = compile_trace(trace)
    sid, fresh, st_size = p.sid, p.fresh, p.st_size
    op_lo, op_hi, op_total, op_inputs = p.op_lo, p.op_hi, p.op_total, p.op_inputs
    refs = [0] * p.num_storages
    freed = bytearray(p.num_storages)
    mem = peak = const = bottleneck = 0
    for e, (k, a) in enumerate(zip(p.ev_kind, p.ev_arg)):
        if k in (KIND_CALL, KIND_CONSTANT):
            for t in op_inputs[a]:
                if freed[sid[t]]:
                    raise TraceError(f"event {e}: op {a} reads tensor {t}, whose storage was "
                                     "released for good earlier (a use after the last release)")
            mem += op_total[a]
            if mem > peak:
                peak = mem
            need = op_total[a] + sum(fresh[t] for t in op_inputs[a])
            if need > bottleneck:
                bottleneck = need
            if k == KIND_CONSTANT:
                const += op_total[a]
            for t in range(op_lo[a], op_hi[a]):
                refs[sid[t]] += 1
        elif k == KIND_RETAIN:
            refs[sid[a]] += 1
        elif k == KIND_RELEASE:
            s = sid[a]
            refs[s] -= 1
            if refs[s] == 0:
                mem -= st_size[s]
                freed[s] = 1
            elif refs[s] < 0:
                raise TraceError(f"event {e}: tensor {a} is released more often than it is "
                                 "referenced")
    result = Baseline(compute=trace.total_cost(), peak_bytes=peak, constant_bytes=const,
                      bottleneck_bytes=bottleneck)
    trace._baseline = result
    return result

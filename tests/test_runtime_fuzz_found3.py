"""Bugs the differential fuzzer's tight mode (NOTE [ Differential fuzzer ] rule 6 in
tests/fuzz_check.py: budgets of 5-50 % of the peak, ``evict_all()`` points, the twin on every
budgeted run) found, one smallest program each (continues test_runtime_fuzz_found2.py)."""

import torch

import tritondtr
from tritondtr.sim import simulate
from tritondtr.traceformat.trace import EventKind


def _twin_counts(rec) -> tuple[tuple, tuple]:
    """(the twin's, the recorded run's) evictions, rematerializations and peak bytes."""
    m = rec.trace.meta["runtime"]
    r = simulate(rec.trace, m["heuristic"], budget=m["budget"], semantics="runtime")
    return (r.evictions, r.remats, r.peak_bytes), (
        m["evictions"],
        m["rematerializations"],
        m["peak_bytes"],
    )


def test_a_release_during_a_plain_data_freeze_recomputes_outside_the_session():
    """``a.data = new`` on a plain ``a`` a recipe reads freezes (NOTE [ Plain .data
    assignment ]); the freeze first applies the queued deaths, and ``x``'s release
    rematerializes its evicted reader ``d`` (NOTE [ Readers before release ]). That drain ran
    with the session's dispatch mode active, from the ``.data`` setter: ``sin``'s
    recomputation was dispatched to the session as a new tracked op (6 ops counted for the
    program's 4, two extra CALLs in the trace) re-entering the core inside ``release``; the
    twin disagreed in longer programs (fuzz seed 500545: 36 rematerializations against the
    run's 34). The drain now runs with the modes disabled."""
    torch.manual_seed(0)
    a = torch.randn(64, dtype=torch.float64)
    a0, new = a.clone(), torch.zeros(64, dtype=torch.float64)
    with tritondtr.trace(None, budget=1 << 20, heuristic="dtr_eq") as rec:
        s = rec.session
        x = a * 2
        d = x.sin()
        s.evict_all()  # x and d evicted
        y = x + 1  # x recomputed, d stays evicted
        del x  # queued: released at the next op or drain
        a.data = new  # a recipe reads a: a freeze, whose drain releases x
        z = d * 3
    assert s.stats.ops == 4, s.stats.ops  # mul, sin, add, mul
    calls = int((rec.trace.kind == EventKind.CALL).sum())
    assert calls == 4, calls
    assert torch.equal(z, (a0 * 2).sin() * 3) and torch.equal(y, a0 * 2 + 1)
    assert torch.equal(a, new)
    got, want = _twin_counts(rec)
    assert got == want

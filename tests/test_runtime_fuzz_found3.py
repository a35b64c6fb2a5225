"""Bugs the differential fuzzer's tight mode (NOTE [ Differential fuzzer ] rule 6 in
tests/fuzz_check.py: budgets of 5-50 % of the peak, ``evict_all()`` points, the twin on every
budgeted run) found, one smallest program each (continues test_runtime_fuzz_found2.py)."""

import contextlib

import pytest
import torch

import tritondtr
import tritondtr.runtime as rt
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


@pytest.mark.parametrize("write", ["data", "inplace"])
def test_a_view_of_a_leaf_whose_data_was_swapped_is_still_watched(write):
    """A recipe reading a view of a hooked leaf is counted as a reader of the leaf (NOTE
    [ Parameter writes ] rule 3), which ReadMemory watched by the leaf's address; after
    ``p.data = new`` that address was stale, so ``v.data = ...`` or an in-place write through
    the view froze nothing: the recomputation read the view's new memory (an AssertionError
    on the buffer size, fuzz seed 501888) or raised StaleInputError. A view of a hooked leaf
    is now the leaf's memory by identity, as the recipe was counted."""

    def run(ctx):
        torch.manual_seed(0)
        p = torch.randn(6, dtype=torch.float64, requires_grad=True)
        with ctx as s:
            p.data = p.data * 0.5 + 0.25  # the leaf gets other memory
            v = p.flatten()[:4].reshape(2, 2)  # an autograd view of the leaf
            w = torch.linalg.pinv(v) @ v
            if s is not None:
                s.evict_all()
            if write == "data":
                v.data = v.detach()[1:]
            else:
                with torch.no_grad():
                    v.mul_(2)
        return rt.unwrap(w).clone(), p.detach().clone()

    want, got = run(contextlib.nullcontext()), run(tritondtr.enable(budget=None))
    assert all(torch.equal(a, b) for a, b in zip(want, got))


@pytest.mark.xfail(
    strict=True,
    raises=RuntimeError,
    reason="PyTorch: autograd replays a wrapper subclass's view by its ops (a plain tensor's "
    "by as_strided), so once the base's .data took another shape, the regenerated grad_fn of "
    "a view written in place raises (fuzz seed 501702; known limit "
    "view-replay-after-data-reshape)",
)
def test_view_of_a_base_whose_data_took_another_shape_has_a_grad_fn():
    def run(ctx):
        torch.manual_seed(0)
        a = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
        with ctx:
            v = (a * 2).clone()
            t = v.unflatten(-1, (1, -1))[..., ::2]
            t.mul_(0.5)  # written in place: its grad_fn is regenerated from v when read
            v.data = v.detach()[1:]  # v: [2, 3]
            v.view(-1)[1::2].add_(1)  # a write through v: t's version moves again
            return t.is_leaf, type(t.grad_fn).__name__

    assert run(contextlib.nullcontext()) == (False, "AsStridedBackward0")
    assert run(tritondtr.enable(budget=None)) == (False, "AsStridedBackward0")


@pytest.mark.xfail(
    strict=True,
    raises=rt.StaleInputError,
    reason="tritondtr: PyTorch's set_data keeps the version counter a plain view shares with its "
    "base, so after v.data = new a write to v's new memory moves the base's _version, and a "
    "recomputation reading the unchanged base is refused as stale (fuzz seed 601102; known "
    "limit data-swap-shares-version)",
)
def test_a_write_after_a_views_data_swap_leaves_its_base_recomputable():
    def run(ctx):
        torch.manual_seed(0)
        a = torch.randn(4, 6, dtype=torch.float64)
        v = a.view(torch.int64)  # a plain view: it shares a's version counter
        with ctx as s:
            v.data = v.detach().flip(0)  # v gets other memory, the same version counter
            y = a.sin()  # a recipe reads a (its _version recorded)
            v.mul_(2)  # a's memory unchanged, a._version moves
            if s is not None:
                s.evict_all()
            z = y * 3  # y recomputed from a
            return rt.unwrap(z).clone(), a.clone(), v.clone(), a._version

    want, got = run(contextlib.nullcontext()), run(tritondtr.enable(budget=None))
    assert all(torch.equal(w, g) for w, g in zip(want[:3], got[:3])) and want[3] == got[3]

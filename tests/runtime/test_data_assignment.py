"""``.data`` assignment in a session: of a tensor the session made (the wrapper takes the new
value's storage; a plain value is refused) and of a plain tensor (NOTE [ Plain .data
assignment ] in runtime/plaindata.py: a swap under a recipe that read the old memory freezes
first), with views and leaves of other shapes. Values, gradients, recomputations and the
twin's counts equal eager's and the recorded run's; the known limits are strict xfails."""

import contextlib

import pytest
import torch

import tritondtr
import tritondtr.runtime as rt
from tritondtr.sim import simulate
from tritondtr.traceformat.trace import EventKind


def test_data_assignment_of_a_session_made_tensor():
    """Assigning .data of a tensor the session made (c.data = t) was silently ignored: c kept its
    old value, and so did the ops and the gradient that read it (found probing the fuzzer's
    ``.grad`` and ``.data`` templates by hand, 54423e3). The wrapper now takes t's cell and view
    (DTRTensor.data)."""

    def prog():
        torch.manual_seed(0)
        a = torch.randn(4, dtype=torch.float64, requires_grad=True)
        c = a * 2
        c.data = a.detach() * 3
        y = c * c
        y.sum().backward()
        return rt.unwrap(y).detach(), a.grad

    ref = prog()
    with rt.enable(budget=None):
        got = prog()
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_plain_data_assignment_to_a_session_made_tensor_is_refused():
    """``c.data = plain`` would give the wrapper a storage of its own behind the runtime's
    back: refused with a clear error, and ``c`` keeps its value. Written with the
    setter (2dfd74d)."""
    z = torch.zeros(3)
    with rt.enable(budget=None):
        c = torch.randn(3) * 1
        before = rt.unwrap(c).clone()
        with pytest.raises(rt.UnsupportedOpError, match=r"\.data"):
            c.data = z
        assert torch.equal(rt.unwrap(c), before)


def _manual_sgd(session):
    """Two steps of manual SGD written ``p.data = p.data - lr * p.grad`` on a parameter made
    before the session, the loss of each step kept."""
    torch.manual_seed(0)
    p = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    x = torch.randn(3, 4, dtype=torch.float64)
    losses = []
    with session as s:
        for _ in range(2):
            loss = (x @ p).tanh().square().sum()
            loss.backward()
            p.data = p.data - 0.1 * p.grad
            p.grad = None
            if s is not None:
                s.evict_all()
            losses.append(loss)
    return p.detach().clone(), [rt.unwrap(v).detach().clone() for v in losses]


def test_plain_data_assigned_a_tracked_tensor_takes_its_value():
    """``p.data = p.data - lr * p.grad`` (p plain, the right side a wrapper) gave p the wrapper's
    storage, which has no data: the next op on p crashed the process (found while writing the
    fuzzer's .data template, tests/fuzz/templates/writes.py, 926c07e). NOTE [ Plain .data
    assignment ]."""
    ref = _manual_sgd(contextlib.nullcontext())
    got = _manual_sgd(rt.enable(stress=True))
    assert torch.equal(got[0], ref[0])
    assert all(torch.equal(a, b) for a, b in zip(got[1], ref[1]))
    assert type(got[0]) is torch.Tensor and "data" not in torch.Tensor.__dict__


def test_plain_data_replaced_under_a_recipe_that_read_it():
    """``a.data = b`` swapped the memory a recipe read (no version moved): the recomputation of
    ``c = a * 2`` read b, a silent wrong value. The session now freezes first. Found with the
    previous one (926c07e)."""
    torch.manual_seed(0)
    a = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 6, dtype=torch.float64)
    want = a.detach() * 2
    with rt.enable(stress=True) as s:
        c = a * 2
        a.data = b
        s.evict_all()
        d = c + 0
    assert torch.equal(rt.unwrap(d), want) and torch.equal(a.detach(), b)


def test_plain_data_property_lives_only_while_a_session_is_active():
    """NOTE [ Plain .data assignment ] rule 2: the setter is installed by the session and
    removed at its exit, after an exception too. Written with the rule (926c07e)."""
    with pytest.raises(KeyError), rt.enable(budget=None):
        assert "data" in torch.Tensor.__dict__
        with pytest.raises(RuntimeError, match="do not nest"), rt.enable(budget=None):
            pass  # refused before it installs anything
        raise KeyError("user")
    assert "data" not in torch.Tensor.__dict__


_AFTER_EXIT = """
import torch, tritondtr.runtime as rt
p = torch.zeros(3, dtype=torch.float64)
with rt.enable(budget=None):
    w = torch.ones(3, dtype=torch.float64) * 2
p.data = w
assert torch.equal(p * 1, torch.full((3,), 2.0, dtype=torch.float64))
"""


@pytest.mark.xfail(
    strict=True,
    reason="p.data = w with no session active (w an escaped wrapper) gives p the wrapper's "
    "empty storage: the next op on p crashes the process (NOTE [ Plain .data assignment ] "
    "rule 4; known limit plain-data-of-wrapper-after-exit)",
)
def test_plain_data_assigned_an_escaped_wrapper_after_exit():
    """Known limit plain-data-of-wrapper-after-exit (the mark says why), in a child process:
    it crashes. Found with the setter (926c07e)."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _AFTER_EXIT], capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode()[-500:]


def _reshaped_leaf(session):
    """A leaf's .data reshaped while a graph built on its old shape lives, then backward
    (the reduced program of fuzz seed 400168)."""
    torch.manual_seed(0)
    p = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    with session:
        v1 = p.clone()
        v1.transpose(0, 1)[1:].add_(1)
        p.data = p.detach()[1:]
        v4 = v1.clone()
        (v4.sum() + v4.exp().sum() * 2).backward()
    return p.grad


def test_leaf_data_reshaped_under_a_graph_backward_runs():
    """The session's post-accumulate hook assigned the plain gradient through Python's .grad
    setter, which refuses the old shape autograd accumulated: the hook raised inside backward
    (eager runs), and again at exit before the core closed (fuzz seed 400168)."""
    want = _reshaped_leaf(contextlib.nullcontext())
    got = _reshaped_leaf(rt.enable(budget=None))
    assert want.shape == (4, 6) and torch.equal(rt.unwrap(got), want)


@pytest.mark.xfail(
    strict=True,
    reason="a leaf's .data reshaped under a live graph: autograd accumulates the old shape's "
    "gradient, which Python's .grad setter refuses, so the session's gradient stays a wrapper "
    "(known limit leaf-data-reshaped-under-a-graph)",
)
def test_leaf_data_reshaped_under_a_graph_gets_a_plain_grad():
    """Known limit leaf-data-reshaped-under-a-graph (the mark says why). Fuzz seed 400168."""
    assert type(_reshaped_leaf(rt.enable(budget=None))) is torch.Tensor


def test_empty_plain_data_replaced_under_a_recipe_that_read_it():
    """``v3.data = v1`` for an empty plain ``v3`` a recipe read: an empty storage has no
    address in ReadMemory, so the session did not freeze and the recomputed loss summed v1
    (fuzz seed 402448). An empty ``p`` now always freezes."""

    def prog(s):
        torch.manual_seed(0)
        a = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
        e = torch.randn(0, 6, dtype=torch.float64) * 2
        b = torch.randn(4, 6, dtype=torch.float64)
        with s:
            loss = a.sum() + e.sum() * 2
            loss.backward()
            e.data = b
            if isinstance(s, rt.Session):
                s.evict_all()
            y = loss + 0
        return rt.unwrap(y), a.grad

    ref = prog(contextlib.nullcontext())
    got = prog(rt.enable(stress=True))
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


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
    """``a.data = new`` on a plain ``a`` a recipe reads freezes (NOTE [ Plain .data assignment
    ]); the freeze first applies the queued deaths, and ``x``'s release rematerializes its
    evicted reader ``d`` (NOTE [ Readers before release ]). That drain ran with the session's
    dispatch mode active, from the ``.data`` setter: ``sin``'s recomputation was dispatched to
    the session as a new tracked op (6 ops counted for the program's 4, two extra CALLs in the
    trace) re-entering the core inside ``release``; the twin disagreed in longer programs (the
    differential fuzzer's tight mode, fuzz seed 500545: 36 rematerializations against the run's
    34). The drain now runs with the modes disabled."""
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
    """A recipe reading a view of a hooked leaf is counted as a reader of the leaf (NOTE [
    Parameter writes ] rule 3), which ReadMemory watched by the leaf's address; after ``p.data =
    new`` that address was stale, so ``v.data = ...`` or an in-place write through the view froze
    nothing: the recomputation read the view's new memory (an AssertionError on the buffer size;
    the differential fuzzer's tight mode, fuzz seed 501888) or raised StaleInputError. A view of
    a hooked leaf is now the leaf's memory by identity, as the recipe was counted."""

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
    """Known limit view-replay-after-data-reshape (the mark says why). Found by the
    differential fuzzer's tight mode, fuzz seed 501702."""

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
    """Known limit data-swap-shares-version (the mark says why). Found by the differential
    fuzzer's tight mode, fuzz seed 601102."""

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

"""A session is freed by reference counting once nothing holds it (NOTE [ Session lifetime ]
in runtime/session.py): its core and the buffers queued for freeing do not wait for the cyclic
garbage collector. Each test runs with the collector disabled, so only reference counting can
free anything. An exception inside a session leaves the process as it was before."""

import contextlib
import gc
import weakref

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

import tritondtr
import tritondtr.runtime as rt
from tests.runtime.eager_check import leaf


@pytest.fixture(scope="module")
def _collected():
    """One full collection before the module's tests, not one per test: with the whole
    suite's modules loaded it takes ~0.6 s, and what each test checks is that its own
    objects go by reference counting, whatever garbage is left from others."""
    gc.collect()


@pytest.fixture
def no_gc(_collected):
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def step(w, x):
    h = x
    for _ in range(6):
        h = (h @ w).tanh()
    loss = h.square().mean()
    loss.backward()
    return loss


def problem():
    g = torch.Generator().manual_seed(0)
    return torch.randn(64, 64, generator=g).requires_grad_(), torch.randn(32, 64, generator=g)


@pytest.mark.parametrize("budget", [None, 60_000])  # 60 kB: ~60 % of the peak, it evicts
@pytest.mark.parametrize("recorded", [False, True])
def test_closed_session_is_freed_without_gc(no_gc, tmp_path, budget, recorded):
    w, x = problem()
    ctx = (
        tritondtr.trace(tmp_path / "t.npz", budget=budget) if recorded else rt.enable(budget=budget)
    )
    with ctx as s:
        step(w, x)
    session = s.session if recorded else s
    assert budget is None or session.stats.evictions > 0
    eng = session.core.engine
    owned = [session, session.core, eng, None if eng is None else eng.table]
    refs = [weakref.ref(o) for o in owned if o is not None]
    assert len(refs) == (2 if budget is None else 4)
    del s, session, ctx, owned, eng
    assert [r() for r in refs] == [None] * len(refs)
    assert w.grad is not None and type(w.grad) is torch.Tensor


def test_escaping_wrapper_keeps_its_session_then_frees_it(no_gc):
    """An escaping wrapper holds its session (it is served after exit); when it dies, its
    buffer and the session go at once, though no op ran after exit to drain the queue."""
    w, x = problem()
    with rt.enable(budget=None) as s:
        loss = step(w, x)
        big = (x @ w).relu()  # escapes with a 32 x 64 buffer
    ref_session = weakref.ref(s)
    ref_buf = weakref.ref(big._cell.storage.buf)
    expected = torch.relu(x @ w.detach())
    del s
    assert ref_session() is not None  # the wrappers hold it
    assert torch.equal(big, expected)  # served after exit
    del big, loss
    assert ref_buf() is None
    assert ref_session() is None


def test_session_after_an_exception_inside_is_freed(no_gc):
    w, x = problem()
    with contextlib.suppress(ZeroDivisionError), rt.enable(budget=60_000) as s:
        step(w, x)
        raise ZeroDivisionError
    ref = weakref.ref(s)
    del s
    assert ref() is None


def test_user_exception_restores_process():
    x = leaf(3)
    with pytest.raises(KeyError), rt.enable(budget="1MiB") as s:
        (x * 2).sum()
        raise KeyError("user")
    assert _get_current_dispatch_mode() is None
    assert s.closed and not s.active
    assert type(x * 2) is torch.Tensor

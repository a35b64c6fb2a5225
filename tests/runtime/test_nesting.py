"""Sessions do not nest (NOTE [ Nested sessions ] in runtime/session.py): the inner one is
refused at entry, whatever kinds of session and whatever dispatch modes are around it, and
the outer one goes on. Sessions one after another: test_grads_after_exit.py."""

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import tritondtr
import tritondtr.runtime as rt

NESTED = r"inside another active tritondtr session \(budget=.*\): sessions do not nest"


def problem():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(127, 61, generator=g).requires_grad_()
    x = torch.randn(33, 127, generator=g)
    return w, x


def loss_of(w, x):
    return ((x @ w).tanh() * 1.5).sum()


def eager_grad(w, x):
    w.grad = None
    loss_of(w, x).backward()
    g, w.grad = w.grad, None
    return g


def test_nested_enable_raises_at_entry():
    """The issue's program: the inner session is refused before it intercepts anything, and
    the outer one goes on as if it had not been asked."""
    w, x = problem()
    ref = eager_grad(w, x)
    with rt.enable(budget="1MiB") as outer:
        what_to_do = r".*one enable\(\) around the whole step"
        with pytest.raises(RuntimeError, match=NESTED + what_to_do), rt.enable(budget=None):
            pass
        assert [type(m).__name__ for m in _get_current_dispatch_mode_stack()] == ["_Mode"]
        loss = loss_of(w, x)
        loss.backward()
    assert not _get_current_dispatch_mode_stack()
    assert outer.stats.ops > 0
    assert type(w.grad) is torch.Tensor and torch.equal(w.grad, ref)


@pytest.mark.parametrize("inner", ["enable", "trace"])
@pytest.mark.parametrize("outer", ["enable", "trace"])
def test_every_kind_of_session_refuses_nesting(outer, inner):
    make = {"enable": lambda: rt.enable(stress=True), "trace": lambda: tritondtr.trace()}
    w, x = problem()
    with make[outer]():
        with pytest.raises(RuntimeError, match=NESTED), make[inner]():
            pass
        loss_of(w, x).backward()
    assert type(w.grad) is torch.Tensor


def test_nesting_under_another_dispatch_mode_is_still_refused():
    """The check looks through the whole mode stack, not only its top."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    outer, raises = rt.enable(stress=True), pytest.raises(RuntimeError, match=NESTED)
    with outer, PassThrough(), raises, rt.enable():
        pass
    assert outer.closed and not _get_current_dispatch_mode_stack()

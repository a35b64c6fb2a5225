"""Sessions do not nest (NOTE [ Nested sessions ] in runtime/session.py), and leaf gradients
are plain tensors after exit wherever the forward ran (NOTE [ What is tracked ] rule 4)."""

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


def test_sessions_one_after_another():
    """Forward in one session, backward in the next: the second never reads ``w``; its
    gradient still reaches ``.grad`` as a plain tensor."""
    w, x = problem()
    ref = eager_grad(w, x)
    with rt.enable(stress=True):
        loss = loss_of(w, x)
    with rt.enable(stress=True) as second:
        loss.backward()
    assert second.stats.ops > 0
    assert type(w.grad) is torch.Tensor and torch.equal(w.grad, ref)


@pytest.mark.parametrize("setting", [{"budget": None}, {"stress": True}])
def test_backward_alone_in_a_session(setting):
    """Forward outside: ``backward()``'s initial ``ones_like`` runs under grad mode inside the
    session, so every gradient of the backward is a wrapper until it reaches ``.grad``."""
    w, x = problem()
    ref = eager_grad(w, x)
    loss = loss_of(w, x)
    with rt.enable(**setting):
        loss.backward()
    assert type(w.grad) is torch.Tensor and torch.equal(w.grad, ref)


def test_gradient_assigned_to_grad_is_plain_after_exit():
    """``p.grad = g`` with a tracked ``g`` (``torch.autograd.grad`` gives a plain one, NOTE
    [ Leaf gradients ]; an op on it under grad mode tracks a copy): no accumulation, no hook
    call; the exit hands it out."""
    w, x = problem()
    ref = eager_grad(w, x)
    with rt.enable(stress=True):
        (g,) = torch.autograd.grad(loss_of(w, x), [w])
        assert not rt.is_tracked(g)
        g = g * 1.0
        assert rt.is_tracked(g)
        w.grad = g
    assert type(w.grad) is torch.Tensor and torch.equal(w.grad, ref)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True:UserWarning")
def test_gradient_with_a_graph_stays_a_wrapper():
    """``create_graph=True``: the gradient keeps its graph, so it stays a wrapper (served after
    exit as NOTE [ Escaping tensors ] says) and double backward works after exit."""
    w, x = problem()
    w.grad = None
    (g_ref,) = torch.autograd.grad(loss_of(w, x), [w], create_graph=True)
    (gg_ref,) = torch.autograd.grad(g_ref.square().sum(), [w])
    with rt.enable(stress=True):
        loss_of(w, x).backward(create_graph=True)
    assert rt.is_tracked(w.grad) and w.grad.grad_fn is not None
    (gg,) = torch.autograd.grad(w.grad.square().sum(), [w])
    assert torch.equal(rt.unwrap(w.grad.detach()), g_ref.detach())
    assert torch.equal(gg, gg_ref)
    w.grad = None  # the parameter-gradient cycle create_graph makes

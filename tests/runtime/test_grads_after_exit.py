"""A leaf's ``.grad`` is a plain tensor after exit wherever the forward ran (NOTE [ What is
tracked ] rule 4): forward and backward in two sessions, a backward alone in one, a gradient
assigned by hand (handed out before the core closes), and a gradient with a graph, which
stays a wrapper."""

import pytest
import torch

import tritondtr
import tritondtr.runtime as rt
from tritondtr.sim import simulate


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


def _assigned_grad_run(budget: int):
    """A parameter's ``.grad`` assigned by hand in a session, then three activations that make
    the session evict it (3 x 192 B live, budget 400 B)."""
    torch.manual_seed(0)
    w = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    x = torch.randn(4, 6, dtype=torch.float64)
    with tritondtr.trace(None, budget=budget, cost="analytic", heuristic="dtr") as rec:
        w.grad = torch.ones_like(w)
        a = x * 2
        b = a * 2
        c = a + 1
    assert torch.equal(w.grad, torch.ones_like(w)) and type(w.grad) is torch.Tensor
    assert torch.equal(rt.unwrap(b), x * 2 * 2) and torch.equal(rt.unwrap(c), x * 2 + 1)
    return rec


def test_hand_assigned_grad_rematerialized_at_exit_keeps_the_budget():
    """Session._close handed out a hand-assigned .grad (p.grad = wrapper) after core.close():
    the evicted gradient was recomputed with no eviction to make room (peak 768 > 400 + 192)
    and the twin, which keeps the budget there, evicted once more (fuzz seeds 300282,
    300351). It is now handed out before the core closes."""
    budget = 400
    rec = _assigned_grad_run(budget)
    s = rec.session.stats
    m = rec.trace.meta["runtime"]
    r = simulate(rec.trace, m["heuristic"], budget=budget, semantics="runtime")
    assert (r.evictions, r.remats, r.peak_bytes) == (
        m["evictions"],
        m["rematerializations"],
        m["peak_bytes"],
    )
    assert s.peak_bytes <= budget + s.max_op_out_bytes


@pytest.mark.xfail(
    strict=True,
    reason="a .grad assigned by hand to a tensor the session made (a wrapper leaf) stays a "
    "wrapper after exit: only plain leaves get the exit hand-out (NOTE [ What is tracked ] "
    "rule 4), while autograd accumulating into the same leaf gives a plain .grad (fuzz seed "
    "300075)",
)
def test_hand_assigned_grad_of_a_session_made_leaf_is_plain_after_exit():
    """Known limit hand-assigned-wrapper-grad (the mark says why). Found by the differential
    fuzzer, fuzz seed 300075."""
    x = torch.randn(4, dtype=torch.float64)
    with rt.enable(budget=None):
        v = x * 2
        v.grad = torch.ones_like(v)
    assert torch.equal(rt.unwrap(v.grad), torch.ones(4, dtype=torch.float64))
    assert type(v.grad) is torch.Tensor

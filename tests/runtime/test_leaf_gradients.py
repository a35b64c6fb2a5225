"""Gradients bound only for a parameter's ``.grad`` stay plain from the op that computes them
(NOTE [ Leaf gradients ] in runtime/leafgrad.py): never tracked or counted, summed in place as
in eager mode, and every gradient bit is eager's."""

import pytest
import torch
import torch.nn.functional as F

import tritondtr.runtime as rt


def eager_grads(fn, params):
    for p in params:
        p.grad = None
    fn().backward()
    grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return grads


def tracked_grads(fn, params, **kw):
    for p in params:
        p.grad = None
    with rt.enable(**kw) as s:
        fn().backward()
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    return grads, s.stats


def test_a_linear_weight_gradient_is_never_counted():
    """A 1024 x 1024 weight (4 MiB) and a batch of 4: the tracked peak stays far below the
    weight gradient's bytes, which autograd computes transposed and hands on through
    ``TBackward0``; the gradients are eager's."""
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(1024, 1024)
    x = torch.randn(4, 1024, generator=g)
    params = list(lin.parameters())
    fn = lambda: lin(x).tanh().square().mean()
    ref = eager_grads(fn, params)
    got, stats = tracked_grads(fn, params, budget=None)
    assert all(type(t) is torch.Tensor and torch.equal(a, t) for a, t in zip(ref, got))
    assert stats.peak_bytes < 1024 * 1024  # the gradient alone is 4 MiB


def test_a_shared_weight_is_summed_in_place_untracked():
    """A weight used in 12 steps: autograd sums its 12 gradients; plain, they are summed in
    place and untracked (no ``aten.add.Tensor`` reaches the session in the backward)."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 64, generator=g).div_(8).requires_grad_()
    x = torch.randn(8, 64, generator=g)

    def fn():
        h = x
        for _ in range(12):
            h = (h @ w).tanh()
        return h.square().mean()

    ref = eager_grads(fn, [w])
    (got,), stats = tracked_grads(fn, [w], budget=None)
    assert torch.equal(ref[0], got)
    assert stats.op_counts["aten.add.Tensor"] == 0
    assert stats.peak_bytes < 12 * 8 * 64 * 4 * 3  # activations only: no 16 kB gradients


@pytest.mark.parametrize("budget_fraction", [0.6, 0.3])
def test_gradients_exact_under_eviction(budget_fraction):
    g = torch.Generator().manual_seed(2)
    layers = torch.nn.Sequential(
        torch.nn.Linear(32, 96), torch.nn.GELU(), torch.nn.Linear(96, 96), torch.nn.Tanh()
    )
    head = torch.nn.Linear(96, 5)
    x, y = torch.randn(48, 32, generator=g), torch.randint(0, 5, (48,), generator=g)
    params = [*layers.parameters(), *head.parameters()]

    def fn():
        h = x
        for _ in range(3):  # the middle layers shared three times
            h = layers(h if h.shape[-1] == 32 else h[:, :32])
        return F.cross_entropy(head(h), y)

    ref = eager_grads(fn, params)
    _, base = tracked_grads(fn, params, budget=None)
    got, stats = tracked_grads(fn, params, budget=int(budget_fraction * base.peak_bytes))
    assert stats.evictions > 0
    assert all(torch.equal(a, t) for a, t in zip(ref, got))


def test_ambiguous_sizes_stay_tracked_and_exact():
    """A square batch (64 x 64 input of a 64 x 64 weight): the input's gradient and the
    weight's have as many elements, so the node's outputs are tracked as before."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 64, generator=g).div_(8).requires_grad_()
    x = torch.randn(64, 64, generator=g).requires_grad_()
    fn = lambda: (x @ w).tanh().square().mean()
    ref = eager_grads(fn, [w, x])
    got, stats = tracked_grads(fn, [w, x], budget=None)
    assert all(torch.equal(a, t) for a, t in zip(ref, got))
    assert stats.peak_bytes >= 64 * 64 * 4 * 2  # the two gradients were counted


def test_create_graph_keeps_gradients_tracked():
    """With ``create_graph=True`` a gradient has a graph of its own: it stays a wrapper."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(16, 16, generator=g).requires_grad_()
    x = torch.randn(4, 16, generator=g)
    (ref,) = torch.autograd.grad((x @ w).tanh().sum(), w, create_graph=True)
    with rt.enable(budget=None):
        (gw,) = torch.autograd.grad((x @ w).tanh().sum(), w, create_graph=True)
        assert rt.is_tracked(gw)
        second = gw.square().sum()
    assert torch.equal(ref, rt.unwrap(gw))
    (ref2,) = torch.autograd.grad(ref.square().sum(), w)
    (got2,) = torch.autograd.grad(second, w)
    assert torch.equal(ref2, got2)


def test_autograd_grad_returns_plain_leaf_gradients():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(32, 8, generator=g).requires_grad_()
    x = torch.randn(6, 32, generator=g)
    (ref,) = torch.autograd.grad((x @ w).relu().sum(), w)
    with rt.enable(budget=None):
        (got,) = torch.autograd.grad((x @ w).relu().sum(), w)
    assert type(got) is torch.Tensor and torch.equal(ref, got)


class _ScaleByRowSum(torch.autograd.Function):
    """A backward with an intermediate of the weight gradient's size that a tracked op reads
    and that is then written in place (NOTE [ Leaf gradients ] rule 6)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, _ = ctx.saved_tensors
        gw = (g * x).sum(0)  # (16,): the weight gradient's size, left plain
        gx = (g * gw).tanh()  # tracked: its recipe must not see the write below
        gw.mul_(0.5)
        return gx, gw


@pytest.mark.parametrize("kw", [{"stress": True, "pin_backward": False}, {"stress": True}])
def test_plain_intermediate_written_after_a_tracked_read(kw):
    g = torch.Generator().manual_seed(6)
    w = torch.randn(16, generator=g).requires_grad_()
    x0 = torch.randn(8, 16, generator=g).requires_grad_()
    fn = lambda: _ScaleByRowSum.apply((x0 * 1.5).sin() * x0.cos(), w).cos().sum()
    ref = eager_grads(fn, [w, x0])
    got, _ = tracked_grads(fn, [w, x0], **kw)
    assert all(torch.equal(a, t) for a, t in zip(ref, got))


def test_hook_value_of_a_weight_size_used_later_and_written():
    def program(enable):
        g = torch.Generator().manual_seed(7)
        w = torch.randn(24, 24, generator=g).requires_grad_()
        x = torch.randn(16, 24, generator=g)
        with enable():
            store = {}
            wt = w * 1.0
            wt.register_hook(lambda grad: store.__setitem__("m", grad * 0.1))
            (x @ wt).tanh().square().mean().backward()
            m = store["m"]
            a = (x @ m).sin()
            m.mul_(0.5)
            ((a * x).sum() + (x @ w).cos().sum()).backward()
        return w.grad

    import contextlib

    ref = program(contextlib.nullcontext)
    got = program(lambda: rt.enable(stress=True))
    assert torch.equal(ref, got)


def test_the_analysis_holds_no_graph_after_backward():
    """NOTE [ Leaf gradients ] rule 7: with ``retain_graph=True`` the graph of a finished
    backward is the program's to drop; the runtime's node cache does not keep it."""
    import weakref

    g = torch.Generator().manual_seed(8)
    lin1, lin2 = torch.nn.Linear(32, 48), torch.nn.Linear(48, 8)
    x = torch.randn(32, 32, generator=g)
    with rt.enable(budget=None) as s:
        a = lin1(x).tanh()
        ref = weakref.ref(a)
        loss = lin2(a).square().mean()
        loss.backward(retain_graph=True)
        del loss, a
        s.drain()
        assert ref() is None
        assert s.core.resident == 0


def test_a_non_leaf_gradient_stays_tracked():
    """``torch.autograd.grad`` of a non-leaf ``h`` near a leaf input: ``h``'s gradient goes
    through ``SinBackward0``, not a view of the leaf, so it is tracked as before."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(16, 64, generator=g).requires_grad_()
    w = torch.randn(64, 64, generator=g)
    with rt.enable(budget=None):
        h = (x * 2).sin()
        (gh,) = torch.autograd.grad((h @ w).sum(), [h])
        assert rt.is_tracked(gh)

"""Long chains of views: NOTE [ View chains ] in tritondtr/runtime/tensor.py.

The structural property is the depth of autograd's recorded view replay (how many view ops
``_view_func_unsafe`` runs to rebuild a view from its base), which is what a view of a view
costs to make and to free. Timing lives in benchmarks/bench_runtime_view_chain.py."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tritondtr.runtime as rt
from tritondtr.runtime.tensor import VIEW_CHAIN_LIMIT, DeepView

DEEP = 3 * VIEW_CHAIN_LIMIT + 5  # several re-rootings, and not a multiple of the limit


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def replay_ops(t: torch.Tensor) -> list[str]:
    """The ops autograd runs to rebuild view ``t`` from a new base (outside any session)."""
    base = torch.zeros(t._base.shape)
    with _Ops() as ops:
        t._view_func_unsafe(base)
    return ops.names


def leaf(*shape, seed=0):
    torch.manual_seed(seed)
    return torch.randn(*shape, requires_grad=True)


def compare(fn, *leaves, **enable):
    """fn() in eager mode and under tritondtr: equal values and gradients."""

    def run():
        for t in leaves:
            t.grad = None
        out = fn()
        out.backward()
        return rt.unwrap(out.detach()).clone(), [t.grad.clone() for t in leaves]

    ref, gref = run()
    with rt.enable(**(enable or {"stress": True, "debug": True})):
        out, g = run()
    assert torch.equal(out, ref)
    for a, b in zip(g, gref):
        assert torch.equal(a, b)


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_view_replay_depth_is_bounded(grad):
    x = leaf(64) if grad else torch.randn(64)
    with rt.enable():
        root = x * 1
        y = root
        chain = []
        for _ in range(1000):
            y = y.view(64)
            chain.append(y)
        assert y._base is root and y.requires_grad == grad
        # below the limit autograd's record is eager's, one view op per view
        assert replay_ops(chain[VIEW_CHAIN_LIMIT - 2]) == ["view"] * (VIEW_CHAIN_LIMIT - 1)
        for t in chain:
            assert 1 <= len(replay_ops(t)) <= VIEW_CHAIN_LIMIT
        assert torch.equal(rt.unwrap(y), rt.unwrap(root))
        if grad:  # backward runs down a chain of views of the gradient: bounded as well
            arrived = []
            root.register_hook(lambda g: arrived.append(len(replay_ops(g))))
            y.sum().backward()
            assert 1 <= arrived[0] <= 2 * VIEW_CHAIN_LIMIT


VIEWS = (  # views that keep the chain going (no copies)
    lambda t: t.t(),
    lambda t: t.unsqueeze(0)[0],
    lambda t: t.reshape(t.shape),
    lambda t: t[:, 1:].narrow(1, 0, t.shape[1] - 1),
    lambda t: torch.movedim(t, 0, 1).mT,
)


def mixed_chain(a: torch.Tensor, k: int) -> list[torch.Tensor]:
    ys = [a]
    for i in range(k):
        ys.append(VIEWS[i % len(VIEWS)](ys[-1]))
    return ys[1:]


def test_mixed_view_chain_values_and_grads():
    x = leaf(6, 60)

    def fn():
        a = x.tanh() * 3
        ys = mixed_chain(a, DEEP)
        head, tail = a.view(-1)[:20], a.view(-1).split([20, 340])[1]
        return sum(v.exp().sum() * (i + 1) for i, v in enumerate(ys[-7:])) + head.sum() * (
            tail.sin().sum()
        )

    compare(fn, x)
    with rt.enable():
        ys = mixed_chain(x * 1, DEEP)
        assert max(len(replay_ops(y)) for y in ys) <= VIEW_CHAIN_LIMIT


def test_expand_chains():
    """A view that overlaps itself is re-rooted only if made in no-grad mode (NOTE [ View
    chains ] rule 4)."""
    x = leaf(1, 4)

    def fn():
        y = x * 2
        for _ in range(DEEP):
            y = y.expand(3, 4)
        return (y * torch.arange(12.0).view(3, 4)).sum()

    compare(fn, x)
    with rt.enable():
        y = z = x * 2
        for _ in range(DEEP):
            y = y.expand(3, 4)
        with torch.no_grad():
            for _ in range(DEEP):
                z = z.expand(3, 4)
        assert len(replay_ops(y)) == DEEP
        assert len(replay_ops(z)) <= VIEW_CHAIN_LIMIT
        assert torch.equal(rt.unwrap(z), rt.unwrap(y))


def test_writes_through_deep_views_reach_every_alias():
    x = leaf(4, 5)

    def fn():
        a = x * 1
        y = a
        for _ in range(DEEP):
            y = y.t()
        y[1].mul_(3)  # through a deep view of a tensor that requires grad
        z = a
        for _ in range(DEEP):
            z = z.view(20).view(4, 5)
        a.add_(x)  # through the base: the deep views see it, their grad_fn is rebuilt
        return (y.exp() * 2).sum() + (z * z).sum() + a.sum()

    compare(fn, x)
    with rt.enable():
        a = torch.zeros(4, 5) * 1
        y = a
        for _ in range(DEEP):
            y = y.view(20).view(4, 5)
        w = y[2]
        assert type(y) is DeepView or y._depth < VIEW_CHAIN_LIMIT
        assert w.add_(7) is w  # an in-place op returns its argument
        a[0].fill_(1)
        assert rt.unwrap(a)[2].eq(7).all() and rt.unwrap(y)[0].eq(1).all()


def test_deep_multi_output_and_no_grad_views_keep_eager_errors():
    """Re-rooted views keep autograd's creation meta: in-place rules as in eager."""
    x = leaf(4, 6)

    def errors(body):
        messages = []
        for ctx in (None, rt.enable()):
            with ctx or torch.enable_grad():
                with pytest.raises(RuntimeError) as e:
                    body()
                messages.append(str(e.value).split(".")[0])
        assert messages[0] == messages[1]

    def split_then_write():
        y = (x * 1).split(3, dim=1)[0]
        for _ in range(DEEP):
            y = y.view(12).view(4, 3)
        y.mul_(2)

    def no_grad_then_write():
        a = x * 1
        with torch.no_grad():
            y = a.view(24)
        for _ in range(DEEP):
            y = y.view(4, 6).view(24)
        y.mul_(2)

    errors(split_then_write)
    errors(no_grad_then_write)

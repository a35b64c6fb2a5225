"""Autocast under the runtime (NOTE [ Replay context ] rule 3 in runtime/recipe.py): a replay
runs the recorded op as it first ran, whatever autocast state is active when it runs.

Every nesting order of ``enable`` / ``autocast`` / backward, at ``stress`` and at a binding
budget (a fraction of the same order's baseline peak), exact (values and gradients) against
the same code in eager; a ``TransformerEncoderLayer`` training step under autocast at 40 % of
its baseline peak, repeated. CPU bfloat16, and CUDA float16 written the same way (GPU tests).
Before the rule, 6 of the 18 CPU order cases, the 3 boundary calls and the layer step (3 runs
of 3) failed."""

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tritondtr.runtime as rt
from tests.runtime.eager_check import compare

DEVICES = [
    pytest.param("cpu", torch.bfloat16, id="cpu-bf16"),
    pytest.param("cuda", torch.float16, id="cuda-fp16", marks=pytest.mark.gpu),
]


def leaves(device):
    g = torch.Generator().manual_seed(0)
    shapes = [(33, 47), (47, 61), (61, 61), (29, 61), (29,)]
    return [torch.randn(s, generator=g).to(device).requires_grad_() for s in shapes]


def forward(device, x, w1, w2, w3, b3):
    """Ops autocast casts (``mm``, ``linear``) around a region that opts out of autocast: under
    an outer autocast, a replay of the float32 ``mm`` in backward is where a re-cast showed."""
    h = torch.mm(x, w1)
    h = h.tanh() * h
    with torch.autocast(device, enabled=False):
        g = torch.mm(h.float(), w2)
        g = g.tanh() * g
    y = F.linear(g, w3, b3)
    return (y.float() ** 2).mean()


# Each order runs the step with ``S()`` (a tritondtr session, or nothing for eager) and
# ``A()`` (autocast) placed as its name says; ``fwd()`` returns the loss. ``ORDERS[name]``:
# (the order, the binding budget as a fraction of its baseline peak). A session around the
# backward alone gets 50 %: at 40 % one op's inputs exceed the budget (BudgetError).
ORDERS = {}


def order(fraction):
    def register(fn):
        ORDERS[fn.__doc__] = (fn, fraction)
        return fn

    return register


@order(0.4)
def _(S, A, fwd):
    """enable(autocast(fwd, bwd))"""
    with S(), A():
        fwd().backward()


@order(0.4)
def _(S, A, fwd):
    """autocast(enable(fwd, bwd))"""
    with A(), S():
        fwd().backward()


@order(0.4)
def _(S, A, fwd):
    """enable(autocast(fwd), bwd)"""
    with S():
        with A():
            loss = fwd()
        loss.backward()


@order(0.4)
def _(S, A, fwd):
    """enable(fwd, autocast(bwd))"""
    with S():
        loss = fwd()
        with A():
            loss.backward()


@order(0.4)
def _(S, A, fwd):
    """autocast(enable(fwd), bwd)"""
    with A():
        with S():
            loss = fwd()
        loss.backward()


@order(0.4)
def _(S, A, fwd):
    """enable(autocast(fwd)), bwd"""
    with S(), A():
        loss = fwd()
    loss.backward()


@order(0.4)
def _(S, A, fwd):
    """enable(fwd), autocast(bwd)"""
    with S():
        loss = fwd()
    with A():
        loss.backward()


@order(0.5)
def _(S, A, fwd):
    """autocast(fwd, enable(bwd))"""
    with A():
        loss = fwd()
        with S():
            loss.backward()


@order(0.5)
def _(S, A, fwd):
    """fwd, enable(autocast(bwd))"""
    loss = fwd()
    with S(), A():
        loss.backward()


def run_order(name, device, dtype, enable):
    """The order's loss, leaf gradients and session, the session made by ``enable(**enable)``
    (eager if ``enable`` is None)."""
    ps = leaves(device)
    sessions = []

    def S():
        if enable is None:
            return contextlib.nullcontext()
        sessions.append(rt.enable(**enable))
        return sessions[-1]

    losses = []

    def fwd():
        losses.append(forward(device, *ps))
        return losses[-1]

    ORDERS[name][0](S, lambda: torch.autocast(device, dtype=dtype), fwd)
    return rt.unwrap(losses[0].detach()), [p.grad for p in ps], sessions[0] if sessions else None


@pytest.mark.parametrize("device, dtype", DEVICES)
@pytest.mark.parametrize("name", list(ORDERS))
@pytest.mark.parametrize("setting", ["stress", "budget"])
def test_nesting_orders_exact(name, device, dtype, setting):
    ref, gref = run_order(name, device, dtype, None)[:2]
    if setting == "stress":
        opts = {"stress": True}
    else:
        peak = run_order(name, device, dtype, {"budget": None})[2].stats.peak_bytes
        # Analytic costs: the same victims in every run. With measured ones, a loaded box
        # once made "enable(fwd), autocast(bwd)" at 40 % leave a mul 7 % over the budget.
        opts = {"budget": int(ORDERS[name][1] * peak), "cost": "analytic"}
    loss, grads, s = run_order(name, device, dtype, opts)
    assert torch.equal(loss, ref)
    for g, r in zip(grads, gref):
        assert type(g) is torch.Tensor  # plain after exit, also when fwd ran outside
        assert torch.equal(g, r)
    assert s.stats.evictions > 0 and s.stats.rematerializations > 0


@pytest.mark.parametrize("device, dtype", DEVICES)
@pytest.mark.parametrize("read", ["tolist", "unwrap", "repr"])
def test_boundary_call_under_autocast(device, dtype, read):
    """A boundary call recomputes from Python, under the caller's autocast state, not from
    inside the mode's handler."""
    x, w = leaves(device)[:2]
    ref = torch.mm(x, w)
    with rt.enable(stress=True) as s:
        a = torch.mm(x, w)  # float32, evicted at once
        with torch.autocast(device, dtype=dtype):
            if read == "tolist":
                got = torch.tensor(a.tolist(), device=device)
            elif read == "unwrap":
                got = rt.unwrap(a)
            else:
                assert repr(a).startswith(repr(ref.detach())[:-1])
                got = rt.unwrap(a)
    assert s.stats.rematerializations > 0
    assert got.dtype == torch.float32 and torch.equal(got, ref.detach())


def transformer_step(layer, x, device, dtype, session):
    """One training step of a copy of ``layer`` with autocast around forward and backward:
    (loss, gradients, updated parameters)."""
    layer = copy.deepcopy(layer)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-2)
    torch.manual_seed(1)  # the same dropout masks in every run
    # CUDA's flash and memory-efficient attention backwards accumulate with atomics: two
    # eager runs can differ in the last bits. The math backend is deterministic.
    attention = sdpa_kernel(SDPBackend.MATH) if device == "cuda" else contextlib.nullcontext()
    with session, attention, torch.autocast(device, dtype=dtype):
        loss = layer(x).float().square().mean()
        loss.backward()
        opt.step()
    grads = [p.grad for p in layer.parameters()]
    return rt.unwrap(loss.detach()), grads, [p.detach() for p in layer.parameters()]


@pytest.mark.parametrize("device, dtype", DEVICES)
def test_transformer_layer_step_at_40_percent(device, dtype):
    """The issue's case: a bmm recomputed under autocast came out in half the bytes, in 8 of
    20 runs (eviction choices follow measured op costs, so runs differ); 5 runs here."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        d_model=64, nhead=4, dim_feedforward=96, dropout=0.1, batch_first=True
    ).to(device)
    x = torch.randn(5, 33, 64, device=device)
    ref = transformer_step(layer, x, device, dtype, contextlib.nullcontext())
    transformer_step(layer, x, device, dtype, base := rt.enable(budget=None))
    budget = int(0.4 * base.stats.peak_bytes)
    for _ in range(5):
        s = rt.enable(budget=budget)
        got = transformer_step(layer, x, device, dtype, s)
        assert s.stats.evictions > 0 and s.stats.rematerializations > 0
        for a, b in zip(got, ref):
            if isinstance(a, list):
                assert all(type(t) is torch.Tensor and torch.equal(t, u) for t, u in zip(a, b))
            else:
                assert torch.equal(a, b)


def test_autocast():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def fn():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return lin(lin(x).relu()).float().sum()

    compare(fn, *lin.parameters())

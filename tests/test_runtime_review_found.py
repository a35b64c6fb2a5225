"""Bugs found by reviewing the fixes of session 10's fuzzer findings (programs against eager
PyTorch, torch.equal), one smallest program each."""

import contextlib

import pytest
import torch
from torch import nn

import tritondtr.runtime as rt


def test_foreach_bumps_each_tensor_once():
    """NOTE [ Op semantics ] rule 11: an in-place foreach op inside a session moves each
    written tensor's ``_version`` by one, as eager's per-tensor kernels do (one
    ``increment_version`` call per tensor)."""
    ps = [torch.randn(3), torch.randn(3)]
    ref = [p + 1 for p in ps]
    with rt.enable(budget=None), torch.no_grad():
        torch._foreach_add_(ps, 1.0)
    assert all(torch.equal(p, r) for p, r in zip(ps, ref))
    eager = [torch.randn(3), torch.randn(3)]
    torch._foreach_add_(eager, 1.0)
    assert [p._version for p in ps] == [p._version for p in eager] == [1, 1]


@pytest.mark.parametrize("stress", [False, True])
def test_recomputation_under_inference_mode(stress):
    """An op under inference_mode hands its wrapper arguments out, recomputing them if
    evicted: the recomputation must not make the session's buffers inference tensors (a later
    in-place op on one raised, and reading one as a plain input raised "Inference tensors do
    not track version counter"). NOTE [ Replay context ] rule 4."""

    def prog(x, session=None):
        h1 = x * 2
        h2 = h1.sin()
        h3 = h2.exp()
        if session is not None:
            session.evict_all()
        with torch.inference_mode():
            m = float(h3.max())
        h2.mul_(0.5)
        out = (h3 * h2).sum() * m
        out.backward()
        return out.detach(), x.grad

    x0 = torch.randn(6, dtype=torch.float64)
    ref = prog(x0.clone().requires_grad_())
    with rt.enable(stress=stress) as s:
        got = prog(x0.clone().requires_grad_(), s)
    assert torch.equal(rt.unwrap(got[0]), ref[0])
    assert torch.equal(got[1], ref[1])


@pytest.mark.parametrize("via_data", [False, True])
def test_parameter_write_under_inference_mode(via_data):
    """A parameter write under inference_mode (an EMA or weight update) is a parameter write:
    it freezes before the op runs plain (NOTE [ What is tracked ] rule 7). Without it the
    recomputation raised StaleInputError (``p``) or read the new weights (``p.data``: a
    version counter of its own)."""

    def prog(p, x, session=None):
        h = (p * x).sin()
        with torch.inference_mode():
            (p.data if via_data else p).mul_(0.5)
        if session is not None:
            session.evict_all()  # h must be recomputed from the old p
        return (h * 1).detach()

    p0, x = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    ref = prog(p0.clone().requires_grad_(), x)
    p = p0.clone().requires_grad_()  # a parameter: made outside the session
    with rt.enable() as s:
        got = rt.unwrap(prog(p, x, s))
    assert torch.equal(got, ref)


@pytest.mark.parametrize("from_wrapper", [False, True])
def test_inference_tensor_read_by_a_recipe(from_wrapper):
    """A tensor made under inference_mode (a target), read afterwards by a tracked op that
    does not save it (eager allows that), then written under inference_mode: the read raised
    "Inference tensors do not track version counter" (recipes record a plain input's
    version); the recomputation after the write must read the old contents."""

    def prog(w, x, session=None):
        h = x * 1 if from_wrapper else x
        with torch.inference_mode():
            target = (h * 3).tanh()
        diff = h @ w - target
        loss = diff.square().mean()
        with torch.inference_mode():
            target.mul_(2)
        if session is not None:
            session.evict_all()  # diff must be recomputed from the old target
        loss.backward()
        return diff.detach() * 1, w.grad

    w0, x = torch.randn(8, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)
    ref = prog(w0.clone().requires_grad_(), x)
    w = w0.clone().requires_grad_()
    with rt.enable() as s:
        got = prog(w, x, s)
    assert torch.equal(rt.unwrap(got[0]), ref[0])
    assert torch.equal(got[1], ref[1])


@pytest.mark.parametrize("stress", [False, True])
@pytest.mark.parametrize("same", [False, True])
def test_foreach_write_to_two_views_of_one_tensor(stress, same):
    """An in-place foreach op on two views of one tracked tensor (or one view twice) raised
    StopIteration in outputs(): the cell, already moved to its new version, came again."""

    def prog(x):
        h = x * 2
        v1, v2 = (h[:3], h[:3]) if same else (h[:3], h[3:])
        torch._foreach_add_([v1, v2], 1.0)
        torch._foreach_mul_([v1, v2], [x[0], x[1]])
        out = (h * h).sum()
        out.backward()
        return h.detach() * 1, x.grad, h._version

    x0 = torch.randn(6, dtype=torch.float64)
    ref = prog(x0.clone().requires_grad_())
    x = x0.clone().requires_grad_()
    with rt.enable(stress=stress):
        got = prog(x)
    assert torch.equal(rt.unwrap(got[0]), ref[0])
    assert torch.equal(got[1], ref[1])
    assert got[2] == ref[2]


def test_batchnorm_over_several_steps_freezes_once_a_step():
    """NOTE [ Parameter writes ] rule 3 counts memory only while a recipe that read it lives:
    BatchNorm's running statistics, read by one step's backward recipes, are written by the
    next step's forward without a freeze, so every step still evicts under the budget (with
    the addresses of dead readers kept, each BN layer froze everything from step 2 on and
    nothing was evicted any more)."""
    from tritondtr.runtime.session import Session

    def run(ctx, steps=3):
        torch.manual_seed(0)
        m = nn.Sequential(
            *[nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.Tanh()) for _ in range(4)]
        ).double()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        x = torch.randn(128, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        rows, losses = [], []
        with ctx() as s:
            for _ in range(steps):
                e0, f0 = (s.stats.evictions, freezes[0]) if s else (0, 0)
                loss = m(x).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(rt.unwrap(loss).detach().clone())
                if s:
                    rows.append((s.stats.evictions - e0, freezes[0] - f0))
        return losses, [t.detach().clone() for t in m.state_dict().values()], rows, s

    freezes = [0]
    original = Session.freeze

    def counted(self):
        freezes[0] += 1
        return original(self)

    Session.freeze = counted
    try:
        ref, ref_state, _, _ = run(contextlib.nullcontext)
        *_, s = run(lambda: rt.enable(budget=None), steps=1)
        got, got_state, rows, _ = run(lambda: rt.enable(budget=s.stats.peak_bytes // 2))
    finally:
        Session.freeze = original
    assert all(torch.equal(rt.unwrap(a), b) for a, b in zip(got, ref))
    assert all(torch.equal(a, b) for a, b in zip(got_state, ref_state))
    assert all(e > 0 and f == 1 for e, f in rows), rows  # the optimizer's freeze only

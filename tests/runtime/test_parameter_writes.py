"""Writes to plain memory that recipes read (NOTE [ Parameter writes ] in runtime/boundary.py):
a write the session sees freezes what depends on the old value first; one it cannot see makes
a later recomputation raise StaleInputError. Optimizer steps, manual SGD through ``.data``,
BatchNorm's running statistics, a wrapper frozen by such a write, and a cache written in a
later session. ``.data`` assignment is test_data_assignment.py; writes under inference mode
are test_inference_mode.py."""

import contextlib

import pytest
import torch
from torch import nn

import tritondtr.runtime as rt
from tests.runtime.eager_check import leaf


def test_batch_norm_stats_not_updated_twice():
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(5)
    bn2 = torch.nn.BatchNorm1d(5)
    bn2.load_state_dict(bn.state_dict())
    x = leaf(8, 5)
    (bn(x).tanh().sum()).backward()
    with rt.enable(stress=True):
        (bn2(x).tanh().sum()).backward()
    for a, b in zip(bn.buffers(), bn2.buffers()):
        assert torch.equal(a, b)


def test_batchnorm_over_several_steps_freezes_once_a_step():
    """NOTE [ Parameter writes ] rule 3 counts memory only while a recipe that read it lives:
    BatchNorm's running statistics, read by one step's backward recipes, are written by the
    next step's forward without a freeze, so every step still evicts under the budget (with
    the addresses of dead readers kept, each BN layer froze everything from step 2 on and
    nothing was evicted any more). Found reviewing the fixes of the fuzzer's
    first finds (0544549)."""
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


def test_write_to_a_plain_input_inside_freezes_and_backward_fails_as_eager():
    """NOTE [ Parameter writes ] rule 3: the write freezes what depends on x; the backward then
    fails exactly as eager's does (x was saved for w's gradient)."""
    x = torch.randn(5)  # plain input from outside, no grad
    eager = {}
    for name, ctx in (
        ("eager", contextlib.nullcontext),
        ("tritondtr", lambda: rt.enable(stress=True)),
    ):
        w = leaf(5)
        xx = x.clone()
        with ctx():
            y = (xx * w).tanh()
            with torch.no_grad():
                xx.add_(1)
            with pytest.raises(RuntimeError, match="modified by an inplace operation") as e:
                y.sum().backward()
            eager[name] = str(e.value)
    assert eager["tritondtr"] == eager["eager"]


def test_changed_outside_input_raises_clear_error():
    """NOTE [ Parameter writes ] rule 4: a write the session does not see (here after exit)
    makes a later recomputation raise StaleInputError, not read the new contents."""
    x = torch.randn(5)  # plain input from outside, no grad
    with rt.enable(stress=True) as s:
        y = (x * 2).tanh()
    assert s.stats.evictions > 0
    x.add_(1)  # outside any session: unseen
    with pytest.raises(rt.StaleInputError, match="modified in place"):
        y.sum().item()


def test_parameter_update_hands_out_held_tensors():
    w = leaf(5)
    with rt.enable(stress=True):
        loss = (w * 2).exp().sum()
        loss.backward()
        with torch.no_grad():
            w.sub_(w.grad)  # an optimizer step
    assert loss.item() == (leaf(5) * 2).exp().sum().item()


def test_parameter_write_through_data():
    """Manual SGD written ``m.weight.data.sub_(...)``. Found by the differential fuzzer's first
    campaign (454b0e1)."""

    def step(ctx):
        torch.manual_seed(0)
        m = torch.nn.Linear(8, 1)
        x = torch.randn(4, 8)
        with ctx():
            loss = m(x).square().mean()
            loss.backward()
            m.weight.data.sub_(0.5 * m.weight.grad)  # manual SGD
            return loss.item()

    assert step(lambda: rt.enable(stress=True)) == step(contextlib.nullcontext)


def test_write_through_a_wrapper_frozen_by_a_parameter_write():
    """A wrapper frozen by a parameter write (NOTE [ Parameter writes ] rule 2), then
    written in place: its reader recomputes from the old value. Written with the fixes of
    the fuzzer's first finds (8bb2c44)."""

    def prog(p, session=None):
        h = p * 2
        with torch.no_grad():
            p.mul_(0.5)  # freezes h (NOTE [ Parameter writes ] rule 2): h is external now
        y = h.sin()  # reads h's buffer
        h.mul_(3)
        if session is not None:
            session.evict_all()  # y must be recomputed from the old h
        return y.detach()

    torch.manual_seed(0)
    p0 = torch.randn(6, dtype=torch.float64)
    ref = prog(p0.clone().requires_grad_())
    p = p0.clone().requires_grad_()  # a parameter: made outside the session
    with rt.enable() as s:
        got = rt.unwrap(prog(p, s))
    assert torch.equal(got, ref)


def test_cache_written_in_a_later_session():
    """A cache made in one session, read then written in place in the next ones (a decoder's KV
    cache with one session per step): the reads keep the values of before the write. Written with
    the fixes of the fuzzer's first finds (8bb2c44)."""

    def decode(session):
        torch.manual_seed(0)
        outs = []
        with session():
            cache = torch.zeros(8, 16, dtype=torch.float64) + 0
        for t in range(3):
            with session():
                att = (cache @ torch.randn(16, dtype=torch.float64)).softmax(0)
                cache[t].copy_(torch.randn(16, dtype=torch.float64))
                outs.append(att.sum().item() + att[0].item())
        return outs

    assert decode(lambda: rt.enable(stress=True)) == decode(contextlib.nullcontext)

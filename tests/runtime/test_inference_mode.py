"""Ops under ``torch.inference_mode`` in a session (NOTE [ What is tracked ] rule 7): their
results, recomputations that must not leave the session's buffers inference tensors (NOTE
[ Replay context ] rule 4), a parameter write under it, which freezes as any parameter write
does, and inference tensors that recipes read."""

import pytest
import torch

import tritondtr.runtime as rt


def test_inference_mode_inside_a_session():
    """Ops under inference_mode inside a session: their results, of wrappers and of plain
    tensors, equal eager's. Found by the differential fuzzer's first campaign (454b0e1)."""
    torch.manual_seed(0)
    w = torch.randn(6, 3, requires_grad=True)
    x, y = torch.randn(4, 6), torch.tensor([0, 1, 2, 0])
    with torch.inference_mode():
        ref = ((x @ w).argmax(-1) == y).float()
    with rt.enable(budget=None):
        logits = x @ w
        with torch.inference_mode():
            acc = (logits.argmax(-1) == y).float()
            first = logits[0] * 1
    assert torch.equal(rt.unwrap(acc), ref)
    assert torch.equal(rt.unwrap(first), (x @ w)[0].detach())


@pytest.mark.parametrize("stress", [False, True])
def test_recomputation_under_inference_mode(stress):
    """An op under inference_mode hands its wrapper arguments out, recomputing them if
    evicted: the recomputation must not make the session's buffers inference tensors (a later
    in-place op on one raised, and reading one as a plain input raised "Inference tensors do
    not track version counter"). NOTE [ Replay context ] rule 4. Found
    reviewing the fixes of the fuzzer's first finds (85e3b6f)."""

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
    version counter of its own). Found reviewing the fixes of the
    fuzzer's first finds (9ee911d)."""

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
    """A tensor made under inference_mode (a target), read afterwards by a tracked op that does
    not save it (eager allows that), then written under inference_mode: the read raised
    "Inference tensors do not track version counter" (recipes record a plain input's version);
    the recomputation after the write must read the old contents. Found reviewing the fixes of
    the fuzzer's first finds (65bea65)."""

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

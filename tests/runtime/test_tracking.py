"""What a session tracks (NOTE [ What is tracked ] in runtime/session.py): buffers made from
nothing tracked stay plain, results of plain inputs with grad mode off stay plain, and nested
tensors stay plain; values and gradients equal eager's."""

import pytest
import torch

import tritondtr.runtime as rt
from tests.runtime.eager_check import compare, leaf


def test_uninitialized_buffers_stay_plain():
    """NOTE [ What is tracked ] rule 5: torch.empty and friends made from nothing tracked are
    plain tensors (C++ code writes them through raw pointers); writes of tracked values into
    them keep values and gradients."""
    x = leaf(4, 6)
    with rt.enable(budget=None):
        a = x.sin()
        plain = [
            torch.empty(4, 6),
            torch.empty_like(x),
            x.new_empty(3),
            torch.empty_strided((2, 3), (1, 2)),
        ]
        assert all(type(t) is torch.Tensor for t in plain)
        assert type(torch.empty_like(a)) is rt.DTRTensor  # from a tracked tensor: tracked
        assert type(a.new_empty(2)) is rt.DTRTensor

    def fn():
        a = x.sin() * 2
        buf = torch.empty(4, 6)
        buf.copy_(a)  # a plain tensor written with a tracked value
        return (buf * a.cos()).sum()

    compare(fn, x)


def test_no_grad():
    x = torch.randn(4, 4)
    with rt.enable(stress=True):
        with torch.no_grad():
            plain = x @ x
            y = (x + 0).tanh()  # grad mode off and no wrapper input: plain
        z = x * 1  # tracked
        with torch.no_grad():
            tracked = z.exp()
    assert type(plain) is torch.Tensor and type(y) is torch.Tensor
    assert rt.is_tracked(tracked) and torch.equal(rt.unwrap(tracked), x.exp())


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_nested_tensor_stays_plain():
    """NOTE [ What is tracked ] rule 3: a nested tensor stays plain. Found by the differential
    fuzzer's first campaign (454b0e1)."""
    a, b = torch.randn(2, 5), torch.randn(3, 5)
    ref = torch.stack([t.sum() for t in (torch.nested.nested_tensor([a, b]) * 2).unbind()])
    with rt.enable(budget=None):
        nt = torch.nested.nested_tensor([a, b])
        out = torch.stack([t.sum() for t in (nt * 2).unbind()])
    assert torch.equal(rt.unwrap(out), ref)

"""Boundary calls (``.item()``, ``.tolist()``, ``.numpy()``, ``repr``, a custom op) inside a
session and after exit, and a write through a wrapper whose buffer one of them handed out.
Values equal eager's."""

import torch

import tritondtr.runtime as rt


def test_boundary_calls_inside_and_after_exit():
    x = torch.arange(6.0).reshape(2, 3)

    @torch.library.custom_op("tritondtr_test::twice", mutates_args=())
    def twice(t: torch.Tensor) -> torch.Tensor:
        return t * 2

    with rt.enable(stress=True):
        y = x + 1
        assert y.sum().item() == 21.0
        assert y.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
        assert (y.numpy() == (x + 1).numpy()).all()
        assert "tensor([[1., 2., 3." in repr(y)
        assert torch.equal(rt.unwrap(twice(y)), (x + 1) * 2)
        z = y * 2
    assert z.tolist() == [[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]]
    w = z + 1  # after exit: plain in, plain out
    assert type(w) is torch.Tensor and torch.equal(w, (x + 1) * 2 + 1)
    z.add_(1)
    assert torch.equal(rt.unwrap(z), w)


def test_write_through_a_handed_out_wrapper():
    """A write through a wrapper whose buffer ``.numpy()`` handed out: the op that read it
    first keeps the old value. Found by the differential fuzzer's first campaign (454b0e1)."""

    def prog(x):
        h = x.clone()
        _ = h.numpy()
        y = h + 1
        h[1:].mul_(2)
        return y

    x = torch.randn(4, 6, dtype=torch.float64)
    ref = prog(x)
    with rt.enable(stress=True):
        got = rt.unwrap(prog(x))
    assert torch.equal(got, ref)


def test_tolist_of_a_conjugate_view():
    """``.tolist()`` of a conjugate view of a wrapper. Found by the differential fuzzer
    (923164a)."""
    x = torch.randn(2, 3, dtype=torch.complex64)
    with rt.enable(budget=None):
        got = (x * 1).conj().tolist()
    assert got == x.conj().tolist()

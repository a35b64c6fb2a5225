"""In-place writes under the runtime: to a tensor and through its views, overwriting ops whose
new version does not depend on the old one (NOTE [ Overwriting ops ] in runtime/outputs.py),
and in-place foreach ops, which move each written tensor's version once as eager does (NOTE
[ Op semantics ] rule 11). Values, gradients and versions equal eager's (torch.equal)."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

import tritondtr.runtime as rt
from tests.runtime.eager_check import compare, leaf
from tritondtr.runtime.recipe import BLANK, READ, WRITE


@pytest.mark.parametrize("alias", [False, True], ids=["no-alias", "alias"])
def test_inplace(alias):
    x = leaf(4, 7)

    def fn():
        a = x * 2
        v = a[1] if alias else None
        a.add_(1).mul_(x)
        b = a.sigmoid() * 1
        b[0].zero_()
        out = b.sum() * 2
        return out + v.sum() if alias else out

    compare(fn, x)


def test_inplace_relu_and_view_write_match_eager_values():
    x = leaf(3, 4)

    def fn():
        a = x.exp() * 1
        a[:, 1:3] = a[:, 1:3] * 5  # copy_ into a view
        return F.relu(a - 2, inplace=True).sum()

    compare(fn, x)


def test_overwriting_ops_do_not_depend_on_the_old_version():
    """NOTE [ Overwriting ops ]: a new version written entirely by copy_ / fill_ / zero_ /
    bernoulli_ is recomputed from a fresh buffer, not from its old version; a partial write
    or one that reads its own buffer keeps the old version as a parent."""
    x = leaf(16, 16)
    with rt.enable(budget=None):
        m = torch.empty_like(x.tanh()).bernoulli_(0.5)
        assert [e[5] for e in m._cell.storage.recipe.inputs] == [BLANK]
        p = x.sin()
        p[1:].zero_()  # the slice does not cover the buffer
        assert [e[5] for e in p._cell.storage.recipe.inputs] == [WRITE]
        q = x.cos()
        q.fill_(q[1, 1])  # reads the buffer it overwrites
        assert sorted(e[5] for e in q._cell.storage.recipe.inputs) == [READ, WRITE]

    def fn():
        torch.manual_seed(5)
        h = x.tanh()
        for _ in range(3):
            h = F.dropout(h.sin(), 0.3)  # CPU: empty_like(h).bernoulli_(0.7).div_(0.7)
        buf = torch.empty_like(h)
        buf.copy_(h.exp())
        z = torch.zeros_like(h).fill_(2.0)
        w = x.sin()
        w[1:].zero_()
        v = x.cos()
        v.fill_(v[2, 3])
        return (h * buf * z * w * v).sum()

    compare(fn, x)


def test_foreach_bumps_each_tensor_once():
    """NOTE [ Op semantics ] rule 11: an in-place foreach op inside a session moves each written
    tensor's ``_version`` by one, as eager's per-tensor kernels do (one ``increment_version``
    call per tensor). Found reviewing the fixes of the fuzzer's first finds."""
    ps = [torch.randn(3), torch.randn(3)]
    ref = [p + 1 for p in ps]
    with rt.enable(budget=None), torch.no_grad():
        torch._foreach_add_(ps, 1.0)
    assert all(torch.equal(p, r) for p, r in zip(ps, ref))
    eager = [torch.randn(3), torch.randn(3)]
    torch._foreach_add_(eager, 1.0)
    assert [p._version for p in ps] == [p._version for p in eager] == [1, 1]


@pytest.mark.parametrize("stress", [False, True])
@pytest.mark.parametrize("same", [False, True])
def test_foreach_write_to_two_views_of_one_tensor(stress, same):
    """An in-place foreach op on two views of one tracked tensor (or one view twice) raised
    StopIteration in outputs(): the cell, already moved to its new version, came again. Found
    reviewing NOTE [ Op semantics ] rule 11 (13f7142)."""

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


def test_foreach_write_bumps_versions():
    """Fixed means: the version moves as in eager, and the recomputation either gives eager's
    values or raises the documented StaleInputError (as a plain ``buf.mul_(3.0)`` does). Found by
    the differential fuzzer in the optimizers' foreach path (cb57e1d)."""

    def prog(ctx):
        torch.manual_seed(0)
        x, buf = torch.randn(4, 4), torch.randn(4, 4)
        with ctx():
            y = (x * 1) @ buf
            torch._foreach_mul_([buf], 3.0)
            version = buf._version
            try:
                return rt.unwrap(y).clone(), version
            except rt.StaleInputError:
                return None, version

    ref, ref_version = prog(contextlib.nullcontext)
    got, version = prog(lambda: rt.enable(stress=True))
    assert version == ref_version
    assert got is None or torch.equal(got, ref)

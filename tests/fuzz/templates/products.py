"""Templates of products and linear algebra: matmul / linear / einsum, batched products
(bmm, baddbmm, addmm, outer, cdist, kron, tensordot), and linalg on square matrices made from
the data (solve, Cholesky of an SPD matrix, QR, SVD and pinv compared only through sign-free
quantities, inv, det, slogdet, matrix_exp). The known limits they avoid are named
(limits.py)."""

from __future__ import annotations

import math

from ..limits import may_values_only_linalg
from .registry import fl, template


@template("matmul", 3)
def t_matmul(g):
    x = g.pick(lambda v: fl(v) and v.dim() >= 1)
    if x is None:
        return None
    xv = g.ns[x]

    def fits(v, axis):
        return fl(v) and v.dim() >= 1 and v.dtype == xv.dtype and v.shape[axis] == xv.shape[-1]

    right = [n for n in g.names(lambda v: fits(v, 0 if v.dim() == 1 else -2))]
    rows = [n for n in g.names(lambda v: fits(v, -1) and v.dim() == 2)]
    o = g.new()
    if right and g.r.random() < 0.5:
        return f"{o} = {x} @ {g.r.choice(right)}"
    if not rows:
        return None
    y = g.r.choice(rows)
    forms = ["{x} @ {y}.t()", "F.linear({x}, {y})", "torch.einsum('...i,ji->...j', {x}, {y})"]
    return f"{o} = " + g.r.choice(forms).format(x=x, y=y)


@template("batched", 3)
def t_batched(g):
    x = g.pick(lambda v: fl(v) and v.dim() in (2, 3) and v.numel() > 0)
    if x is None:
        return None
    if g.ns[x].dim() == 3:
        forms = (
            *("torch.bmm({x}, {x}.mT)", "torch.einsum('bij,bkj->bik', {x}, {x})"),
            *("torch.einsum('bij->j', {x})", "torch.matmul({x}, {x}.mT).diagonal(0, -2, -1)"),
            "torch.baddbmm(torch.ones(1, dtype={x}.dtype), {x}, {x}.mT, beta=0.5, alpha=2)",
            "torch.baddbmm({x}.mT @ {x}, {x}.mT, {x})",
            "torch.tensordot({x}, {x}, dims=([1, 2], [1, 2]))",
        )
    else:
        forms = (
            *("torch.addmm({x}[:, :1], {x}, {x}.t())", "torch.outer({x}[0], {x}[-1])"),
            *("torch.addmv({x}[:, 0], {x}, {x}[0], beta=2)", "torch.einsum('ij,ij->i', {x}, {x})"),
            *("torch.cdist({x}, {x})", "torch.kron({x}[:2, :2], {x}[:2, :2])"),
            "torch.linalg.vector_norm({x}, ord=3, dim=-1)",
            "torch.chain_matmul({x}, {x}.t(), {x})",
        )
    return f"{g.new()} = " + g.r.choice(forms).format(x=x)


LINALG = (
    "torch.linalg.solve({s}, {m})",
    "torch.linalg.cholesky({s})",
    "torch.cholesky_solve({m}, torch.linalg.cholesky({s}))",
    "torch.linalg.solve_triangular(torch.linalg.cholesky({s}), {m}, upper=False)",
    "torch.linalg.inv({s})",
    "torch.linalg.slogdet({s})",
    "torch.linalg.matrix_exp({m} * 0.25)",
    "torch.linalg.pinv({m}) @ {m}",
    "torch.linalg.lu_solve(*torch.linalg.lu_factor({s}), {m})",
    "torch.linalg.matrix_power({m}, 3)",
    "torch.linalg.multi_dot([{m}, {m}.mT, {m}])",
)


# Known limit values-only-linalg-under-a-mode: only on inputs that require grad.
VALUES_ONLY = (
    "torch.linalg.svdvals({m})",
    "torch.linalg.eigvalsh({s})",
    "torch.linalg.matrix_norm({m}, 'nuc')",
    "torch.linalg.matrix_norm({m}, 2)",
    "torch.linalg.cond({s})",
)


# Sign-free quantities only: Q R and U S Vh are unique up to signs that another LAPACK path
# could flip, their products are not.
LINALG_PAIRS = (
    "_q, _r = torch.linalg.qr({m}); {o} = _q @ _r; {p} = _r.diagonal().abs(); del _q, _r",
    "_u, {o}, _vh = torch.linalg.svd({m}); {p} = (_u * {o}) @ _vh; del _u, _vh",
    "_l, {o} = torch.linalg.eigh({s}); {p} = _l.sum() + ({o} * {o}).sum(); del _l",
)


@template("linalg", 3)
def t_linalg(g):
    x = g.pick(lambda v: fl(v) and v.numel() >= 4)
    if x is None:
        return None
    n = min(math.isqrt(min(g.ns[x].numel(), 16)), 4)
    m, s = g.new(), g.new()
    base = (
        f"{m} = {x}.flatten()[:{n * n}].reshape({n}, {n}); "
        f"{s} = {m} @ {m}.mT + {n} * torch.eye({n}, dtype={x}.dtype)\n"
    )
    if g.r.random() < 0.3:
        return base + g.r.choice(LINALG_PAIRS).format(m=m, s=s, o=g.new(), p=g.new())
    forms = LINALG + (VALUES_ONLY if may_values_only_linalg(g.ns[x]) else ())
    if not g.ns[x].requires_grad:  # known limit det-double-backward-under-a-mode
        forms += ("torch.linalg.det({m})",)
    return base + f"{g.new()} = " + g.r.choice(forms).format(m=m, s=s)

"""Templates that write: in-place ops on a tensor or a view of it (and in-place view ops,
a custom Function marking its input dirty), in-place writes through narrow / unfold /
as_strided / select views, ``.data`` assignments (between program tensors of the same or
another shape and dtype, on the first leaves, and of a plain tensor to a tensor the body made,
which the runtime refuses: limits.expected_refusal), and optimizer steps. The known limits
they avoid are named (limits.py)."""

from __future__ import annotations

import torch

from ..limits import (
    may_inplace_view_op,
    may_reshape_data,
    may_swap_data,
    may_write,
)
from .registry import fl, is_t, template

WRITE_FLOAT = (
    *("mul_(1.5)", "add_(1)", "zero_()", "fill_(0.25)", "neg_()", "exp_()", "tanh_()"),
    *("normal_()", "copy_(torch.ones_like({t}) * 3)", "add_({t})", "mul_({t}.detach())"),
    "masked_fill_({t}.real > 0 if {t}.is_complex() else {t} > 0, 0.0)",
    "addcmul_({t}, {t}, value=0.1)",
)


WRITE_REAL = (
    *("sigmoid_()", "clamp_(-0.5, 0.5)", "uniform_()", "bernoulli_(0.5)", "exponential_()"),
    "lerp_(torch.zeros_like({t}), 0.5)",
)


WRITE_INT = ("add_(1)", "mul_(2)", "zero_()", "fill_(1)", "logical_not_()")


WRITE_WHOLE = (
    "{b}.index_add_(0, torch.tensor([0, {n}, 0]), torch.ones(3, *{b}.shape[1:], dtype={b}.dtype))",
    "{b}.index_put_((torch.tensor([0, {n}, 0]),), torch.ones(3, *{b}.shape[1:], dtype={b}.dtype), "
    "accumulate=True)",
    "{b}.index_put_((torch.tensor([0, {n}]),), "
    "torch.full((2, *{b}.shape[1:]), 7, dtype={b}.dtype))",
    "{b}.scatter_(0, torch.zeros(1, *{b}.shape[1:], dtype=torch.long), "
    "torch.ones(1, *{b}.shape[1:], dtype={b}.dtype))",
    "{b}.scatter_add_(0, torch.zeros(2, *{b}.shape[1:], dtype=torch.long), "
    "torch.ones(2, *{b}.shape[1:], dtype={b}.dtype))",
    *("{b}[{b} > 0] = 0", "{b}[0] = 5", "{b}[torch.tensor([0, {n}])] += 1"),
    "{b}.masked_scatter_({b} > 0, torch.arange({b}.numel(), dtype={b}.dtype).reshape({b}.shape))",
    *("{b}.index_fill_(0, torch.tensor([{n}]), -1)", "torch.add({b}, 1, out={b})"),
    "torch.mul({b}, 2, out={b})",
)


# Known limit inplace-view-op-with-grad: only on a tensor that does not require grad.
INPLACE_VIEW = (
    *("{b}.squeeze_()", "{b}.unsqueeze_(-1)", "{b}.detach_()", "{b}.requires_grad_(False)"),
    "{b}.as_strided_(({b}.numel(),), (1,)) if {b}.is_contiguous() else {b}.unsqueeze_(0)",
)


INPLACE_VIEW_1D = ("{b}.transpose_(0, -1)", "{b}.swapdims_(0, -1)")


@template("inplace", 9)
def t_inplace(g):
    """An in-place write to a tensor ``b`` or a view of it: ``b`` is a fresh clone (always
    after exit: known limit unwatched-writes) or an existing tensor."""
    r = g.r
    x = g.pick(lambda v: is_t(v) and may_write(v))  # known limit write-to-empty-input
    if x is None:
        return None
    v = g.ns[x]
    if g.section == "post" or r.random() < 0.65:
        b = g.new()
        base = f"{b} = {x}.clone()\n"
    else:
        b, base = x, ""
    d = v.dim()
    targets = ["{b}"]
    if d >= 1:
        targets += ["{b}[1:]", "{b}[::2]", "{b}[-1]"]
        targets += ["{b}.view(-1)[::3] if {b}.is_contiguous() else {b}[0]"]
    if d >= 2:
        targets += ["{b}.t()" if d == 2 else "{b}.transpose(0, 1)", "{b}.diagonal()"]
        targets += ["{b}[1:].t()" if d == 2 else "{b}[1:][0]", "{b}[:, ::2]", "{b}[1:][:, 1:]"]
        targets += ["{b}.transpose(0, 1)[1:]"]
    isf = v.dtype.is_floating_point
    if isf or v.dtype.is_complex:
        ops = list(WRITE_FLOAT) + (list(WRITE_REAL) if isf else [])
        if d >= 1:
            ops.append("copy_({t}.flip(0))")
    else:
        ops = [*WRITE_INT, "bitwise_not_()" if v.dtype == torch.bool else "neg_()"]
    t = f"_t{g.k}"
    stmt = f"{t} = {r.choice(targets).format(b=b)}; {t}." + r.choice(ops).format(t=t)
    if d >= 1 and r.random() < 0.35 and (isf or v.dtype == torch.int64):
        stmt = r.choice(WRITE_WHOLE).format(b=b, n=v.shape[0] - 1)
    if may_inplace_view_op(v) and r.random() < 0.2:
        stmt = r.choice(INPLACE_VIEW + (INPLACE_VIEW_1D if d >= 1 else ())).format(b=b)
        if r.random() < 0.5:
            stmt += f"; {b}.mul_(1.25) if {b}.is_floating_point() else {b}.add_(1)"
    if r.random() < 0.15 and isf and base:
        stmt = f"{b} = Dirty.apply({b})"
    return base + stmt


VIEW_TARGET = (
    "{b}.narrow(-1, 1, max(1, {b}.shape[-1] - 2))",
    "{b}.unfold(-1, 2, 2)",
    "{b}.as_strided((2,), (2,), {b}.storage_offset() + 1) if {b}.is_contiguous() "
    "and {b}.numel() >= 4 else {b}[..., :1]",
    "{b}.select(-1, 0)",
    "{b}.diagonal(offset=1, dim1=0, dim2=-1) if {b}.dim() >= 2 else {b}[1:]",
    "{b}.movedim(0, -1)[..., :1]",
    "{b}.unflatten(-1, (1, -1))[..., ::2]",
    "{b}.view(-1)[1::2] if {b}.is_contiguous() else {b}.flip(0)[0]",
)


VIEW_WRITE = (
    *("mul_(2)", "add_({t}.detach())", "clamp_(min=0.1)", "clamp_(max={t}.detach().mean())"),
    *("masked_fill_({t} > 0, torch.tensor(0.5, dtype={t}.dtype))", "copy_({t}.exp())"),
    "copy_(torch.where({t} > 0, {t}, {t} * 0.1))",
    "index_add_(-1, torch.zeros(1, dtype=torch.long), torch.ones_like({t}[..., :1]))",
    "scatter_(-1, torch.zeros_like({t}[..., :1], dtype=torch.long), 3.0, reduce='add')",
    "put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0], dtype={t}.dtype), accumulate=True)",
    "index_put_((torch.tensor([0, 0]),), torch.tensor(1.0, dtype={t}.dtype), accumulate=True)",
    "scatter_reduce_(-1, torch.zeros_like({t}, dtype=torch.long), {t} * 2, 'amax')",
    "addcdiv_({t}, {t}.abs() + 1, value=0.5)",
    "lerp_({t}.detach() * 2, {t}.detach().sigmoid())",
)


@template("viewwrite", 5)
def t_viewwrite(g):
    """An in-place write through a narrow / unfold / as_strided / select view of a fresh clone
    (or of an existing tensor, in the body)."""
    x = g.pick(lambda v: fl(v) and v.dim() >= 1 and may_write(v))  # write-to-empty-input
    if x is None:
        return None
    if g.section == "post" or g.r.random() < 0.7:  # unwatched-writes: a clone after exit
        b = g.new()
        base = f"{b} = {x}.clone()\n"
    else:
        b, base = x, ""
    t = f"_t{g.k}"
    target = g.r.choice(VIEW_TARGET).format(b=b)
    stmt = f"{t} = {target}; {t}." + g.r.choice(VIEW_WRITE).format(t=t)
    if g.r.random() < 0.3:
        stmt += f"\n{g.new()} = {b} * 2"
    return base + stmt


@template("data", 3)
def t_data(g):
    """``c.data = t``: ``c`` and ``t`` program tensors (same shape and dtype, or not), a first
    leaf ``p`` given a new value (manual SGD), or ``c`` given a plain leaf made before the
    session (refused for a ``c`` the body made: docs/runtime.md, Limitations)."""
    r = g.r
    c = g.pick(lambda v: is_t(v) and not v.dtype.is_complex and may_swap_data(v, g.ns))
    if c is None:
        return None
    cv = g.ns[c]
    same = g.names(lambda v: is_t(v) and v.shape == cv.shape and v.dtype == cv.dtype)
    other = g.names(lambda v: is_t(v) and not v.dtype.is_complex and v.shape != cv.shape)
    leaves = g.names(lambda v: fl(v) and v.is_leaf and v.requires_grad and v.numel() > 0)
    leaves = [n for n in leaves if n.startswith("a") and may_swap_data(g.ns[n], g.ns)]
    forms = []
    if same:
        t = r.choice(same)
        scaled = f"{t}.detach() * 2 if {t}.is_floating_point() else {t}.detach() + 1"
        forms += [f"{c}.data = {t}", f"{c}.data = {scaled}"]
    reshape = may_reshape_data(cv, g.ns)  # leaf-data-reshaped-..., view-replay-after-...
    if other and reshape:
        forms += [f"{c}.data = {r.choice(other)}"]
    if cv.dim() >= 1 and cv.shape[0] >= 2:
        forms += [f"{c}.data = {c}.detach().flip(0)"]
        forms += [f"{c}.data = {c}.detach()[1:]"] if reshape else []
    if leaves:
        p = r.choice(leaves)
        pv = g.ns[p]
        forms += [f"{p}.data = {p}.data * 0.5 + 0.25", f"{p}.data = {p}.detach().tanh()"]
        if pv.grad is not None:
            forms += [f"{p}.data = {p}.data - 0.1 * {p}.grad"] * 2
        fit = g.names(lambda v: fl(v) and v.shape == pv.shape and v.dtype == pv.dtype)
        if fit:
            forms += [f"{p}.data = {r.choice(fit)}"]
    plain = [n for n in g.names(lambda v: is_t(v) and not v.dtype.is_complex)]
    plain = [n for n in plain if n.startswith("a") and n != c]
    if not reshape:
        plain = [n for n in plain if g.ns[n].shape == cv.shape]
    if plain and g.section == "body" and r.random() < 0.15:  # limits.expected_refusal
        return f"{c}.data = {r.choice(plain)}"
    return r.choice(forms) if forms else None


OPTIMIZERS = (
    "torch.optim.SGD([{ps}], lr=0.1, momentum=0.9)",
    "torch.optim.Adam([{ps}], lr=0.01)",
    "torch.optim.AdamW([{ps}], lr=0.01, foreach=True)",
    "torch.optim.SGD([{ps}], lr=0.1, foreach=False)",
)


@template("optim", 1)
def t_optim(g):
    def steps(v):  # known limit write-to-empty-input: a step writes the parameter
        return fl(v) and v.requires_grad and v.is_leaf and v.grad is not None and may_write(v)

    ls = g.names(steps)
    if not ls:
        return None
    ps = ", ".join(g.r.sample(ls, min(2, len(ls))))
    g.k += 1
    o = f"_opt{g.k}"
    return f"{o} = {g.r.choice(OPTIMIZERS).format(ps=ps)}\n{o}.step()\n{o}.zero_grad()"

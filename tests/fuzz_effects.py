"""Line templates with effects (registered in fuzz_templates.TEMPLATES): in-place writes, grad
modes, new leaves, boundary calls (``.item()``, ``.tolist()``, branching on values), backward
passes, optimizer steps and ``session.evict_all()``. The known limits they avoid are named
(fuzz_limits.py)."""

from __future__ import annotations

import torch
from fuzz_limits import may_inplace_view_op, may_tolist, may_write
from fuzz_templates import fl, is_t, rg, template


@template("grad_mode", 2)
def t_grad_mode(g):
    x = g.pick(is_t)
    if x is None:
        return None
    o = g.new()
    ctx = g.r.choice(["torch.no_grad()", "torch.enable_grad()", "torch.set_grad_enabled(False)"])
    inner = [
        "{o} = {x} * 2",
        "{o} = {x}.clone(); {o}.add_(1)",
        "{o} = {x}[1:] if {x}.dim() else {x} + 1",
        "{o} = ({x} + 1).detach()",
    ]
    if may_write(g.ns[x]):  # known limit write-to-empty-input
        inner.append("{x}.add_(0.5) if not {x}.requires_grad else None; {o} = {x} + 0")
    return f"with {ctx}:\n    " + g.r.choice(inner).format(o=o, x=x)


LEAFY = (
    "{o} = {x}.detach().clone().requires_grad_()",
    "{o} = {x}.detach()",
    "{o} = {x}.detach().requires_grad_()",
    "{o} = {x} * 1; {o}.retain_grad()",
    "{o} = {x} + 0; {o}.register_hook(lambda g: g * 2)",
    "{o} = {x}.new_zeros(0, 3)",
    "{o} = torch.zeros(3, dtype=torch.float64, requires_grad=True)",
    "{o} = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64) * 2",
    "{o} = torch.ones((), dtype=torch.float64)",
    "{o} = torch.arange(6, dtype=torch.float64).reshape(2, 3)",
    "{o} = torch.empty(3, 4, dtype=torch.float64).fill_(2.0)",
    "{o} = torch.full((2, 2), 3.0, requires_grad=True)",
)


@template("leafy", 3)
def t_leafy(g):
    x = g.pick(fl)
    return None if x is None else g.r.choice(LEAFY).format(o=g.new(), x=x)


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


BOUNDARY = (
    "_s = {x}.sum().item()\n{o} = {x} * 2 if _s > 0 else {x} * 3",
    "_r = repr({x})\n{o} = {x} * 1",
    "if bool(({x} != 0).any()):\n    {o} = {x} + 1\nelse:\n    {o} = {x} - 1",
    "_S.evict_all()\n{o} = {x} * 2",
    "{o} = {x}.new_tensor([1.0, 2.0])",
    "{o} = {x}.sum().item() + 0 if {x}.dtype != torch.bool else 0",
)


@template("boundary", 2)
def t_boundary(g):
    x = g.pick(lambda v: is_t(v) and v.numel() >= 1)
    if x is None:
        return None
    forms = list(BOUNDARY)
    if may_tolist(g.ns[x]):  # known limit tolist-of-conj-view
        forms.append("_l = {x}.tolist()\n{o} = torch.tensor(_l, dtype={x}.dtype)")
    return g.r.choice(forms).format(o=g.new(), x=x)


@template("backward", 2)
def t_backward(g):
    """A loss of 1-4 tensors that require grad, then ``backward`` (once, twice, with
    ``retain_graph``, of a vector), ``autograd.grad`` or a double backward."""
    r = g.r
    ds = g.names(lambda v: rg(v) and (v.dtype.is_floating_point or v.dtype.is_complex))
    if not ds:
        return None
    sel = r.sample(ds, min(len(ds), r.randint(1, 4)))
    parts = [
        f"{n}.abs().sum() * {i + 1}" if g.ns[n].dtype.is_complex else f"{n}.sum() * {i + 1}"
        for i, n in enumerate(sel)
    ]
    g.k += 1
    L = f"L{g.k}"
    loss = f"{L} = ({' + '.join(parts)}).double()\n"
    leaves = g.names(lambda v: rg(v) and v.is_leaf)
    kind = r.choice(["bw", "bw2", "grad", "dbl", "gradvec", "bw_retain"])
    if kind == "bw_retain":
        return f"{loss}{L}.backward(retain_graph=True)"
    if kind == "bw2":
        return f"{loss}{L}.backward(retain_graph=True)\n{L}.backward()"
    if kind == "gradvec" and not g.ns[sel[0]].dtype.is_complex:
        return f"{sel[0]}.backward(torch.ones_like({sel[0]}), retain_graph=True)"
    if kind in ("bw", "gradvec") or not leaves:
        return f"{loss}{L}.backward()"
    ls = ", ".join(r.sample(leaves, min(len(leaves), 3)))
    g.k += 1
    gr = f"g{g.k}"
    if kind == "grad":
        keep = r.random() < 0.5
        return (
            f"{loss}{gr} = torch.autograd.grad({L}, [{ls}], allow_unused=True, retain_graph={keep})"
        )
    return (
        f"{loss}{gr} = torch.autograd.grad({L}, [{ls}], create_graph=True, allow_unused=True)\n"
        f"{L}b = sum((_g.abs() if _g.is_complex() else _g).square().sum() "
        f"for _g in {gr} if _g is not None)\n"
        f"if torch.is_tensor({L}b) and {L}b.requires_grad:\n    {L}b.backward()"
    )


@template("evict", 1)
def t_evict(g):
    return "_S.evict_all()"


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

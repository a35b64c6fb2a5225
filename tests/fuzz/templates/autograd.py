"""Templates of autograd: grad modes, new leaves (detach, requires_grad_, retain_grad,
hooks, factories), backward passes (once, twice, with ``retain_graph``, of a vector,
``autograd.grad``, double backward), custom autograd Functions (saving an output, a view,
non-differentiable outputs), manual ``.grad`` writes and ``requires_grad_`` toggles, saved
tensor hooks, and torch.func and vmap (``vmap``, nested and with ``in_dims``, ``grad``,
``grad_and_value``, ``vjp``, ``jvp``, ``jacrev``, ``autograd.functional``'s ``jacobian``,
``hessian`` and ``hvp``). :data:`FUNCTIONS` is the source of the Functions they call. The
known limits they avoid are named (limits.py)."""

from __future__ import annotations

from ..limits import may_assign_grad, may_write
from .registry import fl, is_t, rg, template

FUNCTIONS = """
class SaveOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y

class SaveView(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x.unsqueeze(0))
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (xv,) = ctx.saved_tensors
        return g * xv.squeeze(0).cos()

class TwoOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        m = x > 0
        ctx.mark_non_differentiable(m)
        ctx.save_for_backward(m)
        return x * 3, m

    @staticmethod
    def backward(ctx, g, gm):
        (m,) = ctx.saved_tensors
        return g * 3 + m.to(g.dtype)

class ViewOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * 2

class Lazy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x * 2, x + 1

    @staticmethod
    def backward(ctx, g1, g2):
        (x,) = ctx.saved_tensors
        out = torch.zeros_like(x)
        if g1 is not None:
            out = out + 2 * g1
        if g2 is not None:
            out = out + g2 * x
        return out
"""


FUNCTION_NAMES = frozenset({"SaveOut", "SaveView", "TwoOut", "ViewOut", "Lazy"})


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


FUNCTION = (
    "{o} = SaveOut.apply({x})",
    "{o} = SaveView.apply({x})",
    "{o}, {p} = TwoOut.apply({x})",
    "{o} = ViewOut.apply({x}) * 1",
    "{o}, {p} = Lazy.apply({x})",
    "{o} = Lazy.apply({x})[0]",
    "{o} = SaveOut.apply(SaveView.apply({x}))",
)


@template("function", 2)
def t_function(g):
    x = g.pick(fl)
    if x is None:
        return None
    o = g.new()
    return g.r.choice(FUNCTION).format(o=o, p=g.new(), x=x)


@template("gradwrite", 2)
def t_gradwrite(g):
    """A ``.grad`` set, scaled, clipped or dropped by hand; ``requires_grad_`` toggled on a
    leaf; a hook on a leaf's accumulated grad."""
    leaves = g.names(lambda v: fl(v) and v.is_leaf and v.numel() > 0)
    if not leaves:
        return None
    x = g.r.choice(leaves)
    v = g.ns[x]
    forms = []
    if v.requires_grad:
        if may_assign_grad(x):  # known limit hand-assigned-wrapper-grad: a plain .grad
            forms += ["with torch.no_grad():\n    {x}.grad = torch.ones_like({x})"]
            forms += ["with torch.no_grad():\n    {x}.grad = torch.full_like({x}, 0.5).mT.mT * 1"]
            forms += ["{x}.grad = None"]
        forms += [
            "torch.nn.utils.clip_grad_norm_([{ls}], 1.0)",
            "torch.nn.utils.clip_grad_value_([{ls}], 0.1)",
            "{x}.requires_grad_(False)",
            "{x}.register_post_accumulate_grad_hook(lambda p: p.grad.mul_(0.5))",
        ]
        if v.grad is not None:
            forms += ["{x}.grad.mul_(0.5)", "{x}.grad.zero_()", "{x}.grad += {x}.detach()"]
            forms += ["torch._foreach_mul_([{x}.grad], 2.0)"]
    else:
        forms += ["{x}.requires_grad_()", "{x}.requires_grad_(); {o} = ({x} * {x}).sum()"]
    sample = g.r.sample(leaves, min(2, len(leaves)))
    ls = ", ".join(n for n in sample if g.ns[n].requires_grad) or x
    return g.r.choice(forms).format(x=x, ls=ls, o=g.new())


HOOKS = (
    "torch.autograd.graph.saved_tensors_hooks(lambda t: t * 1, lambda t: t)",
    "torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t + 0)",
    "torch.autograd.graph.saved_tensors_hooks(lambda t: (t,), lambda p: p[0])",
    "torch.autograd.graph.save_on_cpu()",
)


@template("savedhooks", 1)
def t_savedhooks(g):
    x = g.pick(lambda v: rg(v) and fl(v))
    if x is None:
        return None
    o, p = g.new(), g.new()
    inner = g.r.choice(
        [
            "{o} = ({x}.tanh() * {x}).sum(); {p} = {x}.exp() * {x}",
            "{o} = SaveOut.apply({x}) * {x}; {p} = {o}.sin()",
            "{o} = {x}.sigmoid(); {p} = ({o} * {o}).sum()",
        ]
    )
    return f"with {g.r.choice(HOOKS)}:\n    " + inner.format(o=o, p=p, x=x)


FUNC_ANY = (
    "torch.vmap(lambda r: (r.sin() * r).sum())({x})",
    "torch.vmap(lambda r: r.cumsum(0) / (r.norm() + 1))({x})",
    "torch.vmap(lambda r, s: r * s + s.mean(), in_dims=(0, None))({x}, {x}[0])",
    "torch.vmap(lambda r: torch.where(r > 0, r.exp(), r * 2), out_dims=-1)({x})",
    "torch.func.grad(lambda r: (r.tanh() * r).sum())({x})",
    "torch.func.grad(lambda r: r.logsumexp(0).sum() if r.dim() else r.sigmoid())({x})",
    "torch.func.grad_and_value(lambda r: (r.sin() ** 2).sum())({x})",
    "torch.func.jvp(lambda r: r.sin() * r, ({x},), (torch.ones_like({x}),))",
    "torch.func.jacrev(lambda r: r.sin() * r.sum())({x}.flatten()[:4])",
    "torch.func.jacfwd(lambda r: r.exp() * r[0])({x}.flatten()[:3])",
    "torch.autograd.functional.jacobian(lambda r: r.tanh() * r, {x}.flatten()[:4])",
    "torch.autograd.functional.hessian(lambda r: (r.tanh() * r).sum(), {x}.flatten()[:3])",
    "torch.autograd.functional.hvp(lambda r: (r.sin() * r).sum(), {x}.flatten()[:4], "
    "torch.ones_like({x}.flatten()[:4]))",
    "torch.autograd.functional.vjp(lambda r: r.exp().sum(0), {x}, torch.ones_like({x}.sum(0)))",
)


FUNC_2D = (
    "torch.vmap(lambda r: r.softmax(-1) * r.amax())({x})",
    "torch.vmap(torch.outer)({x}, {x})",
    "torch.vmap(torch.vmap(lambda v: v.exp() - v))({x})",
    "torch.vmap(lambda r: r @ r.t() if r.dim() == 2 else r.outer(r))({x})",
    "torch.func.vmap(torch.func.grad(lambda r: (r.tanh() ** 2).sum()))({x})",
)


VJP = "{o}, _fn = torch.func.vjp(lambda r: r.tanh() * 2, {x}); {p} = _fn(torch.ones_like({o}))[0]"


@template("func", 3)
def t_func(g):
    x = g.pick(lambda v: fl(v) and v.dim() >= 1 and v.shape[0] >= 1 and v.numel() >= 4)
    if x is None:
        return None
    forms = list(FUNC_ANY) + (list(FUNC_2D) if g.ns[x].dim() >= 2 else [])
    if g.r.random() < 0.1:
        return VJP.format(o=g.new(), p=g.new(), x=x) + "; del _fn"
    return f"{g.new()} = " + g.r.choice(forms).format(x=x)

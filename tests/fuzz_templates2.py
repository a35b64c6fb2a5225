"""More line templates of the program generator (fuzz_programs.py), registered in
fuzz_templates.TEMPLATES: batched products, losses with reductions, complex views, custom
autograd Functions (saving an output, a view, non-differentiable outputs), index-driven
gathers and scatters, sorts whose indices are used, in-place writes through narrow / unfold /
as_strided / select views, manual ``.grad`` writes, ``requires_grad_`` toggles and saved
tensor hooks. :data:`HEADER2` is the source of the Functions they call."""

from __future__ import annotations

from fuzz_limits import may_assign_grad, may_write
from fuzz_templates import fl, is_t, rg, template

HEADER2 = """
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
HEADER2_NAMES = frozenset({"SaveOut", "SaveView", "TwoOut", "ViewOut", "Lazy"})


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


LOSS = (
    "F.cross_entropy({x}.reshape(-1, {c}), {lab}, reduction='{red}')",
    "F.cross_entropy({x}.reshape(-1, {c}), {lab}, reduction='{red}', label_smoothing=0.1)",
    "F.cross_entropy({x}.reshape(-1, {c}), {lab}, ignore_index=1, reduction='{red}')",
    "F.cross_entropy({x}.reshape(-1, {c}), {lab}, weight=torch.arange(1.0, {c} + 1, "
    "dtype={x}.dtype), reduction='{red}')",
    "F.nll_loss({x}.reshape(-1, {c}).log_softmax(-1), {lab}, reduction='{red}')",
    "F.binary_cross_entropy_with_logits({x}, ({x} > 0).to({x}.dtype), reduction='{red}')",
    "F.smooth_l1_loss({x}, {x}.detach() * 0.5, reduction='{red}')",
    "F.huber_loss({x}, torch.zeros_like({x}), reduction='{red}', delta=0.5)",
    "F.kl_div({x}.log_softmax(-1), {x}.detach().softmax(-1), reduction='{red}')",
    "F.layer_norm({x}, {x}.shape[-1:], torch.linspace(0.5, 1.5, {c}, dtype={x}.dtype), "
    "torch.ones({c}, dtype={x}.dtype))",
    "F.rms_norm({x}, {x}.shape[-1:], eps=1e-5)",
    "F.group_norm({x}.reshape(-1, {c}, 1), 1 if {c} % 2 else 2, "
    "torch.full(({c},), 2.0, dtype={x}.dtype))",
    "F.embedding(torch.tensor([[0, 1], [1, 0]]), {x}.reshape(-1, {c}), padding_idx=0)",
    "F.embedding_bag(torch.tensor([0, 1, 1]), {x}.reshape(-1, {c}), torch.tensor([0, 1]), "
    "mode='{bag}')",
)


@template("loss", 3)
def t_loss(g):
    x = g.pick(lambda v: fl(v) and v.dim() >= 1 and v.numel() >= 2 * max(v.shape[-1], 1))
    if x is None:
        return None
    v = g.ns[x]
    c = v.shape[-1]
    n = v.numel() // c
    lab = f"torch.arange({n}) % {c}"
    red = g.r.choice(["none", "sum", "mean"])
    bag = g.r.choice(["sum", "mean", "max"])
    form = g.r.choice(LOSS)
    return f"{g.new()} = " + form.format(x=x, c=c, lab=lab, red=red, bag=bag)


@template("cview", 2)
def t_cview(g):
    x = g.pick(lambda v: is_t(v) and v.numel() > 0 and (v.dtype.is_complex or fl(v)))
    if x is None:
        return None
    o = g.new()
    if g.ns[x].dtype.is_complex:
        forms = (
            "{o} = torch.view_as_real({x}).mul(2)",
            "{o} = torch.view_as_complex(torch.view_as_real({x}) * 1)",
            "{o} = {x}.clone(); torch.view_as_real({o})[..., 0].add_(1)",
            "{o} = {x}.clone(); {o}.imag.mul_(-1)",
            "{o} = torch.view_as_real({x}.conj().resolve_conj())",
            "{o} = {x}.conj_physical()",
        )
    else:
        forms = (
            "{o} = torch.view_as_complex({x}.reshape(-1, 2).contiguous()) if {x}.numel() % 2 == 0 "
            "else torch.complex({x}, {x} * 2)",
            "{o} = torch.complex({x}, -{x})",
            "{o} = torch.polar({x}.abs(), {x})",
            "{o} = torch.view_as_real(torch.complex({x}, {x}.cos())).sum(-1)",
        )
    return g.r.choice(forms).format(o=o, x=x)


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


GATHER = (
    "{x}.gather(-1, {x}.argsort(-1)[..., :2])",
    "torch.take_along_dim({x}, {x}.argmax(-1, keepdim=True), -1)",
    "{x}.scatter_add(-1, {x}.argsort(-1), {x})",
    "{x}.scatter_reduce(-1, {x}.argsort(-1) // 2, {x}, 'amax', include_self=False)",
    "{x}.scatter_reduce(0, torch.zeros_like({x}, dtype=torch.long), {x}, 'sum')",
    "{x}.index_add(0, torch.tensor([{n}] * {x}.shape[0]), {x}, alpha=2)",
    "{x}.index_copy(0, torch.arange({x}.shape[0]).flip(0), {x} * 2)",
    "torch.searchsorted({x}.detach().flatten().sort()[0], {x}.detach())",
    "{x}.sort(dim=-1, descending=True, stable=True)[0]",
    "{x}.topk(1, largest=False, sorted=False)[0]",
    "{x}.kthvalue(1, -1, keepdim=True)[0]",
    "torch.cummin({x}, 0)[0]",
    "{x}.msort()",
    "torch.unique_consecutive({x}.detach().round(), return_counts=True)[1]",
)
SORTED = (
    "{a}, {b} = {x}.sort(-1); {c} = {x}.gather(-1, {b})",
    "{a}, {b} = {x}.topk(min(2, {x}.shape[-1])); {c} = {a} * {b}.to({a}.dtype)",
    "{a}, {b} = {x}.max(-1, keepdim=True); {c} = {x}.scatter(-1, {b}, 0.0)",
    "{a}, {b} = {x}.kthvalue(1, 0); {c} = {x}.index_select(-1, {b}.flatten()[:2])",
    "{a}, {b} = {x}.flatten().sort(dim=0, stable=True); {c} = {x}.flatten()[{b}]",
)


@template("gather", 3)
def t_gather(g):
    x = g.pick(lambda v: fl(v) and v.dim() >= 1 and v.shape[0] >= 1 and v.shape[-1] >= 1)
    if x is None:
        return None
    if g.r.random() < 0.4:
        return g.r.choice(SORTED).format(a=g.new(), b=g.new(), c=g.new(), x=x)
    n = g.ns[x].shape[0] - 1
    return f"{g.new()} = " + g.r.choice(GATHER).format(x=x, n=n)


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

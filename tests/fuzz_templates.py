"""Line templates of the program generator (fuzz_programs.py): each makes one source line (or a
few) from the tensors of the live eager namespace, or None when nothing fits. Registered with
a weight by :func:`template`; the known limits they avoid are named (fuzz_limits.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from fuzz_limits import may_masked_select, may_median

TEMPLATES: dict[str, tuple[int, Callable]] = {}


def template(kind: str, weight: int):
    def register(fn):
        assert kind not in TEMPLATES, kind
        TEMPLATES[kind] = (weight, fn)
        return fn

    return register


def is_t(v) -> bool:
    return isinstance(v, torch.Tensor)


def fl(v) -> bool:
    return is_t(v) and v.dtype.is_floating_point


def rg(v) -> bool:
    return is_t(v) and v.requires_grad


def _one(g, pred, forms) -> str | None:
    """``v<k> = form(x)`` for a tensor ``x`` matching ``pred``."""
    x = g.pick(pred)
    if x is None:
        return None
    return f"{g.new()} = " + g.r.choice(forms).format(x=x)


UNARY = (
    *("{x}.tanh()", "{x}.sin()", "torch.sigmoid({x})", "{x}.relu()", "{x} * 0.5", "-{x}"),
    *("{x}.square().tanh()", "{x}.exp().clamp(max=50.0)", "{x}.abs().sqrt()", "{x}.softmax(-1)"),
    *("{x}.log_softmax(-1)", "F.gelu({x})", "{x}.cumsum(-1)", "{x}.flip(0)", "{x}.roll(1, 0)"),
    *("{x}.contiguous()", "{x}.clone()", "{x}.clone(memory_format=torch.preserve_format)"),
    *("{x}.float()", "{x}.double()", "{x}.to(torch.float32)", "torch.where({x} > 0, {x}, -{x})"),
    *("{x}.clamp(-0.5, 0.5)", "{x}.sign()", "{x}.round()", "{x}.pow(3)", "{x}.reciprocal()"),
    *("Sq.apply({x})", "blk({x})", "checkpoint(blk, {x}, use_reentrant=False)", "{x}.norm()"),
    *("torch.nan_to_num({x}.log())", "F.layer_norm({x}, {x}.shape[-1:])"),
    "F.normalize({x}, dim=-1)",
)
INT = (
    *("({x} > 0)", "({x} * 3).long()", "{x}.to(torch.int32) + 1", "({x} > 0).sum()"),
    *("({x} != 0).any()", "{x}.argmax()", "{x}.argsort(-1)", "({x} > 0) & ({x} < 1)"),
    *("~({x} > 0)", "({x} * 4).int() // 3", "({x} * 4).int() % 3", "({x} > 0).float() * {x}"),
    *("({x} > 0).to({x}.dtype)", "torch.count_nonzero({x})", "({x} > 0).nonzero()"),
    *("({x} * 10).long().bitwise_and(5)", "{x}.flatten()[({x}.flatten() > 0)]"),
    "torch.bucketize({x}.detach().float(), torch.tensor([-1.0, 0.0, 1.0]))",
)
COMPLEX = (
    *("{x}.conj()", "{x}.real", "{x}.imag", "{x}.abs()", "torch.view_as_real({x})"),
    *("{x} * {x}.conj()", "{x}.conj().mul(2)", "torch.fft.fft({x})", "{x}.angle()"),
)
RANDOM = (
    *("F.dropout({x}, p=0.3, training=True)", "{x} * torch.rand_like({x})"),
    *("{x} * torch.bernoulli(torch.full_like({x}, 0.5))", "{x} + torch.randn_like({x})"),
    *("{x} + torch.randn({x}.shape, dtype={x}.dtype)", "{x} * torch.randint_like({x}, 0, 3)"),
    *("{x}.flatten()[torch.randperm({x}.numel())]", "F.rrelu({x}, training=True)"),
    *("torch.normal({x}, 1.0)", "{x} * torch.empty_like({x}).uniform_()"),
    "F.dropout2d({x}.reshape(1, -1, 1, {x}.shape[-1]) if {x}.dim() else {x}, 0.4, training=True)",
    "F.gumbel_softmax({x}, tau=1.0) if {x}.dim() >= 1 else {x}",
    "F.dropout({x}, p=0.5, training=True) * F.dropout({x}, p=0.5, training=True)",
    "{x}.flatten()[torch.multinomial(({x}.flatten().abs() + 0.1).float(), 3, replacement=True)]",
)


@template("unary", 8)
def t_unary(g):
    return _one(g, fl, UNARY)


@template("int", 2)
def t_int(g):
    return _one(g, lambda v: is_t(v) and not v.dtype.is_complex, INT)


@template("complex", 1)
def t_complex(g):
    return _one(g, lambda v: is_t(v) and v.dtype.is_complex, COMPLEX)


@template("random", 4)
def t_random(g):
    return _one(g, lambda v: fl(v) and v.numel() > 0, RANDOM)


@template("binary", 6)
def t_binary(g):
    x = g.pick(fl)
    if x is None:
        return None
    shape = g.ns[x].shape
    cands = [n for n in g.names(fl) if _broadcasts(shape, g.ns[n].shape)]
    if not cands or g.r.random() < 0.15:
        y = g.r.choice(["2.5", "torch.tensor(1.5, dtype=torch.float64)", "0.0"])
    else:
        y = g.r.choice(cands)
    yy = f"torch.as_tensor({y}).to({x}.dtype)"
    form = g.r.choice(
        [
            *("{x} + {y}", "{x} * {y}", "{x} - {y}", "({x} + {y}).mean()"),
            *("torch.maximum({x}, {yy})", "torch.atan2({x}, {yy} + 3)"),
            *("{x} / (torch.as_tensor({y}).abs() + 1)", "torch.where({x} > 0.3, {x}, {yy})"),
            *(
                "torch.addcmul({x}, {x}, {yy}, value=0.5)",
                "torch.lerp({x}, {yy}.expand_as({x}), 0.3)",
            ),
        ]
    )
    return f"{g.new()} = " + form.format(x=x, y=y, yy=yy)


def _broadcasts(a, b) -> bool:
    try:
        torch.broadcast_shapes(a, b)
    except RuntimeError:
        return False
    return True


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


@template("reduce", 3)
def t_reduce(g):
    x = g.pick(fl)
    if x is None:
        return None
    d = g.ns[x].dim()
    if d == 0:
        return f"{g.new()} = {x} * 2"
    k = g.r.randrange(-d, d)
    forms = [
        *(f"{x}.sum({k})", f"{x}.mean({k}, keepdim=True)", f"{x}.amax({k})", f"{x}.sum()"),
        *(f"{x}.logsumexp({k})", f"{x}.norm(dim={k})", f"{x}.var({k})", f"{x}.std()"),
        f"{x}.cummax({k})[0]",
    ]
    return f"{g.new()} = " + g.r.choice(forms)


VIEW_ANY = ("{x}.unsqueeze(0)", "{x}[None]", "{x}.view_as({x})", "{x}.detach()", "{x}[...]")
VIEW_1D = (
    *("{x}[1:]", "{x}[::2]", "{x}[-1]", "{x}.narrow(0, 0, max(1, {x}.shape[0] // 2))"),
    *("{x}.unsqueeze(-1).expand(*{x}.shape, 3)", "{x}.flatten()", "{x}.reshape(-1)"),
    *("{x}.unfold(0, 1, 1)", "{x}.movedim(0, -1)", "{x}.split(2)[0]", "{x}.chunk(2)[-1]"),
    *("{x}.unbind(0)[0]", "{x}.squeeze()"),
    "{x}.as_strided(({x}.numel() // 2,), (2,), {x}.storage_offset()) if {x}.is_contiguous() "
    "and {x}.numel() >= 2 else {x}[0]",
    "{x}.view(-1) if {x}.is_contiguous() else {x}.t() if {x}.dim() == 2 else {x}[0]",
)
VIEW_2D = (
    *("{x}.transpose(0, 1)", "{x}[0]", "{x}[:, 1:]", "{x}.diagonal()", "{x}.mT"),
    *("{x}[..., ::2]", "{x}.unflatten(0, (1, -1))", "{x}[1:][:, ::2]", "{x}.expand(2, *{x}.shape)"),
    "{x}.permute(*reversed(range({x}.dim())))",
    "{x}.t() if {x}.dim() == 2 else {x}.transpose(0, 1)",
    "{x}[1:].t() if {x}.dim() == 2 else {x}[1:][0]",
    "{x}.t()[1:].t() if {x}.dim() == 2 else {x}[1:]",
)


@template("view", 8)
def t_view(g):
    x = g.pick(is_t)
    if x is None:
        return None
    v = g.ns[x]
    forms = list(VIEW_ANY)
    if v.dim() >= 1:
        forms += VIEW_1D
        if v.is_contiguous() and v.dtype == torch.float64:
            forms += ["{x}.view(torch.int64)", "{x}.view(torch.float32)"]
        if v.is_contiguous() and v.dtype == torch.float32:
            forms += ["{x}.view(torch.int32)"]
    if v.dim() >= 2:
        forms += VIEW_2D
    return f"{g.new()} = " + g.r.choice(forms).format(x=x)


MULTI = (
    "{a}, {b} = {x}.max(dim=0)",
    "{a}, {b} = {x}.min(dim=-1)",
    "{a}, {b} = {x}.sort(dim=-1)",
    "{a}, {b} = {x}.topk(min(2, {x}.shape[-1]), dim=-1)",
    "{a}, {b} = {x}.chunk(2)[0], {x}.chunk(2)[-1]",
    "{a}, {b} = torch.aminmax({x})",
    "{a}, {b} = {x}.kthvalue(1, dim=0)",
    "{a}, {b} = {x}.cummax(dim=0)",
    "{a}, {b} = {x}.mode(dim=-1)",
    "{a}, {b} = torch.unique({x}, return_inverse=True)",
    "{a}, {b} = {x}.split(max(1, {x}.shape[0] // 2))[:2] if {x}.shape[0] >= 2 else ({x}, {x})",
    "{a}, *{b} = {x}.unbind(0); {b} = {b}[0] if {b} else {a}",
)
MULTI_FLOAT = (
    "{a}, {b} = torch.std_mean({x}, dim=0)",
    "{a}, {b} = torch.var_mean({x}, dim=-1, correction=0)",
    "{a}, {b}, _ = torch.native_layer_norm({x}, {x}.shape[-1:], None, None, 1e-5)",
    "{a}, {b} = torch.frexp({x})",
    "{a}, {b} = torch.linalg.qr({x}) if {x}.dim() == 2 else ({x}, {x})",
    "{a}, {b} = torch.linalg.slogdet({x}) if {x}.dim() == 2 and {x}.shape[0] == {x}.shape[1] "
    "else ({x}, {x})",
)


@template("multi", 4)
def t_multi(g):
    x = g.pick(lambda v: is_t(v) and v.dim() >= 1 and v.shape[0] >= 1 and not v.dtype.is_complex)
    if x is None:
        return None
    v = g.ns[x]
    forms = list(MULTI)
    if v.dtype.is_floating_point:
        forms += MULTI_FLOAT
    if may_median(v):  # known limit median-of-overlapping-memory
        forms += ["{a}, {b} = {x}.median(dim=0)"]
    return g.r.choice(forms).format(a=g.new(), b=g.new(), x=x)


@template("cat", 2)
def t_cat(g):
    x = g.pick(lambda v: is_t(v) and v.dim() >= 1)
    if x is None:
        return None
    xv = g.ns[x]
    y = g.r.choice(
        g.names(lambda v: is_t(v) and v.shape[1:] == xv.shape[1:] and v.dtype == xv.dtype)
    )
    forms = [
        *("torch.cat([{x}, {y}])", "torch.stack([{x}, {x}])", "torch.cat([{x}[1:], {y}[:1]])"),
        "torch.cat([{x}, {y}], out=torch.empty(0, dtype={x}.dtype)) "
        "if not ({x}.requires_grad or {y}.requires_grad) else {x} + 0",
    ]
    return f"{g.new()} = " + g.r.choice(forms).format(x=x, y=y)


MASKED_SELECT = "torch.masked_select({x}, torch.ones_like({x}, dtype=torch.bool))"
INDEX = (
    *("{x}[torch.tensor([1, 0, 1])]", "{x}.index_select(0, torch.tensor([0, 0]))", "{x}[[0, 1]]"),
    *("{x}.take(torch.tensor([0, 1]))", "{x}.repeat_interleave(2, dim=0)", "F.pad({x}, (1, 1))"),
    "{x}.gather(0, torch.zeros(1, *{x}.shape[1:], dtype=torch.long))",
    "{x}[{x}.real > 0] if {x}.is_complex() else {x}[{x} > 0] if {x}.dtype != torch.bool "
    "else {x}[{x}]",
    MASKED_SELECT,
    "torch.index_put({x}, (torch.tensor([0, 0]),), torch.ones((), dtype={x}.dtype), "
    "accumulate=True)",
    "{x}.scatter(0, torch.zeros(1, *{x}.shape[1:], dtype=torch.long), 1.0) "
    "if {x}.is_floating_point() else {x}",
    "{x}.repeat(2, *[1] * ({x}.dim() - 1))",
    "{x}.tril() if {x}.dim() == 2 else {x}.roll(1)",
    "F.embedding(torch.tensor([0, 1, 1]), {x}) if {x}.dim() == 2 else {x}",
)


@template("index", 3)
def t_index(g):
    x = g.pick(lambda v: is_t(v) and v.dim() >= 1 and v.shape[0] >= 2)
    if x is None:
        return None
    form = g.r.choice(INDEX)
    if form == MASKED_SELECT and not may_masked_select(g.ns[x]):  # masked-select-grad-strides
        form = form.replace("({x},", "({x}.contiguous(),", 1)
    return f"{g.new()} = " + form.format(x=x)


MODULE = (
    "F.conv1d({x}.reshape(-1, 1, 6), torch.ones(2, 1, 3, dtype={x}.dtype, requires_grad=True))",
    "F.softplus({x}) @ torch.ones(6, 3, dtype={x}.dtype)",
    "F.scaled_dot_product_attention({x}[None], {x}[None], {x}[None])",
    "F.cross_entropy({x}.reshape(-1, 6), torch.zeros({x}.numel() // 6, dtype=torch.long))",
    "F.mse_loss({x}, torch.zeros_like({x}))",
    "F.max_pool1d({x}.reshape(-1, 1, 6), 2)",
    "F.group_norm({x}.reshape(-1, 2, 3), 1)",
)
BATCH_NORM = (
    "_bn_m = torch.zeros(6, dtype={x}.dtype); _bn_v = torch.ones(6, dtype={x}.dtype)\n"
    "{o} = F.batch_norm({x}.reshape(-1, 6), _bn_m, _bn_v, training=True)"
)


@template("module", 2)
def t_module(g):
    x = g.pick(lambda v: fl(v) and v.dim() >= 2 and v.shape[-1] == 6 and v.numel() > 0)
    if x is None:
        return None
    o = g.new()
    if g.r.random() < 1 / 8:
        return BATCH_NORM.format(o=o, x=x)
    return f"{o} = " + g.r.choice(MODULE).format(x=x)

"""Templates of indexing: concatenation, advanced indexing and index ops (index_select,
take, masked_select, index_put, scatter, embedding), and index-driven gathers and scatters
with sorts whose indices are used. The known limit they avoid is named (limits.py)."""

from __future__ import annotations

from ..limits import may_masked_select
from .registry import fl, is_t, template


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

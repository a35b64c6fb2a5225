"""Templates of reductions (sum, mean, amax, logsumexp, norm, var, cummax) and of ops with
two outputs (max / min / sort / topk with indices, chunk, split, unbind, std_mean, frexp,
QR, slogdet, median). The known limit they avoid is named (limits.py)."""

from __future__ import annotations

from ..limits import may_median
from .registry import fl, is_t, template


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

"""Templates of complex tensors: conj, real / imag, abs, angle, fft, and complex views
(view_as_real / view_as_complex, written through, conj_physical, polar)."""

from __future__ import annotations

from .registry import fl, is_t, one, template

COMPLEX = (
    *("{x}.conj()", "{x}.real", "{x}.imag", "{x}.abs()", "torch.view_as_real({x})"),
    *("{x} * {x}.conj()", "{x}.conj().mul(2)", "torch.fft.fft({x})", "{x}.angle()"),
)


@template("complex", 1)
def t_complex(g):
    return one(g, lambda v: is_t(v) and v.dtype.is_complex, COMPLEX)


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

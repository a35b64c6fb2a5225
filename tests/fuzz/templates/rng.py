"""Templates of random ops: dropout and dropout2d, ``*_like`` draws, bernoulli,
randint, randperm, rrelu, normal, uniform_, gumbel_softmax and multinomial."""

from __future__ import annotations

from .registry import fl, one, template

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


@template("random", 4)
def t_random(g):
    return one(g, lambda v: fl(v) and v.numel() > 0, RANDOM)

"""Templates of elementwise ops: unary math on floating tensors (and a custom Function, a
checkpointed block), integer and boolean results, and binary ops between broadcasting
tensors or scalars."""

from __future__ import annotations

import torch

from .registry import fl, is_t, one, template

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


@template("unary", 8)
def t_unary(g):
    return one(g, fl, UNARY)


@template("int", 2)
def t_int(g):
    return one(g, lambda v: is_t(v) and not v.dtype.is_complex, INT)


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

"""Templates of views: slicing, unsqueeze, expand, narrow, unfold, movedim, split / chunk /
unbind, as_strided, dtype views, transposes, diagonal and permute of any tensor."""

from __future__ import annotations

import torch

from .registry import is_t, template

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

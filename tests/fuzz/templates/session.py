"""Templates of lines that reach past the session's ops: boundary calls (``.item()``,
``.tolist()``, ``repr``, branching on values, ``new_tensor``) and ``session.evict_all()``.
The known limit they avoid is named (limits.py)."""

from __future__ import annotations

from ..limits import may_tolist
from .registry import is_t, template

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


@template("evict", 1)
def t_evict(g):
    return "_S.evict_all()"

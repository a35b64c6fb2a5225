"""The registry of the line templates: :func:`template` registers one under its kind with
a weight, and the predicates and the one-line form the templates share."""

from __future__ import annotations

from collections.abc import Callable

import torch

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


def one(g, pred, forms) -> str | None:
    """``v<k> = form(x)`` for a tensor ``x`` matching ``pred``."""
    x = g.pick(pred)
    if x is None:
        return None
    return f"{g.new()} = " + g.r.choice(forms).format(x=x)

"""Line templates of the program generator (programs.py), by subject: each makes one source
line (or a few) from the tensors of the live eager namespace, or None when nothing fits, and
is registered under its kind with a weight (registry.py). The known limits they avoid are
named (limits.py).

:data:`KINDS` is the order the generator draws kinds in: with the weights, it decides every
seed's program, so a new kind goes at its end and an old one keeps its place."""

from __future__ import annotations

from . import (  # noqa: F401  (each registers its templates)
    autograd,
    complex_numbers,
    indexing,
    nn,
    pointwise,
    products,
    reductions,
    rng,
    session,
    views,
    writes,
)
from .registry import TEMPLATES

KINDS = (
    *("unary", "int", "complex", "random", "binary", "matmul", "reduce", "view", "multi"),
    *("cat", "index", "module", "grad_mode", "leafy", "inplace", "boundary", "backward"),
    *("evict", "optim", "data", "func", "linalg", "conv", "batched", "loss", "cview"),
    *("function", "gather", "viewwrite", "gradwrite", "savedhooks"),
)
assert sorted(KINDS) == sorted(TEMPLATES), set(KINDS) ^ set(TEMPLATES)

__all__ = ["KINDS", "TEMPLATES"]

"""Triton kernels of tritondtr, installed as ``tritondtr.kernels``.

They import torch and triton and nothing of tritondtr; their torch twins (the specification)
live in :mod:`tritondtr.policy.scoring`. Design: docs/kernels.md.

* :func:`score`: scores of all slots, [N] float32 (int64 for ``lru`` and ``size``).
* :func:`select`: the k lowest (score, slot) candidates in one launch, [k] int64, -1 padded.
* :class:`Selection`: the same, prepared once over fixed columns for repeated decisions.

Heuristic names: ``dtr``, ``dtr_eq``, ``dtr_local``, ``msps``, ``lru``, ``size``, ``random``.
"""

from .heuristic_scores import HEURISTIC_IDS, score
from .topk_select import MAX_K, Selection, select

__all__ = ["score", "select", "Selection", "HEURISTIC_IDS", "MAX_K"]

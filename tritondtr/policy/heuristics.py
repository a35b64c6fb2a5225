"""Eviction heuristics: the built-in names, and the registry for user-defined ones.

A heuristic maps the metadata of every slot to a score; the slot with the lowest score is
evicted first. The exact formulas of the built-ins, and their tie, NaN and infinity rules, are
written once, in their torch twins (:mod:`tritondtr.policy.scoring`), which the Triton kernels in
:mod:`tritondtr.kernels` reproduce bit for bit.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "CustomHeuristic",
    "Heuristic",
    "NbhdMode",
    "ScoreFn",
    "get_heuristic",
    "heuristic_names",
    "register_heuristic",
]


class NbhdMode(str, enum.Enum):
    """How the ``nbhd_cost`` column of the table is kept for a heuristic.

    * ``none``: not used; the column is left at 0.
    * ``exact``: cost of e*(t), the evicted storages reachable from t through evicted parents
      and through evicted children (the paper's evicted neighbourhood).
    * ``eqclass``: the union-find approximation of e* (paper §4.1).
    * ``ancestors``: evicted ancestors only (reachable through evicted parents), as MSPS uses.
    """

    NONE = "none"
    EXACT = "exact"
    EQCLASS = "eqclass"
    ANCESTORS = "ancestors"


class Heuristic(str, enum.Enum):
    """The built-in heuristics. The lowest score is evicted; s = now - last_access.

    ===========  =============================================  =================
    name         score                                          ``nbhd_cost``
    ===========  =============================================  =================
    dtr          (cost + nbhd_cost) / (size * s)                exact e*
    dtr_eq       (cost + nbhd_cost) / (size * s)                union-find e*
    dtr_local    cost / (size * s)                              unused
    msps         (cost + nbhd_cost) / size                      evicted ancestors
    lru          last_access (int64): oldest first              unused
    size         -size (int64): largest first                   unused
    random       uniform in [0, 1), from (seed, now, slot)      unused
    ===========  =============================================  =================
    """

    DTR = "dtr"
    DTR_EQ = "dtr_eq"
    DTR_LOCAL = "dtr_local"
    MSPS = "msps"
    LRU = "lru"
    SIZE = "size"
    RANDOM = "random"

    @property
    def nbhd_mode(self) -> NbhdMode:
        return _NBHD_MODE[self]

    @property
    def score_dtype(self) -> torch.dtype:
        """float32 for ratio scores; int64 for the exact integer keys of ``lru`` and ``size``."""
        return torch.int64 if self in (Heuristic.LRU, Heuristic.SIZE) else torch.float32


_NBHD_MODE = {
    Heuristic.DTR: NbhdMode.EXACT,
    Heuristic.DTR_EQ: NbhdMode.EQCLASS,
    Heuristic.DTR_LOCAL: NbhdMode.NONE,
    Heuristic.MSPS: NbhdMode.ANCESTORS,
    Heuristic.LRU: NbhdMode.NONE,
    Heuristic.SIZE: NbhdMode.NONE,
    Heuristic.RANDOM: NbhdMode.NONE,
}

ScoreFn = Callable[..., torch.Tensor]
"""Signature of a user heuristic::

    fn(cost, size, last_access, nbhd_cost, now) -> scores

with ``cost`` [N] float32 (compute cost, any consistent unit, e.g. ns), ``size`` [N] int64
bytes, ``last_access`` [N] int64 logical clock, ``nbhd_cost`` [N] float32 and ``now`` an int.
It returns [N] scores (any real dtype; lower is evicted first). It must be pure: no side
effects, no state. Only resident, evictable slots are considered, whatever it returns for the
others; NaN counts as +inf and ties go to the lowest slot id, as for the built-ins.
"""


@dataclass(frozen=True)
class CustomHeuristic:
    """A user heuristic registered with :func:`register_heuristic` (torch backend only)."""

    name: str
    fn: ScoreFn
    nbhd_mode: NbhdMode = NbhdMode.NONE

    @property
    def score_dtype(self) -> torch.dtype:
        return torch.float32


_CUSTOM: dict[str, CustomHeuristic] = {}


def register_heuristic(
    name: str, fn: ScoreFn, *, nbhd_mode: NbhdMode | str = NbhdMode.NONE
) -> CustomHeuristic:
    """Register a user heuristic under ``name``; see :data:`ScoreFn` for the signature.

    ``nbhd_mode`` says which evicted-neighbourhood cost the engine should keep in the
    ``nbhd_cost`` column for it. Names are unique: re-registering raises ``ValueError``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"heuristic name must be a non-empty string, got {name!r}")
    if name in _CUSTOM or name in Heuristic._value2member_map_:
        raise ValueError(f"a heuristic named {name!r} is already registered; pick another name")
    if not callable(fn):
        raise ValueError(f"heuristic {name!r}: fn must be callable, got {type(fn).__name__}")
    h = CustomHeuristic(name, fn, NbhdMode(nbhd_mode))
    _CUSTOM[name] = h
    return h


def unregister_heuristic(name: str) -> None:
    """Remove a user heuristic (for tests and notebooks)."""
    _CUSTOM.pop(name, None)


def get_heuristic(h: Heuristic | CustomHeuristic | str) -> Heuristic | CustomHeuristic:
    """Resolve a name to a built-in :class:`Heuristic` or a registered :class:`CustomHeuristic`."""
    if isinstance(h, (Heuristic, CustomHeuristic)):
        return h
    if isinstance(h, str):
        if h in Heuristic._value2member_map_:
            return Heuristic(h)
        if h in _CUSTOM:
            return _CUSTOM[h]
    raise ValueError(f"unknown heuristic {h!r}; expected one of {heuristic_names()}")


def heuristic_names() -> list[str]:
    """Names of all built-in and registered heuristics."""
    return [h.value for h in Heuristic] + sorted(_CUSTOM)

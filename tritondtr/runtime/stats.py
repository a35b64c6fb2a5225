"""Counters of a session (``session.stats``): the core's, and the session's own."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..core.stats import CoreStats

__all__ = ["SessionStats"]


@dataclass
class SessionStats(CoreStats):
    """What a session did: the counters of :class:`~tritondtr.core.CoreStats` (evictions,
    rematerializations, peak and resident bytes, ...) and

    Attributes:
        recompute_s: seconds spent recomputing: wall clock on a CPU session, device time
            (CUDA events) on a CUDA one (NOTE [ Device time ] in events.py).
        ops: ops dispatched (the user's, not recomputations).
        op_counts: per op name (``"aten.mm.default"``), ops dispatched.
        budget: the session's budget in bytes (None: unlimited), as its config says (the
            core keeps a copy; the stats do not point at the core: NOTE [ Session lifetime ]
            in session.py).
    """

    recompute_s: float = 0.0
    ops: int = 0
    op_counts: Counter = field(default_factory=Counter)

    _config = None  # the session's RuntimeConfig, set by it; not a field (no annotation)

    @property
    def budget(self) -> int | None:
        return None if self._config is None else self._config.budget

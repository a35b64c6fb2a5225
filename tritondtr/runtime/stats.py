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
        budget: the session's budget in bytes (None: unlimited), as its config says or as a
            share resolved at entry (NOTE [ Memory share budgets ] in device.py); the stats do
            not point at the core (NOTE [ Session lifetime ] in session.py).
        device_peak_bytes: see the property.
    """

    recompute_s: float = 0.0
    ops: int = 0
    op_counts: Counter = field(default_factory=Counter)

    _config = None  # the session's RuntimeConfig, set by it; not a field (no annotation)
    _budget = None  # the budget in bytes, set at entry (a share resolved); not a field
    _peak_device = None  # the CUDA device whose peak is read while active (NOTE [ Device peak ])
    _device_peak = None  # that peak, read at exit

    @property
    def budget(self) -> int | None:
        if self._budget is not None:
            return self._budget
        b = None if self._config is None else self._config.budget
        return b if b is None or isinstance(b, int) else None

    @property
    def device_peak_bytes(self) -> int | None:
        """On CUDA, the most bytes the process had allocated on the session's device during
        the session (``torch.cuda.max_memory_allocated`` reset at entry: NOTE [ Device peak ]
        in device.py), everything included; ``peak_bytes`` counts the tracked storages alone.
        None on a CPU session."""
        if self._peak_device is not None:
            from .device import device_peak

            return device_peak(self._peak_device)
        return self._device_peak

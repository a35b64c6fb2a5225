"""Counters of a session (``session.stats``): the core's, and the session's own."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields

from ..core.stats import CoreStats
from ..units import format_bytes
from .timeline import MemoryTimeline

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
        remat_counts: per op name, recomputations.
        budget: the session's budget in bytes (None: unlimited), as its config says or as a
            share resolved at entry (NOTE [ Memory share budgets ] in device.py); the stats do
            not point at the core (NOTE [ Session lifetime ] in session.py).
        device_peak_bytes: see the property.
        timeline: see the property.
    """

    recompute_s: float = 0.0
    ops: int = 0
    op_counts: Counter = field(default_factory=Counter)
    remat_counts: Counter = field(default_factory=Counter)

    _config = None  # the session's RuntimeConfig, set by it; not a field (no annotation)
    _budget = None  # the budget in bytes, set at entry (a share resolved); not a field
    _peak_device = None  # the CUDA device whose peak is read while active (NOTE [ Device peak ])
    _device_peak = None  # that peak, read at exit
    _timeline = None  # the session's TimelineRecorder, if any (NOTE [ Memory timeline ])

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

    @property
    def timeline(self) -> MemoryTimeline | None:
        """The memory of the session op by op (:class:`MemoryTimeline`: tracked bytes, counts
        and phase after each op; NOTE [ Memory timeline ] in timeline.py), when it was
        entered with ``timeline=True``; else None. Live while the session runs; its last row
        is the session's exit once it exited. :func:`tritondtr.plot_memory` draws it."""
        if self._timeline is None:
            return None
        return self._timeline.snapshot(self.budget)

    def as_dict(self) -> dict[str, int | float | str | None]:
        """The scalar counters by name (no per-op tables), for a logger: ``wandb.log``,
        ``trainer.log``, a CSV row. Bytes in bytes, times in seconds."""
        out: dict[str, int | float | str | None] = {"budget_bytes": self.budget}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float, str)):
                out[f.name] = v
        out["device_peak_bytes"] = self.device_peak_bytes
        return out

    def __str__(self) -> str:
        """A short table a person can read: ``print(session.stats)``."""
        budget = "none" if self.budget is None else format_bytes(self.budget)
        if self._config is not None:
            h = self._config.heuristic
            budget += f", heuristic {getattr(h, 'value', None) or getattr(h, 'name', h)}"
        peak = format_bytes(self.peak_bytes)
        if self.budget:
            peak += f" ({self.peak_bytes / self.budget:.0%} of the budget)"
        if self.device_peak_bytes is not None:
            peak += f"   device: {format_bytes(self.device_peak_bytes)}"
        rows = [
            ("budget", budget),
            ("peak (tracked)", peak),
            ("ops", f"{self.ops:,}"),
            ("evictions", f"{self.evictions:,}"),
            ("rematerializations", f"{self.rematerializations:,}"),
            ("recomputing", f"{self.recompute_s * 1e3:.1f} ms"),
            ("deciding", f"{self.select_s * 1e3:.1f} ms, {self.device_syncs} device syncs"),
        ]
        if self._config is not None and self._config.offload is not None:
            rows.append(  # NOTE [ Offload ] in core/core.py
                (
                    "offload",
                    f"{self.offloads:,} copies out ({format_bytes(self.offloaded_bytes)}), "
                    f"{self.prefetches:,} prefetched, {self.fetches:,} fetched when read, "
                    f"link busy {self.link_busy_ns / 1e6:.1f} ms, waited "
                    f"{self.link_wait_ns / 1e6:.1f} ms (device time), copy price "
                    f"x{self.copy_scale:g}",
                )
            )
        if self.refused_copies:  # NOTE [ Asynchronous offload ] rule 7 in core/offload.py
            rows.append(("refused copies", f"{self.refused_copies:,} (no host memory or room)"))
        if self.budget_errors:
            rows.append(("budget errors", str(self.budget_errors)))
        width = max(len(k) for k, _ in rows)
        lines = ["tritondtr session"] + [f"  {k:<{width}}  {v}" for k, v in rows]
        top = self.remat_counts.most_common(5)
        if top:
            lines.append("  most recomputed ops:")
            lines += [f"    {n:>6,}  {name}" for name, n in top]
        return "\n".join(lines)

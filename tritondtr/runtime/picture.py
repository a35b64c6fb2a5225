"""The memory picture of a step: :func:`plot_memory` draws a session's memory timeline
(NOTE [ Memory timeline ] in timeline.py) beside the same step's unlimited run, and writes
its rows as CSV."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..units import format_bytes
from .stats import SessionStats
from .timeline import MemoryTimeline, Phase, write_csv

__all__ = ["plot_memory"]

# Shading of each phase, and the colours of the curves and the marks.
_SHADE = {Phase.FORWARD: "tab:blue", Phase.BACKWARD: "tab:orange", Phase.OPTIMIZER: "tab:green"}
_SESSION, _EAGER, _BUDGET, _EVICT, _REMAT = "C0", "0.45", "tab:red", "tab:purple", "tab:brown"


def plot_memory(
    stats: SessionStats | MemoryTimeline,
    path: str | os.PathLike,
    *,
    eager: SessionStats | MemoryTimeline | None = None,
    title: str | None = None,
) -> tuple[Path, Path]:
    """Draw a session's memory op by op to ``path`` (PNG, or any format matplotlib writes)
    and write its rows beside it, as ``path`` with the suffix ``.csv``.

    The picture: tracked bytes resident after each op (and on CUDA the device's allocated
    bytes, dashed), the budget as a horizontal line, the peak where it was reached, each
    eviction and rematerialization as a tick at its op, the freezes (the optimizer's first
    parameter write) as dotted lines, the forward, backward and optimizer phases shaded;
    with ``eager``, the same step under ``budget=None`` as a grey curve on the same axes
    (the same ops have the same index: recomputations are no rows).

    Args:
        stats: ``session.stats`` of a session entered with ``timeline=True``, or its
            ``stats.timeline``.
        path: the picture's file; its parent folders are made.
        eager: the same step's ``session.stats`` (or timeline) under ``budget=None``.
        title: the picture's title (default: the budget, the peaks and the counts).

    Returns:
        The picture's path and the CSV's: one row per op and run (``run`` is ``session`` or
        ``eager``), the columns of :meth:`MemoryTimeline.as_rows`.

    Raises:
        ValueError: a session recorded without ``timeline=True``, or ``path`` ends in
            ``.csv``.
        ImportError: matplotlib is missing (the CSV is written first).
    """
    path = Path(path)
    if path.suffix.lower() == ".csv":
        raise ValueError(
            f"plot_memory: {path} is the picture's path (the CSV is written beside it, with "
            "the suffix .csv): give a .png path"
        )
    runs = {"session": _timeline(stats, "stats")}
    if eager is not None:
        runs["eager"] = _timeline(eager, "eager")
    csv_path = write_csv(runs, path.with_suffix(".csv"))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(
            f"plot_memory draws with matplotlib, which is not installed (pip install "
            f"matplotlib); the rows are in {csv_path}"
        ) from e
    fig = _draw(plt, runs["session"], runs.get("eager"), title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, csv_path


def _timeline(what, name: str) -> MemoryTimeline:
    if isinstance(what, MemoryTimeline):
        return what
    if not isinstance(what, SessionStats):
        raise TypeError(
            f"plot_memory: {name} must be a session's stats or its timeline, got "
            f"{type(what).__name__}"
        )
    tl = what.timeline
    if tl is None:
        raise ValueError(
            f"plot_memory: {name} has no memory timeline: its session was entered without "
            "timeline=True. Run the step under tritondtr.enable(..., timeline=True) and pass "
            "that session's stats (recording costs a few microseconds per op; NOTE [ Memory "
            "timeline ] in tritondtr/runtime/timeline.py)."
        )
    return tl


def _scale(nbytes: int) -> tuple[float, str]:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return size, unit
    return 1, "bytes"


def _label(tl: MemoryTimeline) -> str:
    return "unlimited (budget=None)" if tl.budget is None else f"budget {format_bytes(tl.budget)}"


def _curve(tl: MemoryTimeline) -> str:
    return "tracked, " + ("unlimited" if tl.budget is None else _label(tl))


def _draw(plt, tl: MemoryTimeline, eager: MemoryTimeline | None, title: str | None):
    top = max(
        int(tl.peak_bytes.max(initial=0)),
        tl.budget or 0,
        0 if eager is None else int(eager.peak_bytes.max(initial=0)),
    )
    if tl.device_bytes is not None:
        top = max(top, int(tl.device_bytes.max(initial=0)))
    unit, uname = _scale(top)
    fig, (ax, rug) = plt.subplots(
        2, 1, figsize=(12, 5.2), sharex=True, gridspec_kw={"height_ratios": [4, 1]}
    )
    for phase, a, b in tl.phase_spans():
        for axis in (ax, rug):
            axis.axvspan(a - 0.5, b - 0.5, color=_SHADE[phase], alpha=0.1, lw=0)
    for phase in Phase:  # one legend entry per phase, shaded or not
        ax.fill_between([], [], color=_SHADE[phase], alpha=0.2, lw=0, label=phase.label)
    if eager is not None:
        ax.plot(eager.op, eager.resident_bytes / unit, color=_EAGER, lw=1.2, label=_curve(eager))
        if eager.device_bytes is not None:
            x, y = _known(eager)
            ax.plot(x, y / unit, color=_EAGER, lw=0.8, ls="--", label="device, unlimited")
    ax.plot(tl.op, tl.resident_bytes / unit, color=_SESSION, lw=1.4, label=_curve(tl))
    if tl.device_bytes is not None:
        x, y = _known(tl)
        ax.plot(x, y / unit, color=_SESSION, lw=0.9, ls="--", label="device (memory_allocated)")
    if tl.budget is not None:
        ax.axhline(tl.budget / unit, color=_BUDGET, ls="--", lw=1, label="budget")
    if len(tl):
        peak = int(tl.peak_bytes[-1])
        at = int(np.argmax(tl.peak_bytes == peak))
        ax.plot(at, peak / unit, "v", color=_SESSION, ms=7, label=f"peak {format_bytes(peak)}")
    for i, f in enumerate(tl.freezes.tolist()):
        ax.axvline(
            f - 0.5, color="k", ls=":", lw=1, label="parameter write (freeze)" if not i else None
        )
    ax.set_ylabel(f"tracked memory ({uname})")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ev, rm = tl.eviction_ops(), tl.remat_ops()
    for y, ops, color in ((1, ev, _EVICT), (0, rm, _REMAT)):
        xs = np.unique(ops)
        rug.vlines(xs, y - 0.35, y + 0.35, color=color, lw=0.8)
    rug.set_yticks([0, 1], [f"remats ({len(rm):,})", f"evictions ({len(ev):,})"], fontsize=8)
    rug.set_ylim(-0.6, 1.6)
    rug.set_xlabel("op (ATen ops the session dispatched, in order; the last is its exit)")
    rug.set_xlim(-0.5, max(len(tl), 0 if eager is None else len(eager)) - 0.5)
    if title is None:
        peak = format_bytes(int(tl.peak_bytes.max(initial=0)))
        title = f"tritondtr memory, {_label(tl)}: peak {peak}, {len(ev):,} evictions, "
        title += f"{len(rm):,} rematerializations"
        if eager is not None:
            title += f"; unlimited peak {format_bytes(int(eager.peak_bytes.max(initial=0)))}"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _known(tl: MemoryTimeline) -> tuple[np.ndarray, np.ndarray]:
    """The rows whose device bytes are known (NOTE [ Memory timeline ] rule 3)."""
    ok = tl.device_bytes >= 0
    return tl.op[ok], tl.device_bytes[ok]

"""Pictures in the style of the DTR paper's Figure 2: overhead against memory ratio."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from .baseline import Baseline
from .simulate import SimResult

__all__ = ["STYLE", "plot_sweeps"]

# Line colour and marker per heuristic (those of the paper's figures where it has them).
STYLE = {
    "dtr": ("green", "*"),
    "dtr_eq": ("royalblue", "D"),
    "dtr_local": ("rebeccapurple", "o"),
    "msps": ("darkturquoise", "v"),
    "lru": ("orange", "^"),
    "size": ("red", "s"),
    "random": ("maroon", "X"),
}


def plot_sweeps(
    sweeps: Mapping[str, tuple[Baseline, Sequence[SimResult]]],
    path: str | os.PathLike,
    *,
    reference: Mapping[str, Mapping[str, Sequence[dict]]] | None = None,
    title: str | None = None,
) -> None:
    """One panel per trace: compute overhead (y) against budget / baseline memory (x), one
    line per heuristic through its successful runs; a cross marks the first failing ratio.

    Shading: the memory ratio taken by constants (dark) and by the largest single op (light),
    below which no budget can work. ``reference`` (``{trace: {heuristic: [{"ratio",
    "status", "overhead"}, ...]}}``, the figure2-reference.json layout) adds dashed lines.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(sweeps)
    cols = min(3, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows), squeeze=False)
    handles = {}
    for ax, name in zip(axes.flat, names):
        base, results = sweeps[name]
        peak = max(base.peak_bytes, 1)
        ax.axvspan(0, base.constant_bytes / peak, color="0.55", alpha=0.5, lw=0)
        ax.axvspan(0, base.bottleneck_bytes / peak, color="0.85", alpha=0.5, lw=0)
        by_h: dict[str, list[SimResult]] = {}
        for r in results:
            if r.ratio is not None:
                by_h.setdefault(r.heuristic, []).append(r)
        for h, rs in by_h.items():
            color, marker = STYLE.get(h, ("black", "x"))
            ok = sorted((r.ratio, r.overhead) for r in rs if r.ok)
            if ok:
                (line,) = ax.plot(*zip(*ok), color=color, marker=marker, ms=5, lw=1.4, label=h)
                handles[h] = line
            for r in rs:
                if not r.ok:
                    ax.plot([r.ratio], [min(r.overhead, 2.0)], color=color, marker="x", ms=7)
            if reference and h in reference.get(name, {}):
                ref_ok = sorted(
                    (p["ratio"], p["overhead"]) for p in reference[name][h] if p["status"] == "ok"
                )
                if ref_ok:
                    (rl,) = ax.plot(*zip(*ref_ok), color=color, ls="--", lw=0.9, alpha=0.7)
                    handles.setdefault("reference (dashed)", rl)
        ax.set_title(name)
        ax.set_xlim(0, 1.05)
        ax.set_xlabel("memory budget / baseline peak")
        ax.set_ylabel("compute overhead (x)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="lower center",
            ncol=min(8, len(handles)),
            frameon=False,
        )
    fig.suptitle(title or "Overhead against memory budget (shaded: constants, largest op)")
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)

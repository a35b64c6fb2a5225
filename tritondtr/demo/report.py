"""The demo's report: its table, demo.csv and demo.png (memory against time, with
``torch.utils.checkpoint`` and the twin's predictions beside the measured runs, one line per
regime: NOTE [ The demo ] rule 4)."""

from __future__ import annotations

import csv
import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from ..units import format_bytes

if TYPE_CHECKING:
    from .regimes import RegimeSpec
    from .runs import DemoRow

__all__ = ["describe_ops", "format_table", "write_outputs"]

_NOTES = """\
peak: the most bytes of tracked storages resident at once (tritondtr's accounting; the largest
  step's) and its share of the unlimited peak. Counts are summed over the steps.
twin: the unlimited run's traces replayed by the simulator at the run's budget ({heuristic},
  runtime semantics): exact at the recorded (unlimited) budget, a prediction at the others.
pred: predicted step time = the unlimited step time + the twin's recomputation cost (op costs
  measured in the recorded run); it leaves out the eviction bookkeeping: a lower estimate.
device peak (CUDA only): torch.cuda.max_memory_allocated over a step, everything the process
  allocated on the device (parameters, gradients, optimizer state included).
checkpoint: every block under torch.utils.checkpoint (use_reentrant=False), run eagerly; its
  peak measured as the others' (under enable(budget=None)); remats: the ops its backward reran."""


def _n(v) -> str:
    return "-" if v is None else str(v)


def format_table(rows: list[DemoRow], heuristic: str = "dtr_eq") -> str:
    """A fixed-width table of the rows (``rows[0]`` eager, ``rows[1]`` unlimited), with the
    twin's predictions beside the measured counts and times, and notes saying what each is."""
    eager, base = rows[0].step_s, rows[1].peak_bytes
    head1 = f"{'':37} {'evictions':^13} {'remats':^13} {'step ms':^15}"
    head2 = (
        f"{'run':>10} {'budget':>10} {'peak':>10} {'%':>4} {'run':>6} {'twin':>6} "
        f"{'run':>6} {'twin':>6} {'run':>7} {'pred':>7} {'x eager':>7}  grads equal"
    )
    device = any(r.device_peak_bytes is not None for r in rows)  # CUDA: one more column
    if device:
        head2 += "  device peak"
    lines = [head1.rstrip(), head2, "-" * len(head2)]
    for r in rows:
        if r.run == "checkpoint":
            lines.append("-" * len(head2))
        peak = "-" if r.peak_bytes is None else format_bytes(r.peak_bytes)
        share = "-" if r.peak_bytes is None or not base else f"{r.peak_bytes / base:.0%}"
        tw_ev, tw_re = _n(r.twin_evictions), _n(r.twin_remats)
        if r.twin_status not in ("", "ok"):
            tw_ev, tw_re = "-", r.twin_status
        ok = "-" if r.grads_equal is None else "yes" if r.grads_equal else "NO"
        if r.error:
            ok = f"fails: {r.error}"
        measured = not r.error and r.run != "eager"
        evictions = r.evictions if measured and r.run != "checkpoint" else "-"
        pred = "-" if r.predicted_step_s is None else f"{r.predicted_step_s * 1e3:.1f}"
        step = "-" if math.isnan(r.step_s) else f"{r.step_s * 1e3:.1f}"
        slow = "-" if math.isnan(r.step_s) else f"{r.step_s / eager:.2f}"
        lines.append(
            f"{r.run:>10} {_bytes(r.budget_bytes):>10} {peak:>10} {share:>4} "
            f"{evictions:>6} {tw_ev:>6} "
            f"{r.rematerializations if measured else '-':>6} {tw_re:>6} "
            f"{step:>7} {pred:>7} {slow:>7}  {ok}"
            + (f"  {_bytes(r.device_peak_bytes)}" if device else "")
        )
    return "\n".join([*lines, _NOTES.format(heuristic=heuristic)])


def _bytes(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


def describe_ops(rows: list[DemoRow], steps: int) -> str:
    """The regime in numbers: the ops tritondtr tracked per step (``SessionStats.ops``: the
    optimizer's updates of plain parameters and some views are not among them), the eager
    step time per tracked op, and what tracking (the unlimited run) added per tracked op,
    from ``rows[0]`` (eager) and ``rows[1]`` (unlimited)."""
    eager, unlimited = rows[0], rows[1]
    ops = unlimited.ops / steps
    per_op = eager.step_s / ops
    tracking = (unlimited.step_s - eager.step_s) / ops
    added = (
        f"added {_time(tracking)} per op"
        if tracking > 0
        else "added no time measurable against eager's in this run"
    )
    return (
        f"{ops:.0f} tracked ops per step, {_time(per_op)} of eager step time per op; tracking "
        f"{added} ({unlimited.step_s / eager.step_s:.2f}x eager)"
    )


def _time(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if abs(s) >= 1e-3 else f"{s * 1e6:.0f} us"


def write_outputs(
    results: list[tuple[RegimeSpec, list[DemoRow]]], out: Path, device: str
) -> tuple[Path, Path | None]:
    """demo.csv (every regime's rows, with its ``regime``) and demo.png (step time against
    peak memory; rematerializations, measured and predicted, against the budget; a line per
    regime, labelled) in ``out``; the plot is skipped (None) when matplotlib is missing."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "demo.csv"
    with open(csv_path, "w", newline="") as f:
        fields = ["regime", *asdict(results[0][1][0]).keys(), "device"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for spec, rows in results:
            for r in rows:
                w.writerow({"regime": spec.regime.value, **asdict(r), "device": device})
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return csv_path, None
    mib = 2**20
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.6))
    for k, (spec, rows) in enumerate(results):
        _plot_regime(a1, a2, spec.label, rows, colors=(f"C{2 * k}", f"C{2 * k + 1}"), mib=mib)
    a1.axhline(1.0, color="k", ls=":", lw=1, label="eager")
    a1.set(xlabel="peak memory, MiB (tracked storages)", ylabel="step time / eager")
    if len(results) > 1:
        a1.set_xscale("log")
    a1.set_title("memory against time")
    a1.legend(fontsize=7)
    a2.set(xlabel="budget (% of the unlimited peak)", ylabel="rematerializations (all steps)")
    a2.set_title("rematerializations")
    if any(r.rematerializations > 0 for _, rows in results for r in rows if r.ratio):
        a2.set_yscale("symlog", linthresh=10)
    a2.set_ylim(bottom=0)
    a2.invert_xaxis()
    a2.legend(fontsize=7)
    for a in (a1, a2):
        a.grid(alpha=0.3)
    bad = [
        f"{r.run} ({spec.regime.value})"
        for spec, rows in results
        for r in rows
        if r.grads_equal is False
    ]
    fig.suptitle(
        f"tritondtr demo on {device}: gradients equal to eager "
        + ("in every run" if not bad else f"EXCEPT {', '.join(bad)}")
    )
    fig.tight_layout()
    png = out / "demo.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return csv_path, png


def _plot_regime(a1, a2, label: str, rows: list[DemoRow], colors, mib: int) -> None:
    """One regime's lines: measured and predicted step time against peak (``a1``) and
    rematerializations against the budget (``a2``), its checkpoint star and line."""
    run_color, twin_color = colors
    eager = rows[0].step_s
    ok = [r for r in rows if r.ratio is not None and r.peak_bytes is not None]
    ck = [r for r in rows if r.run == "checkpoint"]
    twin = [r for r in ok if r.predicted_step_s is not None and r.twin_peak_bytes is not None]
    a1.plot(
        [r.peak_bytes / mib for r in ok],
        [r.step_s / eager for r in ok],
        "o-",
        color=run_color,
        label=f"tritondtr, {label}",
    )
    for r in ok:
        a1.annotate(r.run, (r.peak_bytes / mib, r.step_s / eager), fontsize=7, alpha=0.7)
    a1.plot(
        [r.twin_peak_bytes / mib for r in twin],
        [r.predicted_step_s / eager for r in twin],
        "x--",
        color=run_color,
        alpha=0.5,
        label="twin's prediction",
    )
    for r in ck:
        a1.plot(
            r.peak_bytes / mib,
            r.step_s / eager,
            "*",
            ms=14,
            color=run_color,
            markeredgecolor="k",
            label="torch.utils.checkpoint, per block",
        )
    x = [100 * r.ratio for r in ok]
    a2.plot(x, [r.rematerializations for r in ok], "o-", color=run_color, label=label)
    a2.plot(
        [100 * r.ratio for r in ok if r.twin_remats is not None],
        [r.twin_remats for r in ok if r.twin_remats is not None],
        "x--",
        color=twin_color,
        label="twin's prediction",
    )
    for r in ck:
        a2.axhline(r.rematerializations, color=run_color, ls=":", label="checkpoint (ops rerun)")

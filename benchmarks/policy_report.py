"""Reading the policy sweep's rows (bench_policy_sweep.py): the docs table, the plot, and a
before / after comparison of two row files.

# NOTE [ Policy sweep report ]
# 1. A cell is keyed by (trace, ratio, provider) from the rows' params; values are ``extra``
#    (recomputation compute / the trace's compute) unless said otherwise.
# 2. The table: one line per trace, one column per ratio; a cell reads
#    ``dtr_eq / best heuristic / paper / optimum or bound`` in % of extra compute. A failed
#    run reads ``T`` (thrash: ThrashError or the paper's overhead limit) or ``M`` (oom: the
#    budget is too small for what must stay resident); the optimum ``=x`` (revolve,
#    Checkmate), the bound ``>=x``, ``inf`` when no schedule fits.
# 3. The bounds table: one line per trace, a cell ``dtr_eq / support bound / cut bound``
#    (runtime semantics, % of extra compute) and, when both are finite and positive, how
#    many times the support bound ``dtr_eq`` is (``x2.3``).
# 4. The comparison matches rows by (what, provider, trace, ratio); a runtime row is worse
#    when its status went from ok to a failure, or its extra compute rose by more than
#    ``TOLERANCE`` (relative) and 1e-6 of the step (absolute); the exit status is 1 then.

examples:
  python benchmarks/policy_report.py results/policy_sweep_cpu-2core-1thread.csv   # table + plot
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path

from harness import Row, read_csv

__all__ = ["bounds_table", "cells", "compare", "plot", "table"]

TOLERANCE = 0.01


def _params(row: Row) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in row.params.split(";") if "=" in kv)


def cells(rows: list[Row], what: str = "extra") -> dict[tuple[str, float, str], Row]:
    """NOTE [ Policy sweep report ] rule 1."""
    out = {}
    for r in rows:
        if r.what == what:
            p = _params(r)
            out[p["trace"], float(p["ratio"]), r.provider] = r
    return out


def _status(row: Row) -> str:
    return row.note.split()[0] if row.note else "ok"


def _pct(row: Row | None) -> str:
    if row is None:
        return "-"
    st = _status(row)
    if st in ("thrash", "time_limit"):
        return "T"
    if st in ("oom", "infeasible") or not math.isfinite(row.median):
        return "M" if not row.provider.startswith(("bound", "revolve", "checkmate")) else "inf"
    return f"{100 * row.median:.3g}"


def _grid(rows: list[Row], cell) -> str:
    """A markdown table, one line per trace and one column per ratio (highest first);
    ``cell(cells at that trace and ratio, by provider)`` is the text of a cell."""
    c = cells(rows)
    traces = list(dict.fromkeys(k[0] for k in c))
    ratios = sorted({k[1] for k in c}, reverse=True)
    lines = [
        "| trace | " + " | ".join(f"{r:g}" for r in ratios) + " |",
        "|---|" + "---:|" * len(ratios),
    ]
    for t in traces:
        at = [{p: row for (tt, rr, p), row in c.items() if tt == t and rr == r} for r in ratios]
        lines.append(f"| {t} | " + " | ".join(cell(rt) for rt in at) + " |")
    return "\n".join(lines)


def table(rows: list[Row]) -> str:
    """NOTE [ Policy sweep report ] rule 2, as markdown."""

    def cell(rt: dict[str, Row]) -> str:
        ok = [
            row
            for p, row in rt.items()
            if p.startswith("runtime:") and _status(row) == "ok" and p != "runtime:dtr_eq"
        ]
        best = min(ok, key=lambda row: row.median, default=None)
        eq = rt.get("runtime:dtr_eq")
        if best is not None and eq is not None and _status(eq) == "ok":
            best = None if best.median >= eq.median else best
        best_s = "=" if best is None else f"{_pct(best)} {best.provider[8:]}"
        opt = rt.get("revolve:runtime")
        floor = f"={_pct(opt)}" if opt is not None else f">={_pct(rt.get('bound:runtime'))}"
        return f"{_pct(eq)} / {best_s} / {_pct(rt.get('paper:dtr_eq'))} / {floor}"

    return _grid(rows, cell)


def bounds_table(rows: list[Row]) -> str:
    """NOTE [ Policy sweep report ] rule 3, as markdown."""

    def cell(rt: dict[str, Row]) -> str:
        eq, sup, cut = (rt.get(p) for p in ("runtime:dtr_eq", "bound:runtime", "bound:runtime-cut"))
        text = f"{_pct(eq)} / {_pct(sup)} / {_pct(cut)}"
        finite = sup is not None and math.isfinite(sup.median) and sup.median > 0
        if finite and eq is not None and _status(eq) == "ok":
            text += f" x{eq.median / sup.median:.2g}"
        return text

    return _grid(rows, cell)


def plot(rows: list[Row], path: str | Path) -> Path:
    """Overhead (1 + extra) against ratio, one panel per trace: runtime heuristics as thin
    lines (dtr_eq thick), the paper's policy dashed, the bound and optima as markers; failed
    runs are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = cells(rows)
    traces = list(dict.fromkeys(k[0] for k in c))
    cols = 5
    nrows = max(1, math.ceil(len(traces) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(3.4 * cols, 2.7 * nrows), squeeze=False)
    series: dict[tuple[str, str], list] = defaultdict(list)
    for (t, r, p), row in c.items():
        if _status(row) in ("ok", "optimal") and math.isfinite(row.median):
            series[t, p].append((r, 1 + row.median))
    style = {
        "runtime:dtr_eq": dict(lw=2.2, color="C0"),
        "paper:dtr_eq": dict(lw=1.6, ls="--", color="C3"),
        "bound:runtime": dict(lw=0, marker="v", ms=5, color="k"),
        "revolve:runtime": dict(lw=0, marker="*", ms=8, color="C2"),
        "checkmate:paper": dict(lw=0, marker="P", ms=6, color="C4"),
    }
    for ax, t in zip(axes.flat, traces):
        for (tt, p), pts in sorted(series.items()):
            if tt != t or p == "bound:paper":
                continue
            x, y = zip(*sorted(pts))
            kw = style.get(p, dict(lw=0.8, alpha=0.7))
            ax.plot(x, y, label=p.replace("runtime:", ""), **kw)
        ax.set_title(t, fontsize=9)
        ax.set_yscale("log")
        ax.set_xlim(0.95, 0.05)
        ax.grid(True, which="both", alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in axes.flat[len(traces) :]:
        ax.axis("off")
    handles, labels = {}, []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    labels = list(handles)
    fig.legend([handles[k] for k in labels], labels, loc="lower center", ncol=len(labels))
    per_inch = 1 / fig.get_figheight()  # legend and x label keep their height in inches
    fig.supxlabel("memory ratio (of the runtime's unlimited peak)", fontsize=9, y=0.42 * per_inch)
    fig.supylabel("compute / one unbudgeted step (log)", fontsize=9)
    fig.tight_layout(rect=(0, 0.62 * per_inch, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def compare(before: str | Path, after: str | Path) -> int:
    """NOTE [ Policy sweep report ] rule 4: print per trace, ratio and runtime heuristic what
    changed between two row files; 1 if anything got worse, else 0."""
    a, b = cells(read_csv(before)), cells(read_csv(after))
    worse = 0
    for key in sorted(a.keys() & b.keys()):
        t, r, p = key
        if not p.startswith(("runtime:", "paper:")):
            continue
        x, y = a[key], b[key]
        sx, sy = _status(x), _status(y)
        bad = (sx == "ok" and sy != "ok") or (
            sx == sy == "ok"
            and y.median > x.median * (1 + TOLERANCE)
            and y.median - x.median > 1e-6
        )
        if sx == sy and math.isclose(x.median, y.median, rel_tol=1e-9, abs_tol=1e-12):
            continue
        worse += bad
        tag = "WORSE" if bad else "changed"
        print(
            f"{tag:7s} {t:16s} {r:4g} {p:18s} {100 * x.median:10.4g}% {sx:6s} -> "
            f"{100 * y.median:10.4g}% {sy}"
        )
    missing = sorted(a.keys() - b.keys())
    if missing:
        print(f"{len(missing)} rows of {before} are not in {after}, e.g. {missing[0]}")
    print(f"{worse} worse, {len(a.keys() & b.keys())} rows compared")
    return 1 if worse else 0


def main(argv=None) -> int:
    """``policy_report.py ROWS.csv``: print both tables, redraw ROWS.png beside the file."""
    ap = argparse.ArgumentParser(
        description="Print a policy sweep's tables and redraw its plot (ROWS.png beside it)."
    )
    ap.add_argument("rows", type=Path, help="a row file of bench_policy_sweep.py (.csv)")
    args = ap.parse_args(argv)
    if not args.rows.is_file():
        ap.error(f"{args.rows} is not a file: pass a row file of bench_policy_sweep.py")
    rows = read_csv(args.rows)
    print(table(rows))
    print(bounds_table(rows))
    print(plot(rows, args.rows.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

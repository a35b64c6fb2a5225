"""Where does offload pay? The twin at 90 % .. 10 % of each recorded step's memory, three links,
recompute only, offload only and both (NOTE [ Offload ] in tritondtr/core/core.py).

# NOTE [ Offload sweep ]
# 1. Traces (recorded.py, NOTE [ Recorded steps ]): the zoo at ``--scale``, the GRU loop, the
#    U-Net, GPT-2 / BERT / Llama from config (with transformers), the DTR authors' logs (with
#    ../shared). The recorded steps are priced by the analytic model's reference GPU (the H100
#    model, NOTE [ Cost models ] rule 9), not this CPU's op times, which are ~100x a GPU's and
#    would flatter every copy; the DTR logs keep their own (Titan V) times.
# 2. Each trace at each ratio of its runtime peak with ``dtr_eq`` in the runtime's semantics:
#    ``recompute`` (no link), then per link ``offload`` (every victim copied) and ``both`` (the
#    cheaper per victim at the copy price scale the runtime would choose on steps that
#    repeat: NOTE [ Copy price scale ] in tritondtr/core/tuning.py), each with copies out ahead of
#    the budget and prefetches in the trace's order (a recorded step that repeats: NOTE [
#    The twin ] rule 8; NOTE [ Asynchronous offload ] in tritondtr/core/offload.py); and
#    what those buy, each at scale 1: ``both-unscaled`` (the per-victim price alone),
#    ``both-stalled`` (every copy made when the room is needed, the op waiting),
#    ``both-ahead`` (no prefetch). ``overhead`` = the step's device time (ops,
#    recomputations, waits for the link) / its compute; a failed run (oom, thrash) says so
#    in ``note``; ``copy_scale``: the scale each run ended at.
# 3. ``LOSS``: ``both`` above the better of the other two by more than 0.1 % (the twin is
#    deterministic: no noise). The issue's target: ``both`` at least 20 % of recompute-only's
#    overhead better on the conv and transformer steps at <= 30 % over PCIe 5.
# 4. Memory reached at 1.1x / 1.3x / 1.5x: the smallest ratio whose run is ok within it.
# 5. The plot (beside the rows, ``.png``): per trace, overhead against the budget, recompute
#    only, and offload only and both per link.

examples:
  python benchmarks/bench_sim_offload.py --quick --out out/offload     # zoo at scale 4, ~50 s
  python benchmarks/bench_sim_offload.py --out benchmarks/results      # all traces, ~7 min
  python benchmarks/bench_sim_offload.py --replot out/offload/sim_offload_cpu-analytic-h100.csv
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import recorded  # noqa: E402
from harness import Env, Row, Stats, describe_device, write_csv  # noqa: E402

import tritondtr  # noqa: E402
from tritondtr.sim.simulate import simulate  # noqa: E402

RATIOS = (0.9, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1)
# Rule 2: (provider, action, copies ahead, prefetch, copy price scale); ``offload`` and
# ``both`` are the whole rule, the other three take its parts away (NOTE [ Asynchronous
# offload ], NOTE [ Copy price scale ]).
VARIANTS = (
    ("offload", "offload", True, "trace", None),
    ("both", "both", True, "trace", "trace"),
    ("both-unscaled", "both", True, "trace", 1.0),
    ("both-stalled", "both", False, False, 1.0),
    ("both-ahead", "both", True, False, 1.0),
)
LINKS = ("pcie4", "pcie5", "nvlink-c2c")
CONV = ("cnn", "unet", "dtr-resnet32", "dtr-densenet121", "dtr-unet")
TRANSFORMER = ("gpt", "hf-gpt2", "hf-bert", "hf-llama", "dtr-transformer")


def _record(step) -> tritondtr.sim.Trace:
    with tritondtr.trace(cost="analytic") as rec:  # rule 1: the reference GPU's costs
        step()
    return rec.trace


def traces(scale: int, quick: bool) -> dict:
    """Rule 1's traces by name."""
    names = ("mlp", "cnn", "gpt", "lstm", "treelstm")
    steps = {f"{n}-s{scale}": (lambda n=n: recorded.zoo_step(n, scale)) for n in names}
    if not quick:
        steps["gru40"] = recorded.gru_step
        steps["unet"] = recorded.unet_step
        for n in recorded.HF_MODELS:
            steps[f"hf-{n}"] = lambda n=n: recorded.hf_step(n)
    out = {}
    for name, make in steps.items():
        try:
            out[name] = _record(make())
        except ImportError as e:  # transformers missing: NOTE [ Recorded steps ] rule 3
            print(f"skipping {name}: {e}")
    if not quick:
        out.update(recorded.dtr_log_traces())
    return out


def family(name: str) -> str:
    base = name.rsplit("-s", 1)[0] if name[-1].isdigit() and "-s" in name else name
    return "conv" if base in CONV else "transformer" if base in TRANSFORMER else "other"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="the zoo only")
    ap.add_argument("--scale", type=int, default=16, help="the zoo's scale (default 16; 4 quick)")
    ap.add_argument("--out", type=Path, default=Path("out/offload"), help="output folder")
    ap.add_argument("--tag", default="cpu-analytic-h100", help="file name tag")
    ap.add_argument(
        "--replot", type=Path, metavar="CSV", help="only draw the plot of a sweep's rows"
    )
    args = ap.parse_args(argv)
    if args.replot is not None:
        if not args.replot.is_file():
            ap.error(f"--replot: no such file: {args.replot}")
        print(f"plot: {plot(args.replot, args.replot.with_suffix('.png'))}")
        return 0
    if args.scale < 1:
        ap.error(f"--scale must be >= 1, got {args.scale}")
    torch.set_num_threads(1)
    scale = 4 if args.quick and args.scale == 16 else args.scale
    env, device = Env.capture(), describe_device("cpu")
    rows, table, losses, target = [], [], [], []
    for name, tr in traces(scale, args.quick).items():
        for ratio in RATIOS:
            runs = {"recompute": simulate(tr, "dtr_eq", ratio=ratio, semantics="runtime")}
            for link in LINKS:
                for provider, action, ahead, prefetch, copy_scale in VARIANTS:
                    runs[f"{provider}:{link}"] = simulate(
                        tr,
                        "dtr_eq",
                        ratio=ratio,
                        semantics="runtime",
                        offload_bandwidth=link,
                        action=action,
                        ahead=ahead,
                        prefetch=prefetch,
                        copy_scale=copy_scale,
                    )
            for provider, r in runs.items():
                params = f"trace={name};ratio={ratio};budget={r.budget}"
                note = "" if r.ok else r.status
                for what, value, unit in (
                    ("overhead", r.overhead, "x"),
                    ("remats", r.remats, "count"),
                    ("offloads", r.offloads, "count"),
                    ("copy_scale", r.copy_scale, "x"),
                ):
                    rows.append(
                        Row.of(
                            what,
                            provider,
                            tr.num_ops,
                            Stats.of([value]),
                            unit,
                            device=device,
                            env=env,
                            params=params,
                            note=note,
                        )
                    )
            table.append((name, ratio, runs))
            rec = runs["recompute"]
            for link in LINKS:
                off, both = runs[f"offload:{link}"], runs[f"both:{link}"]
                ok = [x.overhead for x in (rec, off) if x.ok]
                if both.ok and ok and both.overhead > min(ok) * 1.001:
                    losses.append(
                        f"{name} at {ratio:.0%} over {link}: both {both.overhead:.4f}, "
                        f"best alone {min(ok):.4f}"
                    )
                if link == "pcie5" and ratio <= 0.3 and family(name) != "other" and rec.ok:
                    gain = (rec.overhead - both.overhead) / max(rec.overhead - 1.0, 1e-12)
                    target.append((name, ratio, both.ok, gain))
            print(_line(name, ratio, runs), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = write_csv(rows, args.out / f"sim_offload_{args.tag}.csv")
    md = args.out / f"sim_offload_{args.tag}.md"
    md.write_text(_report(table, losses, target, env, scale))
    print(f"rows: {path}\nreport: {md}\nplot: {plot(path, path.with_suffix('.png'))}")
    return 0


def plot(rows_csv: Path, out: Path) -> Path:
    """Rule 5: per trace, the step's overhead against the budget (a share of its runtime
    peak): recompute only, and offload only and both per link; failed runs left out."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: dict = {}
    with open(rows_csv) as f:
        for r in csv.DictReader(f):
            if r["what"] != "overhead" or r["note"]:
                continue
            p = dict(kv.split("=", 1) for kv in r["params"].split(";"))
            curve = runs.setdefault(p["trace"], {}).setdefault(r["provider"], [])
            curve.append((float(p["ratio"]), float(r["median"])))
    styles = {"recompute": ("k", "-")}
    for link, color in zip(LINKS, ("tab:blue", "tab:orange", "tab:green")):
        styles[f"offload:{link}"] = (color, ":")
        styles[f"both:{link}"] = (color, "-")
    names = list(runs)
    cols = 5
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        for provider, (color, ls) in styles.items():
            pts = sorted(runs[name].get(provider, ()))
            if pts:
                ax.plot(*zip(*pts), color=color, ls=ls, marker=".", label=provider)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("budget / runtime peak", fontsize=8)
        ax.set_ylabel("step time / compute", fontsize=8)
        ax.invert_xaxis()
        ax.set_ylim(0.98, 2.0)
        ax.tick_params(labelsize=7)
    for ax in axes.flat[len(names) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", fontsize=8, ncol=len(labels))
    fig.suptitle(
        "Offload: recompute only (black), offload only (dotted) and both (solid) per link; "
        "the twin, H100 model costs",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def _fmt(r) -> str:
    return f"{r.overhead:.3f}" if r.ok else r.status


def _tuned(r) -> str:
    """A ``both`` run with the scale it chose (NOTE [ Copy price scale ])."""
    return f"{_fmt(r)} x{r.copy_scale:g}" if r.ok else r.status


def _line(name, ratio, runs) -> str:
    cells = " | ".join(f"{k} {_fmt(r)}" for k, r in runs.items())
    return f"{name:16s} {ratio:.1f} | {cells}"


def _reached(table, name, provider, limit) -> str:
    best = [
        ratio
        for n, ratio, runs in table
        if n == name and runs[provider].ok and runs[provider].overhead <= limit
    ]
    return f"{min(best):.0%}" if best else "-"


def _report(table, losses, target, env, scale) -> str:
    out = [
        "# Offload sweep (the twin, dtr_eq, runtime semantics)",
        "",
        f"torch {env.torch}, git {env.git_sha}, {env.date}; zoo scale {scale}; costs: the H100",
        "model for recorded steps, the logs' own for the DTR logs. Overhead = device time /",
        "compute; oom / thrash: the run failed. NOTE [ Offload sweep ] in the script.",
        "",
        "| trace | ratio | recompute | "
        + " | ".join(f"offload {k} | both {k}" for k in LINKS)
        + " |",
        "|---|---:|---:|" + "---:|" * (2 * len(LINKS)),
    ]
    for name, ratio, runs in table:
        cells = [_fmt(runs["recompute"])]
        for k in LINKS:
            cells += [_fmt(runs[f"offload:{k}"]), _tuned(runs[f"both:{k}"])]
        out.append(f"| {name} | {ratio:.0%} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Memory reached within 1.1x / 1.3x / 1.5x of the step's compute (smallest ratio):",
        "",
        "| trace | recompute | offload pcie5 | both pcie5 |",
        "|---|---|---|---|",
    ]
    for name in dict.fromkeys(n for n, _, _ in table):
        cells = [
            " / ".join(_reached(table, name, p, lim) for lim in (1.1, 1.3, 1.5))
            for p in ("recompute", "offload:pcie5", "both:pcie5")
        ]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += [
        "",
        "What the copies beside the ops and the tuned scale buy, PCIe 5 (both: stalled /",
        "ahead / ahead + prefetch at scale 1 / the tuned scale):",
        "",
        "| trace | ratio | recompute | stalled | ahead | ahead + prefetch | tuned |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    variants = ("both-stalled:pcie5", "both-ahead:pcie5", "both-unscaled:pcie5")
    for name, ratio, runs in table:
        if ratio in (0.5, 0.3, 0.1):
            cells = [_fmt(runs[p]) for p in ("recompute", *variants)]
            cells.append(_tuned(runs["both:pcie5"]))
            out.append(f"| {name} | {ratio:.0%} | " + " | ".join(cells) + " |")
    out += ["", f"Where both loses to the better of the two alone ({len(losses)}):", ""]
    out += [f"- {x}" for x in losses] or ["- none"]
    met = [t for t in target if t[2] and t[3] >= 0.2]
    out += [
        "",
        "Target (both >= 20 % of recompute-only's overhead better, conv and transformer "
        f"steps, <= 30 %, PCIe 5): {len(met)} of {len(target)} runs",
        "",
    ]
    out += [
        f"- {n} at {r:.0%}: {'ok' if ok else 'failed'}, "
        f"{'n/a' if not math.isfinite(g) else f'{g:.0%}'} of the overhead"
        for n, r, ok, g in target
    ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())

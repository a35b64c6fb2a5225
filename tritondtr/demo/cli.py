"""Train a small GPT-like model under decreasing memory budgets, with exact gradients.

The model learns characters of a short text embedded in tritondtr.demo.tinygpt (no download). It
runs without tritondtr (the reference), under enable(budget=None), which measures the
baseline peak in tritondtr's accounting, under budgets that are decreasing fractions of that
peak down to the lowest that works, and with every block under torch.utils.checkpoint. Every
run starts from the same weights and sees the same batches and dropout masks, so its losses
and gradients must equal the reference bit for bit. Beside each budget, the simulator (the
runtime's twin) predicts the run from the unlimited run's trace. Prints a table (budget,
peak, evictions and rematerializations measured and predicted, step time measured and
predicted, gradients equal) and the first and last loss, and writes demo.csv, demo.png,
trace.npz (the unlimited run's last step, for tritondtr simulate) and memory.png with
memory.csv (the first step's tracked memory op by op at the lowest budget that worked, beside
the unlimited run: tritondtr.plot_memory; --timeline) to --out.

Two regimes (--regime): "large" (the default), a model whose step time is in ops of
milliseconds, as a GPU user's is, so tritondtr's per-op price is small beside them; "small",
the 8-layer model of width 128 whose ops take tens to hundreds of microseconds, where that
price shows (on a CPU it is most of what the unlimited run adds). Each table is named by its
regime and followed by a line measuring it: tracked ops per step, eager step time per op,
and the time tracking added per op. "both" runs large, then small: one table each, one line each in
demo.png, a regime column in demo.csv, and the small regime's trace and memory picture as
trace-small.npz, memory-small.png and memory-small.csv.

examples:
  tritondtr demo                              # about a minute on a 2-core CPU
  tritondtr demo --regime both                # and the small-op model: about two minutes
  tritondtr demo --steps 5 --ratios 0.5,0.3 --out out/demo
  tritondtr demo --timeline 0.5               # the memory picture at 50 % of the peak
  tritondtr simulate out/demo/trace.npz --semantics runtime --heuristics dtr_eq,lru
  tritondtr demo --layers 12 --width 768 --heads 12 --block 1024 --vocab 50257  # GPT-2 small
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import torch

from ..units import format_bytes
from .regimes import REGIMES, Regime, RegimeSpec
from .report import describe_ops, format_table, write_outputs
from .runs import HEURISTIC, DemoRow, lowest_working, memory_runs, run_demo
from .tinygpt import GPTConfig, TinyGPT

__all__ = ["add_arguments", "run"]


def _ratios(text: str) -> tuple[float, ...]:
    try:
        rs = tuple(float(x) for x in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected fractions like 0.5,0.3, got {text!r}") from None
    if not rs or not all(0 < r <= 1 for r in rs):
        raise argparse.ArgumentTypeError(f"ratios must be in (0, 1], got {text!r}")
    return rs


def _regimes(text: str) -> tuple[Regime, ...]:
    """``--regime``: ``large``, ``small`` or ``both`` (large, then small)."""
    if text == "both":
        return (Regime.LARGE, Regime.SMALL)
    try:
        return (Regime(text),)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected large, small or both, got {text!r}") from None


def _picture(text: str) -> str | float:
    """``--timeline``: ``lowest``, ``none`` or a ratio in (0, 1]."""
    if text in ("lowest", "none"):
        return text
    try:
        r = float(text)
    except ValueError:
        r = math.nan
    if not 0 < r <= 1:
        raise argparse.ArgumentTypeError(
            f"expected lowest, none or a fraction of the unlimited peak in (0, 1], got {text!r}"
        )
    return r


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``tritondtr demo``."""
    large, small = REGIMES[Regime.LARGE], REGIMES[Regime.SMALL]

    def regime_default(get) -> str:
        return f"(default: the regime's: large {get(large)}, small {get(small)})"

    parser.add_argument(
        "--regime",
        type=_regimes,
        default=(Regime.LARGE,),
        metavar="large|small|both",
        help=f"large: {large.label}; small: {small.label}; both: large, then small "
        "(default: large)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps per run " + regime_default(lambda r: r.steps),
    )
    parser.add_argument(
        "--refine",
        type=int,
        default=2,
        help="bisection steps between the lowest budget that worked and the "
        "first that failed (default: 2)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="sequences per batch " + regime_default(lambda r: r.batch),
    )
    parser.add_argument(
        "--ratios",
        type=_ratios,
        default=None,
        help="budgets as fractions of the unlimited peak, tried in this order, "
        "stopping at the first that fails (default: 0.8,0.6,0.5,0.4,0.3,"
        "0.25,0.2,0.15,0.1,0.05)",
    )
    for name, help_text in (
        ("layers", "transformer blocks"),
        ("width", "channels"),
        ("heads", "attention heads"),
        ("block", "context length"),
        ("vocab", "vocabulary size (>= the corpus's characters)"),
    ):
        parser.add_argument(
            f"--{name}",
            type=int,
            default=None,
            help=f"{help_text} " + regime_default(lambda r, n=name: getattr(r.config, n)),
        )
    parser.add_argument(
        "--dropout",
        type=float,
        default=None,
        help="dropout probability " + regime_default(lambda r: r.config.dropout),
    )
    parser.add_argument(
        "--device",
        default="auto",
        help="cpu, cuda, cuda:1, or auto: cuda when available (default: auto)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, batches, dropout")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads of torch (default: 1: steadier step times on a busy "
        "machine; 0 keeps torch's default)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=60.0,
        metavar="S",
        help="start no new budget after S seconds of a regime's runs (default: 60)",
    )
    parser.add_argument(
        "--timeline",
        type=_picture,
        default="lowest",
        metavar="lowest|RATIO|none",
        help="the budget of memory.png and memory.csv, the first step's tracked memory op by "
        "op beside the unlimited run's: the lowest budget that worked, a fraction of the "
        "unlimited peak, or none (default: lowest; two more untimed steps)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("out/demo"),
        help="folder for demo.csv, demo.png, trace.npz, memory.png and memory.csv, and with "
        "--regime both trace-small.npz, memory-small.png and memory-small.csv "
        "(default: out/demo)",
    )


def run(args: argparse.Namespace) -> int:
    """``tritondtr demo``: exit status 0 when every run's gradients equal the reference."""
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in ("steps", "batch"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"tritondtr demo: --{name} must be >= 1")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for i, regime in enumerate(args.regime):
        spec = REGIMES[regime]
        suffix = "" if i == 0 else f"-{regime.value}"  # the first regime's files keep the names
        results.append(_run_regime(args, spec, device, suffix))
    csv_path, png = write_outputs(results, args.out, device)
    print(f"wrote {csv_path} and " + (f"{png}" if png else "no plot (no matplotlib)"))
    if len(results) > 1:
        for spec, rows in results:
            print(f"{spec.label}: {describe_ops(rows, spec.steps)}")
    ok = all(r.grads_equal is not False for _, rows in results for r in rows)
    return 0 if ok else 1


def _run_regime(
    args: argparse.Namespace, spec: RegimeSpec, device: str, suffix: str
) -> tuple[RegimeSpec, list[DemoRow]]:
    """One regime's runs, table and lines (NOTE [ The demo ] rule 4), its trace and its memory
    picture (rule 5), named with ``suffix``; the regime as run (sizes from the options, and a
    label that says so) and its rows."""
    sizes = {
        f: getattr(spec.config, f) if getattr(args, f) is None else getattr(args, f)
        for f in ("vocab", "block", "width", "layers", "heads", "dropout")
    }
    config = GPTConfig(**sizes)
    steps, batch = args.steps or spec.steps, args.batch or spec.batch
    if (config, steps, batch) != (spec.config, spec.steps, spec.batch):
        label = f"{spec.label} (sizes from the options)"  # its ops: the line under its table
        spec = dataclasses.replace(spec, label=label, config=config, steps=steps, batch=batch)
    kw = {} if args.ratios is None else {"ratios": args.ratios}
    n = sum(p.numel() for p in TinyGPT(config).parameters())
    print(
        f"{spec.label}\ntritondtr demo: {config.layers}-layer GPT of width {config.width}, "
        f"{n / 1e6:.2f}M parameters, batch {batch}x{config.block} tokens, {steps} steps per "
        f"run, on {device} ({torch.get_num_threads()} threads)"
    )
    trace_path = args.out / f"trace{suffix}.npz"
    rows = run_demo(
        config,
        steps=steps,
        batch=batch,
        refine=args.refine,
        seed=args.seed,
        device=device,
        time_limit_s=args.time_limit,
        trace_path=trace_path,
        **kw,
    )
    eager = rows[0]
    print(format_table(rows, HEURISTIC))
    print(
        f"loss: first {eager.first_loss:.4f} (ln {config.vocab} = "
        f"{math.log(config.vocab):.4f}), last {eager.last_loss:.4f} after {steps} steps; "
        "every run with equal gradients had these losses"
    )
    r = lowest_working(rows)
    if r is not None:
        print(
            f"lowest budget that works: {r.run} of the unlimited peak "
            f"({format_bytes(r.budget_bytes)}), step time {r.step_s / eager.step_s:.2f}x eager"
        )
    print(f"{spec.label}: {describe_ops(rows, steps)}")
    print(f"wrote {trace_path} (replay it: tritondtr simulate {trace_path} --semantics runtime)")
    if args.timeline != "none":
        _memory_picture(args, config, rows, device, batch, suffix)
    return spec, rows


def _memory_picture(
    args: argparse.Namespace,
    config: GPTConfig,
    rows: list[DemoRow],
    device: str,
    batch: int,
    suffix: str,
) -> None:
    """memory{suffix}.png and .csv (NOTE [ The demo ] rule 5), and a line that names them."""
    from ..runtime import plot_memory

    worked = sorted(
        (r for r in rows if r.budget_bytes is not None and not r.error), key=lambda r: r.ratio
    )
    if args.timeline == "lowest":
        tries = worked
    else:
        budget = int(rows[1].peak_bytes * args.timeline)
        tries = [DemoRow(f"{args.timeline:.1%}", args.timeline, budget, None, 0, 0, 0.0, None)]
    runs = memory_runs(config, tries, batch=batch, seed=args.seed, device=device)
    if runs is None:
        print("no memory picture: no budget worked" if not tries else "no memory picture")
        return
    r = runs.budget
    png = args.out / f"memory{suffix}.png"
    try:
        png, csv_path = plot_memory(runs.budgeted, png, eager=runs.unlimited)
        files = f"{png} and {csv_path}"
    except ImportError:  # the rows are written first
        files = f"{png.with_suffix('.csv')} (no picture: no matplotlib)"
    st = runs.budgeted
    print(
        f"wrote {files}: the first step's tracked "
        f"memory op by op at {r.run} of the unlimited peak ({format_bytes(r.budget_bytes)}: "
        f"peak {format_bytes(st.peak_bytes)}, {st.evictions} evictions, "
        f"{st.rematerializations} rematerializations) beside the unlimited run (peak "
        f"{format_bytes(runs.unlimited.peak_bytes)})"
    )

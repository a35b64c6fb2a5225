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

examples:
  tritondtr demo                              # about 20 s on a 2-core CPU
  tritondtr demo --steps 5 --ratios 0.5,0.3 --out out/demo
  tritondtr demo --timeline 0.5               # the memory picture at 50 % of the peak
  tritondtr simulate out/demo/trace.npz --semantics runtime --heuristics dtr_eq,lru
  tritondtr demo --layers 12 --width 768 --heads 12 --block 1024 --vocab 50257  # GPT-2 small
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from ..units import format_bytes
from .report import format_table, write_outputs
from .runs import DEMO_CONFIG, HEURISTIC, DemoRow, lowest_working, memory_runs, run_demo
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
    d = DEMO_CONFIG
    parser.add_argument("--steps", type=int, default=4, help="training steps per run (default: 4)")
    parser.add_argument(
        "--refine",
        type=int,
        default=2,
        help="bisection steps between the lowest budget that worked and the "
        "first that failed (default: 2)",
    )
    parser.add_argument("--batch", type=int, default=8, help="sequences per batch (default: 8)")
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
            default=getattr(d, name),
            help=f"{help_text} (default: {getattr(d, name)})",
        )
    parser.add_argument(
        "--dropout",
        type=float,
        default=d.dropout,
        help=f"dropout probability (default: {d.dropout})",
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
        help="start no new budget after S seconds (default: 60)",
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
        help="folder for demo.csv, demo.png, trace.npz, memory.png and memory.csv "
        "(default: out/demo)",
    )


def run(args: argparse.Namespace) -> int:
    """``tritondtr demo``: exit status 0 when every run's gradients equal the reference."""
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in ("steps", "batch"):
        if getattr(args, name) < 1:
            raise SystemExit(f"tritondtr demo: --{name} must be >= 1")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    config = GPTConfig(
        vocab=args.vocab,
        block=args.block,
        width=args.width,
        layers=args.layers,
        heads=args.heads,
        dropout=args.dropout,
    )
    kw = {} if args.ratios is None else {"ratios": args.ratios}
    n = sum(p.numel() for p in TinyGPT(config).parameters())
    print(
        f"tritondtr demo: {config.layers}-layer GPT, {n / 1e6:.2f}M parameters, batch "
        f"{args.batch}x{config.block} tokens, {args.steps} steps per run, on {device} "
        f"({torch.get_num_threads()} threads)"
    )
    trace_path = args.out / "trace.npz"
    args.out.mkdir(parents=True, exist_ok=True)
    rows = run_demo(
        config,
        steps=args.steps,
        batch=args.batch,
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
        f"{math.log(config.vocab):.4f}), last {eager.last_loss:.4f} after {args.steps} steps; "
        "every run with equal gradients had these losses"
    )
    r = lowest_working(rows)
    if r is not None:
        print(
            f"lowest budget that works: {r.run} of the unlimited peak "
            f"({format_bytes(r.budget_bytes)}), step time {r.step_s / eager.step_s:.2f}x eager"
        )
    csv_path, png = write_outputs(rows, args.out, device)
    print(
        f"wrote {csv_path}, "
        + (f"{png}" if png else "no plot (no matplotlib)")
        + f" and {trace_path} (replay it: tritondtr simulate {trace_path} --semantics runtime)"
    )
    if args.timeline != "none":
        _memory_picture(args, config, rows, device)
    return 0 if all(r.grads_equal is not False for r in rows) else 1


def _memory_picture(
    args: argparse.Namespace, config: GPTConfig, rows: list[DemoRow], device: str
) -> None:
    """memory.png and memory.csv (NOTE [ The demo ] rule 5), and a line that names them."""
    from ..runtime import plot_memory

    worked = sorted(
        (r for r in rows if r.budget_bytes is not None and not r.error), key=lambda r: r.ratio
    )
    if args.timeline == "lowest":
        tries = worked
    else:
        budget = int(rows[1].peak_bytes * args.timeline)
        tries = [DemoRow(f"{args.timeline:.1%}", args.timeline, budget, None, 0, 0, 0.0, None)]
    runs = memory_runs(config, tries, batch=args.batch, seed=args.seed, device=device)
    if runs is None:
        print("no memory picture: no budget worked" if not tries else "no memory picture")
        return
    r = runs.budget
    png = args.out / "memory.png"
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

"""Train a small GPT-like model under decreasing memory budgets, with exact gradients.

The model learns characters of a short text embedded in this module (no download). It first
runs without tritondtr (the reference), then under ``tritondtr.runtime.enable(budget=None)``,
which measures the baseline peak in tritondtr's accounting, then under budgets that are
decreasing fractions of that peak, down to the lowest that works. Every run starts from the
same weights and sees the same batches and dropout masks, so its loss and gradients must equal
the reference bit for bit. Prints a table (budget, peak, evictions, rematerializations, step
time, gradients equal) and writes demo.csv and demo.png to --out.

examples:
  tritondtr demo                              # about 30 s on a 2-core CPU
  tritondtr demo --steps 5 --ratios 0.5,0.3 --out out/demo
  tritondtr demo --layers 12 --width 768 --heads 12 --block 1024 --vocab 50257  # GPT-2 small
"""

from __future__ import annotations

import argparse
import copy
import csv
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .tinygpt import GPTConfig, TinyGPT, batches
from .units import format_bytes

__all__ = ["DemoRow", "run_demo"]


# ---------------------------------------------------------------------------- the runs
@dataclass
class DemoRow:
    """One run: ``ratio`` of the baseline peak (None: eager reference / unlimited), bytes,
    medians of step seconds, whether loss and every gradient equal the reference."""

    run: str
    ratio: float | None
    budget_bytes: int | None
    peak_bytes: int | None
    evictions: int
    rematerializations: int
    step_s: float
    grads_equal: bool | None
    error: str = ""


def _train(model0, data, budget, mode, seed, device):
    """Train a copy of ``model0`` on ``data``; returns (losses, grads per step, stats)."""
    from .runtime import enable

    model = copy.deepcopy(model0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, grads, times = [], [], []
    peak = ev = remat = 0
    for step, (x, y) in enumerate(data):
        _sync(device)
        t0 = time.perf_counter()
        session = enable(budget=budget) if mode != "eager" else None
        if session is not None:
            session.__enter__()
        try:
            torch.manual_seed(seed + step)
            opt.zero_grad(set_to_none=True)
            logits = model(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
        finally:
            if session is not None:
                session.__exit__(None, None, None)
        _sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.detach().clone())
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        if session is not None:
            st = session.stats
            peak, ev, remat = (
                max(peak, st.peak_bytes),
                ev + st.evictions,
                remat + st.rematerializations,
            )
    return losses, grads, (peak, ev, remat, statistics.median(times))


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _equal(ref, got) -> bool:
    (rl, rg), (gl, gg) = ref, got
    return all(torch.equal(a, b) for a, b in zip(rl, gl)) and all(
        torch.equal(a, b) for ga, gb in zip(rg, gg) for a, b in zip(ga, gb)
    )


def run_demo(
    config: GPTConfig | None = None,
    *,
    steps: int = 4,
    batch: int = 8,
    ratios: tuple[float, ...] = (0.8, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05),
    refine: int = 2,
    seed: int = 0,
    device: str | torch.device = "cpu",
    time_limit_s: float = 60.0,
    log=print,
) -> list[DemoRow]:
    """The demo's runs (see the module docstring): ``ratios`` in order until one fails, then
    ``refine`` bisection steps between the lowest that worked and the highest that failed.
    No new budget starts once ``time_limit_s`` seconds have passed. ``config``: the model's
    sizes (default: ``GPTConfig()``, 4 layers of width 128)."""
    from .runtime import BudgetError, ThrashError

    config = config or GPTConfig()

    torch.manual_seed(seed)
    model0 = TinyGPT(config).to(device)
    data = batches(config, steps, batch, seed, device)
    t_start = time.perf_counter()
    for mode in ("eager", "tritondtr"):  # warm-up: lazy initialisation is not a step time
        _train(model0, data[:1], None, mode, seed, device)
    ref_l, ref_g, ref = _train(model0, data, None, "eager", seed, device)
    rows = [DemoRow("eager", None, None, None, 0, 0, ref[3], None)]
    log(f"eager reference: {ref[3] * 1e3:.1f} ms/step")
    loss, grads, st = _train(model0, data, None, "tritondtr", seed, device)
    base = st[0]
    rows.append(
        DemoRow(
            "unlimited", 1.0, None, base, st[1], st[2], st[3], _equal((ref_l, ref_g), (loss, grads))
        )
    )

    def attempt(r: float) -> bool:
        budget = int(base * r)
        try:
            loss, grads, st = _train(model0, data, budget, "tritondtr", seed, device)
        except BudgetError as e:
            why = (
                f"thrashes ({e.rematerializations} rematerializations)"
                if isinstance(e, ThrashError)
                else f"{e.op} needs {format_bytes(e.needed)}"
            )
            rows.append(DemoRow(f"{r:.1%}", r, budget, None, 0, 0, float("nan"), None, error=why))
            return False
        rows.append(
            DemoRow(
                f"{r:.1%}",
                r,
                budget,
                st[0],
                st[1],
                st[2],
                st[3],
                _equal((ref_l, ref_g), (loss, grads)),
            )
        )
        return True

    def out_of_time(r: float) -> bool:
        if time.perf_counter() - t_start <= time_limit_s:
            return False
        log(f"time limit of {time_limit_s:.0f} s reached: stopping before ratio {r:.1%}")
        return True

    ok, failed = 1.0, None
    for r in ratios:
        if out_of_time(r):
            break
        if not attempt(r):
            failed = r
            break
        ok = r
    for _ in range(refine if failed is not None else 0):  # bisect towards the lowest
        r = (ok + failed) / 2
        if out_of_time(r):
            break
        if attempt(r):
            ok = r
        else:
            failed = r
    rows[2:] = sorted(rows[2:], key=lambda row: -row.ratio)
    return rows


# ------------------------------------------------------------------------- table and plot
def format_table(rows: list[DemoRow]) -> str:
    """A fixed-width table of the rows; times relative to the eager reference."""
    eager = rows[0].step_s
    head = (
        f"{'run':>9} {'budget':>11} {'peak':>11} {'evictions':>9} {'remats':>7} "
        f"{'step ms':>8} {'x eager':>7}  grads equal"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        fb = lambda n: "-" if n is None else format_bytes(n)
        ok = "-" if r.grads_equal is None else "yes" if r.grads_equal else "NO"
        if r.error:
            ok = f"fails: {r.error}"
        lines.append(
            f"{r.run:>9} {fb(r.budget_bytes):>11} {fb(r.peak_bytes):>11} "
            f"{r.evictions:>9} {r.rematerializations:>7} {r.step_s * 1e3:>8.1f} "
            f"{r.step_s / eager:>7.2f}  {ok}"
        )
    return "\n".join(lines)


def write_outputs(rows: list[DemoRow], out: Path, device: str) -> tuple[Path, Path | None]:
    """demo.csv (the rows) and demo.png (peak and step time against the budget) in ``out``;
    the plot is skipped (None) when matplotlib is missing."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "demo.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*asdict(rows[0]).keys(), "device"])
        w.writeheader()
        for r in rows:
            w.writerow({**asdict(r), "device": device})
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return csv_path, None
    ok = [r for r in rows if r.ratio is not None and r.peak_bytes is not None]
    eager = rows[0].step_s
    x = [100 * r.ratio for r in ok]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.plot(x, [r.peak_bytes / 2**20 for r in ok], "o-", label="peak resident")
    a1.plot(x, [(r.budget_bytes or ok[0].peak_bytes) / 2**20 for r in ok], "k--", label="budget")
    a1.set(xlabel="budget (% of the unlimited peak)", ylabel="MiB", title="memory")
    a2.plot(x, [r.step_s / eager for r in ok], "o-", color="C1", label="step time / eager")
    a2b = a2.twinx()
    a2b.bar(
        x,
        [r.rematerializations for r in ok],
        width=3,
        alpha=0.3,
        color="C2",
        label="rematerializations",
    )
    a2.set(xlabel="budget (% of the unlimited peak)", ylabel="x eager", title="time")
    a2b.set_ylabel("rematerializations (all steps)")
    for a in (a1, a2):
        a.invert_xaxis()
        a.grid(alpha=0.3)
    a2.axhline(1.0, color="k", ls=":", lw=1, label="eager")
    a1.legend()
    h1, l1 = a2.get_legend_handles_labels()
    h2, l2 = a2b.get_legend_handles_labels()
    a2.legend(h1 + h2, l1 + l2, loc="upper center")
    bad = [r.run for r in ok if not r.grads_equal]
    fig.suptitle(
        f"tritondtr demo on {device}: gradients equal to eager "
        + ("in every run" if not bad else f"EXCEPT {', '.join(bad)}")
    )
    fig.tight_layout()
    png = out / "demo.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return csv_path, png


# ---------------------------------------------------------------------------------- CLI
def _ratios(text: str) -> tuple[float, ...]:
    try:
        rs = tuple(float(x) for x in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected fractions like 0.5,0.3, got {text!r}") from None
    if not rs or not all(0 < r <= 1 for r in rs):
        raise argparse.ArgumentTypeError(f"ratios must be in (0, 1], got {text!r}")
    return rs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``tritondtr demo``."""
    d = GPTConfig()
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
        "--out",
        type=Path,
        default=Path("out/demo"),
        help="folder for demo.csv and demo.png (default: out/demo)",
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
    rows = run_demo(
        config,
        steps=args.steps,
        batch=args.batch,
        refine=args.refine,
        seed=args.seed,
        device=device,
        time_limit_s=args.time_limit,
        **kw,
    )
    print(format_table(rows))
    lowest = [r for r in rows[2:] if not r.error]
    if lowest:
        r = min(lowest, key=lambda row: row.ratio)
        print(
            f"lowest budget that works: {r.run} of the unlimited peak "
            f"({format_bytes(r.budget_bytes)}), step time {r.step_s / rows[0].step_s:.2f}x "
            "eager"
        )
    csv_path, png = write_outputs(rows, args.out, device)
    print(f"wrote {csv_path}" + (f" and {png}" if png else " (no matplotlib: no plot)"))
    return 0 if all(r.grads_equal is not False for r in rows) else 1

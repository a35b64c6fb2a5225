"""Replay traces under memory budgets with each heuristic, in the style of the DTR paper's
Figure 2: prints a table, writes results.csv, baselines.csv and figure2.png to --out.

TRACE is a tritondtr trace (.npz or .jsonl, optionally .gz) or a DTR prototype log; the form
is detected from the content. Budgets are ratios of the baseline peak memory (the peak of a
run with unlimited memory in which every storage is freed at its last release); --budget
gives absolute budgets instead. Each heuristic stops at its first failing ratio (oom: nothing
left to evict; thrash: rematerialization compute above (overhead-limit - 1) x the baseline
compute) unless --no-stop is given.

--semantics runtime replays with the runtime's own DTR core (the simulator as the runtime's
twin): budgets count the tracked storages only, as tritondtr.enable(budget=...) does, and
ratios are of the runtime's unlimited peak; a trace recorded by tritondtr.trace at a budget
replays to exactly the evictions and rematerializations of the recorded run.

Arguments are checked first, then every trace is read and its baseline replayed, before the
first budgeted run. A bad argument or file is one line on stderr naming the option or the
file (and line) and what is wrong, and exit status 2.

examples (tritondtr demo --out out/demo writes out/demo/trace.npz):
  tritondtr simulate out/demo/trace.npz
  tritondtr simulate out/demo/trace.npz --semantics runtime --ratios 0.5,0.3 --heuristics dtr_eq
  tritondtr simulate out/demo/trace.npz --semantics runtime --budget 8MiB --heuristics dtr_eq,lru
  tritondtr simulate resnet32.log other.npz --heuristics dtr_eq,lru --ratios 0.5,0.3 --out sim-out
  tritondtr simulate out/demo/trace.npz --semantics runtime --heuristics dtr_eq \
      --offload-bandwidth pcie5 --prefetch trace
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import sys
from pathlib import Path

from ..units import parse_bytes

DEFAULT_HEURISTICS = "dtr,dtr_eq,dtr_local,msps,lru,size"


# Argument types: argparse reports their ArgumentTypeError as "argument --x: message".
def _ratios(text: str) -> list[float]:
    try:
        ratios = [float(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1.0,0.5, got {text!r}") from None
    if not ratios:
        raise argparse.ArgumentTypeError(f"expected numbers like 1.0,0.5, got {text!r}")
    for r in ratios:
        if not (r > 0 and math.isfinite(r)):
            where = f" in {text!r}" if len(ratios) > 1 else ""
            raise argparse.ArgumentTypeError(
                f"a ratio of the baseline peak must be a finite number > 0, got {r:g}{where}"
            )
    return ratios


def _budget(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _heuristics(text: str) -> list[str]:
    from ..policy.heuristics import get_heuristic

    names = [h.strip() for h in text.split(",") if h.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected heuristic names like dtr,lru, got {text!r}")
    for h in names:
        try:
            get_heuristic(h)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return names


def _bandwidth(text: str) -> float:
    from ..core.link import parse_bandwidth

    try:
        return parse_bandwidth(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _overhead_limit(text: str) -> float:
    try:
        limit = float(text)
    except ValueError:
        limit = math.nan
    if not limit >= 1.0:
        raise argparse.ArgumentTypeError(
            f"expected a multiple of the baseline compute >= 1.0 (2.0: twice), got {text!r}"
        )
    return limit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "traces",
        nargs="+",
        metavar="TRACE",
        help="trace file(s): .npz / .jsonl (optionally .gz) or a DTR log",
    )
    parser.add_argument(
        "--heuristics",
        type=_heuristics,
        default=DEFAULT_HEURISTICS,
        help=f"comma-separated heuristic names (default: {DEFAULT_HEURISTICS}; "
        "also: random, and registered user heuristics)",
    )
    parser.add_argument(
        "--ratios",
        type=_ratios,
        default=None,
        help="comma-separated budgets as fractions of the baseline peak, run in "
        "the order given (default: 1.0,0.9,...,0.1)",
    )
    parser.add_argument(
        "--budget",
        type=_budget,
        action="append",
        default=None,
        metavar="BYTES",
        help="an absolute budget such as 2GiB or 1500000000 (repeatable); replaces --ratios",
    )
    parser.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "triton", "torch"),
        help="scoring backend of the engine (default: auto = Triton on CUDA, torch elsewhere)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="device of the engine's metadata table (default: cpu; 'cuda' "
        "for large traces on a GPU)",
    )
    parser.add_argument(
        "--semantics",
        default="paper",
        choices=("paper", "runtime"),
        help="paper = the DTR paper's simulator (every storage counted, constants too); "
        "runtime = the runtime's own DTR core, its accounting and its rules (default: paper)",
    )
    parser.add_argument(
        "--overhead-limit",
        type=_overhead_limit,
        default=None,
        help="a run thrashes when its total compute would exceed this multiple "
        "of the baseline compute (default: 2.0 in paper semantics, none in runtime "
        "semantics, where the runtime's ThrashError rule applies)",
    )
    parser.add_argument(
        "--ties",
        default="slot",
        choices=("slot", "simrd"),
        help="how equal scores are broken: slot = the engine's rule (lowest "
        "slot id, i.e. the oldest storage); simrd = the DTR paper "
        "simulator's order, to reproduce its numbers (default: slot)",
    )
    parser.add_argument(
        "--no-stop", action="store_true", help="run every ratio even after a heuristic failed"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random heuristic")
    parser.add_argument(
        "--out",
        default="sim-out",
        metavar="DIR",
        help="directory for results.csv, baselines.csv, figure2.png (default: ./sim-out)",
    )
    parser.add_argument(
        "--bound",
        action="store_true",
        help="also print a lower bound of any schedule's overhead at each budget and write "
        "bounds.csv: the support bound in runtime semantics (needs scipy: pip install "
        "'tritondtr[milp]'), the cut bound in paper semantics",
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument(
        "--reference",
        metavar="JSON",
        help="a figure2-reference.json: draw its curves dashed and add "
        "ref_status / ref_overhead columns",
    )
    parser.add_argument(
        "--offload-bandwidth",
        type=_bandwidth,
        default=None,
        metavar="BW",
        help="runtime semantics: victims may also be copied to the host over a link of this "
        "bandwidth ('25GB/s', or pcie4, pcie5, nvlink-c2c); each run is made three ways: "
        "recompute (drop only), offload (copy every victim) and both (the cheaper per "
        "victim, NOTE [ Offload ])",
    )
    parser.add_argument(
        "--prefetch",
        choices=("steps", "trace", "none"),
        default="steps",
        help="with offload: copies back ahead of the read in the previous step's order, as "
        "the runtime (steps; a one-step trace has none), in the trace's own order (trace: "
        "the step replayed as one that repeats, both at the copy price scale the runtime "
        "would tune on such steps), or none (NOTE [ Asynchronous offload ], NOTE [ Copy "
        "price scale ])",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..traceformat.trace import TraceError
    from ..traceformat.trace_io import load_trace
    from ..units import format_bytes
    from .baseline import baseline
    from .simulate import DEFAULT_RATIOS, runtime_peak, simulate

    heuristics = args.heuristics
    ratios = args.ratios or list(DEFAULT_RATIOS)
    budgets = args.budget
    points = budgets if budgets else ratios
    try:
        reference = json.loads(Path(args.reference).read_text()) if args.reference else None
    except OSError as e:
        return _fail(f"--reference {args.reference}: {e.strerror or e}")
    except ValueError as e:
        return _fail(f"--reference {args.reference}: not a figure2-reference.json ({e})")
    if reference is not None and not isinstance(reference, dict):
        return _fail(f"--reference {args.reference}: expected a JSON object of traces")
    if args.offload_bandwidth is not None and args.semantics != "runtime":
        return _fail("--offload-bandwidth: offload is modelled in --semantics runtime only")
    if args.bound and args.semantics == "runtime" and importlib.util.find_spec("scipy") is None:
        return _fail("--bound in runtime semantics needs scipy: pip install 'tritondtr[milp]'")
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return _fail(f"--out {out}: cannot create the directory ({e.strerror or e})")

    # Read every trace and replay its baseline before the first budgeted run: a bad file
    # costs seconds, not the sweeps of the files before it.
    loaded = []
    for path in args.traces:
        try:
            trace = load_trace(path)
        except TraceError as e:
            return _fail(str(e))  # names the file and line (NOTE [ Trace files ] 5)
        except OSError as e:
            return _fail(f"{path}: {e.strerror or e}")
        try:
            base = baseline(trace)
        except TraceError as e:
            return _fail(f"{path}: {e}")
        loaded.append((path, trace, base))
    runtime = args.semantics == "runtime"
    limit = args.overhead_limit if args.overhead_limit is not None or runtime else 2.0

    bw = args.offload_bandwidth
    prefetch = {"steps": True, "trace": "trace", "none": False}[args.prefetch]
    actions = ("recompute", "offload", "both") if bw is not None else ("as recorded",)
    sweeps, rows = {}, []
    bar = tqdm(
        total=len(args.traces) * len(heuristics) * len(points) * len(actions),
        unit="run",
        disable=args.no_progress,
    )
    for path, trace, base in loaded:
        name = trace.meta.get("name", Path(path).stem)
        print(
            f"{name}: {trace.num_ops} ops, {trace.num_tensors} tensors; baseline compute "
            f"{base.compute / 1e6:.1f} ms, peak {format_bytes(base.peak_bytes)}, constants "
            f"{format_bytes(base.constant_bytes)}, largest op "
            f"{format_bytes(base.bottleneck_bytes)}"
            + (f"; runtime peak {format_bytes(runtime_peak(trace))}" if runtime else "")
        )
        results = []
        for h in heuristics:
            for action in actions:
                if bw is None:  # a trace recorded with offload replays with its link
                    kw_link = {}
                elif action != "recompute":
                    kw_link = {"offload_bandwidth": bw, "action": action, "prefetch": prefetch}
                    if action == "both" and prefetch == "trace":  # NOTE [ Copy price scale ]
                        kw_link["copy_scale"] = "trace"
                else:
                    kw_link = {"action": "recompute"}
                for i, x in enumerate(points):
                    kw = {"budget": x} if budgets else {"ratio": x}
                    bar.set_description(
                        f"{name} {h} {x}" if bw is None else f"{name} {h} {action} {x}"
                    )
                    res = simulate(
                        trace,
                        h,
                        overhead_limit=limit,
                        semantics=args.semantics,
                        backend=args.backend,
                        device=args.device,
                        seed=args.seed,
                        ties=args.ties,
                        **kw,
                        **kw_link,
                    )
                    results.append(res)
                    bar.update(1)
                    if not res.ok and not args.no_stop:
                        bar.update(len(points) - i - 1)
                        break
        sweeps[name] = (base, results)
        rows.extend((name, base, r) for r in results)
    bar.close()

    ref_of = _reference_lookup(reference)
    fields = [
        "trace",
        "heuristic",
        "ratio",
        "budget",
        "status",
        "overhead",
        "peak_bytes",
        "evictions",
        "eager_evictions",
        "remats",
        "selections",
        "wall_s",
        *(("action", "offloads", "link_wait", "copy_scale") if bw is not None else ()),
    ]
    extra = ["ref_status", "ref_overhead"] if reference else []
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields + extra)
        for name, _, r in rows:
            d = r.as_dict()
            d["trace"] = name
            w.writerow([d[k] for k in fields] + list(ref_of(name, r)[: len(extra)]))
    with open(out / "baselines.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trace", "compute_ns", "peak_bytes", "constant_bytes", "bottleneck_bytes"])
        for name, (b, _) in sweeps.items():
            w.writerow([name, b.compute, b.peak_bytes, b.constant_bytes, b.bottleneck_bytes])

    head = (
        f"{'trace':<14}{'heuristic':<11}{'ratio':>6}{'budget':>12}{'status':>8}"
        f"{'overhead':>10}{'evictions':>10}{'remats':>8}{'select':>8}{'time s':>8}"
    )
    if bw is not None:
        head += f"{'action':>10}{'offloads':>9}{'scale':>7}"
    if reference:
        head += f"{'ref':>8}{'ref ovh':>9}"
    print(head)
    for name, _, r in rows:
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else "-"
        line = (
            f"{name:<14}{r.heuristic:<11}{ratio:>6}{format_bytes(r.budget):>12}"
            f"{r.status:>8}{r.overhead:>10.4f}{r.evictions:>10}{r.remats:>8}"
            f"{r.selections:>8}{r.wall_s:>8.2f}"
        )
        if bw is not None:
            line += f"{r.action:>10}{r.offloads:>9}{r.copy_scale:>7g}"
        if reference:
            st, ov = ref_of(name, r)
            line += f"{st:>8}{ov:>9}"
        print(line)
    print(f"total replay time {sum(r.wall_s for *_, r in rows):.1f} s; wrote {out}/results.csv")
    if args.bound:
        _bounds(loaded, rows, runtime, out)
    if not args.no_plot and not budgets:
        from .plot import plot_sweeps

        ref_curves = {k: v for k, v in (reference or {}).items()}
        if bw is not None:  # one curve per heuristic and action
            from dataclasses import replace

            sweeps = {
                k: (b, [replace(r, heuristic=f"{r.heuristic} {r.action}") for r in rs])
                for k, (b, rs) in sweeps.items()
            }
        plot_sweeps(sweeps, out / "figure2.png", reference=ref_curves or None)
        print(f"wrote {out}/figure2.png")
    return 0


def _bounds(loaded, rows, runtime: bool, out: Path) -> None:
    """``--bound``: at each budget the runs used, the least overhead any schedule could have
    (NOTE [ Support bound ] in runtime semantics, NOTE [ Cut bound ] in the paper's), next to
    the best run; printed and written to bounds.csv."""
    from ..units import format_bytes
    from .bound import cut_bound, support_bound

    lines, table = [], []
    for path, trace, base in loaded:
        name = trace.meta.get("name", Path(path).stem)
        runs = [r for n, _, r in rows if n == name]
        budgets = sorted({r.budget for r in runs}, reverse=True)
        if runtime:
            found = support_bound(trace, budgets)
            denom = trace.total_cost()
        else:
            found = cut_bound(trace, budgets, "paper")
            denom = base.compute
        for b, lb in zip(budgets, found):
            ok = [r.overhead for r in runs if r.budget == b and r.ok]
            best = min(ok) if ok else math.nan
            low = 1.0 + lb.extra_cost / denom if denom else math.nan
            table.append((name, b, lb.status, low, lb.remats, best))
            lines.append(f"{name:<14}{format_bytes(b):>12}{lb.status:>12}{low:>12.4f}{best:>12.4f}")
    with open(out / "bounds.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trace", "budget", "status", "overhead_bound", "remats_bound", "best_overhead"])
        w.writerows(table)
    which = "support bound" if runtime else "cut bound"
    print(f"lower bound of any schedule ({which}) against the best run")
    print(f"{'trace':<14}{'budget':>12}{'status':>12}{'overhead >=':>12}{'best run':>12}")
    print("\n".join(lines))
    print(f"wrote {out}/bounds.csv")


def _fail(message: str) -> int:
    """Report input the user must fix: one line on stderr, no traceback; exit status 2."""
    print(f"tritondtr simulate: error: {' '.join(message.splitlines())}", file=sys.stderr)
    return 2


def _reference_lookup(reference):
    def lookup(name, r):
        for p in (reference or {}).get(name, {}).get(r.heuristic, []):
            if r.ratio is not None and abs(p["ratio"] - r.ratio) < 1e-9:
                return p["status"], f"{p['overhead']:.4f}"
        return "", ""

    return lookup

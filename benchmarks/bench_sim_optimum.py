"""How far are the heuristics from optimal? Theorem 3.1, revolve and Checkmate.

``python benchmarks/bench_sim_optimum.py`` (a few minutes on 2 CPU cores; ``--full`` adds
N = 3e4 and 1e5, ``--only theorem`` runs Theorem 3.1 alone, ``--jobs 2`` runs its replays in
parallel; ``--ns 30000,100000 --heuristics dtr --merge`` reruns those points alone and keeps
the other rows of sim_theorem31.csv). Writes ``benchmarks/results/sim_theorem31.csv`` /
``.png`` (Theorem 3.1) and ``sim_optimum.csv`` / ``sim_revolve.png`` (the rest); prints the
tables of docs/optimality.md.

# NOTE [ Optimum benchmark ]
# 1. Theorem 3.1: ``generators.chain(N)`` at budget 2*ceil(sqrt(N)) units; the value is the
#    extra operations (compute beyond the baseline, unit costs) divided by N; N = 100 .. 1e4,
#    with ``--full`` up to 1e5 for ``dtr`` and ``dtr_eq`` and 3e4 for ``lru`` (its extra
#    operations grow as N^1.5, and every one is a replayed op: 1e5 would be ~8e6 ops).
# 2. Revolve: chain(1000) at budgets from 8 units up; DTR's extra operations against
#    ``revolve.chain_optimum_extra`` (NOTE [ Revolve and the simulator's chain ]).
# 3. Figure 3 style: small generated graphs at budgets between the largest op and the
#    baseline peak; every heuristic's overhead against ``solve_checkmate``'s optimum.
# 4. Single deterministic runs: median = min = max (the rows' spread fields are not noise).
"""

from __future__ import annotations

import argparse
import math
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import torch
from harness import Env, Row, Stats, describe_device, plot_rows, read_csv, write_csv

from tritondtr.sim import generators as gen
from tritondtr.sim.baseline import baseline
from tritondtr.sim.checkmate import OpGraph, solve_checkmate
from tritondtr.sim.revolve import chain_optimum_extra
from tritondtr.sim.simulate import simulate

HEURISTICS = ["dtr", "dtr_eq", "dtr_local", "msps", "lru", "size"]
OUT = Path(__file__).parent / "results"


def run(trace, h, budget):
    return simulate(trace, h, budget=budget, overhead_limit=1e9, backend="torch", device="cpu")


def theorem_point(n: int, h: str) -> tuple[float, float, str]:
    """Extra operations / N of ``h`` on chain(n) at 2 ceil(sqrt n) units, wall s, status."""
    torch.set_num_threads(1)
    trace = gen.chain(n)
    r = run(trace, h, 2 * math.ceil(math.sqrt(n)))
    return (r.compute - trace.total_cost()) / n, r.wall_s, r.status


THEOREM_MAX_N = {"dtr_eq": 100_000, "dtr": 100_000, "lru": 30_000}  # with --full


def theorem_rows(rows: list[Row], done: dict, ns: list[int], row, kept: list[Row]) -> None:
    """Rewrite ``rows`` with the points in ``done``, plus the ``kept`` rows of sizes or
    heuristics not run now, and write sim_theorem31.csv / .png."""
    rows.clear()
    for n in ns:
        b = 2 * math.ceil(math.sqrt(n))
        row(
            "theorem31_extra_per_n",
            "revolve",
            n,
            chain_optimum_extra(n, b) / n,
            "ops/N",
            f"budget={b}",
        )
        for h in ("dtr_eq", "dtr", "lru"):
            if (n, h) in done:
                value, wall, status = done[n, h]
                row(
                    "theorem31_extra_per_n",
                    h,
                    n,
                    value,
                    "ops/N",
                    f"budget={b};wall_s={wall:.1f}",
                    status,
                )
    ran = {(r.provider, r.size) for r in rows}
    order = ("revolve", "dtr_eq", "dtr", "lru")
    rows.extend(r for r in kept if (r.provider, r.size) not in ran)
    rows.sort(key=lambda r: (r.size, order.index(r.provider) if r.provider in order else 9))
    dev = rows[0].device
    write_csv(rows, OUT / "sim_theorem31.csv")
    plot_rows(
        rows,
        [("theorem31_extra_per_n", "extra operations / N at 2 ceil(sqrt N)")],
        OUT / "sim_theorem31.png",
        title=f"uniform chain, Theorem 3.1 ({dev})",
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--full", action="store_true", help="Theorem 3.1 up to N = 1e5 (dtr, dtr_eq) and 3e4 (lru)"
    )
    ap.add_argument("--only", choices=["theorem"], help="run one part alone")
    ap.add_argument("--jobs", type=int, default=1, help="parallel Theorem 3.1 replays")
    ap.add_argument(
        "--ns",
        type=lambda v: [int(float(x)) for x in v.split(",")],
        help="Theorem 3.1 sizes, e.g. 30000,1e5 (default: 100 .. 1e4, --full 1e5)",
    )
    ap.add_argument(
        "--heuristics",
        default="dtr_eq,dtr,lru",
        help="Theorem 3.1 heuristics, comma separated (default: dtr_eq,dtr,lru)",
    )
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of sim_theorem31.csv that this run does not redo",
    )
    args = ap.parse_args(argv)
    env, dev = Env.capture(), describe_device("cpu")
    rows: list[Row] = []

    def row(what, provider, size, value, unit, params="", note=""):
        rows.append(
            Row.of(
                what,
                provider,
                int(size),
                Stats.of([value]),
                unit,
                device=dev,
                env=env,
                params=params,
                note=note,
            )
        )
        print(f"{what:22s} {provider:10s} {size:>8d} {value:12.4f} {unit} {note}", flush=True)

    ns = [100, 300, 1000, 3000, 10000] + ([30000, 100000] if args.full else [])
    if args.ns:
        ns = args.ns
    points = [
        (n, h)
        for n in ns
        for h in args.heuristics.split(",")
        if n <= (THEOREM_MAX_N[h] if args.full or args.ns else 10000)
    ]
    csv = OUT / "sim_theorem31.csv"
    kept = (
        [r for r in read_csv(csv) if r.what == "theorem31_extra_per_n"]
        if args.merge and csv.exists()
        else []
    )
    done: dict[tuple[int, str], tuple[float, float, str]] = {}
    with ProcessPoolExecutor(args.jobs) as pool:  # longest first; files rewritten as they end
        todo = sorted(points, key=lambda p: -(p[0] ** (1 if p[1] == "dtr_eq" else 2)))
        futures = {pool.submit(theorem_point, n, h): (n, h) for n, h in todo}
        for f in as_completed(futures):
            done[futures[f]] = f.result()
            print(f"theorem31 {futures[f]}: {done[futures[f]]}", flush=True)
            theorem_rows(rows, done, ns, row, kept)
    if args.only == "theorem":
        return 0
    rows = []
    n = 1000
    trace = gen.chain(n)
    for b in (8, 10, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512):
        row("revolve_extra_per_n", "revolve", b, chain_optimum_extra(n, b) / n, "ops/N", f"n={n}")
        for h in ("dtr", "dtr_eq", "msps"):
            r = run(trace, h, b)
            value = (r.compute - trace.total_cost()) / n if r.ok else math.nan
            row("revolve_extra_per_n", h, b, value, "ops/N", f"n={n}", r.status)
    graphs = [
        gen.chain(12),
        gen.random_dag(24, live=6, fan_in=3, seed=0, size=(1, 8)),
        gen.branching(3, width=5, depth=1),
        gen.random_dag(40, live=8, seed=1),
    ]
    for trace in graphs:
        g, peak = OpGraph.from_trace(trace), baseline(trace).peak_bytes
        for frac in (0.9, 0.7, 0.5, 0.4):
            b = max(int(frac * peak), 1)
            opt = solve_checkmate(g, b, time_limit=30)
            name = trace.meta["name"]
            if opt.overhead is None:
                row("checkmate_overhead", "optimal", b, math.nan, "x", f"graph={name}", opt.status)
                continue
            row(
                "checkmate_overhead",
                "optimal",
                b,
                opt.overhead,
                "x",
                f"graph={name}",
                f"{opt.status} in {opt.wall_s:.1f}s",
            )
            for h in HEURISTICS:
                r = run(trace, h, b)
                row(
                    "checkmate_overhead",
                    h,
                    b,
                    r.overhead if r.ok else math.nan,
                    "x",
                    f"graph={name}",
                    r.status,
                )
    write_csv(rows, OUT / "sim_optimum.csv")
    plot_rows(
        [r for r in rows if not math.isnan(r.median)],
        [("revolve_extra_per_n", "extra operations / N (N = 1000)")],
        OUT / "sim_revolve.png",
        title=f"DTR against revolve's optimum ({dev})",
    )
    print(f"torch {torch.__version__}; rows in {OUT / 'sim_optimum.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

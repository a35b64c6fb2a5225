"""How does the simulator scale to millions of tensors?

``python benchmarks/bench_sim_scaling.py [--full] [--device cuda] [--threads 1]
[--only replay|decision|sampling]``. Writes ``benchmarks/results/sim_scaling[_<device>].csv``
and ``sim_scaling[_<device>].png`` (parts 1, 2, 4; ``--only replay`` / ``decision`` replace
their own rows there and keep the other part's) and ``sim_sampling.csv`` (part 3).

# NOTE [ Scaling benchmark ]
# 1. Throughput: ``random_dag(n, live=64)`` replayed at ratio 1.0 (nothing is evicted by the
#    heuristic: every event is bookkeeping, and the replay stays lazy, NOTE [ Lazy replay ]),
#    events per second of the replay alone, median of 3 replays (the trace is compiled and
#    its baseline run beforehand); n = 1e4 .. 1e6 (1e7 with --full). Beside it: the baseline
#    pass (events/s, median of 3), ``compile_trace`` (events/s, once) and the generation of
#    ``generators.chain`` (tensors per second).
# 2. Decision cost against candidates: a table of N resident evictable slots with random
#    metadata; one exact full-scan decision (``MetadataTable.select``, the engine's scoring
#    path, ``dtr`` formula) against one sqrt(N) sampled decision (``SampledEngine``'s path:
#    scan of the state column, draw, score the sample with the torch twin). N = 1e3 .. 1e7.
#    On CUDA the full scan runs the Triton kernel (backend auto); the sample stays on host.
# 3. Overhead of sampling: ``chain(2000)`` at budgets 1.5..8 sqrt(N) units, and
#    ``random_dag(2000, live=300, sizes 1..1000)`` at ratios 0.9..0.4; full scan against
#    sqrt(N) sampling: overhead and replay wall time (overhead limit 3x: beyond it a run is
#    reported as thrash). ``--only sampling`` runs this part alone (sim_sampling.csv).
# 4. GPU target (issue 3, section 6): a 1M-tensor trace with full-scan selection under a
#    minute. ``--device cuda`` runs ``random_dag(1e6, live=2e5)`` at ratio 0.9 on the GPU
#    engine; without CUDA it is reported as not measured. That replay thrashes and stops
#    early (random_dag thrashes at every ratio from 0.5 to 0.99 at 2e3 to 5e4 tensors; the
#    row's note says ``thrash``): the GPU check's ``sim`` stage replays ``chain(5e5)`` (1M
#    tensors) instead, which finishes.
# 5. torch runs on 1 CPU thread by default (``--threads``): with torch's default 2 threads
#    on the shared 2-core AMD EPYC guest, a parallel region stalled ~116 ms at random when the
#    other core was busy (docs/benchmarks.md, "How fast is one eviction decision?"), which
#    made the full-scan rows of an earlier run
#    meaningless. The device column of every row says how many threads ran.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from harness import Env, Row, Stats, describe_device, measure, plot_rows, read_csv, write_csv

from tritondtr.engine.table import MetadataTable, SlotState
from tritondtr.sim import generators as gen
from tritondtr.sim.baseline import baseline
from tritondtr.sim.program import compile_trace
from tritondtr.sim.sampling import SampledEngine
from tritondtr.sim.simulate import simulate

OUT = Path(__file__).parent / "results"


def filled_table(n: int, device: str) -> MetadataTable:
    rng = np.random.default_rng(0)
    t = MetadataTable(capacity=n, device=device)
    t.add_many(
        rng.uniform(1, 100, n).astype(np.float32),
        rng.integers(1, 1 << 20, n),
        rng.integers(0, 1000, n),
        nbhd_cost=rng.uniform(0, 10, n).astype(np.float32),
    )
    return t


def sampled_choice(t: MetadataTable, rng) -> int:
    """SampledEngine.choose's work on a bare table (NOTE [ Sampled selection ])."""
    from tritondtr import policy

    cand = np.flatnonzero(t.host_state == int(SlotState.RESIDENT_EVICTABLE))
    k = math.ceil(math.sqrt(cand.size))
    cand = np.sort(rng.choice(cand, size=k, replace=False))
    cols = {c: torch.from_numpy(getattr(t, "host_" + c)[cand]) for c in t.COLUMNS}
    return int(cand[int(policy.select("dtr", cols, 2000, backend="torch")[0])])


def sampling(row) -> None:
    """NOTE [ Scaling benchmark ] 3."""
    chain = gen.chain(2000)
    dag = gen.random_dag(2000, live=300, size=(1, 1000), cost=(1.0, 9.0), seed=0)
    cases = [(chain, {"budget": b}, b) for b in (68, 90, 135, 180, 360)]
    cases += [(dag, {"ratio": r}, int(100 * r)) for r in (0.9, 0.7, 0.5, 0.4)]
    for trace, budget, size in cases:
        exact = simulate(
            trace, "dtr_eq", overhead_limit=3.0, backend="torch", device="cpu", **budget
        )
        samp = simulate(
            trace,
            "dtr_eq",
            overhead_limit=3.0,
            **budget,
            engine_factory=lambda h: SampledEngine(h, capacity=4096),
        )
        params = f"trace={trace.meta['name']};" + ";".join(f"{k}={v}" for k, v in budget.items())
        for name, r in (("full-scan", exact), ("sqrt-sample", samp)):
            row(
                "sampling_overhead",
                name,
                size,
                Stats.of([r.overhead]),
                "x",
                params,
                f"{r.status}, wall {r.wall_s:.2f}s",
            )
            row("sampling_wall_s", name, size, Stats.of([r.wall_s]), "s", params)


def throughput(row, top: int, device: str) -> None:
    """NOTE [ Scaling benchmark ] 1."""
    for e in range(4, top + 1):
        n = 10**e
        t0 = time.perf_counter()
        trace = gen.chain(n // 2)
        gen_s = time.perf_counter() - t0
        row(
            "generate_rate",
            "chain",
            trace.num_tensors,
            Stats.of([trace.num_tensors / gen_s]),
            "tensors/s",
        )
        trace = gen.random_dag(n, live=64)
        t0 = time.perf_counter()
        compile_trace(trace)
        row(
            "compile_rate",
            "random_dag",
            trace.num_events,
            Stats.of([trace.num_events / (time.perf_counter() - t0)]),
            "events/s",
        )
        rates = []
        for _ in range(3):
            trace._baseline = None  # baseline() caches its result on the trace
            t0 = time.perf_counter()
            baseline(trace)
            rates.append(trace.num_events / (time.perf_counter() - t0))
        row("baseline_rate", "random_dag", trace.num_events, Stats.of(rates), "events/s")
        runs = [
            simulate(trace, "dtr_eq", ratio=1.0, backend="auto", device=device) for _ in range(3)
        ]
        r = runs[-1]
        row(
            "replay_rate",
            "dtr_eq-ratio1.0",
            trace.num_events,
            Stats.of([trace.num_events / x.wall_s for x in runs]),
            "events/s",
            note=f"{r.status}, {r.evictions} evictions, {r.eager_evictions} eager, "
            f"wall {min(x.wall_s for x in runs):.2f}-{max(x.wall_s for x in runs):.2f}s",
        )


def decisions(row, top: int, device: str) -> None:
    """NOTE [ Scaling benchmark ] 2."""
    rng = np.random.default_rng(0)
    for e in range(3, top + 2):
        n = 10**e
        t = filled_table(n, device)
        full = measure(lambda t=t: t.select("dtr", 2000), device=device, repeats=5, max_time_s=10)
        row("decision_us", f"full-scan-{device}", n, full.stats(1e6), "us")
        samp = measure(lambda t=t: sampled_choice(t, rng), repeats=5, max_time_s=10)
        row("decision_us", "sqrt-sample-host", n, samp.stats(1e6), "us")
        del t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="1e7 events and 1e7 candidates")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1, NOTE [ Scaling benchmark ] 5)",
    )
    ap.add_argument("--only", choices=["replay", "decision", "sampling"], help="run one part alone")
    args = ap.parse_args(argv)
    if args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    env, dev = Env.capture(), describe_device(args.device)
    rows: list[Row] = []

    def row(what, provider, size, stats, unit, params="", note=""):
        rows.append(
            Row.of(
                what,
                provider,
                int(size),
                stats,
                unit,
                device=dev,
                env=env,
                params=params,
                note=note,
            )
        )
        print(
            f"{what:20s} {provider:12s} {size:>9d} {stats.median:12.4g} {unit} {note}", flush=True
        )

    top = 7 if args.full else 6
    if args.only in (None, "sampling"):
        sampling(row)
        write_csv(rows, OUT / "sim_sampling.csv")
        if args.only == "sampling":
            return 0
        rows.clear()
    if args.only in (None, "replay"):
        throughput(row, top, args.device)
    if args.only in (None, "decision"):
        decisions(row, top, args.device)
    if args.only is None:
        if args.device.startswith("cuda") and torch.cuda.is_available():
            trace = gen.random_dag(10**6, live=200_000)
            r = simulate(trace, "dtr_eq", ratio=0.9, backend="auto", device=args.device)
            row(
                "gpu_1m_trace_s",
                "full-scan",
                trace.num_tensors,
                Stats.of([r.wall_s]),
                "s",
                note=f"{r.status}, {r.selections} selections",
            )
        else:
            print("gpu_1m_trace_s: not measured (no CUDA device); run with --device cuda")
    suffix = "" if args.device == "cpu" else "_" + args.device.replace(":", "")
    csv = OUT / f"sim_scaling{suffix}.csv"
    if args.only is not None and csv.exists():  # keep the rows of the part not rerun
        mine = {r.what for r in rows}
        rows = [
            r for r in read_csv(csv) if r.what not in mine and not r.what.startswith("sampling")
        ] + rows
    write_csv(rows, csv)
    plot_rows(
        rows,
        [
            ("replay_rate", "trace events / s (x: events)"),
            ("decision_us", "us per decision (x: candidates)"),
        ],
        OUT / f"sim_scaling{suffix}.png",
        title=f"simulator scaling ({dev})",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

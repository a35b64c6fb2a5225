"""How does the simulator scale to millions of tensors?

``python benchmarks/bench_sim_scaling.py [--full] [--device cuda]``. Writes
``benchmarks/results/sim_scaling[_<device>].csv`` and ``sim_scaling[_<device>].png``.

# NOTE [ Scaling benchmark ]
# 1. Throughput: ``random_dag(n, live=64)`` replayed at ratio 1.0 (nothing is evicted: every
#    event is bookkeeping), events per second of the replay alone (the trace is compiled
#    and its baseline run beforehand); n = 1e4 .. 1e6 (1e7 with --full). Generation time
#    of ``generators.chain`` is reported beside it (tensors per second).
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
#    engine; without CUDA it is reported as not measured.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from harness import Env, Row, Stats, describe_device, measure, plot_rows, write_csv

from tritondtr.sim import generators as gen
from tritondtr.sim.baseline import baseline
from tritondtr.sim.program import compile_trace
from tritondtr.sim.sampling import SampledEngine
from tritondtr.sim.simulate import simulate
from tritondtr.table import MetadataTable, SlotState

OUT = Path(__file__).parent / "results"


def filled_table(n: int, device: str) -> MetadataTable:
    rng = np.random.default_rng(0)
    t = MetadataTable(capacity=n, device=device)
    t.add_many(rng.uniform(1, 100, n).astype(np.float32), rng.integers(1, 1 << 20, n),
               rng.integers(0, 1000, n), nbhd_cost=rng.uniform(0, 10, n).astype(np.float32))
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
        exact = simulate(trace, "dtr_eq", overhead_limit=3.0, backend="torch", device="cpu",
                         **budget)
        samp = simulate(trace, "dtr_eq", overhead_limit=3.0, **budget,
                        engine_factory=lambda h: SampledEngine(h, capacity=4096))
        params = f"trace={trace.meta['name']};" + ";".join(f"{k}={v}" for k, v in budget.items())
        for name, r in (("full-scan", exact), ("sqrt-sample", samp)):
            row("sampling_overhead", name, size, Stats.of([r.overhead]), "x", params,
                f"{r.status}, wall {r.wall_s:.2f}s")
            row("sampling_wall_s", name, size, Stats.of([r.wall_s]), "s", params)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="1e7 events and 1e7 candidates")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--only", choices=["sampling"], help="run one part alone")
    args = ap.parse_args(argv)
    env, dev = Env.capture(), describe_device(args.device)
    rows: list[Row] = []

    def row(what, provider, size, stats, unit, params="", note=""):
        rows.append(Row.of(what, provider, int(size), stats, unit, device=dev, env=env,
                           params=params, note=note))
        print(f"{what:20s} {provider:12s} {size:>9d} {stats.median:12.4g} {unit} {note}",
              flush=True)

    top = 7 if args.full else 6
    if args.only == "sampling":
        sampling(row)
        write_csv(rows, OUT / "sim_sampling.csv")
        return 0
    for e in range(4, top + 1):
        n = 10**e
        t0 = time.perf_counter()
        trace = gen.chain(n // 2)
        gen_s = time.perf_counter() - t0
        row("generate_rate", "chain", trace.num_tensors, Stats.of([trace.num_tensors / gen_s]),
            "tensors/s")
        trace = gen.random_dag(n, live=64)
        compile_trace(trace)
        baseline(trace)
        r = simulate(trace, "dtr_eq", ratio=1.0, backend="auto", device=args.device)
        row("replay_rate", "dtr_eq-ratio1.0", trace.num_events,
            Stats.of([trace.num_events / r.wall_s]), "events/s",
            note=f"{r.status}, {r.evictions} evictions, wall {r.wall_s:.1f}s")
    rng = np.random.default_rng(0)
    for e in range(3, top + 2):
        n = 10**e
        t = filled_table(n, args.device)
        full = measure(lambda t=t: t.select("dtr", 2000), device=args.device, repeats=5,
                       max_time_s=10)
        row("decision_us", f"full-scan-{args.device}", n, full.stats(1e6), "us")
        samp = measure(lambda t=t: sampled_choice(t, rng), repeats=5, max_time_s=10)
        row("decision_us", "sqrt-sample-host", n, samp.stats(1e6), "us")
        del t
    sampling(row)
    if args.device.startswith("cuda") and torch.cuda.is_available():
        trace = gen.random_dag(10**6, live=200_000)
        r = simulate(trace, "dtr_eq", ratio=0.9, backend="auto", device=args.device)
        row("gpu_1m_trace_s", "full-scan", trace.num_tensors, Stats.of([r.wall_s]), "s",
            note=f"{r.status}, {r.selections} selections")
    else:
        print("gpu_1m_trace_s: not measured (no CUDA device); run with --device cuda")
    suffix = "" if args.device == "cpu" else "_" + args.device.replace(":", "")
    write_csv(rows, OUT / f"sim_scaling{suffix}.csv")
    plot_rows(rows, [("replay_rate", "trace events / s (x: events)"),
                     ("decision_us", "us per decision (x: candidates)")],
              OUT / f"sim_scaling{suffix}.png", title=f"simulator scaling ({dev})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

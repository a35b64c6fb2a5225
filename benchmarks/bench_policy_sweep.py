"""Where the runtime's policy stands: every heuristic, the paper's policy, and the optimum or a
lower bound, on recorded training steps at 90 % .. 10 % of their memory.

# NOTE [ Policy sweep ]
# 1. Traces (recorded.py, NOTE [ Recorded steps ]): the zoo at scale 4 and 16, ``gru40``,
#    ``tinygpt`` (the demo's model), ``unet``, GPT-2 / BERT / Llama from config, the DTR
#    authors' five logs, and two generated ones where the optimum is known: ``chain200``
#    (revolve) and ``chain12`` (Checkmate too).
#    Recorded traces are cached as .npz under ``--traces`` (default out/policy_sweep/) and
#    reused: op costs are measured times, so two sweeps compare policies only on the same
#    files. ``--quick``: the zoo at scale 4 and gru40 at 0.7 / 0.5 / 0.3 (~2 min on 2 CPU cores).
# 2. Budget: B = ratio x the runtime's unlimited peak (``runtime_peak``). The runtime's policy
#    is the twin (``semantics="runtime"``) at B with each heuristic. The paper's policy is
#    ``dtr_eq`` in the paper's semantics at B + the trace's constant bytes (the same memory
#    for activations, NOTE [ Twin benchmark ]). Both stop as ``thrash`` once their compute
#    exceeds ``OVERHEAD_LIMIT`` x the trace's (the runtime has no such limit, only its
#    ThrashError, which also reads ``thrash``): beyond 10x no one trains, and thrashing runs
#    would take most of the sweep's time.
# 3. Units, the same for every provider: ``extra`` = recomputation compute / the trace's
#    compute (0.25: one step costs 25 % more), ``remats`` = recomputing op runs. A failed run
#    (oom, thrash) reports its numbers at the point of failure and its status in ``note``.
# 4. The optimum or a bound, per semantics: ``revolve`` on chains (runtime budget B equals
#    the paper's B + 2 units: the constant a_0 and the op in flight's output, which the runtime
#    counts after its check; NOTE [ Revolve and the simulator's chain ]); ``checkmate`` (paper
#    semantics) on traces of at most CHECKMATE_MAX_OPS ops without views, 60 s each; a lower
#    bound everywhere: the support bound (NOTE [ Support bound ]) in the runtime's semantics,
#    the cut bound (NOTE [ Cut bound ]) in the paper's. A bound above a successful policy run
#    is a bug and is printed and noted as ``BOUND VIOLATED``.
# 5. Rows (harness Row): what ``extra`` / ``remats``; provider ``runtime:<heuristic>``,
#    ``paper:dtr_eq``, ``bound:runtime`` (support), ``bound:runtime-cut``, ``bound:paper``,
#    ``revolve:runtime``,
#    ``checkmate:paper``; size the trace's ops; params ``trace=..;ratio=..;budget=..`` (+
#    ``wall_s``); note the status; NaN where no schedule fits. Single deterministic runs
#    (median = min = max).

examples:
  python benchmarks/bench_policy_sweep.py --quick --tag before      # ~2 min
  python benchmarks/bench_policy_sweep.py                           # the full sweep, ~40 min
  python benchmarks/bench_policy_sweep.py --compare results/a.csv results/b.csv
  python benchmarks/bench_policy_sweep.py --theorem --big            # chain to 1e5, 1e6 tensors
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import policy_report  # noqa: E402
import recorded  # noqa: E402
from harness import Env, Row, Stats, describe_device, write_csv  # noqa: E402

import tritondtr  # noqa: E402
from tritondtr.sim import baseline, generators, load_trace, runtime_peak, save_trace  # noqa: E402
from tritondtr.sim import simulate as sim  # noqa: E402
from tritondtr.sim.bound import cut_bound, support_bound  # noqa: E402
from tritondtr.sim.checkmate import solve_checkmate  # noqa: E402
from tritondtr.sim.revolve import chain_optimum_extra  # noqa: E402

RATIOS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
QUICK_RATIOS = (0.7, 0.5, 0.3)
HEURISTICS = ("dtr_eq", "dtr", "dtr_local", "msps", "lru", "size", "random")
OVERHEAD_LIMIT = 10.0
CHECKMATE_MAX_OPS = 42  # chain(20) solves in 4-15 s at 70-50 %, chain(30) hits 60 s
CHAIN_EXTRA_UNITS = 2  # NOTE [ Policy sweep ] rule 4


class Emit:
    """Rows of one run: the environment they share and a printed line per row."""

    def __init__(self) -> None:
        self.env, self.device, self.rows = Env.capture(), describe_device("cpu"), []

    def __call__(self, what, provider, size, value, unit, params, note="") -> None:
        """One row; an infinite value (no schedule fits) is written as NaN, its note says why."""
        value = value if math.isfinite(value) else math.nan
        self.rows.append(
            Row.of(
                what,
                provider,
                size,
                Stats.of([value]),
                unit,
                device=self.device,
                env=self.env,
                params=params,
                note=note,
            )
        )
        print(f"{what:8s} {provider:16s} {value:12.5g} {params} {note}", flush=True)


def traces(names: list[str], cache: Path, scales=(4, 16)) -> dict[str, tritondtr.sim.Trace]:
    """NOTE [ Policy sweep ] rule 1: the traces by name, recorded once and cached in ``cache``."""
    steps = {}
    for n in recorded.zoo.ZOO:
        for s in scales:
            steps[f"{n}-s{s}"] = lambda n=n, s=s: recorded.zoo_step(n, s)
    steps["gru40"] = recorded.gru_step
    steps["tinygpt"] = recorded.tinygpt_step
    steps["unet"] = recorded.unet_step
    for n in recorded.HF_MODELS:
        steps[f"hf-{n}"] = lambda n=n: recorded.hf_step(n)
    out = {}
    cache.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name == "chain200":
            out[name] = generators.chain(200)
        elif name == "chain12":
            out[name] = generators.chain(12)
        elif name.startswith("dtr-"):
            out.update(recorded.dtr_log_traces([name[4:]]))
        else:
            path = cache / f"{name}.npz"
            if path.exists():
                out[name] = load_trace(path)
                continue
            try:
                step = steps[name]()
            except ImportError as e:
                print(f"skipping {name}: {e} (pip install tritondtr[hf])")
                continue
            out[name] = recorded.record(step).trace
            save_trace(out[name], path)
    return out


def sweep_trace(name, trace, ratios, heuristics, emit: Emit, *, checkmate_s=60.0) -> None:
    """NOTE [ Policy sweep ] rules 2-5 for one trace at ``ratios`` (of the runtime's peak)
    with ``heuristics`` (names); rows through ``emit``; ``checkmate_s``: the MILP's limit."""
    ops, peak, total = trace.num_ops, runtime_peak(trace), trace.total_cost()
    base = baseline(trace)
    budgets = [int(r * peak) for r in ratios]
    paper_budgets = [b + base.constant_bytes for b in budgets]
    bounds = {
        "runtime": support_bound(trace, budgets),
        "paper": cut_bound(trace, paper_budgets, "paper"),
        "runtime-cut": cut_bound(trace, budgets, "runtime"),  # the support bound's base
    }
    chain_n = trace.meta.get("n") if trace.meta.get("generator") == "chain" else None
    views = bool((trace.alias >= 0).any())
    for j, r in enumerate(ratios):
        params = f"trace={name};ratio={r};budget={budgets[j]}"
        floor = {}
        for sem, denom in (("runtime", total), ("paper", base.compute), ("runtime-cut", total)):
            lb = bounds[sem][j]
            floor[sem] = lb.extra_cost
            emit("extra", f"bound:{sem}", ops, lb.extra_cost / denom, "x", params, lb.status)
            emit("remats", f"bound:{sem}", ops, lb.remats, "count", params, lb.status)
        if chain_n is not None:
            opt = chain_optimum_extra(chain_n, budgets[j] + CHAIN_EXTRA_UNITS)
            value, st = (math.inf, "infeasible") if opt is None else (opt / total, "optimal")
            emit("extra", "revolve:runtime", ops, value, "x", params, st)
            floor["runtime"] = max(floor["runtime"], value * total)
        if ops <= CHECKMATE_MAX_OPS and not views:
            cm = solve_checkmate(trace, paper_budgets[j], time_limit=checkmate_s)
            value = math.inf if cm.extra_cost is None else cm.extra_cost / base.compute
            emit("extra", "checkmate:paper", ops, value, "x", params, cm.status)
            if cm.status == "optimal":
                floor["paper"] = max(floor["paper"], cm.extra_cost)
        runs = [(f"runtime:{h}", "runtime", h) for h in heuristics]
        runs.append(("paper:dtr_eq", "paper", "dtr_eq"))
        for provider, sem, h in runs:
            if sem == "runtime":
                res = sim(
                    trace, h, budget=budgets[j], semantics="runtime", overhead_limit=OVERHEAD_LIMIT
                )
                denom = total
            else:
                res = sim(trace, h, budget=paper_budgets[j], overhead_limit=OVERHEAD_LIMIT)
                denom = base.compute
            note = res.status
            if res.ok and res.remat_compute < floor[sem] * (1 - 1e-9):
                note += " BOUND VIOLATED"
                print(f"BUG: {provider} on {name} at {r} beats its bound", flush=True)
            p = f"{params};wall_s={res.wall_s:.3g}"
            emit("extra", provider, ops, res.remat_compute / denom, "x", p, note)
            emit("remats", provider, ops, res.remats, "count", p, note)


def theorem_rows(emit: Emit, ns=(100, 1000, 10_000, 100_000), heuristics=("dtr_eq",)) -> None:
    """Theorem 3.1's chain in the runtime's semantics at the runtime budget equal to the
    paper's 2 ceil(sqrt N) units (NOTE [ Policy sweep ] rule 4): extra operations / N and
    remats against revolve's optimum; the theorem promises O(N)."""
    for n in ns:
        b = 2 * math.ceil(math.sqrt(n)) - CHAIN_EXTRA_UNITS
        trace, params = generators.chain(n), f"trace=chain{n};budget={b}"
        emit("theorem31", "revolve:runtime", n, chain_optimum_extra(n, b + 2) / n, "ops/N", params)
        for h in heuristics:
            res = sim(trace, h, budget=b, semantics="runtime")
            p = f"{params};wall_s={res.wall_s:.3g};remats={res.remats}"
            emit("theorem31", f"runtime:{h}", n, res.remat_compute / n, "ops/N", p, res.status)


def big_rows(emit: Emit, layers: int = 32_000, ratio: float = 0.5) -> None:
    """One generated transformer of ~1e6 tensors in the runtime's semantics at ``ratio``:
    the replay's wall time and events per second."""
    t0 = time.perf_counter()
    trace = generators.transformer(layers)
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    peak = runtime_peak(trace)
    peak_s = time.perf_counter() - t0
    res = sim(trace, "dtr_eq", budget=int(ratio * peak), semantics="runtime")
    params = (
        f"trace=transformer{layers};tensors={trace.num_tensors};ratio={ratio};"
        f"evictions={res.evictions};remats={res.remats};generate_s={gen_s:.3g};"
        f"unlimited_replay_s={peak_s:.3g}"
    )
    emit("replay_wall", "runtime:dtr_eq", trace.num_events, res.wall_s, "s", params, res.status)
    eps = trace.num_events / res.wall_s
    emit("replay_rate", "runtime:dtr_eq", trace.num_events, eps, "events/s", params, res.status)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="zoo s4 + gru40 at 0.7/0.5/0.3")
    ap.add_argument(
        "--traces", default=str(HERE.parent / "out" / "policy_sweep"), help="trace cache"
    )
    ap.add_argument("--only", help="comma-separated trace names (default: all)")
    ap.add_argument("--heuristics", default=",".join(HEURISTICS), help="runtime heuristics")
    ap.add_argument("--theorem", action="store_true", help="Theorem 3.1's chain to N = 1e5")
    ap.add_argument("--big", action="store_true", help="a 1e6-tensor transformer at 50 %%")
    ap.add_argument("--out", default=str(HERE / "results"), help="output folder")
    ap.add_argument("--tag", default="cpu-2core-1thread", help="file name tag")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="two row files")
    args = ap.parse_args(argv)
    if args.compare:
        return policy_report.compare(*args.compare)
    torch.set_num_threads(1)
    emit, out = Emit(), Path(args.out)
    if args.theorem or args.big:
        if args.theorem:
            theorem_rows(emit)
        if args.big:
            big_rows(emit)
        write_csv(emit.rows, out / f"policy_scale_{args.tag}.csv")
        return 0
    zoo4 = [f"{n}-s4" for n in recorded.zoo.ZOO]
    if args.quick:
        names, ratios = [*zoo4, "gru40"], QUICK_RATIOS
    else:
        names = [*zoo4, *(f"{n}-s16" for n in recorded.zoo.ZOO), "gru40", "tinygpt", "unet"]
        names += [f"hf-{n}" for n in recorded.HF_MODELS]
        names += [f"dtr-{n}" for n in recorded.DTR_LOGS] + ["chain200", "chain12"]
        ratios = RATIOS
    if args.only:
        names = args.only.split(",")
    for name, trace in traces(names, Path(args.traces)).items():
        sweep_trace(name, trace, ratios, args.heuristics.split(","), emit)
        write_csv(emit.rows, out / f"policy_sweep_{args.tag}.csv")  # as it goes
    policy_report.plot(emit.rows, out / f"policy_sweep_{args.tag}.png")
    print(policy_report.table(emit.rows))
    print(policy_report.bounds_table(emit.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

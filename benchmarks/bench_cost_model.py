"""What does each cost model do to the policy's quality, and what does it cost per op?

# NOTE [ Cost model benchmark ]
# 1. Programs: one training step of each zoo model (tests/zoo.py, at ``--scale``) and the
#    unrolled GRU loop of bench_sim_twin.py (batch 32, hidden 256, 40 steps).
# 2. Cost models (NOTE [ Cost models ] in tritondtr/runtime/cost.py): ``measured``,
#    ``analytic`` (the nominal machine), ``analytic-box`` (``AnalyticCost`` with constants
#    fitted to this benchmark's CPU box: what knowing the machine adds), ``uniform`` (every op
#    costs 1: the control, what costs buy at all).
# 3. Quality, per program, ratio r of the unlimited peak and cost model, ``--rounds`` rounds
#    interleaved: ``recompute_ms`` (the session's ``recompute_s``: wall time actually spent
#    recomputing, the quantity a cost model should make small), ``step_ms`` (the whole step),
#    ``remats`` (the count, for reference; its spread shows whether decisions varied).
#    ``note`` counts the runs by status (``ok:4,ThrashError:1``); a run that raised
#    (BudgetError, ThrashError) enters the statistics only if no run of its setting passed.
# 4. Price: us per op of a step that does not bind (budget 2 x the unlimited peak, nothing
#    evicted) with many small ops: the GRU loop, and a chain of 200 ``add`` of 64 floats;
#    the cost model is the only difference between the rows; rounds interleave the models
#    (``us_per_op``). The step's own noise on a shared box exceeds the models' price, so
#    ``cost_fn_us_per_op`` times the cost function alone on every op of one step (op,
#    arguments and outputs kept from a run; caches warm, as from the second step on).

examples:
  python benchmarks/bench_cost_model.py                 # ~5 min on 2 CPU cores
  python benchmarks/bench_cost_model.py --models gru,gpt --rounds 5
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import zoo  # noqa: E402
from bench_sim_twin import _gru_step as gru_step  # noqa: E402  (the same GRU loop)
from harness import Env, Row, Stats, describe_device, measure, write_csv, write_json  # noqa: E402

import tritondtr  # noqa: E402
from tritondtr.runtime import AnalyticCost, BudgetError, CostModel  # noqa: E402
from tritondtr.runtime.cost import price, resolve  # noqa: E402

RATIOS = (0.7, 0.5, 0.3)


def _uniform(op, args, kwargs, out) -> float:
    return 1.0


# Least squares of measured op times on the zoo at scale 4 and the GRU loop (2-core EPYC KVM
# guest, one thread): 4.6 us per op, 88 GFLOP/s, 241 GB/s (mostly cache), rounded.
COSTS = {
    "measured": "measured",
    "analytic": "analytic",
    "analytic-box": AnalyticCost(flops_per_s=9e10, bytes_per_s=2.4e11, op_ns=4600.0),
    "uniform": _uniform,
}


def zoo_step(name: str, scale: int):
    case = zoo.make(name, seed=0, scale=scale)
    opt = torch.optim.SGD(case.model.parameters(), lr=1e-3)
    return lambda: zoo.train_step(case, opt)


def run(step, budget, cost) -> dict:
    """One step under ``enable``: step time, the session's counters, and its status."""
    status = "ok"
    with tritondtr.enable(budget=budget, cost=cost) as s:
        t0 = time.perf_counter()
        try:
            step()
        except BudgetError as e:
            status = type(e).__name__
        dt = time.perf_counter() - t0
    st = s.stats
    return {
        "step_ms": dt * 1e3,
        "recompute_ms": st.recompute_s * 1e3,
        "remats": st.rematerializations,
        "evictions": st.evictions,
        "ops": st.ops,
        "peak": st.peak_bytes,
        "status": status,
    }


def quality_rows(name, step, rounds, env, device) -> list[Row]:
    step()  # warm up
    peak = run(step, None, "measured")["peak"]
    got: dict = {}
    for _ in range(rounds):
        for r in RATIOS:
            for cname, cost in COSTS.items():
                got.setdefault((r, cname), []).append(run(step, int(r * peak), cost))
    rows = []
    for (r, cname), runs in got.items():
        statuses = sorted({x["status"] for x in runs})
        statuses = [f"{st}:{sum(x['status'] == st for x in runs)}" for st in statuses]
        ok = [x for x in runs if x["status"] == "ok"] or runs
        params = (
            f"program={name};ratio={r};budget={int(r * peak)};"
            f"evictions={Stats.of([x['evictions'] for x in ok]).median:g}"
        )
        for what, unit in (("recompute_ms", "ms"), ("step_ms", "ms"), ("remats", "count")):
            rows.append(
                Row.of(
                    what,
                    cname,
                    ok[0]["ops"],
                    Stats.of([x[what] for x in ok]),
                    unit,
                    device=device,
                    env=env,
                    params=params,
                    note=",".join(statuses),
                )
            )
    return rows


def _add_chain():
    x, w = torch.randn(64), torch.randn(64)

    def step():
        y = x
        for _ in range(200):
            y = torch.add(y, w)

    return step


def _calls(step, budget) -> list[tuple]:
    """Every op of one run of ``step``, with its arguments and outputs, as a cost model sees
    them (to time the cost functions alone)."""
    calls = []

    def keep(op, args, kwargs, out):
        calls.append((op, args, dict(kwargs), out))
        return 1.0

    with tritondtr.enable(budget=budget, cost=keep):
        step()
    return calls


def price_rows(rounds, env, device) -> list[Row]:
    rows = []
    for name, step in (("gru", gru_step()), ("add-chain", _add_chain())):
        with tritondtr.enable() as s:
            step()
        budget, ops = 2 * max(s.stats.peak_bytes, 1), s.stats.ops
        samples: dict = {c: [] for c in COSTS}
        for k in range(rounds + 1):  # interleaved; round 0 warms up
            for cname, cost in COSTS.items():
                with tritondtr.enable(budget=budget, cost=cost) as s:
                    t0 = time.perf_counter()
                    step()
                    dt = time.perf_counter() - t0
                assert s.stats.evictions == 0
                if k:
                    samples[cname].append(dt * 1e6 / ops)
        calls = _calls(step, budget)
        for cname, cost in COSTS.items():
            fn = resolve(CostModel(cost) if isinstance(cost, str) else cost)
            if fn is None:
                continue  # measured: the clock is read under every model

            def price_all(fn=fn, calls=calls):
                for c in calls:
                    price(fn, *c)

            t = measure(price_all, warmup=1, repeats=rounds, min_sample_s=0.0)
            rows.append(
                Row.of(
                    "cost_fn_us_per_op",
                    cname,
                    len(calls),
                    t.stats(1e6 / len(calls)),
                    "us",
                    device=device,
                    env=env,
                    timing=t,
                    params=f"program={name};warm caches",
                )
            )
        for cname, us in samples.items():
            rows.append(
                Row.of(
                    "us_per_op",
                    cname,
                    ops,
                    Stats.of(us),
                    "us",
                    device=device,
                    env=env,
                    params=f"program={name};budget={budget};not-binding",
                )
            )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gru,mlp,cnn,gpt,lstm,treelstm")
    ap.add_argument("--scale", type=int, default=4, help="zoo width multiplier (default: 4)")
    ap.add_argument("--rounds", type=int, default=3, help="quality rounds (default: 3)")
    ap.add_argument("--price-rounds", type=int, default=15, help="price rounds (default: 15)")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--tag", default="cpu-2core-1thread")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    env, device = Env.capture(), describe_device("cpu")
    rows = price_rows(args.price_rounds, env, device)
    for r in rows:
        print(f"{r.what:18} {r.params.split(';')[0]:18} {r.provider:13} {r.median:7.2f} us/op")
    for name in [m for m in args.models.split(",") if m]:
        step = gru_step() if name == "gru" else zoo_step(name, args.scale)
        new = quality_rows(name, step, args.rounds, env, device)
        rows += new
        for r in new:
            print(
                f"{name:9} {r.params.split(';')[1]:10} {r.provider:13} {r.what:13} "
                f"{r.median:9.2f} [{r.min:.2f}, {r.max:.2f}] {r.note}",
                flush=True,
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / f"cost_model_{args.tag}.csv")
    write_json(rows, out / f"cost_model_{args.tag}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

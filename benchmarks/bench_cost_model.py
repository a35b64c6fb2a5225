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
# 5. ``--twin`` (the CUDA default): each program's step is recorded once under the H100
#    model (``cost=H100_SXM``), then replayed on the twin at ``TWIN_RATIOS`` of its peak with
#    decisions made from three cost assignments of its ops: ``launch`` (10 us x U(0.8, 1.2),
#    seed 0: what the host clock reads on CUDA, where every op's wall time is its launch),
#    ``analytic-h100`` (the recorded H100 model) and ``truth``. Truth is not measurable on
#    this CPU box: it is modelled as the H100 model times a lognormal error (sigma
#    ``TRUTH_SIGMA``, seed 1; the model's own error, per op), so ``truth`` is the oracle
#    assignment, ``analytic-h100`` the model with that error. Every schedule's
#    recomputations are priced in truth's units (a fused version: the sum of its ops'
#    truths, as the core sums its costs) and reported as % of the step's truth compute.

examples:
  python benchmarks/bench_cost_model.py                 # ~5 min on 2 CPU cores
  python benchmarks/bench_cost_model.py --twin          # the CUDA default, ~2 min
  python benchmarks/bench_cost_model.py --models gru,gpt --rounds 5
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the repository root, for the tests' helpers (tests.zoo)

from harness import Env, Row, Stats, describe_device, measure, write_csv, write_json  # noqa: E402
from recorded import gru_step  # noqa: E402  (the same GRU loop: NOTE [ Recorded steps ])

import tritondtr  # noqa: E402
from tests import zoo  # noqa: E402
from tritondtr.core import BudgetError as CoreBudgetError  # noqa: E402
from tritondtr.core import Core, ThrashError  # noqa: E402
from tritondtr.runtime import (  # noqa: E402
    H100_SXM,
    AnalyticCost,
    BudgetError,
    CostModel,
)
from tritondtr.runtime.cost import price, resolve  # noqa: E402
from tritondtr.sim import twin  # noqa: E402

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


TWIN_RATIOS = (0.5, 0.3, 0.15)
TRUTH_SIGMA = 0.5  # rule 5: the H100 model's error per op, lognormal
TWIN_PROGRAMS = ("gpt", "lstm", "mlp", "cnn", "treelstm", "gru")


class _PricedCore(Core):
    """A twin core that also keeps each storage's truth cost (rule 5): the op in flight's
    (``op_truth``), plus, for a fused version, the truths of the versions it absorbed."""

    truth: list
    op_truth = 0.0

    def new(self, size, cost, inputs, name, pinned=False, backward=False, writes=-1, alone=True):
        ab_before = set(self.absorbed)
        fused = {i: self.truth[i] for i in (*inputs, writes) if i >= 0}
        sid = super().new(size, cost, inputs, name, pinned, backward, writes, alone)
        t = self.op_truth
        t += sum(fused[i] for i in set(inputs) if i in ab_before)  # NOTE [ Fused versions ] 6
        if writes >= 0 and writes in self.absorbed and writes not in ab_before:  # rule 1
            t += fused[writes]
        if sid >= len(self.truth):
            self.truth.extend([0.0] * (sid + 1 - len(self.truth)))
        self.truth[sid] = t
        return sid


class _TruthCounter(twin._Counter):
    def __init__(self) -> None:
        super().__init__(None)
        self.truth_remat = 0.0

    def recompute(self, sid: int, consume: int = -1) -> None:
        self.truth_remat += self.core.truth[sid]


class _PricedTwin(twin._Twin):
    def __init__(self, trace, core, device, truth) -> None:
        super().__init__(trace, core, device)
        self.truth_cost = truth

    def _call(self, o: int) -> None:
        self.core.op_truth = self.truth_cost[o]
        return super()._call(o)


def replay_priced(trace, decide: np.ndarray, truth: np.ndarray, budget: int) -> dict:
    """The twin's replay (NOTE [ The twin ]) of ``trace`` with op costs ``decide``; its
    recomputations priced by ``truth`` (rule 5)."""
    counter = _TruthCounter()
    core = _PricedCore(budget, "dtr_eq", counter, backend="torch")
    core.truth = []
    counter.core = core
    run = _PricedTwin(dataclasses.replace(trace, op_cost=decide), core, torch.device("cpu"), truth)
    status = "ok"
    try:
        run.run(None)
    except ThrashError:
        status = "thrash"
    except CoreBudgetError:
        status = "oom"
    return {"truth_remat": counter.truth_remat, "remats": core.stats.rematerializations,
            "status": status}  # fmt: skip


def twin_rows(programs, scale, env) -> list[Row]:
    rows = []
    for name in programs:
        step = gru_step() if name == "gru" else zoo_step(name, scale)
        step()  # warm up
        with tritondtr.trace(cost=H100_SXM) as rec:
            step()
        tr = rec.trace
        peak = rec.stats.peak_bytes
        ops = ~tr.is_constant_op()
        h100 = tr.op_cost.copy()
        truth = h100 * np.random.default_rng(1).lognormal(0.0, TRUTH_SIGMA, h100.shape)
        launch = 1e4 * np.random.default_rng(0).uniform(0.8, 1.2, h100.shape)
        compute = float(truth[ops].sum())
        for r in TWIN_RATIOS:
            budget = int(r * peak)
            for cname, decide in (("launch", launch), ("analytic-h100", h100), ("truth", truth)):
                got = replay_priced(tr, decide, truth, budget)
                pct = 100.0 * got["truth_remat"] / compute
                rows.append(
                    Row.of(
                        "remat_pct_of_compute",
                        cname,
                        int(ops.sum()),
                        Stats.of([pct]),
                        "%",
                        device="twin (simulated H100 costs); CPU host: " + describe_device("cpu"),
                        env=env,
                        params=(
                            f"program={name};scale={scale};ratio={r};budget={budget};"
                            f"remats={got['remats']};truth_sigma={TRUTH_SIGMA}"
                        ),
                        note=got["status"],
                    )
                )
                print(f"{name:9} {r:5} {cname:14} {pct:8.2f} % {got['remats']:6} {got['status']}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gru,mlp,cnn,gpt,lstm,treelstm")
    ap.add_argument("--scale", type=int, default=4, help="zoo width multiplier (default: 4)")
    ap.add_argument("--rounds", type=int, default=3, help="quality rounds (default: 3)")
    ap.add_argument("--price-rounds", type=int, default=15, help="price rounds (default: 15)")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--tag", default="cpu-2core-1thread")
    ap.add_argument("--twin", action="store_true", help="the CUDA default study (rule 5)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    env, device = Env.capture(), describe_device("cpu")
    if args.twin:
        rows = twin_rows(TWIN_PROGRAMS, args.scale, env)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_csv(rows, out / f"cost_model_cuda_default_{args.tag}.csv")
        return 0
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

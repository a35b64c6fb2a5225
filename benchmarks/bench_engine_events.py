"""How much engine work does one eviction cost, on the engine calls of real training steps?

``record`` runs one training step per workload under ``tritondtr.enable`` at a fraction of its
peak and keeps every call the DTR core made to its :class:`~tritondtr.engine.Engine` (with the
result). ``replay`` replays those calls on a fresh CPU engine of the tree under test and times
each, by kind; ``compare`` alternates ``replay`` between source trees in one run.

# NOTE [ Engine event benchmark ]
# 1. Workloads: the unrolled ``nn.GRUCell`` (batch 32, hidden 256, 40 steps) whose profile
#    started the eqclass work, and the zoo of ``tests/zoo.py`` at ``--scale``; one step each
#    at ``--fraction`` of the step's peak (tritondtr's accounting).
# 2. A replay checks every result against the recorded one (the victims above all): a tree
#    that decides differently stops the replay with an error naming the call. So two trees
#    compared on one trace make the same decisions on it.
# 3. Before every ``select`` and ``choose`` the replay calls ``flush`` and times it apart:
#    values are exact functions of the evicted set (NOTE [ Neighbourhood staging ] rule 5),
#    so this changes nothing but splits the neighbourhood's part from the scoring's.
# 4. Each call is timed alone (``perf_counter``, ~0.1 us of it is the timer's on the 2-core
#    AMD EPYC guest); a replay's total per kind is one sample; rows report median and spread
#    over ``--rounds`` replays, the garbage collector off. ``compare`` runs each tree in its
#    own process, alternating trees round by round, so that load on a shared machine falls on
#    both alike.
# 5. Rows: ``engine_call`` (us per call, provider = the kind), ``engine_per_eviction`` (us per
#    eviction of the step: ``decision`` = flush + scoring, ``bookkeeping`` = every other
#    call, ``total``); ``size`` is the number of evictions, ``params`` the workload.

examples:
  python benchmarks/bench_engine_events.py record --out out/bench    # ~1 min, 2 CPU cores
  python benchmarks/bench_engine_events.py replay --traces out/bench/engine_traces.pkl
  python benchmarks/bench_engine_events.py compare --trees /tmp/old . --traces ...
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # and the root, for tests.zoo

from harness import Env, Row, Stats, describe_device, write_csv, write_json  # noqa: E402

import tritondtr  # noqa: E402
from tritondtr.engine.engine import Engine  # noqa: E402

CALLS = (
    "new",
    "add_parents",
    "set_cost",
    "access",
    "lock",
    "unlock",
    "pin",
    "unpin",
    "evict",
    "remat",
    "release",
    "select",
    "choose",
)
DECISION = ("flush", "select", "choose")
ZOO = ("mlp", "cnn", "gpt", "lstm", "treelstm")


@contextlib.contextmanager
def recording(log: list):
    """Append ``(call, args, kwargs, result)`` of every Engine call in ``CALLS`` to ``log``."""
    saved = {name: getattr(Engine, name) for name in CALLS}

    def wrap(name, f):
        def call(self, *args, **kwargs):
            out = f(self, *args, **kwargs)
            log.append((name, args, kwargs, out))
            return out

        return call

    try:
        for name, f in saved.items():
            setattr(Engine, name, wrap(name, f))
        yield log
    finally:
        for name, f in saved.items():
            setattr(Engine, name, f)


def workload(name: str, scale: int):
    """``(fresh, step)``: ``fresh()`` builds the state of one step, ``step(state)`` runs it."""
    if name == "gru":
        torch.manual_seed(0)
        cell, x = torch.nn.GRUCell(256, 256), torch.randn(40, 32, 256)

        def step(_):
            h = torch.zeros(32, 256)
            for t in range(40):
                h = cell(x[t], h)
            h.square().mean().backward()
            cell.zero_grad()

        return (lambda: None), step
    from tests import zoo

    def fresh():
        case = zoo.make(name, seed=0, scale=scale)
        return case, torch.optim.Adam(case.model.parameters(), lr=1e-3)

    return fresh, lambda state: zoo.train_step(*state)


def record(names: list[str], scale: int, fraction: float) -> dict:
    traces = {}
    for name in names:
        fresh, step = workload(name, scale)
        with tritondtr.enable(budget=None) as s:
            step(fresh())
        budget = int(fraction * s.stats.peak_bytes)
        state, log = fresh(), []
        with recording(log), tritondtr.enable(budget=budget) as s:
            step(state)
        st = s.stats
        traces[name] = dict(
            log=log,
            evictions=st.evictions,
            remats=st.rematerializations,
            budget=budget,
            fraction=fraction,
            scale=scale,
        )
        print(f"{name}: {len(log)} engine calls, {st.evictions} evictions", file=sys.stderr)
    return traces


def replay_once(log: list) -> tuple[dict[str, float], dict[str, int]]:
    """Seconds per kind of call over one replay on a fresh CPU engine, and the counts."""
    eng, total, count = Engine("dtr_eq", device="cpu"), {}, {}
    clock = time.perf_counter
    gc.disable()
    try:
        for name, args, kwargs, want in log:
            if name in ("select", "choose"):  # NOTE [ Engine event benchmark ] rule 3
                t0 = clock()
                eng.flush()
                total["flush"] = total.get("flush", 0.0) + clock() - t0
            f = getattr(eng, name)
            t0 = clock()
            got = f(*args, **kwargs)
            total[name] = total.get(name, 0.0) + clock() - t0
            count[name] = count.get(name, 0) + 1
            if got != want:
                raise SystemExit(f"{name}{args} returned {got!r}, the recording {want!r}")
    finally:
        gc.enable()
    return total, count


def replay(traces: dict, rounds: int) -> dict:
    """Per workload: per kind, the samples (us per call) over ``rounds`` replays."""
    out = {}
    for name, tr in traces.items():
        samples: dict[str, list[float]] = {}
        for _ in range(rounds):
            total, count = replay_once(tr["log"])
            for kind, s in total.items():
                samples.setdefault(kind, []).append(s * 1e6)
        out[name] = dict(total_us=samples, count=count, evictions=tr["evictions"])
    return out


def rows(results: dict, tree: str, env: Env, device: str) -> list[Row]:
    rs = []
    for name, r in results.items():
        ev, count, tot = r["evictions"], r["count"], r["total_us"]
        params = f"workload={name};tree={tree}"
        for kind, us in tot.items():
            n = count.get(kind, count.get("select", 0) + count.get("choose", 0))
            st = Stats.of([u / n for u in us])
            rs.append(
                Row.of("engine_call", kind, ev, st, "us", device=device, env=env, params=params)
            )
        k = len(next(iter(tot.values())))
        per = {
            "decision": [sum(tot[c][i] for c in DECISION if c in tot) / ev for i in range(k)],
            "bookkeeping": [
                sum(tot[c][i] for c in tot if c not in DECISION) / ev for i in range(k)
            ],
        }
        per["total"] = [a + b for a, b in zip(per["decision"], per["bookkeeping"])]
        for kind, xs in per.items():
            rs.append(
                Row.of(
                    "engine_per_eviction",
                    kind,
                    ev,
                    Stats.of(xs),
                    "us",
                    device=device,
                    env=env,
                    params=params,
                )
            )
    return rs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("mode", choices=("record", "replay", "compare", "replay-json"))
    p.add_argument("--workloads", nargs="+", default=["gru", *ZOO])
    p.add_argument("--scale", type=int, default=16, help="zoo width scale (default: 16)")
    p.add_argument("--fraction", type=float, default=0.5, help="budget / peak (default: 0.5)")
    p.add_argument("--rounds", type=int, default=5, help="replays per tree (default: 5)")
    p.add_argument(
        "--trees", nargs="+", default=["."], help="source trees for compare: PATH or LABEL=PATH"
    )
    p.add_argument("--traces", type=Path, default=Path("out/bench/engine_traces.pkl"))
    p.add_argument("--out", type=Path, default=Path("out/bench"), help="output folder")
    p.add_argument("--tag", default="cpu-2core-1thread", help="file name tag")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.mode == "record":
        a.traces.parent.mkdir(parents=True, exist_ok=True)
        with open(a.traces, "wb") as f:
            pickle.dump(record(a.workloads, a.scale, a.fraction), f)
        print(f"wrote {a.traces}")
        return 0
    with open(a.traces, "rb") as f:
        traces = pickle.load(f)
    if a.mode == "replay-json":  # one round in this process, for compare
        json.dump(replay(traces, 1), sys.stdout)
        return 0
    env, device = Env.capture(), describe_device("cpu")
    if a.mode == "replay":
        rs = rows(replay(traces, a.rounds), ".", env, device)
    else:
        trees = dict(t.split("=", 1) if "=" in t else (t, t) for t in a.trees)
        merged: dict[str, dict] = {t: {} for t in trees}
        for i in range(a.rounds):
            for tree in list(trees) if i % 2 == 0 else list(trees)[::-1]:
                penv = dict(os.environ, PYTHONPATH=str(Path(trees[tree]).resolve()))
                cmd = [sys.executable, __file__, "replay-json", "--traces", str(a.traces)]
                res = json.loads(
                    subprocess.run(cmd, env=penv, capture_output=True, text=True, check=True).stdout
                )
                for name, r in res.items():
                    m = merged[tree].setdefault(name, dict(r, total_us={}))
                    for kind, us in r["total_us"].items():
                        m["total_us"].setdefault(kind, []).extend(us)
        rs = [row for tree in trees for row in rows(merged[tree], tree, env, device)]
    a.out.mkdir(parents=True, exist_ok=True)
    stem = a.out / f"engine_events_{a.tag}"
    write_csv(rs, stem.with_suffix(".csv"))
    write_json(rs, stem.with_suffix(".json"))
    for r in rs:
        if r.what == "engine_per_eviction" or r.provider in ("flush", "evict", "remat"):
            print(
                f"{r.params:45} {r.what:20} {r.provider:12} {r.median:8.2f} us "
                f"(q1 {r.q1:.2f}, q3 {r.q3:.2f})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

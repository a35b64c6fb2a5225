"""What does the eviction path cost: per eviction decision, and per eviction or recomputation?

# NOTE [ Eviction path benchmark ]
# 1. Programs: an unrolled ``nn.GRUCell`` (batch 32, hidden 256, 40 steps; forward, backward,
#    SGD step) and the zoo models (tests/zoo.py) at ``--scale`` (16: ops of tens of us).
# 2. Settings: eager; ``not-binding`` (budget = 2 x the unlimited peak: tracked, nothing
#    evicted); ``50%`` of the unlimited peak. Rounds interleave the settings; medians.
# 3. Rows per program: ``step_time`` (ms) per setting; ``vs_not_binding`` (50 % step / not-
#    binding step, the issue's 1.5x / 1.3x targets); ``decision`` (us per eviction: the
#    core's ``select_s`` / evictions, scoring and neighbourhood flush included);
#    ``bookkeeping`` (us per eviction or rematerialization: the 50 % step minus the
#    not-binding step, the selections and the recomputations' own time, divided by
#    evictions + rematerializations); ``scorings`` per eviction; ``recompute`` (us per
#    rematerialization: the session's ``recompute_s``, each replay's op included).

examples:
  python benchmarks/bench_runtime_evict.py                  # ~2 min on 2 CPU cores
  python benchmarks/bench_runtime_evict.py --models gru --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the repository root, for the tests' helpers (tests.zoo)

from harness import Env, Row, Stats, describe_device, write_csv, write_json  # noqa: E402
from recorded import gru_step  # noqa: E402  (the same GRU loop)

import tritondtr  # noqa: E402
from tests import zoo  # noqa: E402


def zoo_step(name: str, scale: int):
    case = zoo.make(name, seed=0, scale=scale)
    opt = torch.optim.SGD(case.model.parameters(), lr=1e-3)
    return lambda: zoo.train_step(case, opt)


def timed(step, budget=None, eager=False):
    if eager:
        t0 = time.perf_counter()
        step()
        return time.perf_counter() - t0, None, None
    with tritondtr.enable(budget=budget) as s:
        t0 = time.perf_counter()
        step()
        dt = time.perf_counter() - t0
    owner = getattr(s, "core", None) or s.pool  # s.pool: the runtime before tritondtr.core
    eng = owner.engine
    return dt, s.stats, (eng.selections if eng is not None else 0)


def measure(step, rounds: int) -> dict:
    step()
    _, st, _ = timed(step)
    peak = st.peak_bytes
    out = {"eager": [], "not-binding": [], "50%": [], "stats": []}
    for _ in range(rounds):
        out["eager"].append(timed(step, eager=True)[0])
        out["not-binding"].append(timed(step, 2 * peak)[0])
        dt, st, scorings = timed(step, peak // 2)
        out["50%"].append(dt)
        out["stats"].append((dt, st, scorings))
    return out


def rows_for(name: str, m: dict, env: Env, device: str) -> list[Row]:
    def row(what, samples, unit, note=""):
        return Row.of(what, name, 0, Stats.of(samples), unit, device=device, env=env, note=note)

    rows = [
        row("step_time", [t * 1e3 for t in m[k]], "ms", k) for k in ("eager", "not-binding", "50%")
    ]
    nb = statistics.median(m["not-binding"])
    rows.append(row("vs_not_binding", [t / nb for t in m["50%"]], "x", "50%"))
    dec, book, scor, rec = [], [], [], []
    for dt, st, scorings in m["stats"]:
        ev, rem = st.evictions, st.rematerializations
        if rem:
            rec.append(st.recompute_s / rem * 1e6)
        if ev:
            dec.append(st.select_s / ev * 1e6)
            scor.append(scorings / ev)
        if ev + rem:
            book.append((dt - nb - st.select_s - st.recompute_s) / (ev + rem) * 1e6)
    st = m["stats"][-1][1]
    note = f"evictions={st.evictions};remats={st.rematerializations}"
    rows += [
        row("decision", dec, "us/eviction", note),
        row("bookkeeping", book, "us/event", note),
        row("scorings", scor, "per eviction", note),
    ]
    if rec:
        rows.append(row("recompute", rec, "us/remat", note))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gru,mlp,cnn,gpt,lstm,treelstm")
    ap.add_argument("--scale", type=int, default=16, help="zoo width multiplier (default: 16)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--tag", default="cpu-2core-1thread")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    env, device = Env.capture(), describe_device("cpu")
    rows = []
    for name in args.models.split(","):
        step = gru_step() if name == "gru" else zoo_step(name, args.scale)
        m = measure(step, args.rounds)
        new = rows_for(name, m, env, device)
        rows += new
        for r in new:
            print(f"{name:9} {r.what:15} {r.median:10.2f} {r.unit:13} {r.note}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / f"runtime_evict_{args.tag}.csv")
    write_json(rows, out / f"runtime_evict_{args.tag}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What does choosing the copy price scale cost a session with offload?

# NOTE [ Rehearsal benchmark ]
# 1. Question: what the tape (NOTE [ Rehearsal ] in tritondtr/core/rehearsal.py) costs the
#    first two steps of a session with ``offload``, and what rehearsing every candidate
#    scale at the second step's end costs, in wall time on this machine.
# 2. Programs: zoo models (tests/zoo.py) at 30 % of their unlimited peak, SGD, the analytic
#    cost model (the same choices every run), ``offload="pcie4"``, one torch thread; one
#    session of ``--steps`` steps per sample.
# 3. Settings, interleaved in rounds: ``tuned`` (the session as installed: it tapes its
#    first two steps and rehearses at the second's end) and ``fixed`` (``core.stop_tape()``
#    at entry: the plain price from the first op, no tape, no rehearsal).
# 4. Rows per program and setting: ``step_time`` per step index (ms; size = the step),
#    and for ``tuned`` ``rehearsal_time`` (ms, every candidate's rehearsal at the choice, timed
#    around ``Tape.rehearse``) with the step's op count and the taped calls in ``note``.

examples:
  python benchmarks/bench_runtime_rehearsal.py                  # ~1 min on 2 CPU cores
  python benchmarks/bench_runtime_rehearsal.py --programs gpt --rounds 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from harness import Env, Row, Stats, describe_device, write_csv  # noqa: E402

import tritondtr  # noqa: E402
from tests.zoo import make, train_step  # noqa: E402
from tritondtr.core.rehearsal import Tape  # noqa: E402

SETTINGS = ("tuned", "fixed")


class Timed:
    """Wall time spent in ``Tape.rehearse`` and the tape's size at the choice (rule 4)."""

    def __init__(self) -> None:
        self.seconds, self.calls, self.mark = 0.0, 0, 0
        self._rehearse = Tape.rehearse

    def __enter__(self) -> Timed:
        rehearse = self._rehearse

        def timed(tape, core, scale):
            t0 = time.perf_counter()
            try:
                return rehearse(tape, core, scale)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls, self.mark = len(tape.calls), tape.mark

        Tape.rehearse = timed
        return self

    def __exit__(self, *exc) -> None:
        Tape.rehearse = self._rehearse


def _session(name: str, setting: str, budget: int, steps: int) -> tuple[list[float], Timed, float]:
    case = make(name)
    opt = torch.optim.SGD(case.model.parameters(), lr=1e-2)
    times = []
    with Timed() as timed, tritondtr.enable(budget=budget, offload="pcie4", cost="analytic") as s:
        if setting == "fixed":
            s.core.stop_tape()
        for _ in range(steps):
            t0 = time.perf_counter()
            train_step(case, opt)
            times.append(time.perf_counter() - t0)
    return times, timed, s.core.tuner.value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--programs", default="gpt,cnn,lstm", help="zoo models (tests/zoo.py)")
    p.add_argument("--steps", type=int, default=4, help="steps per session (default: 4)")
    p.add_argument("--rounds", type=int, default=7, help="sessions per setting (default: 7)")
    p.add_argument("--out", type=Path, default=HERE / "results", help="output folder")
    p.add_argument("--tag", default=None, help="file name tag (default: the CPU)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dev, env = describe_device("cpu"), Env.capture()
    print(f"# {dev}; {args.rounds} rounds of {args.steps}-step sessions, settings interleaved")
    rows = []
    for name in args.programs.split(","):
        with tritondtr.enable(budget=None) as s0:
            train_step(make(name), torch.optim.SGD(make(name).model.parameters(), lr=1e-2))
        budget = int(0.3 * s0.stats.peak_bytes)
        got = {s: [[] for _ in range(args.steps)] for s in SETTINGS}
        rehearsal, scales, tape = [], set(), (0, 0)
        for _ in range(args.rounds):
            for setting in SETTINGS:
                times, timed, scale = _session(name, setting, budget, args.steps)
                for i, t in enumerate(times):
                    got[setting][i].append(t * 1e3)
                if setting == "tuned":
                    rehearsal.append(timed.seconds * 1e3)
                    scales.add(scale)
                    tape = (timed.mark, timed.calls)
        rows += _rows(name, got, rehearsal, scales, tape, dev, env)
    tag = args.tag or f"cpu-{os.cpu_count()}core-1thread"
    path = write_csv(rows, args.out / f"runtime_rehearsal_{tag}.csv")
    print(f"rows: {path}")
    return 0


def _rows(name, got, rehearsal, scales, tape, dev, env) -> list[Row]:
    params = f"program={name};budget=30%;offload=pcie4;cost=analytic"
    one = dict(device=dev, env=env, params=params)
    rows = []
    print(f"## zoo {name} at 30 % of its peak, chosen scale {sorted(scales)}")
    print("| step | tuned ms | fixed ms | tuned / fixed |")
    print("|---:|---:|---:|---:|")
    for i in range(len(got["tuned"])):
        med = {s: statistics.median(got[s][i]) for s in SETTINGS}
        for s in SETTINGS:
            rows.append(Row.of("step_time", s, i + 1, Stats.of(got[s][i]), "ms", **one))
        print(f"| {i + 1} | {med['tuned']:.1f} | {med['fixed']:.1f} | "
              f"{med['tuned'] / med['fixed']:.2f} |")  # fmt: skip
    note = f"taped calls {tape[1]}, of them {tape[0]} in step 1; scale {sorted(scales)}"
    rows.append(Row.of("rehearsal_time", "tuned", 2, Stats.of(rehearsal), "ms", note=note, **one))
    print(f"rehearsal of every candidate: {statistics.median(rehearsal):.1f} ms ({note})")
    return rows


if __name__ == "__main__":
    raise SystemExit(main())

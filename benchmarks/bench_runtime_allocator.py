"""How much of tracking's price on a large model is the CPU allocator returning memory?

On Linux, glibc's malloc hands large blocks back to the kernel (``munmap`` of blocks above the
mmap threshold, ``trim`` of a free heap top above the trim threshold); the next allocation of
that memory page-faults and the kernel zeroes every page again. A step under tritondtr frees
and allocates in another order than eager mode does, and on the zoo's GPT at scale 16 that
order makes the difference.

# NOTE [ Allocator benchmark ]
# 1. Programs: the zoo's GPT and MLP (tests/zoo.py) at ``--scale``, one training step.
# 2. Providers: ``eager``; ``tracking`` (``tritondtr.enable(budget=None)``: every op tracked,
#    nothing evicted); ``50%`` (``budget`` = half of tracking's peak: evictions free buffers
#    and recomputations allocate them again). Rounds interleave them; medians.
# 3. Rows per program and provider: ``cpu_time`` (ms of this thread's CPU time, so other
#    processes on the box do not count), ``minor_faults`` (``getrusage`` minflt over the
#    step), ``sys_time`` (ms of kernel time over the step, the faults' zeroing mostly).
# 4. ``params`` carries ``malloc=``: the ``MALLOC_*`` environment glibc read at start, or
#    ``default``. ``--compare`` runs the same measurement a second time in a child process
#    with ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` set high (nothing is
#    returned to the kernel), so one command gives both configurations.

examples:
  python benchmarks/bench_runtime_allocator.py --compare     # ~1 min on 2 CPU cores
  MALLOC_TRIM_THRESHOLD_=17179869184 python benchmarks/bench_runtime_allocator.py
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the repository root, for the tests' helpers (tests.zoo)

from harness import Env, Row, Stats, describe_device, write_csv  # noqa: E402

import tritondtr  # noqa: E402
from tests import zoo  # noqa: E402

KEEP = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "17179869184"}


def malloc_env() -> str:
    found = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("MALLOC_"))
    return ",".join(found) or "default"


def one_step(step, tracked: bool, budget: int | None = None) -> tuple[float, int, float, int]:
    """CPU ms, minor faults, system ms and tracked peak bytes (0 in eager) of one step."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
    peak = 0
    if tracked:
        with tritondtr.enable(budget=budget) as session:
            step()
        peak = session.stats.peak_bytes
    else:
        step()
    t1, r1 = time.thread_time(), resource.getrusage(resource.RUSAGE_SELF)
    return (t1 - t0) * 1e3, r1.ru_minflt - r0.ru_minflt, (r1.ru_stime - r0.ru_stime) * 1e3, peak


def measure(name: str, scale: int, rounds: int, env: Env, device: str) -> list[Row]:
    case = zoo.make(name, seed=0, scale=scale)
    opt = torch.optim.SGD(case.model.parameters(), lr=1e-3)

    def step():
        zoo.train_step(case, opt)

    one_step(step, False)
    half = one_step(step, True)[3] // 2
    budgets = {"eager": None, "tracking": None, "50%": half}
    got = {p: [] for p in budgets}
    for _ in range(rounds):
        for p, budget in budgets.items():
            got[p].append(one_step(step, p != "eager", budget))
    rows = []
    params = f"model={name};scale={scale};malloc={malloc_env()}"
    for p, samples in got.items():
        for k, (what, unit) in enumerate(
            (("cpu_time", "ms"), ("minor_faults", "count"), ("sys_time", "ms"))
        ):
            rows.append(
                Row.of(
                    what,
                    p,
                    scale,
                    Stats.of([s[k] for s in samples]),
                    unit,
                    device=device,
                    env=env,
                    params=params,
                )
            )
        med = [statistics.median(s[k] for s in samples) for k in range(3)]
        print(
            f"  {name:4s} {p:9s} cpu {med[0]:8.1f} ms  faults {med[1]:8.0f}  sys {med[2]:6.1f} ms"
            f"  (malloc: {malloc_env()})",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", nargs="+", default=["gpt", "mlp"], choices=sorted(zoo.ZOO))
    p.add_argument("--scale", type=int, default=16, help="zoo width multiplier (default: 16)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    p.add_argument("--compare", action="store_true", help="also run with KEEP's MALLOC_* set")
    p.add_argument("--out", type=Path, default=HERE / "results", help="output folder")
    p.add_argument("--tag", default=None, help="file name tag (default: the CPU)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dev, env = describe_device("cpu"), Env.capture()
    print(f"# one training step, eager and tracked; {dev}")
    rows = [r for m in args.models for r in measure(m, args.scale, args.rounds, env, dev)]
    tag = args.tag or f"cpu-{os.cpu_count()}core-1thread"
    path = args.out / f"runtime_allocator_{tag}.csv"
    if args.compare:
        child = [sys.executable, __file__, "--models", *args.models, "--scale", str(args.scale)]
        child += ["--rounds", str(args.rounds), "--out", str(args.out), "--tag", tag + "-keep"]
        done = subprocess.run(child, env={**os.environ, **KEEP}, check=False)
        if done.returncode:
            print(f"the run with {KEEP} failed (exit {done.returncode})", file=sys.stderr)
            return done.returncode
    write_csv(rows, path)
    print(f"rows: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

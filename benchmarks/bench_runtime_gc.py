"""What do Python's full garbage collections cost a step under tritondtr, and gc.freeze()?

The runtime creates Python objects op by op (wrappers, cells, storages, recipes); the ones that
outlive a young collection count toward the next full (generation 2) collection, which walks
every tracked object of the process: ~300k once torch, triton and a training step have run.

# NOTE [ GC benchmark ]
# 1. Program: the GRU loop of benchmarks/recorded.py (batch 32, hidden 256, 40 steps) under
#    ``tritondtr.enable(budget=50 % of its unlimited peak)``, one training step per sample.
# 2. Settings, alternating in rounds of ``--steps`` steps: ``default`` (the collector as the
#    process has it) and ``frozen`` (``gc.collect(); gc.freeze()`` before the round, every
#    object alive then moved out of the collector's reach; ``gc.unfreeze()`` after it).
# 3. Rows per setting: ``step_time`` (ms of this thread's CPU time; mean and median differ by
#    the collections), ``full_gc`` (generation-2 collections per step, from ``gc.callbacks``)
#    and ``full_gc_time`` (ms per collection).

examples:
  python benchmarks/bench_runtime_gc.py            # ~1 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import Env, Row, Stats, describe_device, write_csv  # noqa: E402
from recorded import gru_step  # noqa: E402

import tritondtr  # noqa: E402


class FullCollections:
    """Counts generation-2 collections and their wall time through ``gc.callbacks``."""

    def __init__(self) -> None:
        self.count, self.seconds, self._t0 = 0, 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=10, help="steps per round (default: 10)")
    p.add_argument("--rounds", type=int, default=2, help="rounds per setting (default: 2)")
    p.add_argument("--out", type=Path, default=HERE / "results", help="output folder")
    p.add_argument("--tag", default=None, help="file name tag (default: the CPU)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dev, env = describe_device("cpu"), Env.capture()
    step = gru_step()
    step()
    with tritondtr.enable(budget=None) as session:
        step()
    budget = session.stats.peak_bytes // 2
    counter = FullCollections()
    gc.callbacks.append(counter)
    got = {"default": ([], [0, 0.0]), "frozen": ([], [0, 0.0])}
    try:
        for _ in range(args.rounds):
            for setting, (times, full) in got.items():
                if setting == "frozen":
                    gc.collect()
                    gc.freeze()
                n0, s0 = counter.count, counter.seconds
                for _ in range(args.steps):
                    with tritondtr.enable(budget=budget):
                        t0 = time.thread_time()
                        step()
                        times.append((time.thread_time() - t0) * 1e3)
                full[0] += counter.count - n0
                full[1] += counter.seconds - s0
                if setting == "frozen":
                    gc.unfreeze()
    finally:
        gc.callbacks.remove(counter)
    rows = []
    print(f"# GRU loop at 50 % of its peak, {args.rounds} x {args.steps} steps per setting; {dev}")
    for setting, (times, (count, seconds)) in got.items():
        n = len(times)
        per_gc = seconds / count * 1e3 if count else 0.0
        rows += [
            Row.of("step_time", setting, n, Stats.of(times), "ms", device=dev, env=env,
                   note=f"mean={statistics.mean(times):.2f}"),
            Row.of("full_gc", setting, n, Stats.of([count / n]), "per step", device=dev, env=env),
            Row.of("full_gc_time", setting, n, Stats.of([per_gc]), "ms", device=dev, env=env),
        ]  # fmt: skip
        print(
            f"  {setting:8s} step mean {statistics.mean(times):7.1f} ms, median "
            f"{statistics.median(times):7.1f}, max {max(times):7.1f}; {count} full collections "
            f"of {per_gc:.0f} ms"
        )
    tag = args.tag or f"cpu-{os.cpu_count()}core-1thread"
    path = write_csv(rows, args.out / f"runtime_gc_{tag}.csv")
    print(f"rows: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What does Python's garbage collector cost a training step under tritondtr, and in eager mode?

# NOTE [ GC benchmark ]
# 1. Process: a training process as users have one: ``transformers`` imported and a GPT-2
#    built from config (``recorded.hf_model``), so the collector tracks ~400k objects, as it
#    does wherever a framework is loaded; torch runs one thread.
# 2. Programs, each at 50 % of its unlimited peak, one training step per sample, one session
#    per step: ``gru`` (NOTE [ Recorded steps ] rule 2: 1,500 small ops a step) and ``unet``
#    (rule 6: 174 ops of ~1 ms).
# 3. Settings, interleaved in rounds of ``--steps`` steps: ``eager`` (no tritondtr) and
#    ``tritondtr`` (the package as installed: NOTE [ Garbage collector ] in
#    tritondtr/runtime/collector.py, where it exists); and what this script can apply around
#    a session, to compare collector policies on a package without that NOTE:
#    ``user-freeze`` (``gc.collect(); gc.freeze()`` before the round, not counted, and
#    ``gc.unfreeze()`` after: the advice of the docs before that NOTE), ``entry-freeze``
#    (``gc.freeze()`` at each session's entry, ``gc.unfreeze()`` at its exit) and
#    ``young=N`` (generation 0's threshold N while the session is active).
# 4. Measured through ``gc.callbacks``: collections of each generation and the wall time from
#    each one's start to its stop; and each step's wall time (``time.perf_counter``).
# 5. Rows per program and setting (``params``: program, package label): ``step_time`` (ms,
#    median and spread over every step; the mean in ``note``), ``collections`` (per step, all
#    generations), ``full_collections`` (in all steps), ``collector_time`` (ms per step) and
#    ``collector_share`` (% of the summed step time spent in the collector).

examples:
  python benchmarks/bench_runtime_gc.py                       # ~3 min on 2 CPU cores
  python benchmarks/bench_runtime_gc.py --settings eager,tritondtr,entry-freeze,young=100000
  PYTHONPATH=/path/to/old/checkout python benchmarks/bench_runtime_gc.py --label before
"""

from __future__ import annotations

import argparse
import contextlib
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
from recorded import gru_step, hf_model, unet_step  # noqa: E402

import tritondtr  # noqa: E402

PROGRAMS = {"gru": gru_step, "unet": unet_step}


class Collections:
    """Collections per generation and their wall time, through ``gc.callbacks``."""

    def __init__(self) -> None:
        self.count, self.seconds, self._t0 = [0, 0, 0], 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._t0

    def snapshot(self) -> tuple[list[int], float]:
        return list(self.count), self.seconds


@contextlib.contextmanager
def _around_session(setting: str):
    """What NOTE [ GC benchmark ] rule 3's ``entry-freeze`` and ``young=N`` do at a session's
    entry and exit."""
    if setting == "entry-freeze" and gc.get_freeze_count() == 0:
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
    elif setting.startswith("young="):
        found = gc.get_threshold()
        gc.set_threshold(int(setting.split("=", 1)[1]), *found[1:])
        try:
            yield
        finally:
            gc.set_threshold(*found)
    else:
        yield


def _round(setting: str, step, budget: int, steps: int, times: list) -> None:
    for _ in range(steps):
        t0 = time.perf_counter()
        if setting == "eager":
            step()
        else:
            with _around_session(setting), tritondtr.enable(budget=budget):
                step()
        times.append(time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--programs", default="gru,unet", help="of: " + ",".join(PROGRAMS))
    p.add_argument("--settings", default="eager,tritondtr", help="NOTE [ GC benchmark ] rule 3")
    p.add_argument("--steps", type=int, default=10, help="steps per round (default: 10)")
    p.add_argument("--rounds", type=int, default=4, help="rounds per setting (default: 4)")
    p.add_argument("--label", default="", help="names the package measured (rows, file name)")
    p.add_argument("--out", type=Path, default=HERE / "results", help="output folder")
    p.add_argument("--tag", default=None, help="file name tag (default: the CPU)")
    args = p.parse_args(argv)
    settings = args.settings.split(",")
    torch.set_num_threads(1)
    dev, env = describe_device("cpu"), Env.capture()
    keep = hf_model("gpt2")  # NOTE [ GC benchmark ] rule 1: a model of the framework lives
    gc.collect()
    tracked = len(gc.get_objects())
    t0 = time.perf_counter()
    gc.collect()
    full_ms = (time.perf_counter() - t0) * 1e3
    print(f"# {tracked} objects tracked, a full collection {full_ms:.0f} ms; {dev}")
    print(f"# package: {tritondtr.__file__} {args.label}; thresholds {gc.get_threshold()}")
    counter = Collections()
    rows = []
    gc.callbacks.append(counter)
    try:
        for name in args.programs.split(","):
            step = PROGRAMS[name]()
            step()
            with tritondtr.enable(budget=None) as session:
                step()
            budget = session.stats.peak_bytes // 2
            got = {s: ([], [0, 0, 0], [0.0]) for s in settings}
            for _ in range(args.rounds):
                for setting in settings:
                    times, count, seconds = got[setting]
                    if setting == "user-freeze":  # once, as a program would: not counted
                        gc.collect()
                        gc.freeze()
                    c0, s0 = counter.snapshot()
                    try:
                        _round(setting, step, budget, args.steps, times)
                    finally:
                        c1, s1 = counter.snapshot()
                        if setting == "user-freeze":
                            gc.unfreeze()
                    for g in range(3):
                        count[g] += c1[g] - c0[g]
                    seconds[0] += s1 - s0
            rows += _rows(name, got, args.label, dev, env, tracked)
    finally:
        gc.callbacks.remove(counter)
    del keep
    tag = args.tag or f"cpu-{os.cpu_count()}core-1thread"
    label = f"-{args.label}" if args.label else ""
    path = write_csv(rows, args.out / f"runtime_gc_{tag}{label}.csv")
    print(f"rows: {path}")
    return 0


def _rows(program, got, label, dev, env, tracked) -> list[Row]:
    rows = []
    params = f"program={program};budget=50%;package={label or 'installed'}"
    print(f"## {program} at 50 % of its peak, one session per step")
    print("| setting | steps | step ms median | mean | collections a step (gen 0/1/2) | "
          "full collections | collector ms a step | collector share |")  # fmt: skip
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for setting, (times, count, (seconds,)) in got.items():
        n, total = len(times), sum(times)
        ms = [t * 1e3 for t in times]
        mean = statistics.mean(ms)
        share = 100 * seconds / total
        one = dict(device=dev, env=env, params=params)
        rows += [
            Row.of("step_time", setting, n, Stats.of(ms), "ms", note=f"mean={mean:.2f}", **one),
            Row.of("collections", setting, n, Stats.of([sum(count) / n]), "per step",
                   note="gen0/1/2=" + "/".join(map(str, count)), **one),
            Row.of("full_collections", setting, n, Stats.of([count[2]]), "count",
                   note=f"{tracked} objects tracked", **one),
            Row.of("collector_time", setting, n, Stats.of([seconds * 1e3 / n]), "ms per step",
                   **one),
            Row.of("collector_share", setting, n, Stats.of([share]), "%", **one),
        ]  # fmt: skip
        print(
            f"| {setting} | {n} | {statistics.median(ms):.1f} | {mean:.1f} | "
            f"{sum(count) / n:.2f} ({'/'.join(map(str, count))}) | {count[2]} | "
            f"{seconds * 1e3 / n:.2f} | {share:.2f} % |"
        )
    return rows


if __name__ == "__main__":
    raise SystemExit(main())

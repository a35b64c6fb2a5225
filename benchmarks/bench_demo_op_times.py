"""How long do the ops of the demo's two regimes take (NOTE [ The demo ] rule 4)?

tritondtr's price is paid per op, so a regime is named by how long its ops take beside it.

# NOTE [ Demo op times benchmark ]
# 1. Program: each regime's model, batch and optimizer as ``tritondtr demo`` trains them
#    (``REGIMES`` in tritondtr/demo/regimes.py), one eager training step per sample, no
#    tritondtr; one untimed step first.
# 2. ``op_time``: every op dispatched in ``--steps`` steps, timed alone under a
#    ``TorchDispatchMode`` (``time.perf_counter_ns`` around the call), in us: the median
#    and quartiles of the ops, each op counted once whatever its length. The plain median
#    is the views and the optimizer's per-parameter updates, microseconds in any model.
# 3. ``op_time_weighted``: the op time at which half of the steps' op time lies in longer
#    ops (the median of op time weighted by time), in us: the regime's name. ``op_time_mean``
#    (us) and ``op_share_ge_1ms`` (the fraction of op time in ops of 1 ms or more) beside it.
# 4. ``eager_step``: the step without the dispatch mode, ms, over the same steps.

examples:
  python benchmarks/bench_demo_op_times.py          # ~20 s on 2 CPU cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import Env, Row, Stats, describe_device, write_csv  # noqa: E402

from tritondtr.demo.regimes import REGIMES  # noqa: E402
from tritondtr.demo.tinygpt import TinyGPT, batches  # noqa: E402


class OpTimer(TorchDispatchMode):
    """Every dispatched op's wall time, ns (rule 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.ns: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = time.perf_counter_ns()
        out = func(*args, **(kwargs or {}))
        self.ns.append(time.perf_counter_ns() - t0)
        return out


def weighted_median(ns: list[int]) -> int:
    """The op time at which half of the total lies in longer ops (rule 3)."""
    half, acc = sum(ns) / 2, 0
    for t in sorted(ns, reverse=True):
        acc += t
        if acc >= half:
            return t
    raise ValueError("weighted_median needs at least one op time")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=3, help="timed steps per regime (default: 3)")
    p.add_argument("--out", type=Path, default=HERE / "results", help="output folder")
    p.add_argument("--tag", default=None, help="file name tag (default: the CPU)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dev, env = describe_device("cpu"), Env.capture()
    rows = []
    print(f"# the demo's regimes, {args.steps} eager steps each; {dev}")
    for regime, spec in REGIMES.items():
        torch.manual_seed(0)
        model = TinyGPT(spec.config)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # as the demo's runs
        data = batches(spec.config, args.steps + 1, spec.batch, 0, "cpu")

        def step(x, y, model=model, opt=opt):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            opt.step()

        step(*data[0])
        plain, timer = [], OpTimer()
        for x, y in data[1:]:
            t0 = time.perf_counter()
            step(x, y)
            plain.append((time.perf_counter() - t0) * 1e3)
            with timer:
                step(x, y)
        ns = timer.ns
        us = [t / 1e3 for t in ns]
        n = len(ns) // args.steps  # ops per step
        share = sum(t for t in ns if t >= 1_000_000) / sum(ns)
        wm = weighted_median(ns) / 1e3
        mean = statistics.mean(us)
        kw = {"device": dev, "env": env, "params": f"steps={args.steps}"}
        name = regime.value
        rows += [
            Row.of("op_time", name, n, Stats.of(us), "us", **kw),
            Row.of("op_time_weighted", name, n, Stats.of([wm]), "us", **kw),
            Row.of("op_time_mean", name, n, Stats.of([mean]), "us", **kw),
            Row.of("op_share_ge_1ms", name, n, Stats.of([share]), "fraction", **kw),
            Row.of("eager_step", name, n, Stats.of(plain), "ms", **kw),
        ]
        print(
            f"  {spec.label}: {n} ops per step, op time median {statistics.median(us):.0f} us, "
            f"mean {mean:.0f} us, half of op time in ops >= {wm:.0f} us, "
            f"{share:.0%} in ops >= 1 ms; eager step {statistics.median(plain):.0f} ms"
        )
    tag = args.tag or f"cpu-{os.cpu_count()}core-1thread"
    path = write_csv(rows, args.out / f"demo_op_times_{tag}.csv")
    print(f"rows: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

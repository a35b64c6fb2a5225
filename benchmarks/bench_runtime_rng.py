"""What does capturing the generators of a random op cost, in microseconds per op?

NOTE [ RNG replay ] (runtime/recipe.py) captures, at the first execution of every random op,
the state of each generator it may draw from, and a replay sets and restores them.

# NOTE [ RNG capture benchmark ]
# 1. ``capture`` rows: one call of ``capture_rng`` (what the dispatch path adds to a random
#    op's first execution), per case: ``aten-cpu`` (``rand_like`` on CPU: the CPU default
#    generator), ``aten-cuda`` (the device's generator), ``custom-cpu`` / ``custom-cuda`` (an
#    op outside ATen: the CPU generator and every initialized CUDA one), ``custom-gen``
#    (a custom op with a ``Generator`` argument: that one too).
# 2. ``replay_guard`` rows: what a replay adds around the op (save every current state, set
#    the captured ones, restore), per case.
# 3. ``op_time`` rows: a chain of ``K`` calls of a custom op that draws nothing (``x * 2``)
#    under ``enable(budget=None)``, with the capture (``captured``) and with the op's
#    ``OpInfo`` marked not random (``not-captured``, the price before custom ops were
#    captured), so the difference is the end-to-end price on the real dispatch path. The
#    two settings alternate over ``--rounds`` rounds (5 samples each); a row is the median
#    and spread of the round medians.

examples:
  python benchmarks/bench_runtime_rng.py            # ~10 s on 2 CPU cores
  python benchmarks/bench_runtime_rng.py --device cuda
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import Env, Row, Stats, describe_device, measure, write_csv, write_json  # noqa: E402

from tritondtr.runtime import enable  # noqa: E402
from tritondtr.runtime.recipe import capture_rng, rewind_rng  # noqa: E402
from tritondtr.runtime.semantics import _CACHE, op_info  # noqa: E402


@torch.library.custom_op("tdtr_bench::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@torch.library.custom_op(
    "tdtr_bench::noise", mutates_args=(), schema="(Tensor x, Generator? gen) -> Tensor"
)
def _noise(x, gen):
    return x + torch.rand(x.shape, generator=gen, device=x.device)


def cases(device: str) -> dict[str, tuple]:
    """case -> (op, positional args, kwargs) as the dispatch path sees them."""
    x = torch.ones(64, device=device)
    kind = torch.device(device).type
    found = {
        f"aten-{kind}": (torch.ops.aten.rand_like.default, [x], {}),
        f"custom-{kind}": (torch.ops.tdtr_bench.twice.default, [x], {}),
        "custom-gen": (torch.ops.tdtr_bench.noise.default, [x, torch.Generator(device)], {}),
    }
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--ops", type=int, default=200, help="ops per chain K (default: 200)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--repeats", type=int, default=15, help="samples (default: 15)")
    p.add_argument("--rounds", type=int, default=7, help="op_time rounds (default: 7)")
    p.add_argument("--out", type=Path, default=Path("out/bench"), help="output folder")
    p.add_argument("--tag", default=None, help="file name tag (default: device)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    dev, env, k = describe_device(args.device), Env.capture(), args.ops
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.init()  # its default generators exist from here on (NOTE rule 1)
    print(f"# RNG capture, {dev}; CUDA generators: {len(torch.cuda.default_generators)}")
    rows: list[Row] = []

    def row(what, provider, us, timing, params):
        rows.append(
            Row.of(what, provider, 1, us, "us", device=dev, env=env, timing=timing, params=params)
        )
        print(f"  {what:12s} {provider:14s} {us.median:8.2f} us", flush=True)

    for case, (op, pargs, pkw) in cases(args.device).items():
        info = op_info(op)
        rng = capture_rng(info, device, pargs, pkw)
        gens = f"generators={len(rng)}"
        t = measure(lambda a=(info, device, pargs, pkw): capture_rng(*a), repeats=args.repeats)
        row("capture", case, t.stats(1e6), t, gens)

        def guard(rng=rng):
            saved = [g.get_state() for g, _ in rng]
            rewind_rng(rng)
            for (g, _), state in zip(rng, saved):
                g.set_state(state)

        t = measure(guard, repeats=args.repeats)
        row("replay_guard", case, t.stats(1e6), t, gens)

    op = torch.ops.tdtr_bench.twice.default
    info = op_info(op)
    per_round: dict[str, list[float]] = {"captured": [], "not-captured": []}
    for _ in range(args.rounds):  # settings interleaved: load falls on both alike
        for setting, samples in per_round.items():
            if setting == "not-captured":
                _CACHE[op] = dataclasses.replace(info, random=False)
            try:
                with enable(budget=None):
                    x = torch.ones(64, device=device) + 0

                    def chain(x=x):
                        y = x
                        for _ in range(k):
                            y = _twice(y)

                    t = measure(chain, device=device, warmup=2, repeats=5, min_sample_s=0)
            finally:
                _CACHE[op] = info
            samples.append(t.stats(1e6 / k).median)
    for setting, samples in per_round.items():
        params = f"case=custom-{device.type};ops={k};rounds={args.rounds}"
        row("op_time", setting, Stats.of(samples), None, params)
    got = {r.provider: r.median for r in rows if r.what == "op_time"}
    print(f"  end to end: +{got['captured'] - got['not-captured']:.2f} us per custom op")
    tag = args.tag or (
        f"cpu-{os.cpu_count()}core-{torch.get_num_threads()}thread"
        if device.type == "cpu"
        else torch.cuda.get_device_name().lower().replace(" ", "-")
    )
    write_csv(rows, args.out / f"runtime_rng_{tag}.csv")
    write_json(rows, args.out / f"runtime_rng_{tag}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

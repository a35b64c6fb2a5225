"""What does one view cost at the end of a chain of ``k`` views, ``y = y.view(n)``?

In eager mode a view costs the same at any depth. A view of a wrapper subclass costs autograd
O(depth) (NOTE [ View chains ] in tritondtr/runtime/tensor.py), so a chain of ``k`` views is
O(k^2) unless the runtime keeps the chains short.

# NOTE [ View chain benchmark ]
# 1. Cases: ``chain`` (``k`` views of a tensor made inside the session, then the chain is
#    dropped: making and freeing) and ``chain+backward`` (the same from a tensor that
#    requires grad, then ``y.sum().backward()``).
# 2. Providers: ``eager``; ``wrapper-floor`` (benchmarks/floor.py: the least a wrapper
#    subclass does, for what PyTorch itself costs a wrapper); ``tracking`` (tritondtr,
#    ``budget=None``).
# 3. One sample = one whole case; rows: ``view_time``, us per view (the sample / ``k``).

examples:
  python benchmarks/bench_runtime_view_chain.py                 # ~1 min on 2 CPU cores
  python benchmarks/bench_runtime_view_chain.py --depths 100 1000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from floor import WrapperFloor  # noqa: E402
from harness import Env, Row, describe_device, measure, write_csv, write_json  # noqa: E402

from tritondtr.runtime import enable  # noqa: E402

CASES = ("chain", "chain+backward")
PROVIDERS = ("eager", "wrapper-floor", "tracking")


def _context(provider: str):
    if provider == "tracking":
        return enable(budget=None)
    if provider == "wrapper-floor":
        return WrapperFloor()
    return nullcontext()


def case_fn(case: str, k: int, numel: int):
    """``k`` views of a fresh tensor (one made by an op, so tracked inside a session)."""
    grad = case == "chain+backward"

    def run():
        x = torch.randn(numel, requires_grad=grad)
        y = x * 1
        for _ in range(k):
            y = y.view(numel)
        if grad:
            y.sum().backward()

    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--depths", type=int, nargs="+", default=[100, 1000, 3000], help="chain k")
    p.add_argument("--numel", type=int, default=64, help="elements of the viewed tensor")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--repeats", type=int, default=5, help="samples (default: 5)")
    p.add_argument("--out", type=Path, default=Path("out/bench"), help="output folder")
    p.add_argument("--tag", default=None, help="file name tag (default: the CPU)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    dev, env = describe_device("cpu"), Env.capture()
    print(f"# us per view at the end of a chain of k views, {dev}")
    rows: list[Row] = []
    for case in CASES:
        for k in args.depths:
            for provider in PROVIDERS:
                with _context(provider):
                    t = measure(
                        case_fn(case, k, args.numel),
                        warmup=1,
                        repeats=args.repeats,
                        min_sample_s=0.0,
                        max_time_s=60.0,
                    )
                us = t.stats(1e6 / k)
                rows.append(
                    Row.of(
                        "view_time",
                        provider,
                        k,
                        us,
                        "us",
                        device=dev,
                        env=env,
                        timing=t,
                        params=f"case={case};numel={args.numel}",
                    )
                )
                print(f"  {case:15s} k={k:5d} {provider:14s} {us.median:9.2f} us/view", flush=True)
    tag = args.tag or f"cpu-{os.cpu_count()}core-{torch.get_num_threads()}thread"
    write_csv(rows, args.out / f"runtime_view_chain_{tag}.csv")
    write_json(rows, args.out / f"runtime_view_chain_{tag}.json")
    lines = [
        f"Hardware: {dev}",
        "",
        "| case | k | " + " | ".join(f"{p} us/view" for p in PROVIDERS) + " |",
        "|---|---:|" + "---:|" * len(PROVIDERS),
    ]
    for case in CASES:
        for k in args.depths:
            get = {
                r.provider: r.median
                for r in rows
                if r.size == k and r.params.startswith(f"case={case};")
            }
            lines.append(
                f"| {case} | {k} | " + " | ".join(f"{get[p]:.2f}" for p in PROVIDERS) + " |"
            )
    (args.out / f"runtime_view_chain_{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

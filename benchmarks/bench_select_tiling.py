"""Which tiling makes the one-launch selection fastest here: a sweep of its block and programs.

``kernels.Selection`` picks a block of slots per tile and a number of programs (NOTE [
One-launch selection ] in kernels/topk_select.py; ``_block`` and ``_programs``). This sweep
times the kernel alone at every (block, programs) for a few N and k, checks each one's
victims against the torch twin, and prints the best against the default. On CUDA the
launches are queued behind a sleep, so CUDA events time the kernels back to back, not the
host; on the CPU (``TRITON_INTERPRET=1``, toy sizes) it times the interpreter, which says
nothing about a GPU and only keeps the script working.

examples:
  python benchmarks/bench_select_tiling.py --out out/tiling   # 1e6 and 2^24 on CUDA
  python benchmarks/bench_select_tiling.py --sizes 1e5 --k 1 --out out/tiling
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from bench_scoring import parse_size  # noqa: E402
from harness import describe_device  # noqa: E402
from scoring_baselines import synthetic_columns  # noqa: E402

from tritondtr import policy  # noqa: E402
from tritondtr.engine.table import MetadataTable  # noqa: E402

BYTES_PER_SLOT = 25  # dtr reads cost, size, last_access, nbhd_cost, state


def kernel_us(sel, now: int, rand_base: int, cuda: bool, reps: int) -> float:
    """Microseconds per launch of ``sel``: median of 3 batches of ``reps`` launches."""
    sel(now, rand_base)
    out = []
    for _ in range(3):
        if cuda:
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(200_000_000)  # ~0.1 s: the launches queue up behind it
            start.record()
            for _ in range(reps):
                sel(now, rand_base)
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3 / reps)
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                sel(now, rand_base)
            out.append((time.perf_counter() - t0) * 1e6 / reps)
    return statistics.median(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--sizes", nargs="+", type=parse_size, help="N (default: 1e6 and 16777216 on CUDA)"
    )
    ap.add_argument("--k", nargs="+", type=int, default=[1, 8], help="victims per decision")
    ap.add_argument("--out", type=Path, default=Path("out/tiling"), help="output folder")
    args = ap.parse_args(argv)
    if any(k < 1 or k > 64 for k in args.k):
        ap.error("k must lie in 1..64 (larger k sorts: no tiling to choose)")
    from tritondtr.kernels import topk_select

    from tritondtr import kernels
    from tritondtr.policy.scoring import random_base

    cuda = torch.cuda.is_available()
    if not cuda and not policy.triton_available():
        print("nothing to measure: no CUDA device and no triton", file=sys.stderr)
        return 1
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        import os

        if os.environ.get("TRITON_INTERPRET") != "1":
            print("on a CPU the kernels need TRITON_INTERPRET=1", file=sys.stderr)
            return 1
    sizes = args.sizes or ([10**6, 2**24] if cuda else [5000])
    blocks = [512, 1024, 2048, 4096] if cuda else [1024, 4096]
    sms = topk_select._sm_count(device.index or 0) if cuda else 1
    mults = [1, 2, 4, 8, 16] if cuda else [1, 2]
    reps = 200 if cuda else 3
    rows, failures = [], 0
    for n in sizes:
        cols, now = synthetic_columns(n, seed=n)
        dev = {c: v.to(device) for c, v in cols.items()}
        five = tuple(dev[c] for c in MetadataTable.COLUMNS)
        rb = random_base(0, now)
        for k in args.k:
            ref = policy.select("dtr", cols, now, k=k, backend="torch").tolist()
            default = kernels.Selection("dtr", five, k=k)
            base = kernel_us(default, now, rb, cuda, reps)
            rows.append(dict(n=n, k=k, block="default", programs="default", us=base))
            for block in blocks:
                tiles = -(-n // block)
                for m in mults:
                    p = min(tiles, sms * m)
                    sel = kernels.Selection("dtr", five, k=k, block=block, programs=p)
                    if sel.victims(now, rb) != ref:
                        failures += 1
                        print(f"MISMATCH n={n} k={k} block={block} programs={p}", file=sys.stderr)
                        continue
                    us = kernel_us(sel, now, rb, cuda, reps)
                    rows.append(dict(n=n, k=k, block=block, programs=p, us=us))
            mine = [r for r in rows if r["n"] == n and r["k"] == k and r["block"] != "default"]
            best = min(mine, key=lambda r: r["us"])
            gbs = BYTES_PER_SLOT * n / best["us"] * 1e-3
            print(
                f"N={n:,} k={k}: default {base:.1f} us; best {best['us']:.1f} us at block "
                f"{best['block']}, {best['programs']} programs ({gbs:.0f} GB/s read)"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    tag = "cuda" if cuda else "cpu-interpreter"
    path = args.out / f"select_tiling_{tag}.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, ["device", "n", "k", "block", "programs", "us"])
        w.writeheader()
        for r in rows:
            w.writerow(dict(r, device=describe_device(device), us=round(r["us"], 2)))
    print(f"rows: {path}")
    return 2 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

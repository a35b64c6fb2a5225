"""What does one op cost under tritondtr, in microseconds, on top of eager?

A chain of ``K`` ops on a small tensor (so that the kernel itself costs little) runs inside
one session, and the time per op is compared with the same chain in eager mode. The
difference is the runtime's per-op work: dispatch mode, wrapper tensors, recipe, metadata
table row, byte accounting, freeing of the previous link.

# NOTE [ Dispatch benchmark ]
# 1. Cases: ``add`` (a fresh output per op), ``view`` (a view of the previous view: a chain
#    of ``K`` views, no storage), ``view-base`` (a view of the same base each time), ``detach``
#    (``detach`` of the same base: what autograd does to every output it saves), ``inplace``
#    (``add_`` on a tracked tensor: a new storage version), ``mm`` (16 x 16 matmul),
#    ``add+grad`` (``add`` on a tensor that requires grad: autograd records every op).
# 2. Settings: ``eager``; ``tracking`` (``budget=None``); ``not-binding`` (a budget of 1 GiB,
#    so budget checks and locking run but nothing is evicted); ``timeline`` (not binding,
#    with ``timeline=True``: the memory timeline's row per op, NOTE [ Memory timeline ]).
# 3. One sample = one chain of ``K`` ops inside an already entered session; the session's
#    setup is its own row (``session_setup``: ``with enable(): one op``).
# 4. Rows: ``op_time`` (us per op) per case and setting; ``overhead`` (us per op, setting
#    median minus eager median).

examples:
  python benchmarks/bench_runtime_dispatch.py          # ~20 s on 2 CPU cores
  python benchmarks/bench_runtime_dispatch.py --device cuda --numel 1024
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import Env, Row, Stats, describe_device, measure, write_csv, write_json  # noqa: E402

from tritondtr.runtime import enable  # noqa: E402

CASES = ("add", "view", "view-base", "detach", "inplace", "mm", "add+grad")
SETTINGS = {
    "eager": None,
    "tracking": {"budget": None},
    "not-binding": {"budget": 1 << 30},
    "timeline": {"budget": 1 << 30, "timeline": True},
}


def chain(case: str, k: int, numel: int, device: str):
    """A function running ``k`` ops of ``case`` (its inputs are made when it is built, so
    inside the session when built there: tracked)."""
    if case == "mm":
        x = torch.randn(16, 16, device=device)
        w = torch.randn(16, 16, device=device)
    else:
        x = torch.randn(numel, device=device, requires_grad=case == "add+grad")
        w = torch.randn(numel, device=device)
    if case in ("add", "add+grad"):

        def run():
            y = x
            for _ in range(k):
                y = torch.add(y, w)
    elif case == "view":
        y0 = torch.add(x, w)  # a tracked base inside a session

        def run():
            y = y0
            for _ in range(k):
                y = y.view(-1)
    elif case == "view-base":
        y0 = torch.add(x, w)

        def run():
            for _ in range(k):
                y0.view(-1)
    elif case == "detach":
        y0 = torch.add(x, w)

        def run():
            for _ in range(k):
                y0.detach()
    elif case == "inplace":
        y0 = torch.add(x, w)

        def run():
            for _ in range(k):
                y0.add_(w)
    else:

        def run():
            y = x
            for _ in range(k):
                y = torch.mm(y, w)

    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--ops", type=int, default=200, help="ops per chain K (default: 200)")
    p.add_argument("--numel", type=int, default=64, help="elements per tensor (default: 64)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--repeats", type=int, default=15, help="samples (default: 15)")
    p.add_argument("--out", type=Path, default=Path("out/bench"), help="output folder")
    p.add_argument("--tag", default=None, help="file name tag (default: device)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    dev, env, k = describe_device(args.device), Env.capture(), args.ops
    print(f"# per-op cost, {dev}")
    rows: list[Row] = []
    for case in CASES:
        eager_us = None
        for setting, kw in SETTINGS.items():
            session = enable(**kw) if kw is not None else None
            if session is not None:
                session.__enter__()
            try:
                run = chain(case, k, args.numel, args.device)
                t = measure(
                    run, device=args.device, warmup=2, repeats=args.repeats, min_sample_s=0.0
                )
            finally:
                if session is not None:
                    session.__exit__(None, None, None)
            us = t.stats(1e6 / k)
            params = f"case={case};ops={k};numel={args.numel}"
            rows.append(
                Row.of(
                    "op_time",
                    setting,
                    args.numel,
                    us,
                    "us",
                    device=dev,
                    env=env,
                    timing=t,
                    params=params,
                )
            )
            if eager_us is None:
                eager_us = us.median
            else:
                rows.append(
                    Row.of(
                        "overhead",
                        setting,
                        args.numel,
                        Stats.of([us.median - eager_us]),
                        "us",
                        device=dev,
                        env=env,
                        params=params,
                    )
                )
            print(
                f"  {case:9s} {setting:12s} {us.median:8.2f} us/op (+{us.median - eager_us:7.2f})",
                flush=True,
            )

    def setup():
        with enable(budget=None):
            torch.add(torch.ones(1, device=args.device), 1)

    t = measure(setup, device=args.device, warmup=2, repeats=args.repeats, min_sample_s=0.0)
    rows.append(
        Row.of(
            "session_setup",
            "tracking",
            1,
            t.stats(1e6),
            "us",
            device=dev,
            env=env,
            timing=t,
            params="with enable(): one op",
        )
    )
    print(f"  session setup + one op: {t.stats(1e6).median:.1f} us")
    device = torch.device(args.device).type
    tag = args.tag or (
        f"cpu-{os.cpu_count()}core-{torch.get_num_threads()}thread"
        if device == "cpu"
        else torch.cuda.get_device_name().lower().replace(" ", "-")
    )
    write_csv(rows, args.out / f"runtime_dispatch_{tag}.csv")
    write_json(rows, args.out / f"runtime_dispatch_{tag}.json")
    lines = [
        f"Hardware: {dev}",
        "",
        "| case | eager us/op | "
        + " | ".join(f"{s} us/op (overhead)" for s in list(SETTINGS)[1:])
        + " |",
        "|---|---:|" + "---:|" * (len(SETTINGS) - 1),
    ]
    for case in CASES:
        get = {(r.what, r.provider): r.median for r in rows if r.params.startswith(f"case={case};")}
        lines.append(
            f"| {case} | {get['op_time', 'eager']:.2f} | "
            + " | ".join(
                f"{get['op_time', s]:.2f} (+{get['overhead', s]:.2f})" for s in list(SETTINGS)[1:]
            )
            + " |"
        )
    lines.append(f"\nSession setup (`with enable(): one op`): {t.stats(1e6).median:.0f} us.")
    (args.out / f"runtime_dispatch_{tag}.md").write_text("\n".join(lines) + "\n")
    over = {
        s: [
            next(
                r.median
                for r in rows
                if r.what == "overhead" and r.provider == s and r.params.startswith(f"case={c};")
            )
            for c in CASES
        ]
        for s in list(SETTINGS)[1:]
    }
    _bars(
        list(CASES),
        over,
        "overhead per op (us)",
        f"tritondtr per-op overhead\n{dev}",
        args.out / f"runtime_dispatch_{tag}.png",
    )
    print("\n".join(lines))
    return 0


def _bars(
    groups: list[str], series: dict[str, list[float]], ylabel: str, title: str, path: Path
) -> None:
    """Grouped bars: one group per entry of ``groups``, one bar per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        ax.bar([g + i * width for g in range(len(groups))], values, width, label=name)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], groups)
    ax.set(ylabel=ylabel)
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

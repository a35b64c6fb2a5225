"""What should the runtime keep when FSDP2 frees a block's parameters (NOTE [ FSDP2 ] rule 2)?

# NOTE [ FSDP2 cut benchmark ]
# 1. Program: tests/runtime/test_fsdp2.py's transformer-like stack (each block and the root
#    ``fully_shard``-ed), one AdamW step, two gloo processes on this machine, one torch thread
#    each. Shapes: ``acts`` (the test's: width 33, 3 blocks, 4 x 47 tokens: activations
#    dominate), ``params`` (width 64, 3 blocks, 2 x 16 tokens: a block's parameters outweigh its
#    activations).
# 2. Policies: ``min`` (the runtime's: the cheapest cut per group and free), and one cut
#    always: ``held`` (anchor the held dependents), ``readers`` (anchor the storages that read
#    the parameters) and ``copy`` (copy the parameters). Settings: ``stress``, and 90, 70, 50
#    and 30 % of the unlimited peak (which counts FSDP's unsharded parameters: rule 3).
# 3. Rows (rank 0): ``peak`` (bytes, the session's accounting), ``remats``, ``step_time`` (ms,
#    forward + backward + step, median of ``--rounds``), ``ok`` (1 if the step ran and its
#    loss, gradient shards and updated shards equal FSDP2 without tritondtr, 0 if it raised
#    or differed: the note says which). A failing setting fails on both ranks alike (the
#    sizes decide it), so no rank waits on a collective the other left.

examples:
  python benchmarks/bench_runtime_fsdp.py                 # ~2 min on 2 CPU cores
  python benchmarks/bench_runtime_fsdp.py --shapes acts --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the repository root, for the tests' helpers (tests.zoo)

from harness import Env, Row, Stats, describe_device, write_csv, write_json  # noqa: E402

from tests.runtime.test_fsdp2 import Net, _free_port  # noqa: E402

SHAPES = {"acts": (33, 3, (4, 47)), "params": (64, 3, (2, 16))}  # width, depth, tokens
POLICIES = ("min", "held", "readers", "copy")
SETTINGS = ("stress", "90%", "70%", "50%", "30%")


def _model(width: int, depth: int):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Net(d=width, depth=depth)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _step(shape, x, y, kw=None, policy="min"):
    from tritondtr.runtime import enable, unwrap

    model, opt = _model(*SHAPES[shape][:2])
    session = enable(**kw) if kw is not None else contextlib.nullcontext()
    if kw is not None:
        session.fsdp.policy = policy
    t0 = time.perf_counter()
    with session:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    dt = time.perf_counter() - t0
    out = [unwrap(loss).detach().clone()]
    out += [p.grad.to_local().clone() for p in model.parameters()]
    out += [p.detach().to_local().clone() for p in model.parameters()]
    return dt, out, session if kw is not None else None


def _worker(rank: int, port: int, out_dir: str, shapes, rounds: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    results = []
    try:
        for shape in shapes:
            g = torch.Generator().manual_seed(100 + rank)
            b, t = SHAPES[shape][2]
            x, y = torch.randn(b, t, 5, generator=g), torch.randint(0, 7, (b * t,), generator=g)
            _, ref, _ = _step(shape, x, y)
            _, _, s = _step(shape, x, y, {"budget": None})
            peak = s.stats.peak_bytes
            for _ in range(rounds):
                for policy in POLICIES:
                    for setting in SETTINGS:
                        kw = {"stress": True} if setting == "stress" else None
                        if kw is None:
                            kw = {"budget": int(peak * int(setting[:-1]) / 100)}
                        rec = {"shape": shape, "policy": policy, "setting": setting}
                        try:
                            dt, got, s = _step(shape, x, y, kw, policy)
                        except Exception as e:
                            rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                        else:
                            same = all(torch.equal(a, b) for a, b in zip(got, ref))
                            st = s.stats
                            rec.update(
                                ok=same, ms=dt * 1e3, peak=st.peak_bytes, base=peak,
                                remats=st.rematerializations, cuts=dict(s.fsdp.cuts),
                            )  # fmt: skip
                        results.append(rec)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def rows_for(results: list[dict], env: Env, device: str) -> list[Row]:
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["shape"], r["policy"], r["setting"]), []).append(r)
    rows = []
    for (shape, policy, setting), rs in groups.items():
        params = f"shape={shape};setting={setting}"
        good = [r for r in rs if "error" not in r and r["ok"]]
        note = rs[0].get("error", "") if not good else f"cuts={good[-1]['cuts']}"
        if good and len(good) < len(rs):
            note += f";{len(rs) - len(good)} of {len(rs)} failed"

        def row(what, xs, unit, policy=policy, params=params, note=note):
            return Row.of(what, policy, 0, Stats.of(xs), unit, device=device, env=env,
                          params=params, note=note)  # fmt: skip

        rows.append(row("ok", [float("error" not in r and r["ok"]) for r in rs], "1"))
        if good:
            base = f"base={good[0]['base']}"
            rows.append(row("peak", [r["peak"] for r in good], "bytes", note=base))
            rows.append(row("remats", [r["remats"] for r in good], "count"))
            rows.append(row("step_time", [r["ms"] for r in good], "ms"))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--tag", default="cpu-2core-1thread")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # as in the workers; the rows' device string says so
    shapes = args.shapes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(_free_port(), tmp, shapes, args.rounds), nprocs=2,
                           start_method="spawn")  # fmt: skip
        results = torch.load(os.path.join(tmp, "rank0.pt"), weights_only=False)
    env, device = Env.capture(), describe_device("cpu")
    rows = rows_for(results, env, device)
    print("| shape | setting | policy | ok | peak (of base) | remats | step ms | note |")
    print("|---|---|---|---|---|---|---|---|")
    by = {(r.params, r.provider, r.what): r for r in rows}
    for shape in shapes:
        for setting in SETTINGS:
            for policy in POLICIES:
                key = f"shape={shape};setting={setting}"
                ok = by[(key, policy, "ok")]
                if (key, policy, "peak") not in by:
                    print(f"| {shape} | {setting} | {policy} | 0 | - | - | - | {ok.note} |")
                    continue
                peak, rem, ms = (by[(key, policy, w)] for w in ("peak", "remats", "step_time"))
                base = int(peak.note.split("=")[1])
                print(
                    f"| {shape} | {setting} | {policy} | {ok.median:.2g} | {peak.median:.0f} "
                    f"({peak.median / base:.0%}) | {rem.median:.0f} | {ms.median:.0f} | "
                    f"{ok.note} |"
                )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / f"runtime_fsdp_{args.tag}.csv")
    write_json(rows, out / f"runtime_fsdp_{args.tag}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

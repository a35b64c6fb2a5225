"""DistributedDataParallel (gloo, two CPU processes) gives the same gradients with tritondtr.

Each rank trains the same seeded model on its own shard: once in eager mode, twice under a
budget of half the rank's measured baseline peak (recomputing; offloading every victim) and
once under the stress setting. DDP averages gradients across ranks in its reducer hooks,
which run inside the backward pass, so
the all-reduced gradients must be ``torch.equal`` to eager's on every rank, and equal across
ranks. Each rank writes its results to a file; the test process compares them.

# NOTE [ DDP test harness ]
# 1. Processes are started with ``torch.multiprocessing.start_processes(..., "spawn")`` (a
#    fresh interpreter, as DDP users do) on a free localhost port taken from the OS.
# 2. Nothing can hang: the process group has a timeout, and the parent joins with a deadline
#    after which it kills the workers and fails the test.
# 3. DDP allocates its gradient buckets in C++ (``torch.empty``, then raw-pointer writes) and
#    rebuilds them once, at the forward after the first backward; the runtime leaves such
#    uninitialized buffers plain (NOTE [ What is tracked ] rule 5). The gradient comparison
#    runs two eager steps first; a model used only inside the context is its own test.
# 4. A worker killed by a signal (no Python exception: gloo's C++ threads abort with
#    "terminate called without an active exception" in about 1 of 12 runs on the 2-core CI
#    box, at this session's start as now, with no Python frame on the stack) is spawned
#    again, on a new port, at most twice; a worker that raised is reported at once.
"""

from __future__ import annotations

import datetime
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="torch.distributed with gloo is not available",
)

WORLD = 2
DEADLINE_S = 180.0  # whole test, spawn included (each worker imports torch)
PG_TIMEOUT_S = 60.0  # per collective
ATTEMPTS = 3  # NOTE [ DDP test harness ] rule 4


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)  # same weights on every rank (DDP also broadcasts rank 0's)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64),
        torch.nn.Tanh(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 4),
    )


def _step(ddp, x, y, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    ddp.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    loss.backward()
    return loss, [p.grad for p in ddp.parameters()]


def _worker(rank: int, port: int, out_dir: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tritondtr.runtime import enable, unwrap

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=PG_TIMEOUT_S),
    )
    try:
        g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
        x, y = torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
        ddp = DDP(_model())
        results: dict = {}

        def attempt(name: str, **kw) -> None:
            """Run a step under enable(**kw) (eager if kw is None); record the result, or
            the error as text so that every failing setting is reported at once."""
            try:
                with enable(**kw) as session:
                    loss, grads = _step(ddp, x, y, seed=7)
                results[name] = (
                    unwrap(loss).detach().clone(),
                    [unwrap(t).detach().clone() for t in grads],
                )
                st = session.stats
                results[name + " stats"] = (st.peak_bytes, st.evictions, st.rematerializations)
                results[name + " offload"] = (st.offloads, st.fetches + st.prefetches)
            except Exception as e:
                results[name] = f"{type(e).__name__}: {e}"

        # DDP rebuilds its gradient buckets once, in the forward after the first backward:
        # two eager steps first, so that happens outside tritondtr (NOTE [ DDP test harness ]
        # rule 3); test_ddp_whole_training_inside_context covers the other order.
        _step(ddp, x, y, seed=7)
        loss, grads = _step(ddp, x, y, seed=7)
        results["eager"] = (loss.detach().clone(), [t.detach().clone() for t in grads])
        attempt("unlimited", budget=None)
        peak = results["unlimited stats"][0] if "unlimited stats" in results else 4096
        attempt("half", budget=peak // 2)
        attempt("stress", stress=True)
        attempt("half, offload", budget=peak // 2, offload="1TB/s")  # every victim offloaded
        results["grad types"] = [type(p.grad).__name__ for p in ddp.parameters()]
        results["fresh"] = _fresh_ddp_inside_context(x, y, results["eager"])
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _fresh_ddp_inside_context(x, y, ref) -> str:
    """A new DDP model whose first two steps both run inside tritondtr: "ok", or what
    went wrong (the bucket rebuild allocates inside the context)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tritondtr.runtime import enable, unwrap

    ddp = DDP(_model())
    try:
        with enable(budget=None):
            _step(ddp, x, y, seed=7)
            loss, grads = _step(ddp, x, y, seed=7)
    except Exception as e:  # reported by the test
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    same = torch.equal(unwrap(loss), ref[0]) and all(
        torch.equal(unwrap(a), b) for a, b in zip(grads, ref[1])
    )
    return "ok" if same else "gradients differ from eager"


def _spawn(out_dir: str) -> None:
    """NOTE [ DDP test harness ] rules 1, 2 and 4."""
    for attempt in range(ATTEMPTS):
        try:
            _spawn_once(out_dir)
            return
        except mp.ProcessExitedException as e:  # killed by a signal: rule 4
            if e.signal_name is None or attempt == ATTEMPTS - 1:
                raise


def _spawn_once(out_dir: str) -> None:
    ctx = mp.start_processes(
        _worker, args=(_free_port(), out_dir), nprocs=WORLD, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not ctx.join(timeout=1.0):  # raises ProcessRaisedException if a worker failed
            if time.monotonic() > deadline:
                pytest.fail(f"DDP workers did not finish within {DEADLINE_S:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Every rank's results (one spawn for the module's tests)."""
    out = tmp_path_factory.mktemp("ddp")
    _spawn(str(out))
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


def test_ddp_gloo_gradients_equal_eager(ranks):
    for r, res in enumerate(ranks):
        ref_loss, ref_grads = res["eager"]
        for name in ("unlimited", "half", "stress", "half, offload"):
            assert not isinstance(res[name], str), f"rank {r}, {name}: {res[name]}"
            loss, grads = res[name]
            assert torch.equal(loss, ref_loss), f"rank {r}, {name}: loss differs from eager"
            assert len(grads) == len(ref_grads)
            for k, (a, b) in enumerate(zip(grads, ref_grads)):
                assert torch.equal(a, b), f"rank {r}, {name}: gradient {k} differs from eager"
        for name in ("half", "stress"):
            _, evictions, remats = res[name + " stats"]
            assert evictions > 0 and remats > 0, (name, evictions, remats)
        offloads, back = res["half, offload offload"]
        assert res["half, offload stats"][1] > 0 and offloads > 0 and back > 0
        assert res["half, offload stats"][2] == 0  # NOTE [ Offload ]: nothing recomputed
        assert res["grad types"] == ["Tensor"] * len(ref_grads), (
            "parameter gradients must stay plain tensors"
        )
    # DDP averaged the gradients: every rank holds the same ones, although losses differ.
    for a, b in zip(ranks[0]["eager"][1], ranks[1]["eager"][1]):
        assert torch.equal(a, b)
    assert not torch.equal(ranks[0]["eager"][0], ranks[1]["eager"][0])


def test_ddp_whole_training_inside_context(ranks):
    """A DDP model used only inside the context: its bucket rebuild runs under tritondtr."""
    for r, res in enumerate(ranks):
        assert res["fresh"] == "ok", f"rank {r}: {res['fresh']}"

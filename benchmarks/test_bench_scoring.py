"""Micro benchmarks of one eviction decision (pytest-benchmark), and checks of the baselines.

Run the timings with ``pytest benchmarks/test_bench_scoring.py --benchmark-enable``; under the
project's default ``--benchmark-disable`` every case runs once as a plain test (a few seconds).
Every case asserts its victim against the torch twin's, so a timing is never of a wrong answer.
On CUDA the timed call ends with the device-to-host read of the victim (``.tolist()``), which
synchronises, so pytest-benchmark's wall clock covers the device work.

The sweep over N with the committed results is ``benchmarks/bench_scoring.py``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from scoring_baselines import (
    PyColumns,
    score_numpy,
    select_numpy,
    select_python,
    synthetic_columns,
    synthetic_table,
)

from tritondtr import Heuristic, MetadataTable, SlotState, policy
from tritondtr.policy.scoring import select_torch

HEURISTICS = [h.value for h in Heuristic]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@functools.cache
def columns(n: int, device: str = "cpu") -> tuple[dict[str, torch.Tensor], int]:
    cols, now = synthetic_columns(n, seed=1, evictable=0.9)
    return {k: v.to(device) for k, v in cols.items()}, now


def twin(h: str, cols: dict[str, torch.Tensor], now: int) -> list[int]:
    c = [cols[k].cpu() for k in ("cost", "size", "last_access", "nbhd_cost", "state")]
    return select_torch(Heuristic(h), *c, now, k=1, seed=0).tolist()


def decider(provider: str, h: str, cols: dict[str, torch.Tensor], now: int):
    hh = Heuristic(h)
    if provider == "numpy":
        c = {k: v.numpy() for k, v in cols.items()}
        return lambda: select_numpy(hh, c, now)
    if provider == "python":
        p = PyColumns.of(cols)
        return lambda: select_python(hh, p, now)
    if provider == "torch-table":  # the five columns, evictable_size and the clock bounds
        table = synthetic_table({k: v.cpu() for k, v in cols.items()})
        return lambda: table.select(hh, now, k=1, backend="torch").tolist()
    backend = "triton" if provider == "triton" else "torch"
    return lambda: policy.select(hh, cols, now, k=1, backend=backend).tolist()


def float32_equal_scores(h: str, cols, now: int, a: list[int], b: list[int]) -> bool:
    """The Python loop scores in float64: it may pick another slot only among float32 ties."""
    if a == b:
        return True
    s = score_numpy(Heuristic(h), {k: v.cpu().numpy() for k, v in cols.items()}, now)
    return len(a) == len(b) == 1 and math.isclose(s[a[0]], s[b[0]], rel_tol=1.2e-7)


def run(benchmark, provider: str, h: str, n: int, device: str = "cpu") -> None:
    cols, now = columns(n, device)
    fn = decider(provider, h, cols, now)
    benchmark.group = f"decision N={n:,}"
    benchmark.extra_info.update(provider=provider, heuristic=h, n=n, device=device)
    got = benchmark(fn)
    want = twin(h, cols, now)
    if provider == "python":
        assert float32_equal_scores(h, cols, now, got, want), (got, want)
    else:
        assert got == want


@pytest.mark.parametrize("n", [1000, 100_000, 1_000_000], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("provider", ["torch", "torch-table", "numpy"])
def test_decision_dtr(benchmark, provider, n):
    run(benchmark, provider, "dtr", n)


@pytest.mark.parametrize("n", [1000, 100_000], ids=lambda n: f"N{n}")
def test_decision_dtr_python_loop(benchmark, n):
    run(benchmark, "python", "dtr", n)


@pytest.mark.parametrize("provider", ["torch", "torch-table", "numpy", "python"])
@pytest.mark.parametrize("h", HEURISTICS)
def test_decision_every_heuristic(benchmark, h, provider):
    run(benchmark, provider, h, 4097)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("n", [1_000_000, 2**24], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("provider", ["triton", "torch-cuda"])
def test_decision_dtr_cuda(benchmark, provider, n):
    run(benchmark, provider, "dtr", n, device="cuda")


def test_decision_from_a_table_with_staged_updates(benchmark):
    """The runtime's pattern: a few accesses staged on the host, then a decision (flush +
    select) through :class:`MetadataTable`."""
    cols, now = columns(10_000)
    table = MetadataTable(10_000)
    table.add_many(**{k: v.numpy() for k, v in cols.items()})
    touched = np.arange(0, 10_000, 1250)

    def decide() -> list[int]:
        for s in touched:
            table.touch(int(s), now - 1)
        return table.select("dtr", now).tolist()

    benchmark.group = "decision N=10,000"
    got = benchmark(decide)
    assert got == twin("dtr", {k: v.cpu() for k, v in table.columns().items()}, now)


# ------------------------------------------------------- the baselines on awkward input
def awkward(n: int, case: str) -> tuple[dict[str, torch.Tensor], int]:
    """Ties, NaN, inf, zero staleness and zero size, or nothing evictable."""
    cols, now = synthetic_columns(n, seed=3, evictable=0.6)
    if case == "ties":
        cols["cost"][:] = 1.0
        cols["nbhd_cost"][:] = 0.0
        cols["size"][:] = 4096
        cols["last_access"][:] = now - 7
    elif case == "nan-inf-zero":
        cols["cost"][::5] = float("nan")
        cols["cost"][1::7] = float("inf")
        cols["last_access"][2::3] = now  # zero staleness
        cols["size"][3::4] = 0
    elif case == "all-inf":
        cols["size"][:] = 0
    elif case == "none-evictable":
        cols["state"][:] = SlotState.RESIDENT_LOCKED
    return cols, now


@pytest.mark.parametrize("case", ["ties", "nan-inf-zero", "all-inf", "none-evictable"])
@pytest.mark.parametrize("n", [1, 127, 4097], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("h", HEURISTICS)
def test_baselines_match_the_twin(h, n, case):
    cols, now = awkward(n, case)
    want = twin(h, cols, now)
    assert select_numpy(Heuristic(h), {k: v.numpy() for k, v in cols.items()}, now) == want
    got = select_python(Heuristic(h), PyColumns.of(cols), now)
    assert float32_equal_scores(h, cols, now, got, want), (got, want)

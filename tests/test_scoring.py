"""The torch twins against an independent scalar reference written from NOTE [ Scoring rules ]."""

import math

import numpy as np
import pytest
import torch

from tritondtr import Heuristic, register_heuristic
from tritondtr.heuristics import unregister_heuristic
from tritondtr.scoring import random_base, score_torch, select_torch

F32 = np.float32


def reference_score(h: Heuristic, cost, size, last, nbhd, now, slot, seed):
    """One slot's score, scalar by scalar, with numpy float32 arithmetic."""
    if h is Heuristic.LRU:
        return int(last)
    if h is Heuristic.SIZE:
        return -int(size)
    if h is Heuristic.RANDOM:
        x = (slot ^ random_base(seed, now)) & 0xFFFFFFFF
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        x ^= x >> 16
        return float(F32(x >> 8) * F32(2.0**-24))
    s = F32(now - last)
    if h is Heuristic.MSPS:
        num, den = F32(cost) + F32(nbhd), F32(size)
    elif h is Heuristic.DTR_LOCAL:
        num, den = F32(cost), F32(size) * s
    else:
        num, den = F32(cost) + F32(nbhd), F32(size) * s
    if not den > 0:
        return math.inf
    with np.errstate(all="ignore"):
        v = float(num / den)
    return math.inf if math.isnan(v) else v


def make_columns(n, seed):
    g = torch.Generator().manual_seed(seed)
    cost = torch.rand(n, generator=g) * 10
    cost[torch.randint(0, n, (max(1, n // 10),), generator=g)] = 1.0  # ties
    cost[torch.randint(0, n, (max(1, n // 50),), generator=g)] = float("nan")
    cost[torch.randint(0, n, (max(1, n // 50),), generator=g)] = float("inf")
    size = torch.randint(0, 4, (n,), generator=g) * 256  # zero sizes and ties
    last = torch.randint(0, 12, (n,), generator=g)  # some equal to now -> zero staleness
    nbhd = torch.rand(n, generator=g).where(torch.rand(n, generator=g) < 0.5, torch.tensor(0.0))
    state = torch.randint(0, 4, (n,), generator=g).to(torch.int8)
    return cost, size, last, nbhd, state


@pytest.mark.parametrize("h", list(Heuristic), ids=lambda h: h.value)
@pytest.mark.parametrize("n", [1, 127, 1000])
def test_twin_matches_scalar_reference(h, n):
    now, seed = 11, 3
    cost, size, last, nbhd, state = make_columns(n, seed=n)
    got = score_torch(h, cost, size, last, nbhd, state, now, seed)
    assert got.dtype == h.score_dtype
    for i in range(n):
        if state[i] != 1:
            assert got[i].item() in (math.inf, torch.iinfo(torch.int64).max)
            continue
        want = reference_score(h, cost[i].item(), size[i].item(), last[i].item(),
                               nbhd[i].item(), now, i, seed)
        assert got[i].item() == want, (i, got[i].item(), want)
    # selection: lexicographic (score, slot) order over candidates, first k
    cand = [i for i in range(n) if state[i] == 1]
    order = sorted(cand, key=lambda i: (got[i].item(), i))
    for k in (1, 3, n + 5):
        sel = select_torch(h, cost, size, last, nbhd, state, now, k, seed)
        assert sel.dtype == torch.int64
        assert sel.tolist() == order[:k]


def test_nothing_evictable_gives_empty():
    cost, size, last, nbhd, state = make_columns(50, seed=0)
    state.fill_(2)
    for h in Heuristic:
        assert select_torch(h, cost, size, last, nbhd, state, 20, 4).numel() == 0


def test_random_is_reproducible_and_changes_per_decision():
    cols = make_columns(1000, seed=1)
    a = score_torch(Heuristic.RANDOM, *cols, now=20, seed=7)
    b = score_torch(Heuristic.RANDOM, *cols, now=20, seed=7)
    c = score_torch(Heuristic.RANDOM, *cols, now=21, seed=7)
    assert torch.equal(a, b) and not torch.equal(a, c)
    finite = a[a.isfinite()]
    assert 0.4 < finite.mean().item() < 0.6  # uniform on [0, 1): mean 0.5, sd/sqrt(n) ~ 0.013


def test_custom_heuristic_is_used_and_validated():
    register_heuristic("biggest_cost", lambda cost, size, last, nbhd, now: -cost)
    try:
        cost = torch.tensor([1.0, 5.0, float("nan"), 3.0])
        z = torch.zeros(4, dtype=torch.int64)
        state = torch.tensor([1, 1, 1, 2], dtype=torch.int8)
        from tritondtr.heuristics import get_heuristic

        h = get_heuristic("biggest_cost")
        assert select_torch(h, cost, z, z, torch.zeros(4), state, 1, k=3).tolist() == [1, 0, 2]
        with pytest.raises(ValueError, match="already registered"):
            register_heuristic("biggest_cost", lambda *a: a[0])
        with pytest.raises(ValueError, match="already registered"):
            register_heuristic("dtr", lambda *a: a[0])
    finally:
        unregister_heuristic("biggest_cost")

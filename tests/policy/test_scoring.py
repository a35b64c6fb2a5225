"""The torch twins against the scalar specification of NOTE [ Scoring rules ] (policy/spec.py)."""

import math

import pytest
import torch

from tritondtr import Heuristic, register_heuristic
from tritondtr.policy import spec
from tritondtr.policy.heuristics import unregister_heuristic
from tritondtr.policy.scoring import random_base, score_torch, select_torch


def reference_score(h: Heuristic, cost, size, last, nbhd, now, slot, seed):
    """One slot's score by the readable specification (tritondtr/policy/spec.py)."""
    return spec.score(
        h, cost=cost, size=size, last_access=last, nbhd_cost=nbhd, now=now, slot=slot, seed=seed
    )


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


def extreme_columns(n, seed):
    """make_columns plus negative and -inf costs, negative neighbourhoods, any int8 state,
    sizes near 2**63 and clocks whose difference wraps in int64 (to exactly INT64_MIN too)."""
    g = torch.Generator().manual_seed(seed)
    cost, size, last, nbhd, _ = make_columns(n, seed)

    def some(p):
        return torch.rand(n, generator=g) < p

    cost = torch.where(some(0.3), -cost, cost)
    cost[some(0.02)] = -math.inf
    nbhd = torch.where(some(0.2), -nbhd, nbhd)
    size = torch.where(some(0.1), torch.randint(2**62, 2**63 - 1, (n,), generator=g), size)
    i64 = torch.iinfo(torch.int64)
    wrapping = torch.tensor([i64.min, i64.min + 11, i64.max, -5, 12, 11])  # now is 11
    last = torch.where(some(0.1), wrapping[torch.randint(0, 6, (n,), generator=g)], last)
    state = torch.randint(-128, 128, (n,), generator=g, dtype=torch.int8)
    state[some(0.5)] = 1
    return cost, size, last, nbhd, state


def check_against_reference(h, cols, now, seed, **hints):
    """``hints``: evictable_size and clock_bounds for the twin."""
    cost, size, last, nbhd, state = cols
    n = cost.numel()
    got = score_torch(h, *cols, now, seed, **hints)
    assert got.dtype == h.score_dtype
    for i in range(n):
        if state[i] != 1:
            assert got[i].item() in (math.inf, torch.iinfo(torch.int64).max)
            continue
        want = reference_score(
            h, cost[i].item(), size[i].item(), last[i].item(), nbhd[i].item(), now, i, seed
        )
        assert got[i].item() == want, (i, got[i].item(), want)
    # selection: lexicographic (score, slot) order over candidates, first k
    cand = [i for i in range(n) if state[i] == 1]
    order = sorted(cand, key=lambda i: (got[i].item(), i))
    for k in (1, 3, 8, n + 5):
        sel = select_torch(h, *cols, now, k, seed, **hints)
        assert sel.dtype == torch.int64
        assert sel.tolist() == order[:k]


@pytest.mark.parametrize("h", list(Heuristic), ids=lambda h: h.value)
@pytest.mark.parametrize("n", [1, 127, 1000, 5000])
def test_twin_matches_scalar_reference(h, n):
    check_against_reference(h, make_columns(n, seed=n), now=11, seed=3)


@pytest.mark.parametrize("h", list(Heuristic), ids=lambda h: h.value)
@pytest.mark.parametrize("n", [127, 5000])
def test_twin_matches_scalar_reference_on_extreme_values(h, n):
    check_against_reference(h, extreme_columns(n, seed=n), now=11, seed=3)


def oracle(h, cols, now, k, seed=0):
    """The first k candidates in (score, slot) order, by a Python sort of the twin's scores
    (which test_twin_matches_scalar_reference checks slot by slot)."""
    score = score_torch(h, *cols, now, seed).tolist()
    cand = [i for i, s in enumerate(cols[4].tolist()) if s == 1]
    return sorted(cand, key=lambda i: (score[i], i))[:k]


def structured(n, case):
    """Columns of n slots where every candidate scores 1 (dtr: cost 8, size 1, s 8; lru:
    last_access 3), shaped by ``case`` to reach each branch of the selection."""
    cost, nbhd = torch.full((n,), 8.0), torch.zeros(n)
    size, last = torch.ones(n, dtype=torch.int64), torch.full((n,), 3, dtype=torch.int64)
    state = torch.ones(n, dtype=torch.int8)
    if case == "ties-after-non-candidates":
        state[:3000] = 2
    elif case == "best-in-the-padded-row":
        cost[-1], last[-1] = 1.0, 2
    elif case == "equal-minima-in-several-rows":
        best = [5000, 100, 4097, 2047, 2048, 4096, 6000]
        cost[best], last[best] = 1.0, 2
    elif case == "every-candidate-inf":
        state[:] = 0
        state[4000::7] = 1
        size[:] = 0
        last[:] = 2**62  # non-candidates: lru key > every candidate's but still the worst
    elif case == "fewer-finite-than-k":
        size[:] = 0
        state[::5] = 0
        size[[6001, 5003]] = 1
        last[[6001, 5003]] = torch.tensor([1, 2])
    elif case == "nothing-evictable":
        state[:] = 3
    return cost, size, last, nbhd, state


CASES = [
    "ties-after-non-candidates",
    "best-in-the-padded-row",
    "equal-minima-in-several-rows",
    "every-candidate-inf",
    "fewer-finite-than-k",
    "nothing-evictable",
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("n", [6149, 50001], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("h", [Heuristic.DTR, Heuristic.LRU], ids=lambda h: h.value)
def test_selection_of_large_tables(h, n, case):
    cols = structured(n, case)
    for k in (1, 2, 8, 40):
        assert select_torch(h, *cols, 11, k).tolist() == oracle(h, cols, 11, k), k


@pytest.mark.parametrize("h", list(Heuristic), ids=lambda h: h.value)
def test_selection_of_a_large_random_table(h):
    cols = make_columns(50001, seed=5)
    for k in (1, 8):
        assert select_torch(h, *cols, 11, k, 3).tolist() == oracle(h, cols, 11, k, 3), k


def test_work_buffers_are_not_shared_with_results():
    a, b = make_columns(5000, seed=1), make_columns(5000, seed=2)
    first = score_torch(Heuristic.DTR, *a, 11)
    kept = first.clone()
    score_torch(Heuristic.DTR, *b, 11)
    select_torch(Heuristic.DTR, *b, 11, 8)
    select_torch(Heuristic.DTR, *make_columns(300, seed=3), 11)  # another N: new buffers
    assert torch.equal(first, kept)
    assert select_torch(Heuristic.DTR, *a, 11, 8).tolist() == oracle(Heuristic.DTR, a, 11, 8)


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
        from tritondtr.policy.heuristics import get_heuristic

        h = get_heuristic("biggest_cost")
        assert select_torch(h, cost, z, z, torch.zeros(4), state, 1, k=3).tolist() == [1, 0, 2]
        with pytest.raises(ValueError, match="already registered"):
            register_heuristic("biggest_cost", lambda *a: a[0])
        with pytest.raises(ValueError, match="already registered"):
            register_heuristic("dtr", lambda *a: a[0])
    finally:
        unregister_heuristic("biggest_cost")


def evictable_size(size, state):
    """The derived column a table keeps (NOTE [ Evictable size ]), from its definition."""
    return torch.where(state == 1, size.to(torch.float32), torch.tensor(math.nan))


@pytest.mark.parametrize("h", list(Heuristic), ids=lambda h: h.value)
@pytest.mark.parametrize("n", [127, 5000, 50001], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("make", [make_columns, extreme_columns], ids=["plain", "extreme"])
def test_given_evictable_size_gives_the_same_scores_and_victims(h, n, make):
    cols = make(n, seed=n)
    evs = evictable_size(cols[1], cols[4])
    assert torch.equal(score_torch(h, *cols, 11, 3, evs), score_torch(h, *cols, 11, 3))
    for k in (1, 8):
        assert select_torch(h, *cols, 11, k, 3, evs).tolist() == oracle(h, cols, 11, k, 3), k


def lean_traps(n):
    """Every candidate scores 1 (cost 8, size 1, s 8), except the slots where a lean score
    (NOTE [ Lean twin ] 2) is -inf but the exact one +inf: a negative numerator over a zero
    den, a positive one over den = -0.0 (size 0, last_access after now)."""
    cost, size, last, nbhd, state = structured(n, "ties-after-non-candidates")
    cost[4000], size[4000] = -1.0, 0
    nbhd[4100], size[4100] = -9.0, 0
    size[4200], last[4200] = 0, 15
    return cost, size, last, nbhd, state


@pytest.mark.parametrize(
    "h", [Heuristic.DTR, Heuristic.DTR_LOCAL, Heuristic.MSPS], ids=lambda h: h.value
)
@pytest.mark.parametrize("legit_minus_inf", [False, True], ids=["traps", "traps-and-minus-inf"])
def test_lean_minus_inf_is_settled_by_the_exact_scores(h, legit_minus_inf):
    cols = lean_traps(6149)
    if legit_minus_inf:
        cols[0][5000] = -math.inf  # den > 0: an exact score of -inf, the first victim
    exact = score_torch(h, *cols, 11)
    assert exact[4000] == math.inf and exact[4200] == math.inf
    if legit_minus_inf:
        assert exact[5000] == -math.inf
    for k in (1, 3, 40):
        got = select_torch(h, *cols, 11, k, 0, evictable_size(cols[1], cols[4]))
        assert got.tolist() == oracle(h, cols, 11, k), k


I64 = torch.iinfo(torch.int64)


@pytest.mark.parametrize(
    ("now", "edge"),
    [
        (2**31 - 1, 2**31 - 1),
        (2**31 - 1, 0),
        (2**31 - 1, 2**31),
        (5, -1),
        (2**31, 3),
        (7, 2**32 + 3),
        (7, I64.min),
        (7, I64.max),
        (-3, 2),
    ],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("n", [127, 5000], ids=lambda n: f"N{n}")
def test_both_clock_paths_match_the_reference(now, edge, n):
    """NOTE [ Lean twin ] 3: the int32 path where the clock bounds and now lie in [0, 2**31),
    int64 elsewhere; one edge value moves a column of small clocks across that boundary."""
    cost, size, last, nbhd, state = make_columns(n, seed=9)
    last = (now - last).clamp(0, 2**31 - 1)
    last[100], state[100], size[100], cost[100] = edge, 1, 256, 1.0  # a finite score if s > 0
    cols = (cost, size, last, nbhd, state)
    bounds = (int(last.min()), int(last.max()))
    for h in (Heuristic.DTR, Heuristic.DTR_LOCAL):
        check_against_reference(
            h,
            cols,
            now=now,
            seed=0,
            clock_bounds=bounds,
            evictable_size=evictable_size(size, state),
        )


@pytest.mark.parametrize("seed,now", [(0, 0), (3, 11), (2**32 + 5, 2**40), (-1, 7)])
def test_the_twins_random_base_is_the_specifications(seed, now):
    assert random_base(seed, now) == spec.random_base(seed, now)


@pytest.mark.parametrize("h", list(Heuristic), ids=lambda h: h.value)
def test_twin_selection_matches_the_specifications(h):
    cost, size, last, nbhd, state = make_columns(300, seed=7)
    want = spec.select(
        h,
        cost=cost.tolist(),
        size=size.tolist(),
        last_access=last.tolist(),
        nbhd_cost=nbhd.tolist(),
        state=state.tolist(),
        now=11,
        k=20,
        seed=3,
    )
    assert select_torch(h, cost, size, last, nbhd, state, 11, 20, 3).tolist() == want

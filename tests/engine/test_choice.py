"""The victim-choice strategies of tritondtr/engine/choice.py: which the engine picks, and the
stale batched choice (NOTE [ Stale batched choice ]), the one approximation among them."""

from __future__ import annotations

import random

import pytest

from tritondtr.engine.choice import MISS, BatchedChoice, BoundedStrategy, StaleChoice
from tritondtr.engine.engine import Engine


@pytest.mark.parametrize(
    "heuristic,reuse,strategy",
    [
        ("dtr_eq", 0, BoundedStrategy),  # a ratio heuristic on a CPU table
        ("lru", 0, BatchedChoice),
        ("dtr_eq", 4, StaleChoice),  # reuse > 0: the stale choice, bounds or not
        ("size", 2, StaleChoice),
    ],
)
def test_the_engine_picks_its_strategy(heuristic, reuse, strategy):
    eng = Engine(heuristic, device="cpu", reuse=reuse)
    assert type(eng.choice) is strategy
    assert eng.bounded == (strategy is BoundedStrategy)


def _engine(reuse: int, n: int = 24) -> tuple[Engine, list[int]]:
    eng = Engine("dtr_eq", device="cpu", batch=8, reuse=reuse)
    return eng, [eng.new(float(i + 1), 1 + i % 3, 0) for i in range(n)]


def test_stale_choice_serves_unchanged_candidates_across_ticks_and_mutations():
    eng, _ = _engine(reuse=4)
    first = eng.choose(10)
    assert first == eng.select(10, 1)[0]  # a scoring's first victim is exact
    scored = list(eng.choice.last.ids)
    selections = eng.selections
    eng.evict(first)
    eng.access(scored[1], 11)  # changed since the scoring: skipped from now on
    eng.lock(scored[2])  # no longer a candidate: skipped
    served = [eng.choose(12), eng.choose(13)]
    assert served == scored[3:5]  # the next unchanged candidates, in the scoring's order
    assert eng.selections == selections  # no scoring: a stale choice, not an exact one
    assert eng.choice.cached(eng, 15) is MISS  # 5 ticks after the scoring: too old
    assert eng.choose(15) == eng.select(15, 1)[0]


def test_stale_choice_within_one_loop_is_the_exact_choice():
    """Same clock and no mutation but evictions: the stale choice is rule 3 of NOTE [ Exact
    batched choice ], the same victims as a full re-scoring."""
    rng = random.Random(0)
    for _ in range(20):
        eng, _ = _engine(reuse=8, n=rng.randint(1, 40))
        now = rng.randint(1, 50)
        while (v := eng.choose(now)) is not None:
            assert v == eng.select(now, 1)[0]
            eng.evict(v)


def test_stale_choice_never_serves_a_non_candidate():
    rng = random.Random(1)
    eng, slots = _engine(reuse=16, n=40)
    now = 1
    for _ in range(300):
        now += rng.randint(0, 1)
        v = eng.choose(now)
        if v is None:
            break
        assert eng.is_candidate(v)
        eng.evict(v)
        if rng.random() < 0.5:
            eng.remat(v, now)
        for s in rng.sample(slots, 3):
            if eng.is_resident(s):
                eng.access(s, now)

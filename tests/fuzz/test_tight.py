"""The differential fuzzer's tight mode (NOTE [ Differential fuzzer ] rule 6 in check.py)
on a fixed set of seeds: programs and networks at 5-50 % of their peak, with ``evict_all()``
points and the twin on every budgeted run, equal eager PyTorch exactly. Plus: the budget
descent and its bisection, the inserted evictions, and a planted twin bug that only the
``evict_all`` events expose. Longer runs: ``python -m tests.fuzz --tight --seeds 0:5000
[--models]`` (docs/runtime.md, Tests)."""

from __future__ import annotations

import random

import pytest

import tritondtr.sim.twin as twin_module
from tests.fuzz.check import Tally, check_program, descend, report, with_evictions
from tests.fuzz.models import check_model
from tests.fuzz.programs import Program

PROGRAM_SEEDS = range(8)
MODEL_SEEDS = (5, 9)  # under 0.3 s each; the others are left to campaigns


@pytest.mark.parametrize("seed", PROGRAM_SEEDS, ids=lambda s: f"program{s}")
def test_tight_program_equals_eager(seed):
    failures = check_program(seed, tight=True)
    assert not failures, report(failures)


@pytest.mark.parametrize("seed", MODEL_SEEDS, ids=lambda s: f"model{s}")
def test_tight_model_equals_eager(seed):
    tally = Tally()
    failures = check_model(seed, tally, tight=True)
    assert not failures, report(failures)
    fit = tally.runs - 2 - tally.budget_errors  # budgeted runs that ended normally: all traced
    assert fit >= 1 and tally.twins >= fit and tally.evictions > 0, tally


def test_descend_bisects_between_the_lowest_fit_and_the_highest_miss():
    """Budgets fit from 330 bytes up (peak 1000): the default descent stops at the first
    BudgetError; the tight one goes on past one miss, stops at two, then bisects 400 | 300."""

    def tried(fractions, tight, fits) -> list[int]:
        seen: list[int] = []
        descend(1000, fractions, tight, lambda b: seen.append(b) or fits(b))
        return seen

    five = (0.5, 0.4, 0.3, 0.2, 0.1)
    assert tried(five, False, lambda b: b >= 330) == [500, 400, 300]
    assert tried(five, True, lambda b: b >= 330) == [500, 400, 300, 200, 350, 325]
    assert tried(five, True, lambda b: None) == [500]  # a crash: stop
    # no budgeted run fits: bisect below the unlimited run's peak
    assert tried((0.5, 0.4), True, lambda b: b >= 800) == [500, 400, 750, 875]


def test_with_evictions_inserts_after_the_seed_line_and_keeps_the_raise():
    body = ("torch.manual_seed(1)", "v1 = a0 * 2", "v2 = v1 + 1", "v3 = v2.sin()")
    for seed in range(40):
        prog = with_evictions(Program(0, (), body, (), raise_at=2), random.Random(seed))
        rest = [line for line in prog.body if line != "_S.evict_all()"]
        assert rest == list(body) and prog.body[0] == body[0]
        assert 1 <= len(prog.body) - len(body) <= 3
        ran = prog.body[: prog.raise_at]  # the lines before the raise: the same two
        assert [line for line in ran if line != "_S.evict_all()"] == list(body[:2])


def test_tight_mode_catches_a_twin_that_ignores_evict_all(monkeypatch):
    """With the twin's replay of ``evict_all`` events planted out, the tight runs of these
    seeds report a twin difference (the evictions ``evict_all`` made are not replayed)."""
    monkeypatch.setattr(twin_module, "_EVICT_ALL", -1)
    kinds = {f.kind for seed in PROGRAM_SEEDS for f in check_program(seed, tight=True)}
    assert "twin" in kinds, kinds

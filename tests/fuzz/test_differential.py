"""The differential fuzzer (NOTE [ Differential fuzzer ] in check.py) on a fixed set of seeds:
random programs and small networks under tritondtr (no budget, stress, descending budgets)
equal eager PyTorch exactly. Longer runs: ``python -m tests.fuzz --seeds 0:5000``
(docs/runtime.md, Tests)."""

from __future__ import annotations

import pytest

from tests.fuzz.check import check_program, report
from tests.fuzz.models import check_model

PROGRAM_SEEDS = range(100)
MODEL_SEEDS = (0, 1, 2, 4, 5, 9)  # conv2d, manual SGD, 3 steps; seed 3 (5 s) left to campaigns


@pytest.mark.parametrize("seed", PROGRAM_SEEDS, ids=lambda s: f"program{s}")
def test_program_equals_eager(seed):
    failures = check_program(seed)
    assert not failures, report(failures)


@pytest.mark.parametrize("seed", MODEL_SEEDS, ids=lambda s: f"model{s}")
def test_model_equals_eager(seed):
    failures = check_model(seed)
    assert not failures, report(failures)

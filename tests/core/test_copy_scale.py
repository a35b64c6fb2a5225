"""NOTE [ Copy price scale ] in tritondtr/core/tuning.py: the scale a copy's price is multiplied
by, chosen by the device time of rehearsed steps (the rehearsal itself:
tests/core/test_rehearsal.py); its effect on the twin's decisions (``inf`` is
recompute only, exactly; ``"trace"`` is the run of the candidate the choice keeps)."""

from __future__ import annotations

import math

import pytest
import torch

import tritondtr
from tests.zoo import make, train_step
from tritondtr.core.tuning import CANDIDATES, MARGIN, CopyScale, choose
from tritondtr.sim.simulate import simulate


def test_the_candidates_hold_both_ends_and_start_at_1():
    """Rule 3: with never-copy and copy-every-victim among them, the choice is never slower
    than the better of recompute only and offload only on the steps it rehearses."""
    assert CANDIDATES[0] == 1.0 and 0.0 in CANDIDATES and math.inf in CANDIDATES


def test_the_choice_is_due_once_the_first_steps_ops_ran_after_it():
    """Rules 4 and 5: a freeze right after another ends no step; the choice waits for as
    many ops as the first step had (an optimizer step inside the backward pass freezes per
    parameter); a fixed scale counts nothing."""
    tuner = CopyScale()
    ends = [tuner.step_ended(ops) for ops in (100, 100, 110, 150, 200)]
    assert ends == ["first", None, None, None, "choose"]
    steps = CopyScale()
    assert [steps.step_ended(ops) for ops in (100, 190, 290)] == ["first", None, "choose"]
    fixed = CopyScale(4.0)
    assert [fixed.step_ended(ops) for ops in (10, 20)] == [None, None] and fixed.value == 4.0


def test_the_least_time_is_chosen_for_good():
    tuner = CopyScale()
    tuner.chose({1.0: 50.0, 0.0: 40.0, 0.25: 30.0, math.inf: 45.0})
    assert tuner.value == 0.25 and tuner.fixed
    assert tuner.step_ended(99) is None  # chosen: no more steps counted


def test_no_choice_is_the_plain_price():
    tuner = CopyScale()
    tuner.stop()
    assert tuner.value == 1.0 and tuner.fixed
    assert choose({}) == 1.0


def test_scale_1_is_kept_unless_another_is_faster_by_the_margin():
    near = 100.0 * (1 - MARGIN / 2)
    assert choose({1.0: 100.0, 0.25: near}) == 1.0
    assert choose({1.0: 100.0, 0.25: 99.0, 0.0: 99.0}) == 0.25  # the first of equal ones
    assert choose({0.25: 7.0, 0.0: 5.0}) == 0.0  # 1 failed: not among them
    assert choose({1.0: 7.0, math.inf: 5.0}) == math.inf


def test_never_copying_is_kept_on_a_tie():
    """Rule 4: on a link too slow to pay, 1 and never copying make the same decisions, but 1
    still looks for a victim to copy ahead at every op."""
    assert choose({1.0: 10.0, 0.0: 50.0, 0.25: 10.0, math.inf: 10.0}) == math.inf
    assert choose({1.0: 10.0, 0.25: 9.0, math.inf: 9.0 * (1 + MARGIN / 2)}) == math.inf
    assert choose({1.0: 10.0, 0.25: 9.0, math.inf: 9.1}) == 0.25


@pytest.mark.parametrize("bad", [-1.0, math.nan])
def test_a_bad_scale_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="a copy price scale is >= 0"):
        CopyScale(bad)


def test_cheaper_prices_the_copy_side():
    assert CopyScale(1.0).cheaper(2.0, 3.0) and not CopyScale(1.0).cheaper(3.0, 3.0)
    assert CopyScale(1.0).cheaper(3.0, 3.0, or_equal=True)
    assert CopyScale(0.5).cheaper(5.0, 3.0)
    assert not CopyScale(math.inf).cheaper(0.0, 1e30, or_equal=True)  # never copies
    assert CopyScale(0.0).cheaper(1e30, 1e-9) and not CopyScale(0.0).cheaper(1.0, 0.0)


@pytest.fixture(scope="module")
def gpt_trace():
    """One training step of the zoo GPT, priced by the analytic model."""
    torch.manual_seed(0)
    case = make("gpt")
    opt = torch.optim.SGD(case.model.parameters(), lr=1e-2)
    with tritondtr.trace(None, budget=None, cost="analytic") as rec:
        train_step(case, opt)
    return rec.trace


def _counts(r):
    return (r.status, r.overhead, r.evictions, r.remats, r.peak_bytes, r.offloads)


def test_inf_is_recompute_only_exactly(gpt_trace):
    rec = simulate(gpt_trace, ratio=0.3, semantics="runtime", action="recompute")
    never = simulate(
        gpt_trace, ratio=0.3, semantics="runtime", offload_bandwidth="pcie4",
        prefetch="trace", copy_scale=math.inf,
    )  # fmt: skip
    assert never.offloads == 0 and never.copy_scale == math.inf
    assert _counts(never)[:5] == _counts(rec)[:5]


def test_trace_returns_the_run_the_tuner_keeps(gpt_trace):
    kw = dict(ratio=0.3, semantics="runtime", offload_bandwidth="pcie4", prefetch="trace")
    runs = {c: simulate(gpt_trace, copy_scale=c, **kw) for c in CANDIDATES}
    best = runs[choose({c: r.compute for c, r in runs.items() if r.ok})]
    tuned = simulate(gpt_trace, copy_scale="trace", **kw)
    assert _counts(tuned) == _counts(best) and tuned.copy_scale == best.copy_scale
    assert tuned.overhead <= runs[1.0].overhead
    one_step = simulate(gpt_trace, **kw)  # None: tuned over the trace's steps; one stays at 1
    assert _counts(one_step) == _counts(runs[1.0]) and one_step.copy_scale == 1.0


@pytest.mark.parametrize("bad", ["fast", -1, [1], True])
def test_simulate_refuses_a_bad_copy_scale(gpt_trace, bad):
    with pytest.raises(ValueError, match="copy_scale must be None, 'trace' or a number"):
        simulate(gpt_trace, ratio=0.3, semantics="runtime", copy_scale=bad)


def test_copy_scale_is_modelled_in_runtime_semantics_only(gpt_trace):
    with pytest.raises(ValueError, match="copy_scale is modelled in semantics='runtime' only"):
        simulate(gpt_trace, ratio=0.3, copy_scale=1.0)

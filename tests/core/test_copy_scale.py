"""NOTE [ Copy price scale ] in tritondtr/core/tuning.py: the scale a copy's price is multiplied
by, tuned over steps by their device time; its effect on the twin's decisions (``inf`` is
recompute only, exactly; ``"trace"`` is the run of the candidate the tuner keeps)."""

from __future__ import annotations

import math

import pytest
import torch

import tritondtr
from tests.zoo import make, train_step
from tritondtr.core.tuning import CANDIDATES, MARGIN, MAX_UNLIKE, CopyScale, choose
from tritondtr.sim.simulate import simulate


def _ended(tuner: CopyScale, times, length: int = 10) -> list[float]:
    """The scale each step ran at, steps taking ``times`` (ns) one after another, each
    ``length`` ops long (or a length per step)."""
    ran, now, ops = [], 0.0, 0
    lengths = length if isinstance(length, list) else [length] * len(times)
    for took, n in zip(times, lengths):
        ran.append(tuner.value)
        now += took
        ops += n
        tuner.step_ended(now, ops)
    return ran


def test_the_first_step_is_not_measured_then_each_candidate_runs_once():
    tuner = CopyScale()
    times = [1.0, 50.0, 40.0, 30.0]  # the first: 1 ns, unmeasured
    ran = _ended(tuner, times)
    assert ran == [1.0, *CANDIDATES]
    assert tuner.times == dict(zip(CANDIDATES, times[1:]))
    assert tuner.value == 0.25  # 30 ns, the least
    assert _ended(tuner, [5.0, 500.0]) == [0.25, 0.25]  # chosen for good


def test_every_candidate_copies_at_least_what_scale_1_copies():
    """Rule 3: a step that copies less can fail where copying runs (ThrashError at inf,
    BudgetError at 64 on the zoo LSTM at 5 %: tests/runtime/test_offload.py), and a
    candidate's step is the user's."""
    assert all(0.0 <= c <= 1.0 for c in CANDIDATES) and CANDIDATES[0] == 1.0


def test_equal_times_keep_scale_1():
    tuner = CopyScale()
    _ended(tuner, [7.0] + [10.0] * len(CANDIDATES))
    assert tuner.value == 1.0


def test_scale_1_is_kept_unless_another_is_faster_by_the_margin():
    near = 100.0 * (1 - MARGIN / 2)
    assert choose({1.0: 100.0, 0.25: near}) == 1.0
    assert choose({1.0: 100.0, 0.25: 99.0, 0.0: 99.0}) == 0.25  # the first of equal ones
    assert choose({0.25: 7.0, 0.0: 5.0}) == 0.0  # 1 failed: not among them
    tuner = CopyScale()
    _ended(tuner, [7.0, 1000.0, 999.5, 3000.0])
    assert tuner.value == 1.0


def test_steps_of_another_length_measure_nothing():
    """Rule 4: an evaluation pass, or a freeze that is not a step's end (an optimizer step
    inside the backward pass), is not compared with the steps; a freeze right after another
    (no op between) is no step at all."""
    tuner = CopyScale()
    ran = _ended(tuner, [1.0, 50.0, 5.0, 40.0, 0.0, 90.0], [10, 10, 3, 10, 0, 10])
    assert ran == [1.0, 1.0, 0.0, 0.0, 0.25, 0.25]
    assert tuner.times == {1.0: 50.0, 0.0: 40.0, 0.25: 90.0} and tuner.unlike == 1
    assert tuner.value == 0.0


def test_tuning_stops_at_1_when_no_step_is_like_the_first():
    tuner = CopyScale()
    lengths = [10, 10] + [11] * MAX_UNLIKE + [10] * 8
    ran = _ended(tuner, [5.0] * len(lengths), lengths)
    assert ran[2] == CANDIDATES[1] and ran[-1] == 1.0 and tuner.fixed
    assert tuner.times == {1.0: 5.0}


def test_a_fixed_scale_is_never_tuned():
    tuner = CopyScale(4.0)
    assert _ended(tuner, [1.0, 2.0, 3.0, 4.0]) == [4.0] * 4
    assert tuner.times == {}


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

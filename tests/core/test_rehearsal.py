"""NOTE [ Rehearsal ] in tritondtr/core/rehearsal.py: the tape of a driver's calls, replayed
on counting cores at each candidate copy price scale. The reference for a rehearsal's time
is a straight run of the twin at that scale, fixed from the first op."""

from __future__ import annotations

import math
import pathlib
import re
import warnings

import pytest
import torch

import tritondtr
from tests.zoo import make, train_step
from tritondtr.core import BudgetError, Core, rehearsal
from tritondtr.core.link import Link
from tritondtr.core.rehearsal import NOT_TAPED, TAPED, Idle
from tritondtr.core.tuning import CANDIDATES, choose
from tritondtr.sim.simulate import runtime_peak
from tritondtr.sim.twin import replay_runtime

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tritondtr"


@pytest.fixture(scope="module")
def gpt_steps():
    """Three SGD steps of the zoo GPT, unlimited, priced by the analytic model, and 30 % of
    their runtime peak."""
    torch.manual_seed(0)
    case = make("gpt")
    opt = torch.optim.SGD(case.model.parameters(), lr=1e-2)
    with tritondtr.trace(None, budget=None, cost="analytic") as rec:
        for _ in range(3):
            train_step(case, opt)
    return rec.trace, int(0.3 * runtime_peak(rec.trace))


def _step_times(trace, budget, scale, monkeypatch) -> list[float]:
    """The device time of each step of a straight twin run at ``scale`` (ns)."""
    ends, freeze = [], Core.freeze

    def timed(core):
        freeze(core)
        ends.append((core.ops, core.elapsed))

    with monkeypatch.context() as m:
        m.setattr(Core, "freeze", timed)
        stats, _ = replay_runtime(trace, "dtr_eq", budget, link=Link("pcie4"), copy_scale=scale)
    assert stats.status == "ok"
    steps, last = [], (0, 0.0)
    for ops, at in ends:
        if ops != last[0]:  # a freeze right after another ends no step
            steps.append(at - last[1])
            last = (ops, at)
    return steps


def test_each_rehearsal_takes_the_time_of_a_run_at_its_scale(gpt_steps, monkeypatch):
    """Rules 4 and 5: the time a candidate's rehearsal gives is, exactly, the second step's
    device time in a run at that scale from the first op; the tuned run then runs at the
    least of them."""
    trace, budget = gpt_steps
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rule 4: a rehearsal's own error warns
        _, core = replay_runtime(trace, "dtr_eq", budget, link=Link("pcie4"))
    times = core.tuner.times
    assert set(times) == set(CANDIDATES)
    for scale in CANDIDATES:
        assert times[scale] == _step_times(trace, budget, scale, monkeypatch)[1], scale
    assert core.tuner.value == choose(times)
    assert len(set(times.values())) > 1  # the scales decide differently here


def test_a_core_tapes_only_while_its_scale_is_to_be_chosen(gpt_steps):
    plain = Core(None, "dtr_eq", Idle())
    fixed = Core(1000, "dtr_eq", Idle(), link=Link("pcie4"), copy_scale=1.0)
    assert type(plain) is Core and plain.tape is None
    assert type(fixed) is Core and fixed.tape is None
    tuned = Core(1000, "dtr_eq", Idle(), link=Link("pcie4"))
    assert type(tuned) is not Core and isinstance(tuned, Core) and tuned.tape is not None
    assert type(tuned).__name__ == "Core"
    trace, budget = gpt_steps
    _, core = replay_runtime(trace, "dtr_eq", budget, link=Link("pcie4"))
    assert type(core) is Core and core.tape is None  # rule 3: the tape ends at the choice


def test_a_full_tape_ends_at_the_plain_price(gpt_steps, monkeypatch):
    """Rule 3: a session that ends no second step within MAX_TAPE calls stays at 1."""
    monkeypatch.setattr(rehearsal, "MAX_TAPE", 100)
    trace, budget = gpt_steps
    _, core = replay_runtime(trace, "dtr_eq", budget, link=Link("pcie4"))
    assert core.tape is None and core.tuner.fixed and core.tuner.value == 1.0
    assert core.tuner.times == {}


def test_a_call_that_raised_is_rehearsed_as_raised():
    """Rule 4: a BudgetError the program caught is part of the recorded run; a rehearsal
    raising there too goes on."""
    core = Core(100, "dtr_eq", Idle(), link=Link("1GB/s"))
    core.start(torch.device("cpu"))
    for _ in range(2):
        big = core.new(80, 1.0, (), "pinned", pinned=True)
        core.enter("grows", [big])
        core.release_inputs()
        core.new(40, 1.0, (big,), "grows", pinned=True)
        core.end(1.0)
        with pytest.raises(BudgetError):
            core.enter("too_big", [big])
        core.release_inputs()
        core.freeze()
    assert set(core.tuner.times) == set(CANDIDATES)


def _driver_calls() -> set[str]:
    names = set()
    for path in [*(ROOT / "runtime").glob("*.py"), *(ROOT / "sim").glob("*.py")]:
        names.update(re.findall(r"\bcore\.([a-z_]+)\(", path.read_text()))
    return names


def test_every_call_a_driver_makes_is_taped_or_said_not_to_be():
    """Rule 2: a new driver call that changes the core joins TAPED, else the rehearsal
    diverges from the run without a sound."""
    public = {n for n in dir(Core) if not n.startswith("_") and callable(getattr(Core, n))}
    assert set(TAPED) <= public and set(NOT_TAPED) <= public
    assert not set(TAPED) & set(NOT_TAPED)
    assert _driver_calls() <= set(TAPED) | set(NOT_TAPED)


@pytest.mark.parametrize("scale", [math.inf, 0.0])
def test_a_fixed_scale_is_never_rehearsed(gpt_steps, scale):
    trace, budget = gpt_steps
    _, core = replay_runtime(trace, "dtr_eq", budget, link=Link("pcie4"), copy_scale=scale)
    assert core.tuner.times == {} and core.tuner.value == scale
    assert core.stats.copy_scale == scale


def test_a_rehearsal_that_errs_warns_and_is_not_chosen(gpt_steps, monkeypatch):
    """Rule 4: an error of the rehearsal itself (not the budget's) is a bug of tritondtr:
    said, and the user's step goes on at another scale."""
    trace, budget = gpt_steps
    rehearsal.taped(Core)  # the taped class keeps the methods it was made with
    freeze = Core.freeze

    def broken(core):
        if core.tape is None and core.tuner.value == 0.0:  # the rehearsal at 0 only
            raise ValueError("planted")
        return freeze(core)

    monkeypatch.setattr(Core, "freeze", broken)
    with pytest.warns(RuntimeWarning, match="rehearsal of copy price scale 0 failed"):
        _, core = replay_runtime(trace, "dtr_eq", budget, link=Link("pcie4"))
    assert set(core.tuner.times) == set(CANDIDATES) - {0.0}

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
        made = [core.new(40, 1.0, (), "a")]  # evicted below: the budget binds (rule 5)
        made.append(core.new(80, 1.0, (), "pinned", pinned=True))
        core.enter("grows", [made[1]])
        core.release_inputs()
        made.append(core.new(40, 1.0, (made[1],), "grows", pinned=True))
        core.end(1.0)
        with pytest.raises(BudgetError):
            core.enter("too_big", [made[1]])
        core.release_inputs()
        for sid in made:  # the program drops its tensors
            core.release(sid)
        core.freeze()
    assert core.stats.evictions > 0 and set(core.tuner.times) == set(CANDIDATES)


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
    freeze = Core.freeze

    def broken(core):
        if core.tape is None and core.tuner.value == 0.0:  # the rehearsal at 0 only
            raise ValueError("planted")
        return freeze(core)

    monkeypatch.setattr(Core, "freeze", broken)
    with pytest.warns(RuntimeWarning, match="rehearsal of copy price scale 0 failed"):
        _, core = replay_runtime(trace, "dtr_eq", budget, link=Link("pcie4"))
    assert set(core.tuner.times) == set(CANDIDATES) - {0.0}


def test_no_choice_before_the_budget_binds_after_the_first_step():
    """NOTE [ Copy price scale ] rule 5: a span in which nothing was evicted ties every scale
    and tells nothing (never copying would be kept): the choice waits, taping, for a step
    end after an eviction."""
    core = Core(100, "dtr_eq", Idle(), link=Link("1GB/s"))
    core.start(torch.device("cpu"))
    for step in range(4):
        for _ in range(2 if step < 2 else 4):  # from the third step on, 120 bytes > 100
            a = core.new(30, 1.0, (), "a")
            core.enter("use", [a])
            core.release_inputs()
            core.new(0, 1.0, (a,), "use")
            core.end(1.0)
        core.freeze()
        chosen = core.tape is None
        assert chosen == (step >= 2) and bool(core.tuner.times) == chosen, step
    assert core.stats.evictions > 0 and set(core.tuner.times) == set(CANDIDATES)


def test_the_taped_class_runs_what_its_base_holds_now(monkeypatch):
    """Rule 2: a method of the base class replaced after the taped class was made (a test's
    patch, a profiler's wrapper) is what a taped core runs, and its name is the base's."""
    rehearsal.taped(Core)
    seen = []
    enter = Core.enter

    def spy(core, name, sids):
        seen.append(name)
        return enter(core, name, sids)

    monkeypatch.setattr(Core, "enter", spy)
    core = Core(100, "dtr_eq", Idle(), link=Link("1GB/s"))
    core.start(torch.device("cpu"))
    core.enter("op", [])
    assert seen == ["op"] and core.tape.calls[-1].name == "enter"
    assert type(core).__module__ == Core.__module__ and type(core).__qualname__ == "Core"


def test_a_rehearsal_warning_made_an_error_still_ends_the_tape(gpt_steps, monkeypatch):
    """Rule 4 under ``-W error``: the rehearsal's warning is raised to the program, as the
    filter asks, and the scale is chosen among the candidates rehearsed, the tape ended."""
    trace, budget = gpt_steps
    freeze, cores = Core.freeze, []

    def broken(core):
        if core.tape is None and core.tuner.value == 0.0:
            raise ValueError("planted")
        if core.tape is not None:
            cores.append(core)
        return freeze(core)

    monkeypatch.setattr(Core, "freeze", broken)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="rehearsal of copy price scale 0 failed"):
            replay_runtime(trace, "dtr_eq", budget, link=Link("pcie4"))
    core = cores[-1]
    assert core.tape is None and type(core) is Core and core.tuner.fixed
    assert set(core.tuner.times) == {1.0}  # 0 raised: 1/4 and inf were not reached

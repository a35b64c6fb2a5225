"""NOTE [ Op protocol ] in core/core.py: the runtime's session and the twin drive the DTR core
through the same calls. A step is run under ``tritondtr.trace`` with every protocol call of
its core logged (method and arguments); the twin replays the recorded trace with the same
log; the two logs must be equal, call for call. The twin's counts agreeing (tests/sim/
test_twin.py) follows from this; a difference here names the first call where the drivers
part."""

from __future__ import annotations

import contextlib

import pytest
import torch

import tritondtr
from tests import zoo
from tritondtr.core import Core
from tritondtr.sim.twin import replay_runtime

# The protocol (rule 1) and what passes between ops (rule 4); internal calls of the core to
# these methods are logged too, and are the same on both sides when the decisions are.
PROTOCOL = (
    "enter",
    "prepare",
    "use_evicted",
    "use",
    "begin",
    "release_inputs",
    "hand_out",
    "new",
    "end",
    "release",
    "forget",
    "materialize",
    "freeze",
    "evict_all",
)


@contextlib.contextmanager
def logged_calls():
    """Every call of a :data:`PROTOCOL` method, per core: ``{id(core): [(name, args)]}``."""
    logs: dict[int, list] = {}
    originals = {name: getattr(Core, name) for name in PROTOCOL}

    def logging(name, fn):
        def call(self, *args, **kwargs):
            # A list as it was when passed: a driver may change its own afterwards.
            args = tuple(list(a) if type(a) is list else a for a in args)
            logs.setdefault(id(self), []).append((name, args, tuple(sorted(kwargs.items()))))
            return fn(self, *args, **kwargs)

        return call

    try:
        for name, fn in originals.items():
            setattr(Core, name, logging(name, fn))
        yield logs
    finally:
        for name, fn in originals.items():
            setattr(Core, name, fn)


def _step(name: str):
    case = zoo.make(name, seed=0)
    opt = torch.optim.SGD(case.model.parameters(), lr=1e-2)
    return lambda: zoo.train_step(case, opt)


def _peak(name: str) -> int:
    with tritondtr.enable(budget=None, cost="analytic") as s:
        _step(name)()
    return s.stats.peak_bytes


def _runtime_and_twin(name: str, **kw) -> tuple[list, list, object]:
    step = _step(name)
    with logged_calls() as logs, tritondtr.trace(cost="analytic", **kw) as rec:
        step()
    (runtime,) = logs.values()
    m = rec.trace.meta["runtime"]
    with logged_calls() as logs:
        replay_runtime(
            rec.trace,
            m["heuristic"],
            m["budget"],
            stress=kw.get("stress", False),
            pin_backward=m["pin_backward"],
        )
    (twin,) = logs.values()
    return runtime, twin, rec.stats


def _first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"call {i}: runtime {x}, twin {y}"
    return f"lengths {len(a)} and {len(b)}"


@pytest.mark.parametrize("name", ["mlp", "lstm", "gpt"])
@pytest.mark.parametrize("setting", ["unlimited", "50%", "30%", "stress"])
def test_the_twin_makes_the_runtimes_calls(name, setting):
    kw = {
        "unlimited": {},
        "50%": {"budget": int(0.5 * _peak(name))} if setting == "50%" else {},
        "30%": {"budget": int(0.3 * _peak(name))} if setting == "30%" else {},
        "stress": {"stress": True},
    }[setting]
    runtime, twin, stats = _runtime_and_twin(name, **kw)
    assert runtime == twin, _first_difference(runtime, twin)
    called = {c[0] for c in runtime}
    assert {"enter", "release_inputs", "new", "end", "release"} <= called
    if setting != "unlimited":  # the engine is built: ``enter`` calls ``use`` and ``begin``
        assert {"use", "begin"} <= called
    if setting != "unlimited":
        assert stats.evictions > 0 and "materialize" in called

"""What the fuzzer's checker reports: a planted wrong recomputation is a mismatch in programs
and networks, and an UnsupportedOpError is expected only where docs/runtime.md lists it (NOTE
[ Differential fuzzer ] rule 3)."""

from __future__ import annotations

import tritondtr.runtime.session as session_module
import tritondtr.runtime.tensor as tensor_module
from tests.fuzz.check import Tally, check_program, check_run, reference
from tests.fuzz.models import check_model
from tests.fuzz.planted import plant_wrong_recomputation
from tests.fuzz.programs import Program
from tests.fuzz.run import RunConfig

STRESS = RunConfig(stress=True, heuristic="dtr_eq")


def test_checker_catches_a_planted_wrong_recomputation(monkeypatch):
    plant_wrong_recomputation(monkeypatch)
    for seed in (0, 1):
        kinds = {f.kind for f in check_program(seed)}
        assert "mismatch" in kinds, (seed, kinds)
    assert "mismatch" in {f.kind for f in check_model(0)}


def test_documented_refusal_is_expected_and_others_are_failures(monkeypatch):
    """``c.data = plain`` for a tracked ``c`` is refused as docs/runtime.md says: counted, no
    failure, and every name holds eager's value before the line; a refusal the docs do not
    list (planted: every wrapper ``.data`` assignment refused) is a failure."""
    pre = ("a0 = torch.ones(4, 6, dtype=torch.float64)", "a1 = torch.zeros(4, 6)")
    body = ("v1 = a0 * 2", "v1.data = a1", "v2 = v1 + 1")
    prog, ref = reference(Program(0, pre, body, ()))
    tally = Tally()
    assert not check_run(prog, STRESS, ref, tally)[0] and tally.refusals == 1
    planted = (*body[:1], "v3 = a0 * 3", "v1.data = v3")
    prog, ref = reference(Program(0, pre, planted, ()))

    def refuse(self, new):
        raise session_module.UnsupportedOpError(".data", "planted")

    monkeypatch.setattr(
        tensor_module.DTRTensor, "data", property(tensor_module._DATA.__get__, refuse)
    )
    assert {f.kind for f in check_run(prog, STRESS, ref)[0]} == {"refused"}

"""The DTR paper's Figure 2, reproduced on the five shared logs against the reference numbers
of its own simulator (``../shared/reference/figure2-reference.json``).

Tolerances (issue 3): overhead within 2 % relative for the DTR family and msps, 5 % for lru and
size, at every ratio where both succeed; the same status everywhere except at most one ratio at
the feasibility boundary; baselines equal. ``size`` runs with the reference's tie order
(NOTE [ Tie order ]); with the engine's own order it differs by design (docs/simulator.md).
The most expensive points (exact dtr and msps on densenet121 and lstm, about 110 s on a 2-core
box) are marked slow.
"""

import json
import pathlib

import pytest

from tritondtr.sim import baseline, load_trace, simulate

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
LOGS = SHARED / "traces" / "dtr-prototype"
REFERENCE = SHARED / "reference" / "figure2-reference.json"

pytestmark = pytest.mark.skipif(
    not REFERENCE.exists(), reason=f"{SHARED} (shared logs and reference) is absent"
)

MODELS = ["resnet32", "densenet121", "transformer", "unet", "lstm"]
HEURISTICS = ["dtr", "dtr_eq", "dtr_local", "msps", "lru", "size"]
TOLERANCE = {"lru": 0.05, "size": 0.05}
TIES = {"size": "simrd"}
SLOW = {("densenet121", "dtr"), ("densenet121", "msps"), ("lstm", "dtr"), ("lstm", "msps")}

_traces: dict = {}


def reference():
    return json.loads(REFERENCE.read_text())


def trace(model):
    if model not in _traces:
        _traces[model] = load_trace(LOGS / f"{model}.log")
    return _traces[model]


@pytest.mark.parametrize("model", MODELS)
def test_baseline_equals_reference(model):
    ref = reference()[model]["baseline"]
    b = baseline(trace(model))
    assert (b.compute, b.peak_bytes, b.constant_bytes, b.bottleneck_bytes) == (
        ref["compute_ns"],
        ref["peak_bytes"],
        ref["constant_bytes"],
        ref["bottleneck_bytes"],
    )


def compare(model, heuristic):
    """Sweep the reference's ratios (stopping at our first failure) and check the rules."""
    points = reference()[model][heuristic]
    ours = []
    for p in points:
        r = simulate(
            trace(model),
            heuristic,
            ratio=p["ratio"],
            device="cpu",
            backend="torch",
            ties=TIES.get(heuristic, "slot"),
        )
        ours.append(r)
        if not r.ok:
            break
    tol = TOLERANCE.get(heuristic, 0.02)
    mismatched = []
    for p, r in zip(points, ours):
        if p["status"] == "ok" and r.ok:
            assert r.overhead == pytest.approx(p["overhead"], rel=tol), (
                f"{model} {heuristic} at ratio {p['ratio']}: overhead {r.overhead:.4f}, "
                f"reference {p['overhead']:.4f}"
            )
        elif p["status"] != r.status:
            mismatched.append((p["ratio"], p["status"], r.status))
    ref_fail = next((i for i, p in enumerate(points) if p["status"] != "ok"), len(points))
    our_fail = next((i for i, r in enumerate(ours) if not r.ok), len(points))
    assert abs(ref_fail - our_fail) <= 1, f"feasibility boundary moved: {mismatched}"
    assert len(mismatched) <= 1, f"{model} {heuristic}: status differs at {mismatched}"


CASES = [
    pytest.param(m, h, marks=[pytest.mark.slow] if (m, h) in SLOW else [], id=f"{m}-{h}")
    for m in MODELS
    for h in HEURISTICS
]


@pytest.mark.parametrize("model, heuristic", CASES)
def test_overheads_match_reference(model, heuristic):
    compare(model, heuristic)

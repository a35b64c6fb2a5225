"""The twin's check for tests that record a run (NOTE [ The twin ] rule 4 in
tritondtr/sim/twin.py)."""

from __future__ import annotations

from tritondtr.sim import simulate


def assert_twin_replays(trace, budget: int) -> None:
    """Replayed at ``budget`` (``dtr_eq``, the runtime's semantics), ``trace`` finishes with
    exactly the recorded run's evictions, rematerializations and peak bytes."""
    m = trace.meta["runtime"]
    twin = simulate(trace, "dtr_eq", budget=budget, semantics="runtime")
    assert (twin.status, twin.evictions, twin.remats, twin.peak_bytes) == (
        "ok",
        m["evictions"],
        m["rematerializations"],
        m["peak_bytes"],
    )

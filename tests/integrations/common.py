"""What every recipe test of docs/integrations.md checks, and its shared pieces."""

from __future__ import annotations

import torch

__all__ = ["assert_evicted_within_budget", "assert_same_parameters", "half_peak"]


def half_peak(stats) -> int:
    """The budget the recipes train under: half the tracked peak a ``budget=None`` run
    measured (the zoo tests' 50 %)."""
    assert stats.peak_bytes > 0, "the measuring session tracked nothing"
    return stats.peak_bytes // 2


def assert_evicted_within_budget(stats, budget: int) -> None:
    """The session did its work: it evicted and recomputed, and kept NOTE [ Budget
    accounting ]'s bound. A session that silently tracked nothing fails here."""
    assert stats.budget == budget
    assert stats.evictions > 0 and stats.rematerializations > 0, str(stats)
    assert stats.peak_bytes <= budget + stats.max_op_out_bytes, str(stats)


def assert_same_parameters(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    """Every parameter and buffer equals the eager run's, bit for bit, and is plain."""
    got, want = model.state_dict(), reference.state_dict()
    assert got.keys() == want.keys()
    for name, t in got.items():
        assert type(t) is torch.Tensor, f"{name} is a {type(t).__name__}"
        assert torch.equal(t, want[name]), f"{name} differs from the run without tritondtr"

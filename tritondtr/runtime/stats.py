"""Counters of a session (``session.stats``); the runtime updates them in place."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["SessionStats"]


@dataclass
class SessionStats:
    """What a session did. Bytes are of the storages created inside the context.

    Attributes:
        budget: the budget in bytes (None: unlimited).
        evictions: storages evicted to meet the budget (not counting buffers freed because
            their last tensor died, see ``freed``).
        rematerializations: storages recomputed.
        recompute_s: seconds spent recomputing (wall clock, host side).
        select_s: seconds spent choosing victims.
        peak_bytes: the most bytes resident at once.
        resident_bytes: bytes resident now.
        ops: ops dispatched (the user's, not recomputations).
        op_counts: per op name (``"aten.mm.default"``), ops dispatched.
        freed: buffers freed because their last tensor died.
        backward_unpins: times the storages of the backward pass had to be made evictable.
        budget_errors: :class:`~tritondtr.runtime.BudgetError` raised (ThrashError included).
        relaxations: times a recomputation did not fit beside the inputs held for the
            recomputations waiting on it, and those were made evictable again (NOTE [
            Iterative rematerialization ] rule 5 in runtime/remat.py).
        max_op_out_bytes: the most bytes one op (or one recomputation) added at once; the
            peak never exceeds ``budget + max_op_out_bytes`` (NOTE [ Budget accounting ]).
    """

    budget: int | None = None
    evictions: int = 0
    rematerializations: int = 0
    recompute_s: float = 0.0
    select_s: float = 0.0
    peak_bytes: int = 0
    resident_bytes: int = 0
    ops: int = 0
    op_counts: Counter = field(default_factory=Counter)
    freed: int = 0
    backward_unpins: int = 0
    budget_errors: int = 0
    relaxations: int = 0
    max_op_out_bytes: int = 0

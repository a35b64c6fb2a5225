"""The DTR core's errors: the budget cannot hold an op's working set, or thrashes. Each says
what happened, with the numbers, and what to do."""

from __future__ import annotations

import torch

from ..units import format_bytes

__all__ = ["BudgetError", "ThrashError", "is_oom"]

_OOM = getattr(torch, "OutOfMemoryError", ())
_CPU_REFUSAL = "DefaultCPUAllocator: can't allocate memory"


def is_oom(e: BaseException) -> bool:
    """Whether ``e`` is the allocator refusing memory: ``torch.OutOfMemoryError`` (CUDA), or
    the ``RuntimeError`` of PyTorch's CPU allocator, which is not of that class (NOTE [
    Out-of-memory fallback ] rule 5 in runtime/oom.py)."""
    return isinstance(e, _OOM) or (isinstance(e, RuntimeError) and _CPU_REFUSAL in str(e))


class BudgetError(RuntimeError):
    """The budget cannot hold the working set of one op (its inputs plus what is pinned).

    Raised before the op runs; nothing was changed, the session stays usable.
    """

    def __init__(self, op: str, needed: int, budget: int, pinned: str) -> None:
        self.op, self.needed, self.budget = op, needed, budget
        super().__init__(
            f"tritondtr: the budget of {format_bytes(budget)} ({budget} bytes) cannot hold the "
            f"working set of {op}: {format_bytes(needed)} ({needed} bytes) must stay resident "
            f"for it and nothing else can be evicted. Pinned/locked: {pinned}. Raise the budget "
            "(budget=None measures the unlimited peak) or shrink the op (smaller batch)."
        )


class ThrashError(BudgetError):
    """Making one tensor resident again recomputed the same storages over and over: the
    budget leaves too little room beside what the recomputation holds (NOTE [ Iterative
    rematerialization ] rule 6 in core/remat.py).

    Raised between two recomputations; what was recomputed stays valid and resident, the
    session stays usable. ``op`` is the op whose output was being recomputed, ``needed`` the
    budget (the working set fit; the schedule did not), ``rematerializations`` and
    ``storages`` the counts of that recomputation.
    """

    def __init__(self, op: str, budget: int, remats: int, storages: int) -> None:
        self.op, self.budget = op, budget
        self.needed = budget
        self.rematerializations, self.storages = remats, storages
        RuntimeError.__init__(
            self,
            f"tritondtr: the budget of {format_bytes(budget)} ({budget} bytes) thrashes: "
            f"recomputing the output of {op} took {remats} rematerializations of "
            f"{storages} distinct storages ({remats / storages:.0f} each on average): each "
            "recomputation evicts what the next one needs. Raise the budget (budget=None "
            "measures the unlimited peak) or shrink the model's working set (smaller batch).",
        )

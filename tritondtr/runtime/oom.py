"""The out-of-memory fallback: an op the allocator refuses is run again after evicting.

# NOTE [ Out-of-memory fallback ]
# 1. When the allocator refuses an allocation inside an op the session runs (a user op, or a
#    recomputation: ``Session.recompute``) and the session may evict (a budget or stress),
#    the core evicts and the op runs again; with nothing left to evict, the allocator's error
#    propagates unchanged. The budget may be far above what the device has free (``"auto"``
#    counts only tracked storages): this is what keeps such a run alive.
# 2. Retry i (from 0) evicts up to 2**i victims: one refused allocation may need the bytes of
#    many victims, and one victim per retry made the retries linear in the bytes missing;
#    doubling bounds them by log2 of the number of storages.
# 3. Before each retry, the generators the op's first attempt captured are set back to their
#    state before that attempt (NOTE [ RNG replay ] rule 4 in recipe.py): a random op may have
#    drawn before its allocation failed, and the retry must draw what eager drew.
# 4. A retry's decisions allocate nothing on the device: the runtime's table is on the host
#    (NOTE [ Decisions on the host ] in core/core.py). With ``table="device"`` a selection
#    allocates a few hundred bytes on the device (the victims, the partial results): if even
#    those are refused, that error propagates.
# 5. The allocator's refusal is ``torch.OutOfMemoryError`` (CUDA), or on a CPU the
#    ``RuntimeError`` of PyTorch's CPU allocator ("DefaultCPUAllocator: can't allocate
#    memory"), which is not an ``OutOfMemoryError`` class; both are retried.
# 6. A recomputation's retry keeps the recipe's resident inputs while it evicts (locked for
#    the retry's evictions): the core locks a recomputation's inputs only when it is over
#    budget (NOTE [ Iterative rematerialization ] rule 8 in core/remat.py: only room-making
#    evicts), and a refusal comes at any budget. Without the locks a retry could evict the
#    very input the replay reads (a GPU probe's step under a budget that never bound).
# 7. Allocations the session does not track are retried too: the session's storages are
#    the device's memory as much as at any op. An op on plain tensors only, run with grad
#    off (an optimizer's step, the backward's accumulation of a gradient: NOTE [ What is
#    tracked ] rule 2), or allocating uninitialized memory (rule 5 there: the mask of a
#    dropout of a plain tensor); the session's own copies of plain tensors (NOTE [ In-place
#    versions ] rule 2: batch norm's running statistics; NOTE [ Leaf gradients ] rule 6).
#    Not an op that writes an argument (rule 1) or draws random numbers (nothing captured
#    its generators to rewind: rule 3): then the allocator's error propagates, as it would
#    without the session. So a training-mode batch norm (it writes its running statistics)
#    refused by the allocator is never retried. Found by fuzzing a CPU model of the device
#    (a dispatch mode under the session refusing above a byte limit): ~900 runs, no wrong
#    value; these were the refusals that propagated with storages left to evict.
# 8. A recomputation refused with nothing left to evict, inside a rematerialization whose
#    pending frames hold locks, releases those locks and tries again, as for a budget error
#    (NOTE [ Iterative rematerialization ] rule 5 in core/remat.py): what the frames held is
#    what the replay needs room from.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.errors import is_oom
from ..engine.residency import RESIDENT

__all__ = ["evict_for_retry", "is_oom"]


def evict_for_retry(core, attempt: int, keep: Iterable[int] = ()) -> bool:
    """Rule 2: evict up to ``2**attempt`` victims, none of the storages ``keep`` (rule 6);
    False if none was evictable."""
    state = core.state
    kept = [sid for sid in keep if state[sid] == RESIDENT]
    for sid in kept:
        core.lock(sid)
    try:
        if not core.evict_one():
            return False
        for _ in range((1 << min(attempt, 30)) - 1):
            if not core.evict_one():
                break
        return True
    finally:
        for sid in kept:
            core.unlock(sid)

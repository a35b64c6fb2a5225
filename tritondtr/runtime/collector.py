"""Python's garbage collector while sessions are active.

# NOTE [ Garbage collector ]
# 1. While a session is active, generation 0's threshold is at least ``YOUNG_THRESHOLD``
#    (100,000 tracked objects instead of CPython's 700); the thresholds found at the first
#    entry are restored when the last active session of the process exits, in ``finally``
#    (also when the block raised). Nothing else of the collector is touched.
# 2. Why: a young collection runs when the tracked objects allocated minus those freed since
#    the last one exceed the threshold. The runtime makes ~8 tracked Python objects per op of
#    a step (wrapper, cell, storage, recipe, input records, sizes) that live as long as the
#    step holds the tensor, so the count climbs ~9 per op through the forward and falls back
#    through the backward: with 700, every 90 ops of the forward set off a collection, whose
#    survivors (all alive) moved to the older generations, and every ~100k of them one full
#    collection of every object of the process (~400k once transformers is loaded, 0.2 to
#    0.6 s each on a 2-core CPU). Eager mode keeps its saved tensors in C++ and makes none of
#    this. With 100,000 a step whose count climbs less (~11,000 ops) sets off no collection
#    at all: the runtime's objects die by reference counting before any collector sees them.
#    Measurements: docs/benchmarks.md, Garbage collection.
# 3. A threshold the program set at or above ``YOUNG_THRESHOLD`` is left alone, and so is 0
#    (automatic collection off). Thresholds the program sets while a session is active are
#    kept: exit restores only where it finds the value it set.
# 4. The price: garbage in reference cycles, which only the collector frees, waits for
#    100,000 net allocations instead of 700 while a session is active. A program whose cycles
#    hold device memory can call ``gc.collect()`` (what ``accelerate``'s ``release_memory``
#    does) or set its own threshold (rule 3).
# 5. Not ``gc.freeze()`` of the process's objects at entry: full collections then skip them,
#    but they vanish from ``gc.get_objects()`` until exit, cycles among them are not freed,
#    and young collections still ran (15 a step on the GRU loop, ~1.4 % of its time).
# 6. Sessions in several threads share the process's collector: a count of active sessions,
#    under a lock; the first entry saves, the last exit restores.
"""

from __future__ import annotations

import gc
import threading

__all__ = ["YOUNG_THRESHOLD", "session_ended", "session_started"]

YOUNG_THRESHOLD = 100_000  # NOTE [ Garbage collector ] rule 1


class _Collector:
    """The collector's thresholds while sessions are active; the one owner of what was saved."""

    __slots__ = ("_active", "_lock", "_saved", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0  # sessions active in the process
        self._saved: tuple[int, ...] | None = None  # the thresholds found (rule 1)
        self._set: tuple[int, ...] | None = None  # the thresholds set (rule 3)

    def started(self) -> None:
        with self._lock:
            self._active += 1
            if self._active > 1:
                return
            found = gc.get_threshold()
            if 0 < found[0] < YOUNG_THRESHOLD:
                raised = (YOUNG_THRESHOLD, *found[1:])
                gc.set_threshold(*raised)
                self._saved, self._set = found, raised

    def ended(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active > 0 or self._saved is None:
                return
            saved, self._saved = self._saved, None
            if gc.get_threshold() == self._set:
                gc.set_threshold(*saved)


_COLLECTOR = _Collector()


def session_started() -> None:
    """A session became active (NOTE [ Garbage collector ] rule 1)."""
    _COLLECTOR.started()


def session_ended() -> None:
    """A session that started is no longer active: the last one restores the thresholds."""
    _COLLECTOR.ended()

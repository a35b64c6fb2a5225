"""CUDA event timing, never waited for: ops' device times (``cost="events"``, NOTE [ Cost
models ] rule 10 in cost.py) and the device time of recomputations and victim choices
(NOTE [ Device time ]).

# NOTE [ Device time ]
# 1. On a CUDA session ``recompute_s`` and ``select_s`` are device time: a pair of CUDA
#    events is recorded on the current stream around each recomputation and each victim
#    choice, and its elapsed time is added once the end event has completed. The host clock
#    there would count the launches only, or, where the work synchronizes (a choice reads
#    its victim back), the whole backlog of queued user ops.
# 2. Events are never waited for while the session runs: the oldest pending pairs are
#    polled (``Event.query()``) at each new pair; the session's exit waits for the rest
#    (one synchronization, at exit), so the counters are complete once the block ends. On
#    CPU both counters stay wall time (a CPU op is synchronous).
# 3. ``select_s`` is device time only for a table on the device (``enable(table="device")``):
#    a decision on the host table (the default, NOTE [ Decisions on the host ] in
#    core/core.py) is host work that launches nothing, so its wall time is what it costs.
# 4. Events are recorded on the current stream of the session's device, not of the current
#    device: a ``cuda:1`` session timed on device 0's stream would time the wrong GPU.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from ..engine.residency import EVICTED, RESIDENT

__all__ = ["DeviceClock", "OpTimer"]

EventFactory = Callable[[], Any]
"""Makes an event with ``record()``, ``query()``, ``synchronize()`` and
``elapsed_time(end) -> ms``: ``torch.cuda.Event(enable_timing=True)``, or a test's fake."""


def cuda_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)


def _recorder(device: torch.device | None):
    """``fn(event)``: record it on ``device``'s current stream (rule 4); without a device,
    on the current device's (the tests' fake events)."""
    if device is None:
        return lambda ev: ev.record()
    return lambda ev: ev.record(torch.cuda.current_stream(device))


class DeviceClock:
    """NOTE [ Device time ]: sums the elapsed time of event pairs into ``stats.<field>``
    (seconds) as they complete."""

    def __init__(self, stats, event: EventFactory = cuda_event, device=None) -> None:
        self.stats = stats
        self.event = event
        self.record = _recorder(device)
        self.pending: deque = deque()  # (start, end, field) in recording order

    def start(self):
        ev = self.event()
        self.record(ev)
        return ev

    def stop(self, start, field: str) -> None:
        end = self.event()
        self.record(end)
        self.pending.append((start, end, field))
        self.poll()

    def poll(self) -> None:
        p = self.pending
        while p and p[0][1].query():
            self._add(*p.popleft())

    def finish(self) -> None:
        """Rule 2: wait for every pending pair (the session's exit)."""
        p = self.pending
        while p:
            start, end, field = p.popleft()
            end.synchronize()
            self._add(start, end, field)

    def _add(self, start, end, field: str) -> None:
        st = self.stats
        setattr(st, field, getattr(st, field) + start.elapsed_time(end) / 1e3)


class _Op:
    """One op's first execution: its events, its estimate, the storages it made."""

    __slots__ = ("end", "estimate", "start", "storages")

    def __init__(self, start, end, estimate: float) -> None:
        self.start, self.end, self.estimate = start, end, estimate
        self.storages: list = []  # weakrefs to runtime Storages


class OpTimer:
    """NOTE [ Cost models ] rule 10: the event pairs of ops' first executions, applied to
    the core as they complete."""

    def __init__(self, core, event: EventFactory = cuda_event, device=None) -> None:
        self.core = core
        self.event = event
        self.record = _recorder(device)
        self.pending: deque[_Op] = deque()
        self.op: _Op | None = None  # the op in flight, once it ran
        self._start = None

    def set_device(self, device: torch.device) -> None:
        """The session's device is known: record there from now on (rule 4)."""
        self.record = _recorder(device)

    def start(self) -> None:
        """Before the op's execution."""
        ev = self.event()
        self.record(ev)
        self._start = ev

    def stop(self, estimate: float) -> None:
        """After it: ``estimate``, the cost its storages are created with."""
        end = self.event()
        self.record(end)
        self.op = _Op(self._start, end, estimate)

    def made(self, storage_ref) -> None:
        """The op in flight created this storage (a weakref to it)."""
        if self.op is not None:
            self.op.storages.append(storage_ref)

    def done(self) -> None:
        """The op ended: keep its events if it made a storage; apply what completed."""
        op, self.op = self.op, None
        if op is not None and op.storages:
            self.pending.append(op)
        p = self.pending
        while p and p[0].end.query():
            self._apply(p.popleft())

    def finish(self) -> None:
        """The session's exit: apply every pending op (waits for them)."""
        p = self.pending
        while p:
            op = p.popleft()
            op.end.synchronize()
            self._apply(op)

    def _apply(self, op: _Op) -> None:
        ns = max(op.start.elapsed_time(op.end) * 1e6, 1.0)
        core = self.core
        state = core.state
        for ref in op.storages:
            s = ref()
            if s is None or s.sid < 0 or s.recipe is None:  # dead, fused away, or external
                continue
            sid = s.sid
            if state[sid] == RESIDENT or state[sid] == EVICTED:
                core.set_cost(sid, max(core.cost[sid] - op.estimate + ns, 1.0))

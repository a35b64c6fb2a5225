"""The order of reads a prefetch follows: what the previous training step read, op by op.

# NOTE [ Step plan ]
# 1. A training step repeats the ops of the one before it, so the previous step's order of
#    reads says what this one reads next (NOTE [ Asynchronous offload ] rule 5 in
#    offload.py). A storage is known across steps by where it was made: (the number of the
#    op that made it within its step, its place among that op's new storages). Storages made
#    before the step (parameters, inputs) have no key and are never prefetched.
# 2. The driver tells the plan, per op, in order: ``read`` (the op's tracked inputs, the
#    list ``Core.enter`` takes), ``made`` for each new storage, ``ran`` before ``Core.end``
#    (so that, after the op, ``position`` is the next op's number); and ``step`` where a step
#    ends (the optimizer's parameter writes: ``Core.freeze``). The session and the twin make
#    the same calls, so their plans agree and the twin replays the runtime's prefetches.
# 3. A plan is a hint: a step that differs (a dynamic model, the first step) only makes
#    prefetches useless or missing, never a wrong value; a prefetch never evicts (rule 5).
"""

from __future__ import annotations

import bisect

__all__ = ["StepPlan"]


class StepPlan:
    """A :class:`~tritondtr.core.offload.ReadPlan` from the previous step (NOTE [ Step
    plan ])."""

    __slots__ = ("key", "op", "outs", "previous", "reads")

    def __init__(self) -> None:
        self.op = 0  # the number, within this step, of the op running or next
        self.outs = 0  # new storages the op in flight has made
        self.key: dict[int, tuple[int, int]] = {}  # sid -> where this step made it
        self.reads: dict[tuple[int, int], list[int]] = {}  # key -> the ops reading it
        self.previous: dict[tuple[int, int], list[int]] = {}  # the previous step's reads

    def read(self, sids) -> None:
        """The op in flight reads ``sids``."""
        key, reads, op = self.key, self.reads, self.op
        for sid in sids:
            k = key.get(sid)
            if k is not None:
                ops = reads.get(k)
                if ops is None:
                    reads[k] = [op]
                elif ops[-1] != op:
                    ops.append(op)

    def made(self, sid: int) -> None:
        """The op in flight made new storage ``sid``."""
        self.key[sid] = (self.op, self.outs)
        self.outs += 1

    def ran(self) -> None:
        """The op in flight is done."""
        self.op += 1
        self.outs = 0

    def step(self) -> None:
        """A step ended: its reads are the plan of the next."""
        self.previous, self.reads, self.key = self.reads, {}, {}
        self.op = self.outs = 0

    def position(self) -> int:
        return self.op

    def next_read(self, sid: int) -> int | None:
        k = self.key.get(sid)
        ops = self.previous.get(k) if k is not None else None
        if not ops:
            return None
        i = bisect.bisect_left(ops, self.op)
        return ops[i] if i < len(ops) else None

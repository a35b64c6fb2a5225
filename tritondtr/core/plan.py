"""The order of reads a prefetch follows: what the previous training step read, op by op.

# NOTE [ Step plan ]
# 1. A training step repeats the ops of the one before it, so the previous step's order of
#    reads says what this one reads next (NOTE [ Asynchronous offload ] rule 5 in
#    offload.py). An op is known across steps by its name and how many ops of that name
#    the step ran before it (the 17th ``aten.mm``), a storage by the op that made it and its
#    place among that op's new storages. So ops a step adds or lacks (the first step's lazy
#    initialisations: FSDP2 ran 40 more ``as_strided`` in its first step than in its
#    second) shift the keys of their own name only. Storages made before the step
#    (parameters, inputs) have no key and are never prefetched.
# 2. Time is the previous step's op numbers: ``position`` is the number, in the previous
#    step, of the op after the last one that ran whose key it knew (an op it did not know
#    moves nothing), so a read it predicts and the op running now are on one axis.
# 3. The driver tells the plan, per op, in order: ``read`` (the op's name and tracked
#    inputs, as ``Core.enter`` takes them), ``made`` for each new storage, ``ran`` before
#    ``Core.end``; and ``step`` where a step ends (the optimizer's parameter writes:
#    ``Core.freeze``). The core makes these calls from the op protocol, so the session's
#    plan and the twin's agree and the twin replays the runtime's prefetches.
# 4. A plan is a hint: a step that differs (a dynamic model, the first step) only makes
#    prefetches useless or missing, never a wrong value; a prefetch never evicts (rule 5 of
#    NOTE [ Asynchronous offload ]).
# 5. A session that never writes its parameters (inference, evaluation) never ends a step:
#    after :data:`MAX_OPS` ops the plan ends one itself, so what it keeps stays bounded (a
#    GPT-2 small training step is ~10k ops).
# 6. Not handled: an optimizer step inside the backward pass writes its parameters one by one,
#    so every write ends a step, the keys of the forward's storages are gone before the
#    backward pass reads them, and nothing is prefetched (the zoo GPT at 30 % over PCIe 4,
#    four steps: 0 prefetches and 165 fetches on read, against 117 and 48 with the optimizer
#    after the backward pass). A step there would end where the forward pass begins, which
#    no freeze marks. Tried and not kept: a step ended only at a write after as many ops as
#    the first step had, the keys of the step before kept, a stale prefetch entry planned
#    again: still none (the plan then named storages to bring back, but memory had no room
#    for them when the reads came, and a prefetch never evicts).
"""

from __future__ import annotations

import bisect

__all__ = ["MAX_OPS", "StepPlan"]

MAX_OPS = 1 << 18  # rule 5

Key = tuple  # (op name, occurrence) for an op; (op key, output place) for a storage


class StepPlan:
    """A :class:`~tritondtr.core.offload.ReadPlan` from the previous step (NOTE [ Step
    plan ])."""

    __slots__ = (
        "at", "counts", "epoch", "index", "key", "last", "op", "outs", "previous", "reads",
    )  # fmt: skip

    def __init__(self) -> None:
        self.op = 0  # this step's number of the op in flight (or next)
        self.at: Key = ()  # the key of the op in flight
        self.outs = 0  # new storages the op in flight has made
        self.counts: dict[str, int] = {}  # op name -> ops of that name this step so far
        self.index: dict[Key, int] = {}  # op key -> this step's number
        self.key: dict[int, Key] = {}  # sid -> the key of the storage, made this step
        self.reads: dict[Key, list[int]] = {}  # storage key -> the ops reading it (numbers)
        self.previous: tuple[dict[Key, int], dict[Key, list[int]]] = ({}, {})  # last step's
        self.last = 0  # position(): rule 2
        self.epoch = 0  # steps ended (ReadPlan.epoch)

    def read(self, name: str, sids) -> None:
        """Op ``name`` runs next and reads ``sids``."""
        n = self.counts.get(name, 0)
        self.counts[name] = n + 1
        at = self.at = (name, n)
        op = self.op
        self.index[at] = op
        key, reads = self.key, self.reads
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
        self.key[sid] = (self.at, self.outs)
        self.outs += 1

    def ran(self) -> None:
        """The op in flight is done."""
        before = self.previous[0].get(self.at)
        if before is not None:
            self.last = before + 1
        self.op += 1
        self.outs = 0
        if self.op >= MAX_OPS:  # rule 5
            self.step()

    def step(self) -> None:
        """A step ended: its reads are the plan of the next."""
        self.previous = (self.index, self.reads)
        self.index, self.reads, self.key, self.counts = {}, {}, {}, {}
        self.op = self.outs = self.last = 0
        self.at = ()
        self.epoch += 1

    def position(self) -> int:
        return self.last

    def next_read(self, sid: int) -> int | None:
        k = self.key.get(sid)
        ops = self.previous[1].get(k) if k is not None else None
        if not ops:
            return None
        i = bisect.bisect_left(ops, self.last)
        return ops[i] if i < len(ops) else None

"""A counting executor for tests that drive :class:`tritondtr.core.Core` directly: it runs
nothing, and records what the core asked of it (the :class:`tritondtr.core.Executor`
protocol)."""

from __future__ import annotations


class Counting:
    """``recomputed``: sids recomputed, in order; ``consumed``: the storages those
    recomputations took the buffer of (NOTE [ Consumed versions ]); ``freed``: sids whose
    buffer was dropped; ``kept``: sids made external; ``copied`` (copies to the host),
    ``fetched``, ``discarded``: NOTE [ Offload ], NOTE [ Asynchronous offload ]."""

    def __init__(self) -> None:
        self.recomputed: list[int] = []
        self.consumed: list[int] = []
        self.freed: list[int] = []
        self.kept: list[int] = []
        self.copied: list[int] = []
        self.fetched: list[int] = []
        self.discarded: list[int] = []

    def recompute(self, sid: int, consume: int = -1) -> None:
        self.recomputed.append(sid)
        if consume >= 0:
            self.consumed.append(consume)

    def free(self, sid: int) -> None:
        self.freed.append(sid)

    def keep(self, sid: int) -> None:
        self.kept.append(sid)

    def copy_out(self, sid: int) -> None:
        self.copied.append(sid)

    def fetch(self, sid: int, hint: bool = False) -> None:
        self.fetched.append(sid)

    def drop_copy(self, sid: int) -> None:
        self.discarded.append(sid)

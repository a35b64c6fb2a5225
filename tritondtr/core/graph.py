"""The storage graph of the DTR core: what each tracked storage is and which storages it
was computed from, independent of where its bytes are (NOTE [ Core parts ] in core.py).

Per core id (``sid``, dense, reused: the last freed first): its size, cost, creation clock,
parents (the tracked storages its op reads), op name, the storage it is an in-place version
of, and how many storages' ops read it; the fused versions' nesting and the versions an op in
flight absorbed (NOTE [ Fused versions ] in core.py); the readers map (NOTE [ Readers before
release ]). The core decides when a storage enters and leaves; the graph keeps the records
and the ids. It reads the core's residency states (``state``), lent at construction.
"""

from __future__ import annotations

from typing import NamedTuple

from ..engine.residency import EVICTED

__all__ = ["Absorbed", "StorageGraph"]

MAX_LINKS = 16  # NOTE [ Fused versions ] rule 4 in core.py: ops per fused recipe, at most


class Absorbed(NamedTuple):
    """A version absorbed during the op in flight (NOTE [ Fused versions ] rule 6): what an
    output of the same op made later stands for when it names it as a parent."""

    parents: tuple[int, ...]
    cost: float
    links: int


class StorageGraph:
    """The core's storage records and ids; every method is one step of the core's.

    Args:
        state: the core's residency per sid (read only: ``_fuse`` asks whether a version is
            evicted).
        readers: keep the readers map (the core does with a budget and without stress).
    """

    def __init__(self, state: bytearray, readers: bool) -> None:
        self.state = state  # lent, read
        self.size: list[int] = []
        self.cost: list[float] = []
        self.born: list[int] = []  # clock at creation (orders recomputations)
        self.inputs: list[tuple[int, ...]] = []  # the tracked storages its op reads
        self.name: list[str] = []  # its op, for errors
        self.writes: list[int] = []  # the storage it is an in-place version of, or -1
        self.nread: list[int] = []  # storages whose op reads it (NOTE [ Fused versions ])
        self.links: dict[int, int] = {}  # sid -> recipes its replay nests (ibid. rules 4, 6)
        self.absorbed: dict[int, Absorbed] = {}  # absorbed id -> what it was, until the op ends
        self.free_ids: list[int] = []
        # sid -> the storages whose recipes read it (NOTE [ Readers before release ])
        self.readers: dict[int, dict[int, None]] | None = {} if readers else None

    def add(
        self,
        size: int,
        cost: float,
        now: int,
        inputs: tuple[int, ...],
        counted: tuple[int, ...],
        name: str,
        writes: int,
    ) -> int:
        """A new storage's records; returns its sid (a freed one first). ``counted``: the
        parents whose reader count grows (``fuse``'s answer; ``inputs`` otherwise)."""
        nread = self.nread
        for i in counted:
            nread[i] += 1
        free = self.free_ids
        if free:
            sid = free.pop()
            self.size[sid], self.cost[sid], self.born[sid] = size, cost, now
            self.inputs[sid], self.name[sid] = inputs, name
            self.writes[sid], nread[sid] = writes, 0
            return sid
        self.size.append(size)
        self.cost.append(cost)
        self.born.append(now)
        self.inputs.append(inputs)
        self.name.append(name)
        self.writes.append(writes)
        nread.append(0)
        return len(nread) - 1

    def fuse(self, inputs: tuple, cost: float, writes: int, alone: bool) -> tuple:
        """NOTE [ Fused versions ] for a new storage: (parents, the parents whose reader count
        grows, cost, writes, the version absorbed or -1, the recipes the replay nests or 0)."""
        ab, deep = self.absorbed, 0
        if ab and any(i in ab for i in inputs):  # rule 6
            cost += sum(ab[i].cost for i in set(inputs) if i in ab)
            deep = max(ab[i].links for i in inputs if i in ab)
            inputs = tuple(x for i in inputs for x in (ab[i].parents if i in ab else (i,)))
        p = writes
        if p >= 0 and alone and not self.nread[p] and p in inputs:  # rules 1 and 3
            links = max(self.links.get(p, 1), deep) + 1
            if links <= MAX_LINKS and self.state[p] == EVICTED:  # rule 4
                counted = tuple([i for i in inputs if i != p])  # p's reads pass to the new one
                inputs = self.inputs[p] + counted
                return inputs, counted, cost + self.cost[p], self.writes[p], p, links
        return inputs, inputs, cost, writes, -1, deep + 1 if deep else 0

    def link(self, sid: int, links: int, absorbed: int) -> None:
        """``sid``'s replay nests ``links`` recipes; it absorbed version ``absorbed`` (or -1),
        whose records the op's later outputs may still need (rule 6) until :meth:`end_op`."""
        self.links[sid] = links
        if absorbed >= 0:
            p = absorbed
            self.absorbed[p] = Absorbed(self.inputs[p], self.cost[p], self.links.get(p, 1))

    def end_op(self) -> None:
        """The op ended: the ids of the versions it absorbed are free (rule 5)."""
        self.free_ids.extend(self.absorbed)
        self.absorbed.clear()

    def set_cost(self, sid: int, cost: float) -> None:
        self.cost[sid] = cost

    def read(self, sid: int) -> None:
        """NOTE [ Readers before release ] rule 3: ``sid`` reads its inputs."""
        readers = self.readers
        for i in self.inputs[sid]:
            r = readers.get(i)
            if r is None:
                readers[i] = {sid: None}
            else:
                r[sid] = None

    def _unread(self, sid: int) -> None:
        """NOTE [ Readers before release ] rule 3: ``sid`` reads nothing from now on."""
        readers = self.readers
        readers.pop(sid, None)
        for i in self.inputs[sid]:
            r = readers.get(i)
            if r is not None:
                r.pop(sid, None)

    def cut(self, sid: int) -> None:
        """``sid`` becomes external: it reads nothing and nests no recipe any more."""
        if self.readers:
            self._unread(sid)
        nread = self.nread
        for i in self.inputs[sid]:
            nread[i] -= 1
        if self.links:
            self.links.pop(sid, None)
        self.inputs[sid] = ()

    def remove(self, sid: int, absorbed: bool) -> None:
        """``sid`` leaves the graph; its id is free at once, or once the op ends for a version
        an in-place op absorbed (whose reads passed to the new version)."""
        if not absorbed:
            nread = self.nread
            for i in self.inputs[sid]:
                nread[i] -= 1
        if self.readers:
            self._unread(sid)
        self.inputs[sid] = ()
        if self.links:
            self.links.pop(sid, None)
        if not absorbed:
            self.free_ids.append(sid)

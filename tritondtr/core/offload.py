"""Offload: victims copied to the host and back instead of recomputed, with copies that run
beside the ops (copied out ahead of the need, brought back ahead of the read).

:class:`HostCopies` owns which storages have a host copy and the copies in flight;
:class:`Offloader` is the part of :class:`~tritondtr.core.Core` that decides (NOTE [ Offload ]
in core.py says which action a victim gets; this NOTE says when copies run).

# NOTE [ Asynchronous offload ]
# 1. A host copy outlives the eviction that made it. A storage's value never changes (a write
#    makes a new version: NOTE [ Fused versions ] in core.py), so its copy stays valid until
#    it leaves the core (``forget``) or becomes external (``externalize``: parameter writes).
#    A storage with a copy is either offloaded (evicted) or *backed* (resident, with its
#    bytes on the host too). Evicting a backed storage copies nothing: the executor frees
#    its buffer; any drop of it (a release, a hand-out, a consumed version) leaves it
#    offloaded, fetchable. A fetch keeps the copy, so the storage is backed again.
# 2. Copy out ahead (``Core(ahead=True)``, the default with a link): after each op, when the
#    link's device-to-host direction is idle and the room not yet backed, ``budget -
#    (resident - backed bytes)``, is less than ``headroom`` (the most bytes one op has added
#    so far, ``stats.max_op_out_bytes``), the best of the heuristic's top
#    :data:`AHEAD_CANDIDATES` that has no copy is copied out, if that pays with the copy out
#    hidden: its copy back is cheaper than its recomputation with its evicted neighbourhood
#    (always, under ``always_offload``), at the copy price scale (NOTE [ Copy price scale ]
#    in tuning.py; at the scale that never copies there is no look). Its bytes stay
#    resident and counted until the budget makes it a
#    victim; the ops go on meanwhile. One copy ahead at a time (the link is idle when one is
#    issued), so a copy made for room (NOTE [ Offload ] rule 3) queues behind at most one.
# 3. A backed victim is still priced as NOTE [ Offload ] rule 1 prices any victim, with
#    nothing left to copy out: the wait for its copy if in flight plus its copy back,
#    against its recomputation with its evicted neighbourhood; offloaded if that is no
#    higher, else its copy is dropped and so is it. The engine's cost of a backed storage
#    (and of it offloaded) is the lower of its copy back and its cost, what losing it costs
#    at most, so the heuristic weighs a backed victim by that, and its readers' evicted
#    neighbourhoods price it so. Its own ``cost`` stays. (Measured: pricing backed victims
#    and the lower of the two took the quick sweep's losses from 15 to 11; pricing the copy
#    back as hidden when a plan reads the victim later made it 14 (13 at half).)
# 4. Waiting: evicting a storage whose copy out is in flight waits until it is done (its
#    bytes count against the budget until then: the copy reads them, and on CUDA the
#    allocator may not reuse them before), as does bringing it back; an op reading a storage
#    whose copy back is in flight waits for it (``stats.link_wait_ns``). A storage released
#    or handed out while its copy is in flight does not wait (its bytes were not needed for
#    room; the executor keeps them until the copy is done). Nothing else waits for the link.
# 5. Prefetch (with a plan: ``Core.plan``, the order in which a previous step read its
#    storages, :class:`ReadPlan`; an offloaded storage waits in a heap by the op the plan
#    reads it at, an entry stale once the storage is fetched, its id reused or the plan's op
#    numbers started again): after each op, when the host-to-device direction is idle,
#    the offloaded storage the plan reads next, within the next :data:`PREFETCH_OPS` ops, is
#    copied back if its bytes fit below ``budget - headroom`` without evicting anything (a
#    storage no wrapper holds is not: no op can read it). It
#    is resident and counted from then, backed, its last use now; its fetch is a prefetch
#    (``stats.prefetches``), not a fetch. One the allocator refuses is given up, evicting
#    nothing (``Executor.fetch(hint=True)``).
# 6. All of it is in the core's device time (NOTE [ Offload link ] rule 2) and depends only on
#    sizes, costs, the link and the plan, so the twin replays the runtime's copies exactly.
#    The runtime's executor makes each copy when the core asks; whether it overlaps the
#    device's work (CUDA side streams) changes no decision.
# 7. Refusals: the executor may refuse a copy out (no host memory: the victim is dropped
#    instead) or a prefetch (the allocator: given up). The core numbers the copies it asks
#    for, out and back ahead, in one sequence and keeps the numbers refused
#    (``stats.refused_copies`` counts them); a recorded run carries them, and the twin,
#    asking for the same copies in the same order, refuses the same numbers (NOTE [ The
#    twin ] rule 9). A fetch for a read is not numbered: the runtime retries it after
#    evicting (NOTE [ Out-of-memory fallback ], outside the twin).
# 8. Measured (the twin, every recorded step, three links): docs/simulator.md, Where does
#    offload pay?
"""

from __future__ import annotations

import heapq
import math
from typing import Protocol

from ..engine.residency import RESIDENT
from .link import offload_price

__all__ = ["AHEAD_CANDIDATES", "PREFETCH_OPS", "HostCopies", "Offloader", "ReadPlan"]

AHEAD_CANDIDATES = 4  # rule 2: the heuristic's top candidates a copy ahead chooses among
PREFETCH_OPS = 32  # rule 5: how many ops ahead the plan is read


class ReadPlan(Protocol):
    """The order in which a previous step read its storages (NOTE [ Asynchronous offload ]
    rule 5), in the driver's op numbering."""

    def position(self) -> int:
        """The number of the op the driver runs next."""

    def next_read(self, sid: int) -> int | None:
        """The number of the first op from :meth:`position` on that reads ``sid``, or None."""

    @property
    def epoch(self) -> int:
        """How many times the plan's op numbers started again (a step plan's steps): a read
        it predicted in an earlier epoch is on another axis."""


class HostCopies:
    """Which storages have a host copy, and the copies in flight, in the core's device time
    (ns). The one writer of these fields; the :class:`Offloader` decides when they change.

    ``host[sid]``: a copy of ``sid``'s value exists on the host or is being made.
    ``copying[sid]``: when its copy out is done, while that is later than the last look.
    ``arriving[sid]``: when its copy back (a prefetch) is done, likewise. ``backed``: bytes
    of resident storages with a host copy. ``waiting``: the offloaded storages by the op
    the plan reads them at, ``(op, sid, its creation clock, the plan's epoch)`` (a heap;
    entries go stale, and are checked when popped: the storage fetched, forgotten, its id
    reused, or the plan's op numbers started again). ``asked``: copies asked of the executor
    so far, out and prefetched back (rule 7); ``refused``: the numbers of those it refused."""

    __slots__ = ("arriving", "asked", "backed", "copying", "host", "refused", "waiting")

    def __init__(self) -> None:
        self.host = bytearray()
        self.copying: dict[int, float] = {}
        self.arriving: dict[int, float] = {}
        self.backed = 0
        self.waiting: list[tuple[int, int, int, int]] = []
        self.asked = 0
        self.refused: list[int] = []

    def ask(self) -> int:
        """A copy is asked of the executor: its number (rule 7)."""
        self.asked += 1
        return self.asked

    def refuse(self, number: int) -> None:
        """The executor refused copy ``number`` (rule 7)."""
        self.refused.append(number)

    def grow(self) -> None:
        self.host.append(0)

    def made(self, sid: int, size: int, done: float) -> None:
        """Resident ``sid``'s copy out was issued; it is done at ``done``."""
        self.host[sid] = 1
        self.backed += size
        self.copying[sid] = done

    def went(self, sid: int, size: int) -> None:
        """Backed ``sid`` left the device (offloaded now)."""
        self.backed -= size

    def came(self, sid: int, size: int, done: float | None = None) -> None:
        """Offloaded ``sid`` is on the device again (backed); ``done``: a copy back in flight
        until then."""
        self.backed += size
        if done is not None:
            self.arriving[sid] = done

    def drop(self, sid: int, size: int, resident: bool) -> None:
        """``sid``'s copy is gone (it left the core or became external)."""
        if resident:
            self.backed -= size
        self.host[sid] = 0
        self.copying.pop(sid, None)
        self.arriving.pop(sid, None)


class Offloader:
    """The offload decisions of :class:`~tritondtr.core.Core` (NOTE [ Offload ] in core.py,
    NOTE [ Asynchronous offload ]); uses the core's lists, engine, link and counters."""

    def evict(self, sid: int) -> None:
        """Evict resident, unlocked ``sid``: offloaded if it is backed or that pays, else
        dropped (NOTE [ Offload ] rule 1)."""
        if self.copies.host[sid]:  # rule 1: its copy is there, or on its way (rule 4)
            if self.always_offload or self._backed_pays(sid):
                self._wait_copied(sid)
            else:  # rule 3: a drop is priced lower
                self.discard_copy(sid)
            self.drop(sid)
        elif self.link is not None and self.offload_pays(sid):
            self.offload(sid)
        else:
            self.drop(sid)

    def _drop_price(self, sid: int) -> float:
        """NOTE [ Offload ] rule 1: what dropping resident ``sid`` costs, its recomputation
        with its evicted neighbourhood (ns)."""
        eng = self.engine
        eng.flush()
        return self.cost[sid] + float(eng.table.host_nbhd_cost[self.eslot[sid]])

    def _backed_pays(self, sid: int) -> bool:
        """Rule 3: is evicting backed ``sid`` as an offload (waiting for its copy if in
        flight, then its copy back) priced no higher than dropping it?"""
        wait = max(0.0, self.copies.copying.get(sid, 0.0) - self.elapsed)
        copy = wait + self.link.duration(self.size[sid])
        return self.tuner.cheaper(copy, self._drop_price(sid), or_equal=True)

    def offload_pays(self, sid: int, ahead: bool = False) -> bool:
        """NOTE [ Offload ] rule 1: is offloading resident ``sid`` cheaper than dropping it?
        ``ahead``: its copy out would be hidden (rule 2), so only the copy back counts."""
        if self.always_offload:
            return True
        size, link = self.size[sid], self.link
        price = link.duration(size) if ahead else offload_price(size, link, self.elapsed)
        return self.tuner.cheaper(price, self._drop_price(sid))  # NOTE [ Copy price scale ]

    def offload(self, sid: int) -> None:
        """Evict resident, unlocked ``sid`` by copying it to the host now, the op that needs
        the room waiting for the copy (NOTE [ Offload ] rule 3); a copy the executor cannot
        make (no host memory) drops it instead."""
        if self._copy_out(sid):
            self._wait_copied(sid)  # rule 4
        self.drop(sid)

    def _copy_out(self, sid: int) -> bool:
        """Issue resident ``sid``'s copy to the host; False if the executor refused it."""
        number = self.copies.ask()  # rule 7
        try:
            self.executor.copy_out(sid)
        except RuntimeError:
            self.copies.refuse(number)
            self.stats.refused_copies += 1
            return False
        size, link, st = self.size[sid], self.link, self.stats
        self.copies.made(sid, size, link.copy_out(size, self.elapsed))
        self._price_backed(sid)
        st.offloads += 1
        st.offloaded_bytes += size
        st.link_busy_ns += link.duration(size)
        return True

    def _price_backed(self, sid: int) -> None:
        """Rule 3: the engine prices ``sid`` at the cheaper of its copy back and its cost."""
        slot = self.eslot[sid]
        if slot >= 0:
            self.engine.set_cost(slot, min(self.link.duration(self.size[sid]), self.cost[sid]))

    def _wait_copied(self, sid: int) -> None:
        """Rule 4: ``sid``'s bytes leave the device; wait for its copy out if in flight."""
        done = self.copies.copying.pop(sid, None)
        if done is not None:
            self.wait_until(done)

    def wait_arrived(self, sid: int) -> None:
        """Rule 4: an op reads ``sid``; wait for its copy back if in flight."""
        done = self.copies.arriving.pop(sid, None)
        if done is not None:
            self.wait_until(done)

    def fetch(self, sid: int) -> None:
        """Copy offloaded ``sid`` back (room already made: :meth:`recompute`), the reader
        waiting for it (NOTE [ Offload ] rule 4); it stays backed."""
        size, link = self.size[sid], self.link
        self.executor.fetch(sid)  # first: a refused allocation changes nothing
        self._wait_copied(sid)  # rule 4: its copy out first
        self.wait_until(link.copy_in(size, self.elapsed))
        self.set_offloaded(sid, False)
        self.copies.came(sid, size)
        self.stats.fetches += 1
        self.stats.fetched_bytes += size
        self.stats.link_busy_ns += link.duration(size)

    def discard_copy(self, sid: int) -> None:
        """``sid`` leaves the core or becomes external: its host copy goes (rule 1)."""
        resident = self.state[sid] == RESIDENT  # a copy in flight is not waited for (rule 4)
        self.copies.drop(sid, self.size[sid], resident)
        self.set_offloaded(sid, False)
        slot = self.eslot[sid]
        if slot >= 0:  # rule 3: priced as a recomputation again
            self.engine.set_cost(slot, self.cost[sid])
        self.executor.drop_copy(sid)

    # ----------------------------------------------------- copies beside the ops
    def after_op(self) -> None:
        """Rules 2 and 5, after each op, with a link and a budget."""
        budget, link = self.bytes.budget, self.link
        # at a scale that never copies no copy ahead can pay: no look (NOTE [ Copy price
        # scale ] rule 4)
        if self.ahead and link.out_busy <= self.elapsed and self.tuner.value != math.inf:
            room = budget - self.bytes.resident + self.copies.backed
            if room < self.stats.max_op_out_bytes:
                self._ahead()
        if self.plan is not None and link.in_busy <= self.elapsed:
            self._prefetch()

    def _ahead(self) -> None:
        """Rule 2: copy out the best candidate without a host copy, if that pays."""
        eng, host, sid_of = self.engine, self.copies.host, self.sid_of
        for slot in eng.select(self.now, AHEAD_CANDIDATES):
            sid = sid_of[slot]
            if not host[sid]:
                if self.offload_pays(sid, ahead=True):
                    self._copy_out(sid)
                return

    def _prefetch(self) -> None:
        """Rule 5: copy back the offloaded storage the plan reads next, if it fits."""
        plan, waiting, offloaded = self.plan, self.copies.waiting, self.offloaded
        pos, epoch = plan.position(), plan.epoch
        held, born = self.held, self.born
        while waiting:
            at, sid, made, planned = waiting[0]
            if (
                not offloaded[sid]  # fetched since
                or not held[sid]  # no op can read it (no wrapper holds it)
                or born[sid] != made  # forgotten, its id another storage's now
                or planned != epoch  # the plan's op numbers started again
            ):
                heapq.heappop(waiting)
                continue
            if at < pos:  # the plan's read did not come: when is the next?
                heapq.heappop(waiting)
                self.plan_read(sid)
                continue
            break
        else:
            return
        if at >= pos + PREFETCH_OPS:
            return
        size, acc = self.size[sid], self.bytes
        if acc.resident + size + self.stats.max_op_out_bytes > acc.budget:
            return
        heapq.heappop(waiting)
        number = self.copies.ask()  # rule 7
        try:
            self.executor.fetch(sid, hint=True)
        except RuntimeError:  # the allocator refused it: a prefetch is a hint, not a need
            self.copies.refuse(number)
            self.stats.refused_copies += 1
            return
        link = self.link
        start = max(self.elapsed, self.copies.copying.pop(sid, 0.0))  # rule 4: out first
        done = link.copy_in(size, start)
        self.set_offloaded(sid, False)
        self.resident_again(sid, True)  # its last use now: the plan reads it soon
        acc.arrive(size)
        self.copies.came(sid, size, done)
        st = self.stats
        st.prefetches += 1
        st.fetched_bytes += size
        st.link_busy_ns += link.duration(size)

    def plan_read(self, sid: int) -> None:
        """Offloaded ``sid`` waits for the plan's next read of it (rule 5)."""
        if self.plan is not None:
            at = self.plan.next_read(sid)
            if at is not None:
                heapq.heappush(self.copies.waiting, (at, sid, self.born[sid], self.plan.epoch))

"""Anchors and outside bytes: what the core keeps for an input that goes away for a while.

:class:`Anchors` is the part of :class:`~tritondtr.core.Core` that serves inputs the program
frees and brings back (FSDP2's unsharded parameters, NOTE [ FSDP2 ] in runtime/fsdp.py): it
keeps chosen storages resident while such an input is away, answers which held storages
depend on given ones, and counts bytes the rank holds outside the tracked storages (through
the core's :class:`~tritondtr.core.account.ByteAccount`).

# NOTE [ Anchored storages ]
# 1. An anchored storage is resident and never evicted (an engine pin) until every anchor
#    taken on it is released: anchors are counted per storage, one per absent input that
#    needs it. Anchoring an evicted storage recomputes it first, while its inputs are there.
# 2. An anchor survives the death of the storage's last wrapper: the buffer stays resident
#    (and counted) while recipes still refer to it, since recomputing it would need the
#    absent input. Forgetting, freezing or handing the storage out ends its anchors.
# 3. When its last anchor is released, a storage no wrapper holds is dropped at once (its
#    input is back, so it is recomputable, and nothing reads it but recomputations); a
#    held one becomes an ordinary candidate (unless a never-evict or backward pin stays).
# 4. Backward pins (NOTE [ Backward storages ]) never unpin an anchored storage.
# 5. *Outside* bytes are memory the rank holds that is no tracked storage (FSDP2's
#    unsharded parameters while allocated, the runtime's copies of them). They are part of
#    ``resident`` and of the peak, never evictable; when they grow, victims are evicted
#    until the budget holds again (NOTE [ Budget accounting ] rule 2, as for an op).
"""

from __future__ import annotations

from ..engine.residency import EXTERNAL, FREE, RESIDENT

__all__ = ["Anchors"]


class Anchors:
    """The anchored storages of one core (NOTE [ Anchored storages ]): ``anchored``, sid ->
    anchors taken, whose one writer this is. What an anchor does to a storage (recompute it,
    let it into the engine, pin it, drop it) is the core's work: the core is passed to each
    call that needs it (``core``, the :class:`~tritondtr.core.Core`), and never kept (a part
    holding its core would be a reference cycle: NOTE [ Session lifetime ] in
    runtime/session.py)."""

    __slots__ = ("anchored",)

    def __init__(self) -> None:
        self.anchored: dict[int, int] = {}

    def anchor(self, core, sid: int) -> None:
        """Keep ``sid`` resident and unevictable until :meth:`unanchor` (rule 1)."""
        state = core.state[sid]
        if state in (FREE, EXTERNAL):
            return
        core.sync()
        if state != RESIDENT:
            core.materialize(sid)
            core.unlock(sid)
        elif core.eslot[sid] < 0:  # NOTE [ Backward storages ] rule 5 in backward.py
            core.admit(sid)
        n = self.anchored.get(sid, 0)
        self.anchored[sid] = n + 1
        if n == 0:
            core.engine.pin(core.eslot[sid])

    def unanchor(self, core, sid: int) -> None:
        """Release one anchor of ``sid`` (rule 3)."""
        n = self.anchored.get(sid, 0)
        if n > 1:
            self.anchored[sid] = n - 1
            return
        if n == 0:
            return  # its anchors ended (rule 2)
        del self.anchored[sid]
        if core.pinned[sid] or core.pins.in_bw[sid]:
            return
        if core.held[sid]:
            core.engine.unpin(core.eslot[sid])
        else:
            core.drop(sid)
            core.stats.freed += 1

    def end(self, sid: int) -> None:
        """``sid`` was dropped, handed out, made external or forgotten: its anchors end
        (rule 2)."""
        self.anchored.pop(sid, None)

    @staticmethod
    def held_descendants(core, roots) -> list[int]:
        """The storages a wrapper holds among ``roots`` and everything computed from them
        (tracked edges only), in creation order."""
        inputs, state, held = core.inputs, core.state, core.held
        children: dict[int, list[int]] = {}
        for sid, parents in enumerate(inputs):
            if state[sid] != FREE:
                for p in parents:
                    children.setdefault(p, []).append(sid)
        seen, todo = set(roots), list(roots)
        while todo:
            for c in children.get(todo.pop(), ()):
                if c not in seen:
                    seen.add(c)
                    todo.append(c)
        found = [s for s in seen if held[s] and state[s] not in (FREE, EXTERNAL)]
        return sorted(found, key=core.born.__getitem__)

"""Rematerialization: making an evicted storage resident again, without Python recursion.

:class:`Rematerializer` is the part of :class:`~tritondtr.core.Core` that plans
recomputations: :meth:`~Rematerializer.materialize` recomputes a target and whatever evicted
storages its inputs need, with an explicit stack of :class:`Frame` records; each single
recomputation runs through the core's executor under the budget.

# NOTE [ Iterative rematerialization ]
# 1. ``materialize`` recomputes with an explicit stack of frames (a storage, the locks it
#    holds, its parent frame): no Python recursion, so a chain of any depth works (tested at
#    100k).
# 2. A frame pushes its evicted inputs (each child frame knows its parent frame); a finished
#    child is locked on behalf of its parent, so what was recomputed for a pending frame is
#    not evicted under it. Inputs that were resident are not locked while children run (a
#    deep path would otherwise lock everything along it): the frame re-checks on each visit
#    and locks all its inputs only to run (and only if it must make room: rule 8). Every
#    recomputed input stays locked for its frame, so each visit has fewer inputs to
#    recompute and the loop ends (rules 5 and 6 bound the exception).
# 3. On any exception every lock taken by any frame is released: the core is as before,
#    except for storages already recomputed, which are valid resident storages.
# 4. A frame's missing inputs are recomputed oldest first (creation clock ``born``). The
#    older one is usually an ancestor of the newer (a residual stream ``x + f(x)``), so it
#    is computed before its descendants rather than under their locks, and is not
#    recomputed once inside the newer one's frame, lost, and recomputed again (a residual
#    chain under ``stress`` needs far fewer rematerializations this way than newest first;
#    measured: see docs/benchmarks.md, Measurements behind the NOTEs, Iterative
#    rematerialization).
# 5. The inputs held for pending frames can fill the budget: along a backward chain whose
#    gradients were evicted, every level holds the activation it recomputed first. When a
#    recomputation then cannot make room, every lock of every frame is released (the frames
#    stay, with nothing held) and the top frame tries again; frames re-check their inputs on
#    their next visit and recompute what was evicted meanwhile. Only the caller's locks (the
#    op in flight's inputs) stay. At most 2 x (storages given a frame) releases per
#    ``materialize``, then the BudgetError stands; ``stats.relaxations`` counts them. The
#    same for a recomputation the allocator refused with nothing left to evict (the
#    executor's retries: NOTE [ Out-of-memory fallback ] rule 8 in runtime/oom.py).
# 6. A recomputation that recomputes the same storages over and over (more than 64
#    rematerializations per distinct storage given a frame, and more than 10,000 in all)
#    raises :class:`ThrashError` (a BudgetError) between two recomputations instead of
#    running on for minutes. The bound is loose on purpose: the zoo TreeLSTM at scale 1, 30 %
#    and ``lru`` recomputes its storages many times in one call and finishes (measured: see
#    docs/benchmarks.md, Measurements behind the NOTEs, Iterative rematerialization).
#    Unwinding is rule 3's.
# 7. ``stress`` (no budget) evicts everything evictable after every recomputation, so only
#    what the pending frames lock survives from one recomputation to the next. Where two
#    frames share an evicted ancestor that neither locks (an LSTM's gates feed its input,
#    forget, cell and output gates; a Tree-LSTM node feeds h and c), each recomputes it, and
#    the count multiplies per level (about 4x per LSTM step): the zoo LSTM and TreeLSTM
#    raised rule 6's ThrashError, which stress must never raise (NOTE [ Budget accounting ]
#    rule 4).
#    So under stress a storage that one ``materialize`` recomputes a second time stays locked
#    until its target is resident; then those locks are released and everything evictable is
#    evicted. Every storage is recomputed at most twice per ``materialize``, and a chain
#    that shares nothing (rule 4's residual chain) keeps its peak.
# 8. A frame locks its inputs to run only when its recomputation must make room first (the resident
#    bytes are over the budget): the locks keep ``make_room`` off them, and nothing else evicts
#    between the locks and the recomputation (the replay itself runs plain ops). Under the budget
#    nothing is evicted, so the locks would change no victim and cost two engine calls per input
#    (measured: docs/history/benchmarks-log.md, Replay bookkeeping). Children finished for the frame
#    stay locked either way (rule 2).

# NOTE [ Consumed versions ]
# 1. An in-place op makes a new version of the storage it writes (NOTE [ In-place versions ]
#    in runtime/outputs.py); recomputing that version replays the op on a copy of the old
#    version, which stays resident beside it. When the old version is only there for this
#    recomputation, the copy is waste: memory the budget must find by evicting, and a copy.
# 2. So a recomputation of version ``sid`` of storage ``p`` (``Core.writes``) *consumes* ``p``
#    when ``p`` is resident, held by no wrapper (the program never reads it again: NOTE
#    [ Unheld storages ] rule 1 in unheld.py), not pinned or anchored, read once by the op,
#    and locked by nobody but this frame: ``p`` is evicted first (its bytes leave the count
#    before room is made), and the replay writes ``p``'s buffer itself, which becomes
#    ``sid``'s. ``p`` keeps its recipe, like any evicted storage.
# 3. A chain of in-place ops (an RNN cell's gates: ``add_``, ``sigmoid_``, ``mul_`` on chunks
#    of one buffer) is then rebuilt in one buffer instead of one copy per link. Measured on
#    the twin: docs/history/benchmarks-log.md, Consumed versions.

# NOTE [ A recomputation is not a use ]
# 1. The heuristics' staleness (now - last access) stands for "how soon will the program read
#    this again". A storage that no wrapper holds (``held`` is 0: its last wrapper died, only
#    the inputs of other storages keep it) is never read by the program again; it matters
#    only as an input of further recomputations.
# 2. So a storage recomputed on the way to another one (not the storage asked for) and held
#    by no wrapper keeps the last access it had (``Engine.remat(slot, None)``). Once the
#    recomputation that needed it is done it is among the first victims, instead of the
#    program's own storages recomputed beside it. The storage asked for, and recomputed
#    storages a wrapper holds, take ``now``.
# 3. Why: with ``now`` for every recomputed storage, TinyGPT at the checkpoint's peak kept
#    most of its budget in such intermediates during the backward, all "just used", and
#    evicted the saved activations recomputed with them, then recomputed those again (far
#    more rematerializations; measured: see docs/benchmarks.md, Measurements behind the
#    NOTEs, A recomputation is not a use). Only victims change: values, the peak bound and
#    gradients are as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..engine.residency import EVICTED, EXTERNAL, RESIDENT
from .errors import BudgetError, ThrashError, is_oom

__all__ = ["Frame", "Rematerializer"]

_profiling = torch.autograd._profiler_enabled
_THRASH, _THRASH_MIN = 64, 10_000  # NOTE [ Iterative rematerialization ] rule 6


@dataclass(slots=True, eq=False)
class Frame:
    """One pending recomputation of ``materialize``'s stack.

    ``locks``: the storages locked for it (None until its first visit); ``parent``: the frame
    whose input it is, None for the target.
    """

    sid: int
    parent: Frame | None
    locks: list[int] | None = field(default=None)


class Rematerializer:
    """The rematerialization plan of :class:`~tritondtr.core.Core` (NOTE [ Iterative
    rematerialization ]); uses the core's lists, engine, executor and counters."""

    def materialize(self, target: int, use: bool = True) -> None:
        """Make ``target`` resident, leaving it locked once (the caller unlocks it). ``use``:
        the program reads it now (NOTE [ A recomputation is not a use ]); False for a
        recomputation the core makes on its own (NOTE [ Readers before release ] in core.py)."""
        self.sync()  # a lazy core drops only dead buffers, never one a caller asks for
        prof = torch.profiler.record_function("tritondtr::rematerialize") if _profiling() else None
        if prof is not None:
            prof.__enter__()
        stack = [Frame(target, None)]
        pushed, relaxed = {target}, 0  # storages given a frame; rule 5's releases
        stress, once, kept = self.stress, set(), []  # rule 7: recomputed once, locked to stay
        state, inputs, born, offloaded = self.state, self.inputs, self.born, self.offloaded
        stats = self.stats
        remats0 = stats.rematerializations + stats.fetches
        try:
            while stack:
                frame = stack[-1]
                sid = frame.sid
                if state[sid] != RESIDENT:
                    if frame.locks is None:
                        frame.locks = []
                    locks = frame.locks
                    if not offloaded[sid]:  # NOTE [ Offload ] rule 4: a fetch needs no input
                        missing = [Frame(i, frame) for i in inputs[sid] if state[i] == EVICTED]
                        if missing:
                            pushed.update(m.sid for m in missing)
                            if len(missing) > 1:  # rule 4: the oldest on top, computed first
                                missing.sort(key=lambda m: born[m.sid], reverse=True)
                            stack.extend(missing)
                            continue
                        if self.over_budget():  # rule 8: only room-making can evict an input
                            for i in inputs[sid]:
                                if state[i] != EXTERNAL:
                                    self.lock(i)
                                    locks.append(i)
                    try:
                        self.recompute(
                            sid,
                            use if sid == target else bool(self.held[sid]),
                            -1 if offloaded[sid] else self._consumable(sid, locks),
                        )
                    except BudgetError:
                        if relaxed >= 2 * len(pushed) or not self._relax(stack):
                            stats.budget_errors += 1
                            raise
                        relaxed += 1
                        continue  # rule 5: the top frame re-checks its inputs
                    except RuntimeError as e:  # rule 5, for the allocator's refusal
                        if not is_oom(e) or relaxed >= 2 * len(pushed) or not self._relax(stack):
                            raise
                        relaxed += 1
                        continue
                    for i in locks:
                        self.unlock(i)
                    frame.locks = None
                    if stress:  # rule 7
                        if sid in once:
                            self.lock(sid)
                            kept.append(sid)
                        else:
                            once.add(sid)
                    done = stats.rematerializations + stats.fetches - remats0
                    if done > _THRASH * len(pushed) and done > _THRASH_MIN:  # rule 6
                        stats.budget_errors += 1
                        raise ThrashError(self.name[target], self.bytes.budget, done, len(pushed))
                stack.pop()
                self.lock(sid)  # for the parent frame, or for the caller
                if frame.parent is not None:
                    frame.parent.locks.append(sid)
                if stress:
                    self.evict_all()
            if kept:  # rule 7: the target is resident
                for i in kept:
                    self.unlock(i)
                self.evict_all()
        except BaseException:
            for frame in stack:
                for i in frame.locks or ():
                    if state[i] == RESIDENT and self.lock_count(i):
                        self.unlock(i)
            for i in kept:
                if state[i] == RESIDENT and self.lock_count(i):
                    self.unlock(i)
            raise
        finally:
            if prof is not None:
                prof.__exit__(None, None, None)

    def _relax(self, stack: list[Frame]) -> bool:
        """Rule 5: release every lock the frames of ``stack`` hold, if frames below the top
        hold some; False if that cannot help."""
        if not any(frame.locks for frame in stack[:-1]):
            return False
        self.stats.relaxations += 1
        for frame in stack:
            for i in frame.locks or ():
                self.unlock(i)
            if frame.locks is not None:
                frame.locks = []
        return True

    def _consumable(self, sid: int, locks: list[int]) -> int:
        """NOTE [ Consumed versions ] rule 2: the storage the recomputation of ``sid`` may
        consume, or -1; unlocked and taken out of the frame's ``locks`` if it is."""
        p = self.writes[sid]
        if (
            p < 0
            or self.state[p] != RESIDENT
            or self.held[p]
            or self.pinned[p]
            or p in self.anchored
            or self.inputs[sid].count(p) != 1
        ):
            return -1
        mine = locks.count(p)
        if self.lock_count(p) != mine:
            return -1
        for _ in range(mine):
            locks.remove(p)
            self.unlock(p)
        return p

    def recompute(self, sid: int, use: bool, consume: int = -1) -> None:
        """Recompute evicted ``sid`` (inputs resident and locked). ``use``: the program will
        read it (NOTE [ A recomputation is not a use ]). ``consume``: the storage whose
        buffer the replay takes (NOTE [ Consumed versions ]), or -1."""
        self.tick()
        if self.eslot[sid] < 0:  # NOTE [ Backward storages ] rule 5 in backward.py
            self.admit(sid)
        if consume >= 0:
            self.drop(consume, free=False)
        fetch = self.offloaded[sid]  # NOTE [ Offload ] rule 4 in core.py
        try:
            self.make_room(self.name[sid])
            self.bytes.new_op()
            if fetch:
                self.fetch(sid)
            elif consume >= 0:
                self.executor.recompute(sid, consume)
            else:
                self.executor.recompute(sid)
        except BaseException:
            if consume >= 0:  # evicted in the core: its buffer goes too
                self.executor.free(consume)
            raise
        if not fetch:
            self.ran(self.cost[sid])
            self.stats.rematerializations += 1
        self.resident_again(sid, use)
        self.bytes.grow(self.size[sid])

    def resident_again(self, sid: int, use: bool) -> None:
        """Evicted ``sid``'s buffer is back (recomputed, fetched or prefetched): resident for
        the core, its engine slot and the unheld scorer; ``use``: its last use is now."""
        self.recomputed_resident(sid)
        scorer = self.scorer
        if scorer.inside:  # NOTE [ Unheld storages ] rule 6 in unheld.py
            scorer.forget_ancestors(sid, False)
        slot = self.eslot[sid]
        self.engine.remat(slot, self.now if use else None)
        if not self.held[sid]:  # NOTE [ Unheld storages ] rule 4 in unheld.py
            scorer.recomputed(sid)
        if self.pinned[sid]:
            self.engine.pin(slot)

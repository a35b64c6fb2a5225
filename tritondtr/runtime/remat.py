"""Rematerialization: making an evicted storage resident again, without Python recursion.

:func:`materialize` is ``Pool.materialize``: it recomputes ``target`` and whatever evicted
storages its recipe needs, with an explicit stack of frames; :func:`recompute` runs one
recipe under the budget.

# NOTE [ Iterative rematerialization ]
# 1. ``materialize`` recomputes with an explicit stack of frames [storage, locks]: no Python
#    recursion, so a chain of any depth works (tested at 100k).
# 2. A frame pushes its evicted inputs (each child frame knows its parent frame); a finished
#    child is locked on behalf of its parent, so what was recomputed for a pending frame is
#    not evicted under it. Inputs that were resident are not locked while children run (a
#    deep path would otherwise lock everything along it): the frame re-checks on each visit
#    and locks all its inputs only to run. Every recomputed input stays locked for its frame,
#    so each visit has fewer inputs to recompute and the loop ends (rules 5 and 6 bound the
#    exception).
# 3. On any exception every lock taken by any frame is released: the pool is as before,
#    except for storages already recomputed, which are valid resident storages.
# 4. A frame's missing inputs are recomputed oldest first (creation clock ``born``). The
#    older one is usually an ancestor of the newer (a residual stream ``x + f(x)``), so it
#    is computed before its descendants rather than under their locks, and is not
#    recomputed once inside the newer one's frame, lost, and recomputed again. Newest first,
#    a residual chain of 12 blocks under ``stress`` took 81,831 rematerializations (x4 per
#    two blocks) against 741, and on the demo's GPT a deep backward recomputation locked 17
#    storages (4.26 MiB, one residual and one dropout mask per block) where 3.89 MiB now do.
# 5. The inputs held for pending frames can fill the budget: along a backward chain whose
#    gradients were evicted, every level holds the activation it recomputed first (the zoo
#    MLP at width 512 and 30 %: six 256 KiB storages locked under a 1.28 MiB budget). When a
#    recomputation then cannot make room, every lock of every frame is released (the frames
#    stay, with nothing held) and the top frame tries again; frames re-check their inputs on
#    their next visit and recompute what was evicted meanwhile. Only the caller's locks (the
#    op in flight's inputs) stay. At most 2 x (storages given a frame) releases per
#    ``materialize``, then the BudgetError stands; ``stats.relaxations`` counts them. That MLP
#    now runs (4 releases, 354 rematerializations) where it raised.
# 6. A recomputation that recomputes the same storages over and over (more than 64
#    rematerializations per distinct storage given a frame, and more than 10,000 in all)
#    raises :class:`ThrashError` (a BudgetError) between two recomputations instead of
#    running on: without it the zoo TreeLSTM at scale 4 and 30 % ran for minutes under rule
#    5 (before rule 5: 42,510 rematerializations in 5.9 s, then a BudgetError; its eager
#    step takes 3.4 ms); now ThrashError after ~16,000 in 2.6 s. The bound is loose on
#    purpose: the TreeLSTM at scale 1, 30 % and ``lru`` needs ~25 per storage in one call
#    and finishes (5,440 rematerializations, 0.3 s); at 20 % it raises. Unwinding is rule 3's.

# NOTE [ A recomputation is not a use ]
# 1. The heuristics' staleness (now - last access) stands for "how soon will the program read
#    this again". A storage that no wrapper holds (its last wrapper died, only recipes keep
#    it: ``held`` is False) is never read by the program again; it matters only as an input
#    of further recomputations.
# 2. So a storage recomputed on the way to another one (not the storage the op in flight
#    asked for) and held by no wrapper keeps the last access it had (``Engine.remat(slot,
#    None)``). Once the recomputation that needed it is done it is among the first victims,
#    instead of the program's own storages recomputed beside it. The storage asked for, and
#    recomputed storages a wrapper holds, take ``now`` as before.
# 3. Why: with ``now`` for every recomputed storage, TinyGPT (8 layers, width 128) at the
#    checkpoint's peak kept ~14 of its ~20 MiB budget in such intermediates during the
#    backward (masked scores, pre-dropout masks, the qkv projection), all "just used", and
#    evicted the saved activations recomputed with them, then recomputed those again: each
#    storage 2.2 times on average, ~530 rematerializations per step. With this rule: ~295,
#    1.3 times each, about 40 % less recomputation time. The zoo at 70 / 50 / 30 / 20 %: fewer
#    in 9 of 16 settings (LSTM at 30 %: 702 -> 296), the same within 5 % in 6, more in one
#    (MLP at 30 %: 70 against 60); the demo: about half as many from 40 % to 20 % of its
#    peak, but one of eight runs at its lowest budget (11.2 %) hit a BudgetError
#    (docs/benchmarks.md, Runtime). Only victims change: values, the peak bound and gradients
#    are as before.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from .errors import BudgetError, ThrashError
from .recipe import WRITE, Storage, run_recipe

if TYPE_CHECKING:
    from .pool import Pool

__all__ = ["materialize", "recompute"]

_profiling = torch.autograd._profiler_enabled
_THRASH, _THRASH_MIN = 64, 10_000  # NOTE [ Iterative rematerialization ] rule 6


def _born(frame: list) -> int:
    return frame[0].born


def materialize(pool: Pool, target: Storage) -> torch.Tensor:
    """Make ``target`` resident (NOTE [ Iterative rematerialization ]); returns its
    buffer, with ``target`` locked once (the caller unlocks it)."""
    pool.sync()  # a lazy pool frees only dead buffers, never one a caller asks for
    prof = torch.profiler.record_function("tritondtr::rematerialize") if _profiling() else None
    if prof is not None:
        prof.__enter__()
    stack: list[list] = [[target, None, None]]  # [storage, locks, parent frame]
    pushed, relaxed = {id(target)}, 0  # storages given a frame; rule 5's releases
    remats0 = pool.stats.rematerializations
    try:
        while stack:
            frame = stack[-1]
            s = frame[0]
            if s.buf is None:
                if frame[1] is None:
                    frame[1] = []
                missing = [
                    [e[2], None, frame]
                    for e in s.recipe.inputs
                    if e[5] <= WRITE and e[2].slot >= 0 and e[2].buf is None
                ]
                if missing:
                    pushed.update(id(m[0]) for m in missing)
                    if len(missing) > 1:  # rule 4: the oldest on top, computed first
                        missing.sort(key=_born, reverse=True)
                    stack.extend(missing)
                    continue
                locks = frame[1]
                for e in s.recipe.inputs:
                    if e[5] <= WRITE and e[2].slot >= 0:
                        pool.lock(e[2])
                        locks.append(e[2])
                try:
                    recompute(pool, s, s is target or s.held)
                except BudgetError:
                    if relaxed >= 2 * len(pushed) or not _relax(pool, stack):
                        raise
                    relaxed += 1
                    continue  # rule 5: the top frame re-checks its inputs
                for x in locks:
                    pool.unlock(x)
                frame[1] = None
                done = pool.stats.rematerializations - remats0
                if done > _THRASH * len(pushed) and done > _THRASH_MIN:  # rule 6
                    pool.stats.budget_errors += 1
                    raise ThrashError(target.recipe.info.name, pool.budget, done, len(pushed))
            stack.pop()
            pool.lock(s)  # for the parent frame, or for the caller
            if frame[2] is not None:
                frame[2][1].append(s)
            if pool.config.stress:
                pool.evict_all()
        return target.buf
    except BaseException:
        for frame in stack:
            for x in frame[1] or ():
                if x.buf is not None and pool.engine.lock_count(x.slot):
                    pool.unlock(x)
        raise
    finally:
        if prof is not None:
            prof.__exit__(None, None, None)


def _relax(pool: Pool, stack: list[list]) -> bool:
    """NOTE [ Iterative rematerialization ] rule 5: release every lock the frames of
    ``stack`` hold, if frames below the top hold some; False if that cannot help."""
    if not any(frame[1] for frame in stack[:-1]):
        return False
    pool.stats.budget_errors -= 1  # handled here; counted by make_room
    pool.stats.relaxations += 1
    for frame in stack:
        for x in frame[1] or ():
            pool.unlock(x)
        if frame[1] is not None:
            frame[1] = []
    return True


def recompute(pool: Pool, s: Storage, use: bool) -> None:
    """Recompute evicted ``s`` (inputs resident and locked). ``use``: the program will
    read it (NOTE [ A recomputation is not a use ])."""
    rec = s.recipe
    pool.now += 1
    pool.make_room(rec.info.name)
    pool.op_bytes = 0
    t0 = time.perf_counter()
    bufs = run_recipe(rec, (s.out,))
    pool.stats.recompute_s += time.perf_counter() - t0
    buf = bufs[0]
    if buf.untyped_storage().nbytes() != s.nbytes:  # NOTE [ Replay context ] rule 2
        raise AssertionError(
            f"bug of tritondtr: recomputing {rec.info.name} gave a buffer of "
            f"{buf.untyped_storage().nbytes()} bytes, the first execution {s.nbytes}"
        )
    s.buf = buf
    pool.engine.remat(s.slot, pool.now if use else None)
    pool.stats.rematerializations += 1
    if s.pinned:
        pool.engine.pin(s.slot)
    pool.grow(s.nbytes)

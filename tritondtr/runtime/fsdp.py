"""FSDP2 (``torch.distributed.fsdp.fully_shard``) inside a session: parameters that come and go.

# NOTE [ FSDP2 ]
# 1. FSDP2 all-gathers a module's parameters before its forward and again before its
#    backward, and frees them after each (``untyped_storage().resize_(0)``: the unsharded
#    parameter stays the same tensor, with the same ``_version``). A recipe reading a freed
#    parameter cannot run. Unsharding it for one recomputation is a collective that only
#    this rank would enter (ranks evict and recompute differently: costs are timed per
#    rank), so it would hang; no recomputation ever reads a freed parameter instead.
# 2. Just before FSDP frees the parameters of one ``fully_shard`` group (its
#    ``FSDPParamGroup._to_sharded`` / ``_to_sharded_post_forward``, wrapped while a session
#    is active, with ``_to_unsharded``: :meth:`FSDPWatch.install`), the session looks for
#    the live storages whose recipes read them, directly or through a version they absorbed
#    (NOTE [ Fused versions ] in core/core.py; their *readers*). If a wrapper still holds
#    one of them or anything computed from them, it keeps the cheapest of three sufficient
#    cuts, in bytes not already kept:
#      a. ``readers``: anchor the readers (NOTE [ Anchored storages ] in core/anchors.py);
#      b. ``held``: anchor the held storages computed from them (the *held dependents*);
#      c. ``copy``: copy the parameters' memory; recomputations read the copy while FSDP's
#         memory is away (``stand_in``), and its bytes are counted (rule 3).
#    Anchoring an evicted storage recomputes it first, while the parameters are still
#    there. All of it ends when FSDP brings the group's parameters back (``_to_unsharded``).
#    Decided per group, not per parameter: the held dependents of a block are the same for
#    all its parameters, so per parameter a small bias always looked cheaper to copy.
#    After a block's forward the copy is smallest when activations outweigh parameters, the
#    readers when parameters do; after its backward the held dependents are (the loss and
#    the gradient flowing on, against the block's whole forward, which still leads to the
#    loss). Each single cut fails on one of two stacks (docs/benchmarks.md, "Which cut does
#    FSDP2 need?").
#    Ties prefer b, then a.
# 3. The budget counts what the rank holds for FSDP while the session sees it: a group's
#    unsharded parameters from ``_to_unsharded`` to their free, and the copies of rule 2c
#    (outside bytes, NOTE [ Anchored storages ] rule 5). Not counted, like parameters
#    without FSDP: the sharded parameters, gradients, optimizer state, and FSDP's transient
#    all-gather and reduce-scatter buffers. With ``budget=None`` nothing is kept (nothing
#    is evicted), and ``stats.peak_bytes`` is the baseline peak in this accounting.
# 4. FSDP's own buffers never become wrappers: its copies and collectives run under no_grad
#    on plain tensors (NOTE [ What is tracked ] rule 2), it allocates with ``torch.empty``
#    (rule 5), and a parameter's gradient is plain before FSDP reduce-scatters it (rule 4).
# 5. FSDP keeps the unsharded parameter's ``_version`` across its copies, so a recipe cannot
#    see the optimizer's update through it. The sharded parameters are therefore watched as
#    parameters are (NOTE [ Parameter writes ]): the first write to one after tracked work
#    freezes every held storage. A sharded parameter found changed when FSDP brings it back
#    while storages still depend on its old value is a bug of tritondtr (an unseen write).
# 6. At exit, if FSDP freed a parameter during the session, every held storage is frozen
#    (NOTE [ Parameter writes ] rule 2), the copies are dropped and FSDP's memory is no
#    longer counted: wrappers that escape the session never depend on FSDP's memory, which
#    the next step overwrites unseen.
# 7. FSDP's own copies into a group's unsharded memory are not parameter writes (NOTE
#    [ Parameter writes ] rule 3 would take them for writes to memory recipes read): rules 2
#    and 5 cover that memory, so its storages (``storage_key``: the same object across FSDP's
#    ``resize_``) are left out of rule 3's addresses.
"""

from __future__ import annotations

import functools
import sys
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .recipe import PLAIN, WRITE, derive, geometry

__all__ = ["FSDPWatch", "storage_key"]

_FSDP_GROUP = "torch.distributed.fsdp._fully_shard._fsdp_param_group"  # torch 2.11 to 2.13
POLICIES = ("min", "held", "readers", "copy")  # rule 2; "min" is the runtime's


class Kept(NamedTuple):
    """What is kept for one FSDP parameter group while its memory is away (rule 2)."""

    cut: str  # "held", "readers" or "copy"
    anchors: tuple[int, ...]  # anchored sids
    copies: tuple[int, ...]  # storage keys in ``FSDPWatch.copies``
    nbytes: int  # of the copies
    versions: tuple[int, ...]  # the sharded parameters' ``_version`` at the free (rule 5)


class FSDPWatch:
    """The session's view of FSDP2 (NOTE [ FSDP2 ]); created by the session, which calls
    :meth:`install` at entry and :meth:`close` at exit. ``policy`` selects rule 2's cut
    (``"min"``; the others exist for docs/benchmarks.md)."""

    def __init__(self, session, policy: str = "min") -> None:
        if policy not in POLICIES:
            raise ValueError(f"FSDP policy must be one of {POLICIES}, got {policy!r}")
        self.session = session
        self.policy = policy
        self.counted: dict[int, int] = {}  # id(FSDPParamGroup) -> bytes counted (rule 3)
        self.kept: dict[int, Kept] = {}  # id(FSDPParamGroup) -> what is kept (rule 2)
        self.copies: dict[int, torch.Tensor] = {}  # storage key -> copy (rule 2c)
        self.frees = 0  # group frees seen (rule 6)
        self.cuts: dict[str, int] = dict.fromkeys(POLICIES[1:], 0)  # cuts taken, per kind
        self.keys: set[int] = set()  # storage keys of every group's unsharded memory (rule 7)
        self._saved: tuple | None = None

    # ---------------------------------------------------------------- install
    def install(self) -> None:
        """Wrap FSDP2's free and unshard of a parameter group, if FSDP2 is in use (rule 2)."""
        mod = sys.modules.get(_FSDP_GROUP)
        if mod is None or self._saved is not None:
            return
        cls = mod.FSDPParamGroup
        saved = (cls._to_sharded, cls._to_sharded_post_forward, cls._to_unsharded)

        def freeing(method):
            @functools.wraps(method)
            def wrapper(group, *args, **kwargs):
                self.before_free(group)
                return method(group, *args, **kwargs)

            return wrapper

        @functools.wraps(saved[2])
        def to_unsharded(group, *args, **kwargs):
            out = saved[2](group, *args, **kwargs)
            self.after_unshard(group)
            return out

        self._saved = (cls, saved)
        cls._to_sharded, cls._to_sharded_post_forward = freeing(saved[0]), freeing(saved[1])
        cls._to_unsharded = to_unsharded

    def close(self, freeze: bool) -> None:
        """At exit (rule 6): freeze if FSDP freed anything, drop the copies, unwrap FSDP."""
        try:
            if freeze and self.frees:
                self.session.freeze()
        finally:
            if self._saved is not None:
                cls, saved = self._saved
                cls._to_sharded, cls._to_sharded_post_forward, cls._to_unsharded = saved
                self._saved = None
            core = self.session.core
            core.shrink_outside(sum(k.nbytes for k in self.kept.values()))
            core.shrink_outside(sum(self.counted.values()))
            self.kept.clear()
            self.copies.clear()
            self.counted.clear()

    # ----------------------------------------------------------------- events
    def before_free(self, group) -> None:
        """FSDP is about to free ``group``'s unsharded parameters (rules 2, 3 and 5)."""
        storages = _storages(group)
        if not storages:
            return
        self.keys.update(key for key, _ in storages)  # rule 7
        session = self.session
        core = session.core
        self.frees += 1
        for p in group.fsdp_params:
            session.watch_leaf(p.sharded_param)  # rule 5: its writes freeze
        if core.evicting and id(group) not in self.kept:
            with _disable_current_modes():
                if session.depth == 0:
                    session.drain()
                with session.in_flight():
                    kept = self._keep(group, storages)
            if kept is not None:
                self.kept[id(group)] = kept
        nbytes = self.counted.pop(id(group), 0)
        if nbytes:
            core.shrink_outside(nbytes)

    def after_unshard(self, group) -> None:
        """FSDP brought ``group``'s unsharded parameters back (rules 2, 3 and 5)."""
        session = self.session
        storages = _storages(group)
        self.keys.update(key for key, _ in storages)  # rule 7
        kept = self.kept.pop(id(group), None)
        nbytes = sum(st.nbytes() for _, st in storages)
        count = nbytes and id(group) not in self.counted and not session.closed
        if kept is None and not count:
            return
        with _disable_current_modes():
            if session.depth == 0:  # dead storages forgotten before anything is dropped
                session.drain()
            if kept is not None:
                self._release(group, kept)
            if count:
                self.counted[id(group)] = nbytes
                session.core.grow_outside(nbytes, f"FSDP2 all-gather of {_name(group)}")

    # ------------------------------------------------------------------ cuts
    def _keep(self, group, storages) -> Kept | None:
        core = self.session.core
        readers = self._readers({key for key, _ in storages})
        if not readers:
            return None
        held = core.held_descendants(readers)
        if not held:
            return None  # nothing the program can read needs the parameters again
        size, anchored = core.size, core.anchored
        costs = {  # bytes not kept yet
            "held": sum(size[s] for s in held if s not in anchored),
            "readers": sum(size[s] for s in readers if s not in anchored),
            "copy": sum(st.nbytes() for _, st in storages),
        }
        cut = min(costs, key=costs.get) if self.policy == "min" else self.policy
        self.cuts[cut] += 1
        versions = _versions(group)
        if cut == "copy":
            for key, st in storages:
                copy = torch.empty((0,), dtype=torch.uint8, device=st.device)
                self.copies[key] = copy.set_(st.clone())
            core.grow_outside(costs["copy"], f"copy of FSDP2 parameters of {_name(group)}")
            return Kept(cut, (), tuple(k for k, _ in storages), costs["copy"], versions)
        sids = held if cut == "held" else sorted(readers, key=core.born.__getitem__)
        for sid in sids:
            core.anchor(sid)
        return Kept(cut, tuple(sids), (), 0, versions)

    def _release(self, group, kept: Kept) -> None:
        core = self.session.core
        if _versions(group) != kept.versions:  # rule 5
            live = [s for s in kept.anchors if s in core.anchored]
            if live or (kept.copies and self._readers(set(kept.copies))):
                raise AssertionError(
                    f"bug of tritondtr: FSDP2 parameters of {_name(group)} changed while "
                    "tracked storages depended on their old values (a write the session did "
                    "not see; NOTE [ FSDP2 ] rule 5)"
                )
        for sid in kept.anchors:
            core.unanchor(sid)
        for key in kept.copies:
            del self.copies[key]
        if kept.nbytes:
            core.shrink_outside(kept.nbytes)

    def _readers(self, keys: set[int]) -> list[int]:
        """Sids of the live storages whose recipes read one of the storages ``keys``."""
        found = []
        for ref in self.session.storages:
            s = ref() if ref is not None else None
            if s is None or s.recipe is None or s.sid < 0:
                continue
            if _reads(s.recipe, keys):
                found.append(s.sid)
        return found

    @property
    def stand_in(self):
        """``run_recipe``'s ``stand_in`` (rule 2c): None while no copy exists."""
        return self._stand_in if self.copies else None

    def _stand_in(self, t: torch.Tensor) -> torch.Tensor:
        copy = self.copies.get(storage_key(t))
        if copy is None or t.untyped_storage().nbytes():
            return t
        return derive(copy, geometry(t))


def _reads(rec, keys: set[int]) -> bool:
    """Whether ``rec`` reads plain memory ``keys``, itself or through a version it absorbed
    (NOTE [ Fused versions ] in core/core.py: an input Storage with sid -1 and a recipe)."""
    for e in rec.inputs:
        if e.mode == PLAIN:
            if storage_key(e.source) in keys:
                return True
        elif e.mode <= WRITE:
            src = e.source
            if src.sid < 0 and src.recipe is not None and _reads(src.recipe, keys):
                return True
    return False


def _storages(group) -> list[tuple[int, torch.UntypedStorage]]:
    """(key, storage) of the unsharded memory FSDP holds for ``group`` now (not freed)."""
    out, seen = [], set()
    for p in group.fsdp_params:
        for t in (*p.all_gather_outputs, *getattr(p, "_unsharded_inner_tensors", ())):
            st = t.untyped_storage()
            key = st._cdata
            if key not in seen and st.nbytes():
                seen.add(key)
                out.append((key, st))
    return out


def _versions(group) -> tuple[int, ...]:
    return tuple(p._sharded_param_data._version for p in group.fsdp_params)


def storage_key(t) -> int | None:
    """The identity of ``t``'s untyped storage (stable across ``resize_``); None for a tensor
    without one (a subclass)."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _name(group) -> str:
    return getattr(group, "_module_fqn", None) or "the root module"

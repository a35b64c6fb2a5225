"""Where tracked memory meets plain tensors: values handed out, parameter writes, ops after
the context exits, and the debug-mode invariant check.

# NOTE [ Parameter writes ]
# 1. Recipes read parameters as they were (``_version`` is recorded). An in-place write to a
#    plain leaf the session has seen (``optimizer.step()``, ``p.sub_(...)``) would make every
#    storage that depends on the old value unrecomputable.
# 2. So before the first such write after any tracked op, every storage a wrapper still holds
#    (the loss, logits the program kept, saved tensors of a retained graph) is recomputed if
#    evicted and turned external for good: it keeps its value, leaves the engine and the byte
#    count. Tensors that escape a training step therefore stay valid.
# 3. The same holds for any plain memory a recipe read: the session keeps the address of
#    every plain storage its live recipes read (:class:`ReadMemory`: a parameter's while it
#    is hooked, NOTE [ What is tracked ] rule 4; any other plain input's while a recipe that
#    records it lives; the buffer of an external wrapper or of another session's wrapper,
#    which a recipe reads through its plain value). Memory whose readers all died is free
#    to write (BatchNorm's running statistics, read by the backward's recipes of the last
#    step, are written by the next forward). An in-place write to read memory is rule 1's
#    write, whatever tensor it goes through: the tensor itself; another tensor on the same
#    memory (``p.data`` in manual SGD, ``p.data.add_(g, alpha=-lr)``, has a version counter
#    of its own, and views made inside the session are not autograd views, so they do not
#    share one either); or a wrapper whose storage is external (handed out by ``.numpy()``,
#    ``data_ptr()``, ``unwrap``, frozen by an earlier write) or another session's (a cache
#    made in one session and updated in the next), whose op writes the plain buffer below
#    autograd.
#    Version counters see none of these, and a recomputation after the write would read the
#    new contents, silently. ``F.alpha_dropout`` of a plain tensor does it inside one call
#    (ATen writes its plain noise after a tracked op read it).
# 4. Not watched: writes that do not reach the dispatcher (C++ or numpy through raw
#    pointers, writes between two sessions). A recomputation after one raises
#    :class:`StaleInputError` naming the op if the plain tensor's version moved, else reads
#    the new contents.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..engine.residency import EXTERNAL, RESIDENT
from .copies import bytes_of
from .dynamo import opaque
from .fsdp import storage_key
from .recipe import Storage, derive, storage_ptr
from .semantics import ONE, bump_versions
from .tensor import WRAPPER_TYPES, DTRTensor

__all__ = [
    "ReadMemory",
    "call_plain",
    "check_invariants",
    "freeze",
    "reads_plain",
    "value",
    "writes_leaf",
]


@opaque  # behind unwrap, .tolist(), printing: NOTE [ Dynamo never traces the runtime ]
def value(session, t: DTRTensor, *, escape: bool) -> torch.Tensor:
    """The plain value of ``t`` (recomputed if evicted). ``escape``: hand the buffer out
    (NOTE [ Escaping tensors ] rule 2), required whenever the plain tensor may outlive
    the call or be written."""
    core = session.core
    with _disable_current_modes():
        cell = t._cell
        s = cell.storage
        if s.recipe is None:
            return derive(s.buf, t._view)
        with session.in_flight():
            observer = session.observer
            if s.buf is None:
                if observer is not None:
                    observer.materialized(s.sid)
                core.materialize(s.sid)
                core.unlock(s.sid)
            if session.host_link.pending:  # NOTE [ Host copies on CUDA ] rule 5
                session.host_link.order((s.sid,))
            buf = s.buf
            if escape:
                cell.storage = Storage(buf, s.nbytes, -1, None, -1, session.released)
                core.hand_out(s.sid, escape=True)
                if observer is not None:
                    observer.released(s.sid)
            return derive(buf, t._view)


class ReadMemory:
    """NOTE [ Parameter writes ] rule 3: the plain memory the session's live recipes read,
    and its hooked leaves' memory, by storage address.

    ``leaves``: address -> weak reference to the leaf (a parameter stays watched while it
    lives and its memory is there). ``readers``: address -> number of live recipes that read
    plain memory there, other than a hooked leaf's (a view of a parameter, ``t(W)`` of every
    linear layer, is the leaf's memory: watched already, counted by nobody). A recipe is
    counted when it is sealed and uncounted by a weak-reference callback when it dies (it
    holds the tensors it reads, so the memory cannot be freed and reused meanwhile). So
    memory whose readers all died (BatchNorm's running statistics after the backward that
    read them) is written freely. The callbacks are few: most plain reads are parameters'.
    """

    __slots__ = ("_ids", "_watch", "leaves", "readers")

    def __init__(self) -> None:
        self.leaves: dict[int, weakref.ref] = {}
        self._ids: dict[int, weakref.ref] = {}  # id of a hooked leaf -> weak reference to it
        self.readers: dict[int, int] = {}
        self._watch: set[weakref.ref] = set()  # keeps the recipes' callbacks alive

    def __len__(self) -> int:
        """Addresses watched (leaves and read memory, possibly counted twice)."""
        return len(self.leaves) + len(self.readers)

    def leaf(self, p: torch.Tensor, skip: set[int]) -> None:
        """Hooked leaf ``p`` (NOTE [ What is tracked ] rule 4); ``skip``: storage keys to
        leave out (NOTE [ FSDP2 ] rule 7). Its entries go when it dies (rule 8); a live leaf
        at the same address keeps it (a parameter, not autograd's unpacked ``t(W)``)."""
        ptr = storage_ptr(p)
        if ptr and not (skip and storage_key(p) in skip):
            ref = weakref.ref(p, _forget(self._ids, id(p), self.leaves, ptr))
            self._ids[id(p)] = ref
            old = self.leaves.get(ptr)
            held = old() if old is not None else None
            if held is None or storage_ptr(held) != ptr:
                self.leaves[ptr] = ref

    def recipe(self, rec, plains: list[torch.Tensor], skip: set[int]) -> None:
        """``rec`` is sealed and reads the plain tensors ``plains``: count it as a reader of
        their memory, a leaf's apart."""
        ptrs = ()
        readers, ids = self.readers, self._ids
        for t in plains:
            base = t._base  # a view of a parameter (``t(W)``): autograd made it a view of it
            if base is not None:
                ref = ids.get(id(base))
                if ref is not None and ref() is base:
                    continue  # the leaf's memory: watched as the leaf
            ptr = storage_ptr(t)
            if not ptr or self._leaf(ptr):  # a parameter's memory: watched as the leaf
                continue
            if skip and storage_key(t) in skip:
                continue
            readers[ptr] = readers.get(ptr, 0) + 1
            ptrs += (ptr,)
        if ptrs:
            watch = self._watch

            def died(ref, ptrs=ptrs) -> None:  # a dict update: safe inside the collector
                watch.discard(ref)
                for ptr in ptrs:
                    n = readers.get(ptr, 0) - 1
                    if n > 0:
                        readers[ptr] = n
                    else:
                        readers.pop(ptr, None)

            watch.add(weakref.ref(rec, died))

    def _leaf(self, ptr: int) -> bool:
        ref = self.leaves.get(ptr)
        leaf = ref() if ref is not None else None
        return leaf is not None and storage_ptr(leaf) == ptr

    def written(self, t: torch.Tensor) -> bool:
        """Whether writing plain tensor ``t`` writes memory a live recipe reads, or a hooked
        leaf's memory. A view of a hooked leaf is the leaf's memory by identity, as
        :meth:`recipe` counts it: once ``p.data = new`` gave the leaf other memory, its old
        address in ``leaves`` no longer says so (fuzz seed 501888)."""
        base = t._base
        if base is not None:
            ref = self._ids.get(id(base))
            if ref is not None and ref() is base:
                return True
        ptr = storage_ptr(t)
        return bool(ptr) and (ptr in self.readers or self._leaf(ptr))

    def clear(self) -> None:
        self.leaves.clear()
        self._ids.clear()
        self.readers.clear()
        self._watch.clear()


def _forget(ids: dict, key: int, leaves: dict, ptr: int):
    """The weak-reference callback that drops a dead leaf's entries (NOTE [ What is tracked ]
    rule 8); it holds the dicts, not their owner (cleared at the session's exit)."""

    def forget(ref) -> None:  # dict updates: safe inside the collector
        if ids.get(key) is ref:
            del ids[key]
        if leaves.get(ptr) is ref:
            del leaves[ptr]

    return forget


def writes_leaf(session, info, args, kwargs) -> bool:
    """Whether the op writes plain memory the session's recipes read (NOTE [ Parameter
    writes ] rules 1 and 3)."""
    reads = session.reads
    for key in info.written:
        v = (args[key] if key < len(args) else None) if type(key) is int else kwargs.get(key)
        for t in v if isinstance(v, (list, tuple)) else (v,):
            if type(t) in WRAPPER_TYPES:
                cell = t._cell
                s = cell.storage
                if cell.session is session and s.recipe is not None:
                    continue  # a tracked storage: the write makes a new version
                t = s.buf  # external or another session's: its plain buffer, if resident
                if t is None:
                    continue  # not resident: no recipe of this session read it
            elif not isinstance(t, torch.Tensor):
                continue
            if session.watches(t):
                return True
            if reads and reads.written(t):
                return True
    return False


def reads_plain(session, t: torch.Tensor) -> bool:
    """Whether the session's recipes read plain tensor ``t`` (a hooked leaf, or memory a
    live recipe reads): replacing its memory (NOTE [ Plain .data assignment ] in
    plaindata.py) is a write of NOTE [ Parameter writes ]."""
    return session.watches(t) or bool(session.reads and session.reads.written(t))


def freeze(session) -> bool:
    """NOTE [ Parameter writes ]: hand out every storage a wrapper still holds; False if
    the session has tracked nothing yet (nothing to hand out)."""
    core = session.core
    if core.device is None:
        return False
    with _disable_current_modes():  # a release may recompute (NOTE [ Readers before release ])
        session.drain()
        if session.observer is not None:
            session.observer.froze()
        with session.in_flight():
            core.freeze()
    return True


def call_plain(info, args, kwargs):
    """After exit (NOTE [ Escaping tensors ] rule 1): plain values in, plain out."""
    pargs, pkw = list(args), dict(kwargs)
    for i, kind, name in info.args:
        where, key = (pargs, i) if name is None else (pkw, name)
        if (name is None and i >= len(pargs)) or (name is not None and name not in pkw):
            continue
        v = where[key]
        if kind == ONE:
            where[key] = unwrap_any(v)
        elif v is not None:
            where[key] = [unwrap_any(t) for t in v]
    out = info.run(*pargs, **pkw)
    if info.bump:  # NOTE [ Op semantics ] rule 11
        bump_versions(info, args, kwargs)
    for r, (_, _, wrote_arg) in enumerate(info.rets):
        if wrote_arg is not None:
            obj = args[wrote_arg] if type(wrote_arg) is int else kwargs[wrote_arg]
            if len(info.rets) == 1:
                return obj
            out = (*out[:r], obj, *out[r + 1 :])
    return out


def check_invariants(session) -> None:
    """Raise AssertionError if the session's storages disagree with its core (debug mode)."""
    core = session.core
    if core.device is None:
        return
    with _disable_current_modes():  # the engine's checks run torch ops: never our own
        core.check_invariants(ops_in_flight=session.depth > 0)
        session.host_link.settle()  # NOTE [ Host copies on CUDA ]: the host copies are whole
    pending = set(session.released)
    owner: dict[int, int] = {}  # data_ptr of a resident tracked buffer -> its sid
    for sid, ref in enumerate(session.storages):
        s = ref() if ref is not None else None
        if s is None or s.sid != sid or sid in pending:
            continue
        if s.recipe is None:
            assert core.state[sid] == EXTERNAL and s.buf is not None, f"storage {sid}: external"
        else:
            res = core.state[sid] == RESIDENT
            assert res == (s.buf is not None), f"storage {sid}: buffer vs core residency"
            assert bool(core.host[sid]) == (s.host is not None), (  # NOTE [ Offload ]
                f"storage {sid}: host copy vs the core's"
            )
            if res and s.host is not None:  # NOTE [ Asynchronous offload ] rule 1: backed
                assert torch.equal(s.host[0], bytes_of(s.buf).cpu()), (
                    f"storage {sid} ({core.name[sid]}): its bytes changed since its host copy"
                )
            if core.lazy:  # NOTE [ Lazy engine ]: held storages are all resident
                assert res or not core.held[sid], f"storage {sid}: held, not resident"
            if res and s.nbytes:  # NOTE [ Op semantics ] rule 8: one storage per buffer
                ptr = s.buf.untyped_storage().data_ptr()
                other = owner.setdefault(ptr, sid)
                assert other == sid, (
                    f"storages {other} ({core.name[other]}) and {sid} ({core.name[sid]}) share "
                    "one buffer: an op returned a view its schema does not annotate; register "
                    "it with hidden_alias in runtime/semantics.py"
                )


def unwrap_any(v):
    if type(v) in WRAPPER_TYPES:
        return v._cell.session.value(v, escape=True)
    return v

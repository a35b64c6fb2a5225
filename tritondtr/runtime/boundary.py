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
# 3. Writes to other plain tensors the program reads (an input batch reused in place) are not
#    watched: a later recomputation raises :class:`StaleInputError` naming the op.
# 4. A write is a parameter write when it goes to the leaf itself or to any plain tensor on
#    the leaf's memory: ``p.data`` (manual SGD: ``p.data.add_(g, alpha=-lr)``) and views of
#    ``p`` are other tensor objects, and ``p.data`` has a version counter of its own, so
#    neither the leaf's identity nor rule 1's version check would see the write, and a
#    recomputation after it would silently read the new weights. The session keeps, per
#    hooked leaf, the address of its storage (NOTE [ What is tracked ] rule 4).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..residency import EXTERNAL, RESIDENT
from .dynamo import opaque
from .recipe import Storage, derive
from .semantics import ONE
from .tensor import WRAPPER_TYPES, DTRTensor

__all__ = ["call_plain", "check_invariants", "freeze", "storage_ptr", "value", "writes_leaf"]


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
        session.depth += 1
        try:
            observer = session.observer
            if s.buf is None:
                if observer is not None:
                    observer.materialized(s.sid)
                core.materialize(s.sid)
                core.unlock(s.sid)
            buf = s.buf
            if escape:
                cell.storage = Storage(buf, s.nbytes, -1, None, -1, session.released)
                core.hand_out(s.sid)
                if observer is not None:
                    observer.released(s.sid)
            return derive(buf, t._view)
        finally:
            session.depth -= 1


def writes_leaf(session, info, args, kwargs) -> bool:
    """Whether the op writes a plain leaf the session hooked (NOTE [ Parameter writes ] rules
    1 and 4)."""
    hooks, ptrs = session._hooks, session._leaf_ptrs
    for key in info.written:
        v = (args[key] if key < len(args) else None) if type(key) is int else kwargs.get(key)
        for t in v if isinstance(v, (list, tuple)) else (v,):
            if isinstance(t, torch.Tensor) and type(t) not in WRAPPER_TYPES:
                h = hooks.get(id(t))
                if h is not None and h[0]() is t:
                    return True
                if ptrs:
                    ptr = storage_ptr(t)
                    ref = ptrs.get(ptr) if ptr else None
                    leaf = ref() if ref is not None else None
                    if leaf is not None and storage_ptr(leaf) == ptr:
                        return True
    return False


def storage_ptr(t: torch.Tensor) -> int:
    """The address of ``t``'s storage, or 0 if it has none a write could reach (not strided,
    no memory, a storage FSDP2 freed, a subclass without one)."""
    if t.layout is not torch.strided:
        return 0
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):  # as fsdp._key: a subclass
        return 0


def freeze(session) -> None:
    """NOTE [ Parameter writes ]: hand out every storage a wrapper still holds."""
    core = session.core
    if core.device is None:
        return
    session.drain()
    if session.observer is not None:
        session.observer.froze()
    with _disable_current_modes():
        session.depth += 1
        try:
            core.freeze()
        finally:
            session.depth -= 1
    session.frozen_at = core.now


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
    out = info.func(*pargs, **pkw)
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

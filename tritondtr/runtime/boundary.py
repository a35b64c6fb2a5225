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
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .recipe import Storage, derive
from .semantics import ONE
from .tensor import DTRTensor

__all__ = ["call_plain", "check_invariants", "freeze", "value", "writes_leaf"]


def value(session, t: DTRTensor, *, escape: bool) -> torch.Tensor:
    """The plain value of ``t`` (recomputed if evicted). ``escape``: hand the buffer out
    (NOTE [ Escaping tensors ] rule 2), required whenever the plain tensor may outlive
    the call or be written."""
    pool = session.pool
    with _disable_current_modes():
        cell = t._cell
        s = cell.storage
        if s.slot < 0:
            return derive(s.buf, t._view)
        pool.depth += 1
        try:
            buf = s.buf
            if buf is None:
                buf = pool.materialize(s)
                pool.unlock(s)
            if escape:
                cell.storage = Storage(buf, s.nbytes, -1, None, -1, pool)
                pool.hand_out(s)
            return derive(buf, t._view)
        finally:
            pool.depth -= 1


def writes_leaf(session, info, args, kwargs) -> bool:
    hooks = session._hooks
    for key in info.written:
        v = (args[key] if key < len(args) else None) if type(key) is int else kwargs.get(key)
        for t in v if isinstance(v, (list, tuple)) else (v,):
            if isinstance(t, torch.Tensor) and type(t) is not DTRTensor:
                h = hooks.get(id(t))
                if h is not None and h[0]() is t:
                    return True
    return False


def freeze(session) -> None:
    """NOTE [ Parameter writes ]: hand out every storage a wrapper still holds."""
    pool = session.pool
    if pool.device is None:
        return
    pool.drain()
    held = [s for s in pool.live() if s.held]
    with _disable_current_modes():
        for s in held:
            if s.slot < 0:
                continue
            pool.depth += 1
            try:
                if s.buf is None:
                    pool.materialize(s)
                    pool.unlock(s)
                pool.externalize(s)
            finally:
                pool.depth -= 1
    pool.frozen_at = pool.now


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
    """Raise AssertionError if the pool disagrees with the engine (debug mode)."""
    pool = session.pool
    if pool.device is None:
        return
    total = 0
    if pool.lazy:  # NOTE [ Lazy engine ]: no engine yet; held storages are all resident
        for s in pool.live():
            assert s.buf is not None or not s.held, f"lazy id {s.slot}: held, not resident"
            total += s.nbytes if s.buf is not None else 0
    else:
        pool.engine.check_invariants()
        for s in pool.live():
            res = pool.engine.is_resident(s.slot)
            assert res == (s.buf is not None), f"slot {s.slot}: buffer vs engine residency"
            if res:
                total += s.nbytes
                if pool.depth == 0:
                    assert not pool.engine.lock_count(s.slot), f"slot {s.slot} locked"
    pending = sum(n for _, n in pool.released)
    assert total + pending == pool.resident, (
        f"resident bytes {pool.resident} != live resident storages {total} + {pending}"
    )


def unwrap_any(v):
    if type(v) is DTRTensor:
        return v._cell.pool.session.value(v, escape=True)
    return v

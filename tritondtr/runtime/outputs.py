"""The outputs of a tracked op: fresh storages, views, and new versions of written inputs.

:func:`outputs` is the general case of ``Session._call``; the session inlines its common
cases (one fresh output, one view, an in-place op on its first argument) and shares
:func:`fresh`, :func:`view_of` and :func:`forget` with this module.

# NOTE [ In-place versions ]
# 1. An op writing a tracked tensor really writes its buffer (no copy), and the buffer becomes
#    a new storage version whose recipe is "copy the old version, apply the op". The old
#    version becomes an evicted storage that keeps its recipe, so the dependents that read it
#    can still be recomputed; the alias cell points at the new version, so every alias (views,
#    detached tensors) sees the new contents. This works with or without aliases.
# 2. An op writing a plain tensor writes it for real; if the op also produces tracked outputs,
#    the recipe keeps a copy taken before the op, and replays write a copy of that copy.
#    Batch norm's running statistics are such a write (NOTE [ Op semantics ] rule 2), so a
#    replay never updates them twice.
# 3. A replay writes one buffer per written storage (a copy of the old version, or the old
#    version's own buffer: NOTE [ Consumed versions ] in core/remat.py), and every argument
#    that reads a written storage reads that buffer, as the first execution read the memory
#    it wrote: ``torch._foreach_add_([a, b], [b, a])`` adds the new ``a`` to ``b``. Reading
#    the old version instead gave a silently wrong ``b`` (found by the differential fuzzer;
#    older than NOTE [ Fused versions ], whose absorbed versions were read this way already).
#    (Overlapping reads and writes within one op PyTorch refuses itself.)

# NOTE [ Overwriting ops ]
# 1. An op that writes every element of a tracked argument without reading it (NOTE [ Op
#    semantics ] rule 9: ``copy_``, ``fill_``, ``zero_``, ``bernoulli_``, ...) produces a new
#    version that does not depend on the old one, provided the argument covers its whole
#    buffer (dense, as many bytes as the storage) and no other argument reads that buffer.
# 2. Then the recipe's entry is ``BLANK`` (the buffer's size and geometry, not the old
#    storage): a replay writes a fresh uninitialized buffer instead of rematerializing and
#    copying the old version, and the old version is not a parent (no engine edge, not kept
#    alive by the recipe). CPU dropout (``empty_like(x).bernoulli_(p)``) is the common case.
# 3. The first execution is unchanged (the op writes the old buffer in place), and so is
#    what ``tritondtr.trace`` records (the call reads the old version).
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..core import Core
from .boundary import ReadMemory
from .config import RuntimeConfig
from .fsdp import FSDPWatch
from .nondeterministic import pins_nondeterministic
from .recipe import (
    PLAIN,
    READ,
    WRITE,
    Cell,
    OpCall,
    Recipe,
    Storage,
    blank,
    geometry,
    storage_ptr,
)
from .semantics import ONE, OTHER
from .tensor import WRAPPER_TYPES, DTRTensor, view_wrapper

__all__ = [
    "OutputOwner",
    "aliases",
    "blank_writes",
    "forget",
    "fresh",
    "outputs",
    "seal",
    "view_of",
]


class OutputOwner(Protocol):
    """What wrapping an op's outputs needs of the session that ran it (``Session`` is one):
    its core, config and memory watches to read, and the session's own methods to track a
    storage, fix its device, and ask the rules an output is checked against."""

    core: Core
    config: RuntimeConfig
    fsdp: FSDPWatch
    reads: ReadMemory

    def start(self, device: torch.device) -> None: ...

    def track(self, buf, recipe, out, parents, cost, pinned, writes=-1, alone=True) -> Storage: ...

    def leaf_grad(self, o: torch.Tensor) -> bool: ...

    def adopts_device(self, out: torch.Tensor, info) -> bool: ...


def outputs(session: OutputOwner, call: OpCall, out):
    """The wrapped result of op ``call`` whose plain result is ``out``: fresh outputs
    tracked, views wrapped over their argument's cell, written arguments given new versions
    (NOTE [ In-place versions ] rule 1), written returns given back as the caller's objects."""
    info, args, kwargs, pargs, pkw = call.info, call.args, call.kwargs, call.pargs, call.pkw
    inputs, wrote, parents, cost = call.inputs, call.wrote, tuple(call.parents), call.cost
    core, rets = session.core, info.rets
    single = len(rets) == 1
    res = [out] if single else list(out) if rets else []
    rec = None
    for r, (kind, view, wrote_arg) in enumerate(rets):
        if kind == OTHER:
            continue
        o = res[r]
        if wrote_arg is not None:  # NOTE [ Op semantics ] rule 3
            res[r] = args[wrote_arg] if type(wrote_arg) is int else kwargs[wrote_arg]
        elif view is not None:
            src = args[view] if type(view) is int else kwargs[view]
            psrc = pargs[view] if type(view) is int else pkw[view]
            if type(src) in WRAPPER_TYPES and src._cell.session is session:
                if kind == ONE:
                    if not info.may_copy or aliases(o, psrc):  # NOTE [ Op semantics ] 10
                        res[r] = view_of(o, src, psrc)
                else:
                    res[r] = [view_of(e, src, psrc) for e in o]
        elif kind == ONE:
            if _trackable(o, session, info) and not session.leaf_grad(o):
                rec = rec or Recipe(call)
                res[r] = fresh(session, o, rec, r, -1, parents, cost)
        else:
            for j, e in enumerate(o):
                if _trackable(e, session, info) and not session.leaf_grad(e):
                    rec = rec or Recipe(call)
                    o[j] = fresh(session, e, rec, r, j, parents, cost)
    if wrote:  # NOTE [ In-place versions ] rule 1
        rec = rec or Recipe(call)
        seen = set()
        alone = len({id(cell.storage) for cell in wrote}) == 1  # NOTE [ Fused versions ] 3
        for cell in wrote:
            old = cell.storage
            if id(old) in seen:
                continue
            seen.add(id(old))
            k = next(n for n, e in enumerate(inputs) if e.source is old)
            rec.outs += ((-1, k),)
            buf, pinned = old.buf, core.pinned[old.sid]
            if info.nondet and not pinned:  # NOTE [ Nondeterministic ops ] rule 2
                pinned = pins_nondeterministic(info, buf)
            core.hand_out(old.sid)
            cell.storage = session.track(
                buf, rec, len(rec.outs) - 1, parents, cost, pinned, old.sid, alone
            )
            seen.add(id(cell.storage))  # the cell again (two views of it in a foreach list)
    if rec is not None:
        seal(session, rec, pargs, pkw)
    if not rets:
        return out
    return res[0] if single else tuple(res)


def fresh(session: OutputOwner, o, rec, r, j, parents, cost) -> DTRTensor:
    core, info, never = session.core, rec.info, session.config.never_evict
    if core.device is None:
        session.start(o.device)
    outs = rec.outs = (*rec.outs, (r, j))
    pinned = (
        info.never_evict
        or (info.nondet and pins_nondeterministic(info, o))  # NOTE [ Nondeterministic ops ]
        or (never is not None and bool(never(info.name, o)))
    )
    s = session.track(o, rec, len(outs) - 1, parents, cost, pinned)
    return DTRTensor(Cell(s, session), o, None)


def aliases(o: torch.Tensor, psrc: torch.Tensor) -> bool:
    """Whether ``o`` shares ``psrc``'s memory (NOTE [ Op semantics ] rule 10 in semantics.py)."""
    return o.device == psrc.device and storage_ptr(o) == storage_ptr(psrc) != 0


def view_of(o: torch.Tensor, src: DTRTensor, psrc: torch.Tensor) -> DTRTensor:
    """A wrapper for output ``o``, a view of the argument ``src`` (plain value ``psrc``).

    A view with its argument's geometry shares the argument's view description (its plain
    value is then the same tensor), except a 0-dim view of a base: eager hands the next op a
    fresh view object there, and a reduction of a 0-dim tensor over ``dim=0`` / ``-1`` gives
    other bits on a fresh view than on a reduction's squeezed output (``linalg_vector_norm``
    of -1.66e21 in float32: inf against 1.66e21; fuzz seed 105076)."""
    if (
        o.dtype == psrc.dtype
        and o.storage_offset() == psrc.storage_offset()
        and o.size() == psrc.size()
        and o.stride() == psrc.stride()
        and o.is_conj() == psrc.is_conj()
        and o.is_neg() == psrc.is_neg()
        and (src._view is not None or o.dim())
    ):
        view = src._view
    else:
        view = geometry(o)
    return view_wrapper(src, o, view)


def blank_writes(inputs, pargs, pkw, parents) -> list[tuple[int, tuple]]:
    """NOTE [ Overwriting ops ] rule 1: (index, :func:`blank` description) of each written
    input whose new version will not depend on the old one; its parent edge is dropped."""
    found = []
    for k, e in enumerate(inputs):
        if e.mode != WRITE:
            continue
        s = e.source
        if sum(1 for x in inputs if x.source is s) > 1:
            continue
        v = (pargs if type(e.key) is int else pkw)[e.key]
        if e.index >= 0:
            v = v[e.index]
        if not _covers(v, s.nbytes):
            continue
        found.append((k, blank(s.buf)))
        if s.sid in parents:
            parents.remove(s.sid)
    return found


def _covers(v: torch.Tensor, nbytes: int) -> bool:
    """Whether the elements of ``v`` tile all ``nbytes`` bytes of its storage, each byte
    once: no offset, and some order of its dimensions is contiguous."""
    if v.storage_offset() or v.numel() * v.element_size() != nbytes:
        return False
    step = 1
    for stride, size in sorted((st, sz) for sz, st in zip(v.size(), v.stride()) if sz != 1):
        if stride != step:
            return False
        step *= size
    return True


def seal(session: OutputOwner, rec, pargs, pkw) -> None:
    """The op ran and ``rec`` is complete: its call keeps storages, not tensors (every
    tensor input's place in ``pargs`` / ``pkw`` is cleared), its positional arguments become
    a tuple (NOTE [ Storage lifetime ] rule 6), and the session notes the plain memory it
    reads (NOTE [ Parameter writes ] rule 3 in boundary.py)."""
    plains = written = None
    for e in rec.inputs:
        if type(e.key) is int and e.index < 0:  # a positional tensor: the common case
            pargs[e.key] = None
        else:
            forget(pargs, pkw, e)
        if e.mode == PLAIN:
            plains = [e.source] if plains is None else [*plains, e.source]
        elif e.mode == WRITE:
            written = {id(e.source)} if written is None else {*written, id(e.source)}
    if written is not None:  # NOTE [ In-place versions ] rule 3
        rec.aliased = any(e.mode == READ and id(e.source) in written for e in rec.inputs)
    rec.args = tuple(pargs)
    if plains is not None:
        session.reads.recipe(rec, plains, session.fsdp.keys)


def forget(pargs, pkw, e) -> None:
    """Drop the tensor of recipe input ``e`` from the recipe's call (it keeps the storage)."""
    pos, j = e.key, e.index
    where = pargs if type(pos) is int else pkw
    if j < 0:
        where[pos] = None
    else:
        where[pos][j] = None


def _trackable(o, session, info) -> bool:
    if o is None or o.layout is not torch.strided or o.is_nested:  # NOTE [ What is tracked ] 3
        return False
    # NOTE [ Session device ] in device.py
    return o.device == session.core.device or session.adopts_device(o, info)

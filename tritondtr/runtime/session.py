"""The session: interposes on every ATen op inside ``with tritondtr.enable(...)``.

# NOTE [ What is tracked ]
# 1. With grad mode on, every op inside the context is tracked: its fresh outputs become
#    wrapper tensors (:class:`DTRTensor`) whose storage the pool owns. Plain tensors it reads
#    (parameters, the input batch) are *external*: never evicted, not counted, and the
#    ``_version`` each recipe read is checked before a recomputation.
# 2. With grad mode off, an op is tracked only if it reads a wrapper. Optimizer steps (which
#    run under no_grad on parameters, plain gradients and state) therefore stay plain.
# 3. Outputs on another device than the first tracked one, or not strided, stay plain.
# 4. A plain leaf that requires grad (a parameter) gets a post-accumulate-grad hook for the
#    session's lifetime: a wrapper gradient is replaced by a plain tensor (handed out, see
#    ``value``), so parameters, gradients and optimizer state stay plain tensors.
# 5. Uninitialized memory made from nothing tracked (``torch.empty``, ``empty_strided``;
#    ``empty_like`` or ``new_empty`` of a plain tensor) stays plain: its contents are not a
#    function of anything, so there is nothing to recompute, and C++ code allocates buffers
#    this way and then writes them through raw pointers (DDP's reducer rebuilding its gradient
#    buckets; a wrapper has no data there). Writes into it are writes to a plain tensor
#    (NOTE [ In-place versions ] rule 2), and its bytes are not counted.

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

# NOTE [ Escaping tensors ]
# 1. Wrappers stay valid after the context exits: every op on them is still served, with no
#    budget, on plain copies of nothing: the buffer is materialized (recomputed if needed),
#    handed out (``value``), and the op runs on plain tensors and returns plain tensors.
# 2. Handing a buffer out (``unwrap``, ``.numpy()``, ``data_ptr()``, gradients of parameters)
#    moves it to an external storage the pool no longer counts or evicts; the old version
#    stays in the graph, evicted, for its dependents.
"""

from __future__ import annotations

import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from . import boundary
from .errors import UnsupportedOpError
from .pool import Pool
from .recipe import (
    BLANK,
    PLAIN,
    READ,
    SNAPSHOT,
    WRITE,
    Cell,
    Recipe,
    Storage,
    blank,
    capture_rng,
    derive,
    geometry,
)
from .semantics import _CACHE, ONE, OTHER, op_info
from .stats import SessionStats
from .tensor import DTRTensor, restride

__all__ = ["Session"]

_OOM = getattr(torch, "OutOfMemoryError", RuntimeError)
_now_ns = time.perf_counter_ns
_grad_enabled = torch.is_grad_enabled
_STRIDED = torch.strided
_TRACK = object()  # ``Session._special``: no rare case applied, track the op


class _Mode(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch >= 2.12 otherwise wraps __torch_dispatch__ in a dynamo-disable shim (~5 us
        # per op on a 2-core CPU); this mode is never traced by dynamo.
        return False

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.session.dispatch(func, args, kwargs or {})


class Session:
    """One ``with tritondtr.enable(...)`` block; see :func:`tritondtr.enable`.

    ``stats`` (:class:`SessionStats`) is updated live; ``config`` is the validated
    :class:`RuntimeConfig`; ``pool`` owns the tracked storages and the engine.
    """

    def __init__(self, config) -> None:
        self.config = config
        self.stats = SessionStats(budget=config.budget)
        self.pool = Pool(config, self.stats, self)
        self._mode = _Mode(self)
        self._hooks: dict[int, tuple] = {}
        self.active = False
        self.closed = False
        self.debug, self.stress = config.debug, config.stress
        self.observer = None  # tritondtr.trace: .op(...) after each op (runtime/trace.py)

    # ------------------------------------------------------------------ context
    def __enter__(self) -> Session:
        if self.active or self.closed:
            raise RuntimeError("a tritondtr Session is entered once; call tritondtr.enable() "
                               "again for a new one")
        self._mode.__enter__()
        self.active = True
        return self

    def __exit__(self, *exc) -> bool:
        try:
            self._mode.__exit__(*exc)
        finally:
            self.active, self.closed = False, True
            for _, handle in self._hooks.values():
                handle.remove()
            self._hooks.clear()
            self.pool.budget = None
        return False

    # ----------------------------------------------------------------- dispatch
    def dispatch(self, func, args, kwargs):
        info = _CACHE.get(func) or op_info(func)
        pool = self.pool
        if pool.depth == 0 and (pool.dead or pool.released):
            pool.drain()
        if info.special or self.closed:
            out = self._special(info, args, kwargs)
            if out is not _TRACK:
                return out
        if not _grad_enabled() and not _any_wrapper(info, args, kwargs):
            return func(*args, **kwargs)  # NOTE [ What is tracked ] rule 2
        out = self._call(info, args, kwargs)
        if self.debug and pool.depth == 0:
            pool.drain()
            self.check_invariants()
        return out

    def _special(self, info, args, kwargs):
        """The rare cases, decided before an op is tracked: the op's result, or ``_TRACK``."""
        if info.inplace_view and type(args[0]) is DTRTensor:
            return restride(info.func, args, kwargs)  # NOTE [ Op semantics ] rule 6
        if self.closed:
            return boundary.call_plain(info, args, kwargs)
        if info.uninit and not _any_wrapper(info, args, kwargs):
            return info.func(*args, **kwargs)  # NOTE [ What is tracked ] rule 5
        pool = self.pool
        if (info.written and pool.now != pool.frozen_at
                and boundary.writes_leaf(self, info, args, kwargs)):
            self.freeze()  # NOTE [ Parameter writes ] (boundary.py)
        if info.unsupported is not None and _any_wrapper(info, args, kwargs):
            raise UnsupportedOpError(info.name, info.unsupported)
        if info.unsupported_grad is not None and _grad_enabled() and any(
                i < len(args) and getattr(args[i], "requires_grad", False)
                for i in info.semantics.grad_args):  # NOTE [ Op semantics ] rule 7
            raise UnsupportedOpError(info.name, info.unsupported_grad,
                                     "Differentiate it outside the context.")
        return _TRACK

    def _call(self, info, args, kwargs):
        pool, func = self.pool, info.func
        locked: list[Storage] = []
        pool.depth += 1
        if pool.lazy and pool.budget is not None and pool.resident > pool.budget:
            pool.sync()  # NOTE [ Lazy engine ] rule 2: before any input is locked
        try:
            inputs, parents, wrote = [], [], []
            written = info.written
            pargs = list(args)
            if info.flat is not None:  # single positional tensors: walk them directly
                pkw = kwargs
                n, lazy, now = len(args), pool.lazy, pool.now
                for i in info.flat:
                    if i >= n:
                        break
                    v = args[i]
                    if type(v) is DTRTensor and lazy and i not in written:  # _in's hot case
                        cell = v._cell
                        s = cell.storage
                        buf = s.buf
                        if cell.pool is pool and s.slot >= 0 and buf is not None:
                            s.seen = now  # NOTE [ Lazy engine ] rule 1
                            view = v._view
                            inputs.append((i, -1, s, view, None, READ))
                            pargs[i] = buf if view is None else derive(buf, view)
                            continue
                    if v is not None:
                        pargs[i] = self._in(v, i, -1, i in written, inputs, locked, parents,
                                            wrote)
            else:
                pkw = dict(kwargs)
                self._walk(info, args, kwargs, pargs, pkw, inputs, locked, parents, wrote)
            if written and (wrote or info.fresh):  # NOTE [ In-place versions ] rule 2
                for k, e in enumerate(inputs):
                    if e[5] == PLAIN and e[0] in written:
                        inputs[k] = (e[0], e[1], e[2].clone(), None, None, SNAPSHOT)
            blanks = _blanks(inputs, pargs, pkw, parents) if info.overwrites and wrote \
                else None
            pool.now += 1
            if pool.budget is not None and pool.resident > pool.budget:
                pool.make_room(info.name)
            pool.op_bytes = 0
            rng = capture_rng(_device_of(pargs, pkw), pkw.get("generator")) if info.random \
                else None
            while True:
                t0 = _now_ns()
                try:
                    out = func(*pargs, **pkw)
                    break
                except _OOM:
                    if not pool.evicting:
                        raise
                    if pool.lazy:  # NOTE [ Lazy engine ] rule 2; then lock as synced ops do
                        pool.sync()
                        for e in inputs:
                            if e[5] <= WRITE and e[2].buf is not None:
                                pool.lock(e[2])
                                locked.append(e[2])
                    if not pool.evict_one():
                        raise
            cost = float(_now_ns() - t0)
            for s in locked:
                pool.unlock(s)
            locked.clear()
            if info.fresh1:  # one fresh output: _outputs' common case
                if out is not None and out.layout is _STRIDED and (
                        out.device == pool.device if pool.device is not None
                        else out.device.type != "meta"):
                    rec = Recipe(info, pargs, pkw, inputs, rng)
                    out = self._fresh(out, rec, 0, -1, parents, cost)
                    for e in inputs:  # the recipe keeps storages, not tensors
                        if type(e[0]) is int and e[1] < 0:
                            pargs[e[0]] = None
                        else:
                            _forget(pargs, pkw, e)
            elif info.inplace1 and len(wrote) == 1 and inputs[0][0] == 0:  # another: add_
                cell = wrote[0]
                old = cell.storage  # NOTE [ In-place versions ] rule 1
                rec = Recipe(info, pargs, pkw, inputs, rng)
                rec.outs.append((-1, 0))
                buf, pinned = old.buf, old.pinned
                pool.hand_out(old)
                cell.storage = pool.track(buf, rec, 0, parents, cost, pinned)
                out = args[0]
                for e in inputs:
                    _forget(pargs, pkw, e)
            elif info.view1 is not None:  # one view: _outputs' other common case
                src = args[info.view1]
                if type(src) is DTRTensor and src._cell.pool is pool:
                    out = _view_of(out, src, pargs[info.view1])
            else:
                out = self._outputs(info, args, kwargs, pargs, pkw, out, inputs, parents,
                                    wrote, rng, cost)
            if self.observer is not None:
                self.observer.op(info, args, kwargs, inputs, out, wrote, cost)
            if blanks:  # NOTE [ Overwriting ops ] rule 2, once the observer has seen the call
                for k, desc in blanks:
                    e = inputs[k]
                    inputs[k] = (e[0], e[1], desc, e[3], None, BLANK)
        finally:
            for s in locked:
                pool.unlock(s)
            pool.depth -= 1
        st = self.stats
        st.ops += 1
        st.op_counts[info.name] += 1
        if self.stress:
            pool.evict_all()
        return out

    def _walk(self, info, args, kwargs, pargs, pkw, inputs, locked, parents, wrote) -> None:
        """Every tensor argument (lists and kwargs too) to its plain value, via ``_in``."""
        written = info.written
        for i, kind, name in info.args:
            if name is None:
                if i >= len(args):
                    continue
                v = args[i]
            else:
                v = kwargs.get(name)
            if v is None:
                continue
            key = i if name is None else name
            w = key in written if written else False
            if kind == ONE:
                pv = self._in(v, key, -1, w, inputs, locked, parents, wrote)
            else:
                pv = [self._in(t, key, j, w, inputs, locked, parents, wrote)
                      for j, t in enumerate(v)]
            if name is None:
                pargs[i] = pv
            else:
                pkw[name] = pv

    def _in(self, v, key, j, w, inputs, locked, parents, wrote):
        """The plain value of tensor argument ``v``; records it in ``inputs``."""
        pool = self.pool
        if type(v) is DTRTensor:
            cell = v._cell
            s = cell.storage
            if cell.pool is pool and s.slot >= 0:
                buf = s.buf
                if pool.lazy:  # NOTE [ Lazy engine ] rule 1: resident, nothing to lock
                    s.seen = pool.now
                else:
                    if buf is None:
                        buf = pool.materialize(s)
                        locked.append(s)
                    elif pool.evicting:
                        pool.lock(s)
                        locked.append(s)
                    pool.access(s)
                    parents.append(s.slot)
                view = v._view
                inputs.append((key, j, s, view, None, WRITE if w else READ))
                if w:
                    wrote.append(cell)
                return buf if view is None else derive(buf, view)
            v = cell.pool.session.value(v, escape=True)  # external storage or foreign
        elif not isinstance(v, torch.Tensor):  # a Python number in a Tensor slot
            return v
        elif v.requires_grad and v.is_leaf:
            self._hook(v)
        inputs.append((key, j, v, None, v._version, PLAIN))
        return v

    def _outputs(self, info, args, kwargs, pargs, pkw, out, inputs, parents, wrote, rng,
                 cost):
        pool, rets = self.pool, info.rets
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
                if type(src) is DTRTensor and src._cell.pool is pool:
                    if kind == ONE:
                        res[r] = _view_of(o, src, psrc)
                    else:
                        res[r] = [_view_of(e, src, psrc) for e in o]
            elif kind == ONE:
                if _trackable(o, pool):
                    rec = rec or Recipe(info, pargs, pkw, inputs, rng)
                    res[r] = self._fresh(o, rec, r, -1, parents, cost)
            else:
                for j, e in enumerate(o):
                    if _trackable(e, pool):
                        rec = rec or Recipe(info, pargs, pkw, inputs, rng)
                        o[j] = self._fresh(e, rec, r, j, parents, cost)
        if wrote:  # NOTE [ In-place versions ] rule 1
            rec = rec or Recipe(info, pargs, pkw, inputs, rng)
            seen = set()
            for cell in wrote:
                old = cell.storage
                if id(old) in seen:
                    continue
                seen.add(id(old))
                k = next(n for n, e in enumerate(inputs) if e[2] is old)
                rec.outs.append((-1, k))
                buf, pinned = old.buf, old.pinned
                pool.hand_out(old)
                cell.storage = pool.track(buf, rec, len(rec.outs) - 1, parents, cost, pinned)
        if rec is not None:  # the recipe keeps storages, not tensors
            for e in inputs:
                _forget(pargs, pkw, e)
        if not rets:
            return out
        return res[0] if single else tuple(res)

    def _fresh(self, o, rec, r, j, parents, cost) -> DTRTensor:
        pool, info, never = self.pool, rec.info, self.config.never_evict
        if pool.device is None:
            pool.start(o.device)
        outs = rec.outs
        outs.append((r, j))
        pinned = info.never_evict or (info.nondet_bitwise and o.is_cuda) or (
            never is not None and bool(never(info.name, o)))
        s = pool.track(o, rec, len(outs) - 1, parents, cost, pinned)
        return DTRTensor(Cell(s, pool), o, None)

    def evict_all(self) -> int:
        """Evict every evictable storage now (tests, measurements); returns how many."""
        pool = self.pool
        if pool.device is None:
            return 0
        before = self.stats.evictions
        with _disable_current_modes():
            pool.drain()
            pool.evict_all()
        return self.stats.evictions - before

    # ------------------------------------------------------------------ values
    def value(self, t: DTRTensor, *, escape: bool) -> torch.Tensor:
        """The plain value of ``t`` (see :func:`boundary.value`)."""
        return boundary.value(self, t, escape=escape)

    def freeze(self) -> None:
        """NOTE [ Parameter writes ] (boundary.py)."""
        boundary.freeze(self)

    def check_invariants(self) -> None:
        """Raise AssertionError if the pool disagrees with the engine (debug mode)."""
        boundary.check_invariants(self)

    def _hook(self, p: torch.Tensor) -> None:
        """NOTE [ What is tracked ] rule 4."""
        h = self._hooks.get(id(p))
        if h is not None and h[0]() is p:
            return
        self._hooks[id(p)] = (weakref.ref(p), p.register_post_accumulate_grad_hook(self._on_grad))

    def _on_grad(self, p: torch.Tensor) -> None:
        g = p.grad
        if type(g) is DTRTensor and g.grad_fn is None:
            p.grad = g._cell.pool.session.value(g, escape=True)

def _view_of(o: torch.Tensor, src: DTRTensor, psrc: torch.Tensor) -> DTRTensor:
    """A wrapper for output ``o``, a view of the argument ``src`` (plain value ``psrc``)."""
    if (o.dtype == psrc.dtype and o.storage_offset() == psrc.storage_offset()
            and o.size() == psrc.size() and o.stride() == psrc.stride()
            and o.is_conj() == psrc.is_conj() and o.is_neg() == psrc.is_neg()):
        view = src._view
    else:
        view = geometry(o)
    return DTRTensor(src._cell, o, view)


def _blanks(inputs, pargs, pkw, parents) -> list[tuple[int, tuple]]:
    """NOTE [ Overwriting ops ] rule 1: (index, :func:`blank` description) of each written
    input whose new version will not depend on the old one; its parent edge is dropped."""
    found = []
    for k, e in enumerate(inputs):
        if e[5] != WRITE:
            continue
        s = e[2]
        if sum(1 for x in inputs if x[2] is s) > 1:
            continue
        v = (pargs if type(e[0]) is int else pkw)[e[0]]
        if e[1] >= 0:
            v = v[e[1]]
        if not _covers(v, s.nbytes):
            continue
        found.append((k, blank(s.buf)))
        if s.slot in parents:
            parents.remove(s.slot)
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


def _forget(pargs, pkw, e) -> None:
    """Drop the tensor of recipe input ``e`` from the recipe's call (it keeps the storage)."""
    pos, j = e[0], e[1]
    where = pargs if type(pos) is int else pkw
    if j < 0:
        where[pos] = None
    else:
        where[pos][j] = None


def _trackable(o, pool) -> bool:
    if o is None or o.layout is not torch.strided:
        return False
    if pool.device is None:
        return o.device.type != "meta"
    return o.device == pool.device


def _any_wrapper(info, args, kwargs) -> bool:
    for i, kind, name in info.args:
        v = (args[i] if i < len(args) else None) if name is None else kwargs.get(name)
        if v is None:
            continue
        if kind == ONE:
            if type(v) is DTRTensor:
                return True
        elif any(type(t) is DTRTensor for t in v):
            return True
    return False


def _device_of(pargs, pkw) -> torch.device | None:
    for a in pargs:
        if isinstance(a, torch.Tensor):
            return a.device
    d = pkw.get("device")
    return torch.device(d) if d is not None else None


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
#    ``value``), so parameters, gradients and optimizer state stay plain tensors. The leaf
#    gets it when an op reads it, or when autograd accumulates into its ``.grad`` inside the
#    session (its forward ran outside the session, or in an earlier one). At exit, a wrapper
#    the program assigned to a hooked leaf's ``.grad`` itself (``p.grad = g``) is replaced
#    too. A gradient with a graph (``create_graph=True``) stays a wrapper.
# 5. Uninitialized memory made from nothing tracked (``torch.empty``, ``empty_strided``;
#    ``empty_like`` or ``new_empty`` of a plain tensor) stays plain: its contents are not a
#    function of anything, so there is nothing to recompute, and C++ code allocates buffers
#    this way and then writes them through raw pointers (DDP's reducer rebuilding its gradient
#    buckets; a wrapper has no data there). Writes into it are writes to a plain tensor
#    (NOTE [ In-place versions ] rule 2 in outputs.py), and its bytes are not counted.

# NOTE [ Escaping tensors ]
# 1. Wrappers stay valid after the context exits: every op on them is still served, with no
#    budget, on plain copies of nothing: the buffer is materialized (recomputed if needed),
#    handed out (``value``), and the op runs on plain tensors and returns plain tensors.
# 2. Handing a buffer out (``unwrap``, ``.numpy()``, ``data_ptr()``, gradients of parameters)
#    moves it to an external storage the pool no longer counts or evicts; the old version
#    stays in the graph, evicted, for its dependents.

# NOTE [ Nested sessions ]
# 1. Sessions do not nest: entering one while another tritondtr session is active on this
#    thread raises ``RuntimeError`` before anything is intercepted, and says what to do
#    (one session around the whole step, or exit the outer one first).
# 2. Why not join the outer session with the inner one's options: a session is one pool, one
#    budget and one set of statistics. Two pools side by side each count only their own
#    storages, so neither budget bounds what the program holds, and each session's wrappers
#    are foreign to the other (the outer session intercepted the inner one's work, and a
#    parameter's gradient stayed a wrapper after both exits). A join has no answer a user
#    could predict to which budget binds what the inner block made and kept, nor to what
#    each session's stats count. An error can later become a join without breaking a
#    program that runs today; the reverse cannot.
# 3. Sessions one after another are fine: a closed session's wrappers are served as NOTE
#    [ Escaping tensors ] says, and gradients reach plain ``.grad`` as NOTE [ What is
#    tracked ] rule 4 says.
"""

from __future__ import annotations

import time
import weakref

import torch
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _disable_current_modes,
    _get_current_dispatch_mode_stack,
)

from . import boundary
from .errors import UnsupportedOpError
from .outputs import blank_writes, forget, fresh, outputs, view_of
from .pool import Pool
from .recipe import (
    BLANK,
    PLAIN,
    READ,
    SNAPSHOT,
    WRITE,
    Recipe,
    Storage,
    capture_rng,
    derive,
)
from .semantics import _CACHE, ONE, op_info
from .stats import SessionStats
from .tensor import DTRTensor, restride

__all__ = ["Session"]

_OOM = getattr(torch, "OutOfMemoryError", RuntimeError)
_now_ns = time.perf_counter_ns
_grad_enabled = torch.is_grad_enabled
_STRIDED = torch.strided
_TRACK = object()  # ``Session._special``: no rare case applied, track the op
_autograd_node = torch._C._current_autograd_node  # NOTE [ What is tracked ] rule 4
_AccumulateGrad = torch._C._functions.AccumulateGrad


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
            raise RuntimeError(
                "a tritondtr Session is entered once; call tritondtr.enable() again for a new one"
            )
        for mode in _get_current_dispatch_mode_stack():  # NOTE [ Nested sessions ]
            if type(mode) is _Mode:
                raise RuntimeError(
                    "tritondtr.enable() or trace() inside another active tritondtr session (budget="
                    f"{mode.session.config.budget}): sessions do not nest. Put one enable() "
                    "around the whole step (forward, backward, optimizer step), or exit the "
                    "outer session before entering this one."
                )
        self._mode.__enter__()
        self.active = True
        return self

    def __exit__(self, *exc) -> bool:
        try:
            self._mode.__exit__(*exc)
        finally:
            self.active, self.closed = False, True
            leaves = [ref() for ref, _ in self._hooks.values()]
            for _, handle in self._hooks.values():
                handle.remove()
            self._hooks.clear()
            self.pool.budget = None
            for p in leaves:  # NOTE [ What is tracked ] rule 4: ``.grad`` assigned directly
                if p is not None:
                    self._on_grad(p)
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
        node = _autograd_node()
        if node is not None and type(node) is _AccumulateGrad:  # NOTE [ What is tracked ] 4
            self._hook(node.variable)
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
        if (
            info.written
            and pool.now != pool.frozen_at
            and boundary.writes_leaf(self, info, args, kwargs)
        ):
            self.freeze()  # NOTE [ Parameter writes ] (boundary.py)
        if info.unsupported is not None and _any_wrapper(info, args, kwargs):
            raise UnsupportedOpError(info.name, info.unsupported)
        if (
            info.unsupported_grad is not None
            and _grad_enabled()
            and any(
                i < len(args) and getattr(args[i], "requires_grad", False)
                for i in info.semantics.grad_args
            )
        ):  # NOTE [ Op semantics ] rule 7
            raise UnsupportedOpError(
                info.name, info.unsupported_grad, "Differentiate it outside the context."
            )
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
                        pargs[i] = self._in(v, i, -1, i in written, inputs, locked, parents, wrote)
            else:
                pkw = dict(kwargs)
                self._walk(info, args, kwargs, pargs, pkw, inputs, locked, parents, wrote)
            if written and (wrote or info.fresh):  # NOTE [ In-place versions ] rule 2
                for k, e in enumerate(inputs):
                    if e[5] == PLAIN and e[0] in written:
                        inputs[k] = (e[0], e[1], e[2].clone(), None, None, SNAPSHOT)
            blanks = (
                blank_writes(inputs, pargs, pkw, parents) if info.overwrites and wrote else None
            )
            pool.now += 1
            if pool.budget is not None and pool.resident > pool.budget:
                pool.make_room(info.name)
            pool.op_bytes = 0
            rng = capture_rng(_device_of(pargs, pkw), pkw.get("generator")) if info.random else None
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
            if info.fresh1:  # one fresh output: outputs' common case
                if (
                    out is not None
                    and out.layout is _STRIDED
                    and (
                        out.device == pool.device
                        if pool.device is not None
                        else out.device.type != "meta"
                    )
                ):
                    rec = Recipe(info, pargs, pkw, inputs, rng)
                    out = fresh(self, out, rec, 0, -1, parents, cost)
                    for e in inputs:  # the recipe keeps storages, not tensors
                        if type(e[0]) is int and e[1] < 0:
                            pargs[e[0]] = None
                        else:
                            forget(pargs, pkw, e)
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
                    forget(pargs, pkw, e)
            elif info.view1 is not None:  # one view: outputs' other common case
                src = args[info.view1]
                if type(src) is DTRTensor and src._cell.pool is pool:
                    out = view_of(out, src, pargs[info.view1])
            else:
                out = outputs(
                    self, info, args, kwargs, pargs, pkw, out, inputs, parents, wrote, rng, cost
                )
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
                pv = [
                    self._in(t, key, j, w, inputs, locked, parents, wrote) for j, t in enumerate(v)
                ]
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

"""The session: interposes on every ATen op inside ``with tritondtr.enable(...)``.

# NOTE [ What is tracked ]
# 1. With grad mode on, every op inside the context is tracked: its fresh outputs become
#    wrapper tensors (:class:`DTRTensor`) whose storage the session's DTR core tracks. Plain
#    tensors it reads (parameters, the input batch) are *external*: never evicted, not
#    counted, and the ``_version`` each recipe read is checked before a recomputation.
# 2. With grad mode off, an op is tracked only if it reads a wrapper. Optimizer steps (which
#    run under no_grad on parameters, plain gradients and state) therefore stay plain.
# 3. Outputs on another device than the session's (NOTE [ Session device ] in device.py), or
#    not strided, stay plain; so do nested tensors (``torch.nested``: strided layout, but no
#    sizes to wrap).
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
# 6. An op that takes no tensor and returns none (the profiler's ``record_function``
#    markers, which FSDP2 emits around its collectives) is not tracked: it ticks no clock
#    and makes no room, so a budget error is never raised from a profiler range's exit,
#    where it would replace the error that ended the range.
# 7. Under ``torch.inference_mode`` no op is tracked: wrapper arguments are handed out
#    (NOTE [ Escaping tensors ] rule 2) and the op runs on plain tensors and returns plain
#    tensors, as after the context exits. Inference tensors have no autograd history, so
#    nothing would need them recomputed; and autograd's ADInplaceOrView key is off there, so
#    composite ops (``aten.to.dtype`` of ``.float()``) reached the mode undecomposed and a
#    wrapper could not be made a view (its version counter cannot be set). A write there to
#    plain memory the session's recipes read still freezes first (NOTE [ Parameter writes ]:
#    an EMA or weight update under inference_mode). A recipe may read an inference tensor
#    made there (a target for a loss): it has no version to record, and only an op under
#    inference_mode can write it, which that check sees.
# 8. What rule 4 keeps per leaf (its hook, its memory's watch in ``ReadMemory``) goes when the
#    leaf dies, through a weak-reference callback. Autograd unpacks a saved ``t(W)`` of each
#    linear layer's weight as a new leaf object in every backward pass (a view of ``W``,
#    ``grad_fn`` None); a session around a whole training loop kept an entry for each of them
#    (a hook handle, three weak references), one per linear layer and step, for good.

# NOTE [ Escaping tensors ]
# 1. Wrappers stay valid after the context exits: every op on them is still served, with no
#    budget, on plain copies of nothing: the buffer is materialized (recomputed if needed),
#    handed out (``value``), and the op runs on plain tensors and returns plain tensors.
# 2. Handing a buffer out (``unwrap``, ``.numpy()``, ``data_ptr()``, gradients of parameters)
#    moves it to an external storage the core no longer counts or evicts; the old version
#    stays in the graph, evicted, for its dependents.

# NOTE [ Nested sessions ]
# 1. Sessions do not nest: entering one while another tritondtr session is active on this
#    thread raises ``RuntimeError`` before anything is intercepted, and says what to do
#    (one session around the whole step, or exit the outer one first).
# 2. Why not join the outer session with the inner one's options: a session is one core, one
#    budget and one set of statistics. Two cores side by side each count only their own
#    storages, so neither budget bounds what the program holds, and each session's wrappers
#    are foreign to the other (the outer session intercepted the inner one's work, and a
#    parameter's gradient stayed a wrapper after both exits). A join has no answer a user
#    could predict to which budget binds what the inner block made and kept, nor to what
#    each session's stats count. An error can later become a join without breaking a
#    program that runs today; the reverse cannot.
# 3. Sessions one after another are fine: a closed session's wrappers are served as NOTE
#    [ Escaping tensors ] says, and gradients reach plain ``.grad`` as NOTE [ What is
#    tracked ] rule 4 says.

# NOTE [ Session lifetime ]
# 1. A session lives as long as something holds it: the user's ``with ... as s``, or a wrapper
#    that escaped (its cell holds the session, NOTE [ Escaping tensors ]). When the last goes,
#    reference counting frees it at once, with its core's tables (device tensors on a GPU)
#    and every buffer still queued for freeing; no garbage collection is needed.
# 2. So nothing the session owns points back at it strongly: the core's executor and the FSDP
#    watch hold a ``weakref.proxy`` (both die with the session), the dispatch mode exists only
#    while the session is active, the stats read the budget from the config (not the core),
#    and a storage queues its death in the session's ``released`` list, not through the
#    session (NOTE [ Storage lifetime ] in recipe.py). Before this rule every session was a
#    reference cycle: closed sessions and their queued buffers waited for a full collection
#    of the process (~150 ms each on the 2-core AMD EPYC guest, every few steps:
#    docs/benchmarks.md, "What do Python's garbage collections cost a step?").

# NOTE [ One op's path ]
# 1. A tracked op is one ``OpCall`` record (recipe.py; after ``torch.utils.checkpoint``'s
#    ``_CheckpointFrame``) taken by ``Session._call`` through three methods, in the order of
#    NOTE [ Op protocol ] in core/core.py; the record lives for the op, the ``Recipe`` made
#    from it stays.
# 2. ``_bind``: every tensor argument to the plain value the op runs on (a wrapper's buffer or
#    a view of it), each recorded as an ``Input``; the tracked ones made resident and kept so
#    by ``Core.enter``; the inputs the op overwrites found (NOTE [ Overwriting ops ]).
# 3. ``_run``: the op, timed and priced, retried after an out-of-memory error (NOTE [ Out-of-
#    memory fallback ] in oom.py), then ``release_inputs``.
# 4. ``_wrap``: the outputs tracked (``hand_out`` and ``new`` through ``track``) and wrapped:
#    one fresh tensor, an in-place write of the first argument and one view here, every
#    other case in outputs.py. Then the observer sees the record and ``end`` closes the op.
# 5. What the record costs (an object and three calls per op: 0.4 to 0.8 us on the 2-core
#    AMD EPYC guest, measured alone) is paid for by calling the op through its C entry
#    (``OpInfo.run`` in semantics.py, 0.35 us) and reading the grad mode once: per-op
#    dispatch -1.0 to +2.3 % of the single method it replaced, 18 interleaved rounds there
#    (docs/benchmarks.md, What does the runtime cost per op?).
# 6. Only the session writes its own fields; other modules call its methods (``died``,
#    ``observe``, ``in_flight``, ``watch_leaf``): tests/runtime/test_session_fields.py.
"""

from __future__ import annotations

import time
import warnings
import weakref
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _disable_current_modes,
    _get_current_dispatch_mode_stack,
)

from ..core import BudgetError, Core
from ..core.link import Link
from ..engine.residency import FREE
from ..units import format_bytes
from . import boundary, collector, plaindata
from . import device as devices
from .config import TablePlace
from .copies import HostLink
from .cost import CostModel, price, resolve
from .dynamo import OPAQUE, opaque
from .errors import UnsupportedOpError
from .events import DeviceClock, OpTimer
from .fsdp import FSDPWatch
from .leafgrad import LeafGrads
from .nondeterministic import pins_nondeterministic
from .oom import evict_for_retry, is_oom
from .outputs import aliases, blank_writes, fresh, outputs, seal, view_of
from .recipe import (
    BLANK,
    PLAIN,
    READ,
    SNAPSHOT,
    WRITE,
    Input,
    OpCall,
    Recipe,
    Storage,
    capture_rng,
    derive,
    rewind_rng,
    run_recipe,
)
from .semantics import _CACHE, ONE, bump_versions, op_info
from .stats import SessionStats
from .tensor import WRAPPER_TYPES, DTRTensor, restride, view_wrapper
from .timeline import TimelineRecorder

__all__ = ["Session"]

_now_ns = time.perf_counter_ns
_in_backward = torch._C._current_graph_task_id
_new_tuple = tuple.__new__  # Input records on the hot path: C-level (0.16 against 0.25 us per
# input for _make on the 2-core AMD EPYC guest)
_grad_enabled = torch.is_grad_enabled
_STRIDED = torch.strided
_TRACK = object()  # ``Session._special``: no rare case applied, track the op
_autograd_node = torch._C._current_autograd_node  # NOTE [ What is tracked ] rule 4
_inference_mode = torch.is_inference_mode_enabled  # ibid. rule 7
_AccumulateGrad = torch._C._functions.AccumulateGrad
_UNRESOLVED = object()  # ``Session.cost_fn`` until the session's device is known (NOTE
# [ Cost models ] rule 8 in cost.py)


class _LeafHook(NamedTuple):
    """A leaf the session hooked (NOTE [ What is tracked ] rule 4)."""

    leaf: weakref.ref  # to the leaf: ``id`` keys outlive their tensors
    handle: torch.utils.hooks.RemovableHandle  # its post-accumulate-grad hook


class _InFlight:
    """``with session.in_flight():`` the runtime's own work between ops (a recomputation for a
    value, a freeze, an FSDP2 keep) counts as an op in flight: the session's queues are not
    drained inside it. Reentrant; the session's ``depth`` is its only state."""

    __slots__ = ("session",)

    def __init__(self, session: Session) -> None:
        self.session = session

    def __enter__(self) -> None:
        self.session.depth += 1

    def __exit__(self, *exc) -> None:
        self.session.depth -= 1


class _Mode(TorchDispatchMode, plaindata.WatchesPlainData):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # PyTorch's per-call dynamo guard, only where ``@opaque`` cannot mark the handler
        # (NOTE [ Dynamo never traces the runtime ] rules 2 and 6).
        return not OPAQUE

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session

    @opaque  # NOTE [ Dynamo never traces the runtime ]
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.session.dispatch(func, args, kwargs or {})

    def before_set_data(self, p: torch.Tensor) -> None:
        """NOTE [ Plain .data assignment ] rule 2 (plaindata.py)."""
        s = self.session
        if s.closed or s.core.now == s.frozen_at:
            return
        if p.numel() == 0 or boundary.reads_plain(s, p):  # empty: no address to watch
            s.freeze()


class _TimelineMode(_Mode):
    """The session's mode when it records a memory timeline: a row after each op (NOTE
    [ Memory timeline ] rule 1 in timeline.py; the plain mode does no work for it)."""

    @opaque  # NOTE [ Dynamo never traces the runtime ]
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        s = self.session
        out = s.dispatch(func, args, kwargs or {})
        s.timeline.op(func, out, s.stats, s.core.device)
        return out


class Session:
    """One ``with tritondtr.enable(...)`` block; see :func:`tritondtr.enable`.

    ``stats`` (:class:`SessionStats`) is updated live; ``config`` is the validated
    :class:`RuntimeConfig`; ``core`` (:class:`tritondtr.core.Core`) makes every DTR decision
    on the session's tracked storages. The session interposes (dispatch, outputs, views,
    boundary calls) and is the core's executor: it runs the recomputations the core asks for
    and frees the buffers it evicts.
    """

    def __init__(self, config) -> None:
        self.config = config
        self.stats = SessionStats()
        self.stats._config = config  # SessionStats.budget reads it
        share = isinstance(config.budget, devices.MemoryShare)
        self.core = Core(
            0 if share else config.budget,  # a share is resolved at entry
            config.heuristic,
            weakref.proxy(self),  # NOTE [ Session lifetime ]
            backend=config.backend,
            stress=config.stress,
            pin_backward=config.pin_backward,
            stats=self.stats,
            table_device="cpu" if config.table is TablePlace.HOST else None,
            prefetch=config.offload is not None,  # NOTE [ Step plan ] in core/plan.py
        )
        self.host_link = HostLink(torch.device("cpu"))  # NOTE [ Host copies on CUDA ]
        self._cuda = devices.cuda_available()  # NOTE [ Session device ] rule 2
        self._warned_device = config.device is not None  # ibid. rule 3: once, unless named
        self._streams: torch.cuda.Stream | None = None  # NOTE [ Side streams ]: default
        self._side_seen = False
        self._default = (0, 0)  # (device index, raw handle) of ``_streams``
        self._precision: tuple | None = None  # NOTE [ Precision flags ]: CUDA sessions
        self.storages: list = []  # sid -> weakref to its Storage (NOTE [ Storage lifetime ])
        self.dead: list[Storage] = []  # NOTE [ Storage lifetime ] rule 2
        self.released: list[int] = []  # rule 3: sids
        self.absorbed: list[Storage] = []  # versions the op in flight fused (NOTE [ Fused
        # versions ] in core/core.py): their ``sid`` becomes -1 when the op ends
        self.depth = 0  # > 0 while an op is in flight (then the queues are not drained)
        self.frozen_at = -1  # clock of the last ``freeze``
        self._mode: _Mode | None = None  # while active (NOTE [ Session lifetime ])
        self._hooks: dict[int, _LeafHook] = {}  # id(leaf) -> NOTE [ What is tracked ] rule 4
        self.reads = boundary.ReadMemory()  # NOTE [ Parameter writes ] rule 3
        self.leafgrads = LeafGrads()  # NOTE [ Leaf gradients ] (leafgrad.py)
        self.active = False
        self.closed = False
        self._collecting = False  # NOTE [ Garbage collector ]: the thresholds are raised
        self.debug, self.stress = config.debug, config.stress
        # None: measured (NOTE [ Cost models ] in cost.py); the device's model (rules 8-10)
        self.cost_fn = _UNRESOLVED if isinstance(config.cost, CostModel) else config.cost
        if config.cost is CostModel.MEASURED:
            self.cost_fn = None
        self.timer: OpTimer | None = None  # ``events``: NOTE [ Cost models ] rule 10
        if config.cost is CostModel.EVENTS:
            self.timer = OpTimer(self.core)
        self.clock: DeviceClock | None = None  # NOTE [ Device time ] in events.py
        self.observer = None  # tritondtr.trace: .op(...) after each op (runtime/recording.py)
        self.timeline: TimelineRecorder | None = None  # NOTE [ Memory timeline ]
        if config.timeline:
            self.timeline = self.stats._timeline = TimelineRecorder()
        self.fsdp = FSDPWatch(weakref.proxy(self))  # NOTE [ FSDP2 ] (fsdp.py)

    # ------------------------------------------------------------------ context
    @opaque
    def __enter__(self) -> Session:
        if self.active or self.closed:
            raise RuntimeError(
                "a tritondtr Session is entered once; call tritondtr.enable() again for a new one"
            )
        for mode in _get_current_dispatch_mode_stack():  # NOTE [ Nested sessions ]
            if isinstance(mode, _Mode):
                raise RuntimeError(
                    "tritondtr.enable() or trace() inside another active tritondtr session (budget="
                    f"{mode.session.config.budget}): sessions do not nest. Put one enable() "
                    "around the whole step (forward, backward, optimizer step), or exit the "
                    "outer session before entering this one."
                )
        self._start_device()
        self._mode = (_Mode if self.timeline is None else _TimelineMode)(self)
        self._mode.__enter__()
        self.active = True
        self.fsdp.install()
        plaindata.install()  # NOTE [ Plain .data assignment ] rule 2
        collector.session_started()  # NOTE [ Garbage collector ] (collector.py): last, so
        self._collecting = True  # an entry that raised has nothing to restore
        return self

    @opaque
    def __exit__(self, *exc) -> bool:
        try:
            mode, self._mode = self._mode, None
            mode.__exit__(*exc)
        finally:
            try:
                self.fsdp.close(freeze=exc[0] is None)  # NOTE [ FSDP2 ] rule 6
            finally:
                try:
                    self._close()
                finally:
                    if self._collecting:  # NOTE [ Garbage collector ] rule 1
                        self._collecting = False
                        collector.session_ended()
        if exc[0] is None:  # after every cleanup: a warnings filter may make it an error
            self._warn_if_never_bound()
        return False

    def _start_device(self) -> None:
        """At entry: the named device (NOTE [ Session device ] rule 1), a budget share (NOTE
        [ Memory share budgets ]) and the device peak's reset (NOTE [ Device peak ])."""
        config, core = self.config, self.core
        dev = devices.concrete(config.device) if config.device is not None else None
        if dev is not None:
            self.start(dev)
        where = dev or devices.default_device()
        if isinstance(config.budget, devices.MemoryShare):
            core.bytes.set_budget(config.budget.resolve(where))
        self.stats._budget = core.budget
        if where.type == "cuda":
            devices.reset_peak(where)
            self.stats._peak_device = where  # NOTE [ Device peak ]: the stats own it

    def _warn_if_never_bound(self) -> None:
        """A byte budget that never bound saved nothing: say so once, at exit, with the peak
        a smaller budget could start from (not for ``"auto"`` / shares, which are meant as
        ceilings)."""
        b, core = self.config.budget, self.core
        if type(b) is int and core.lazy and self.stats.ops and core.device is not None:
            warnings.warn(
                f"tritondtr: the budget of {format_bytes(b)} never bound: the tracked peak was "
                f"{format_bytes(self.stats.peak_bytes)} and nothing was evicted. To save memory, "
                "give a budget below the peak (the tests use 50 % and 30 % of it); "
                "budget=None measures it without this warning.",
                stacklevel=3,
            )

    def _side_streams(self, inputs) -> None:
        """NOTE [ Side streams ]: after an op, its tracked inputs' buffers are recorded as used
        by the current stream, once any op of the session ran off the default stream."""
        if not self._side_seen:  # the raw handle: no Stream object per op
            index, default = self._default
            if torch._C._cuda_getCurrentRawStream(index) == default:
                return
            self._side_seen = True
        stream = torch.cuda.current_stream(self.core.device)
        for inp in inputs:
            if inp.mode <= WRITE:
                buf = inp.source.buf
                if buf is not None:
                    buf.record_stream(stream)

    def adopts_device(self, out: torch.Tensor, info) -> bool:
        """Whether ``out``, not on the session's device, fixes it now (NOTE [ Session device ]
        rule 2); otherwise it stays plain, with rule 3's warning once."""
        dev = out.device
        if self.core.device is None and devices.tracks(None, self._cuda, dev):
            return True
        if not self._warned_device and dev.type != "meta":
            self._warned_device = True
            devices.warn_other_device(info.name, dev, self.core.device)
        return False

    def _close(self) -> None:
        st = self.stats
        if st._peak_device is not None:  # NOTE [ Device peak ]: read once, at exit
            st._device_peak = devices.device_peak(st._peak_device)
            st._peak_device = None
        plaindata.uninstall()
        self.active, self.closed = False, True
        leaves = [h.leaf() for h in self._hooks.values()]
        for h in self._hooks.values():
            h.handle.remove()
        self._hooks.clear()
        self.reads.clear()
        self.leafgrads = LeafGrads()  # drop the nodes of the last backward pass
        try:
            for p in leaves:  # NOTE [ What is tracked ] rule 4: ``.grad`` assigned directly,
                if p is not None:  # handed out while the budget still holds (evictions allowed)
                    self._on_grad(p)
        finally:
            try:
                if self.timer is not None:  # NOTE [ Cost models ] rule 10: at exit, waited for
                    self.timer.finish()
            finally:
                try:
                    if self.clock is not None:  # NOTE [ Device time ] rule 2
                        self.clock.finish()
                finally:
                    self.core.close()
                    if self.timeline is not None:  # NOTE [ Memory timeline ] rule 3
                        self.timeline.exit(st, self.core.device)

    # ----------------------------------------------------------------- dispatch
    def dispatch(self, func, args, kwargs):
        info = _CACHE.get(func) or op_info(func)
        if self.depth == 0 and (self.dead or self.released):
            self.drain()
        grad = _grad_enabled()
        if not grad and _inference_mode():  # NOTE [ What is tracked ] rule 7
            if info.written:
                self._freeze_if_read(info, args, kwargs)
            return boundary.call_plain(info, args, kwargs)
        if info.special or self.closed:
            out = self._special(info, args, kwargs)
            if out is not _TRACK:
                return out
        if not grad and not _any_wrapper(info, args, kwargs):
            try:
                out = info.run(*args, **kwargs)  # NOTE [ What is tracked ] rule 2
            except RuntimeError as e:
                out = self._retry_plain(info, args, kwargs, e)
            if info.bump:  # NOTE [ Op semantics ] rule 11
                bump_versions(info, args, kwargs)
            return out
        out = self._call(info, args, kwargs, grad)
        node = _autograd_node()
        if node is not None and type(node) is _AccumulateGrad:  # NOTE [ What is tracked ] 4
            self.watch_leaf(node.variable)
        if self.debug and self.depth == 0:
            self.drain()
            self.check_invariants()
        return out

    def _retry_plain(self, info, args, kwargs, error: RuntimeError):
        """NOTE [ Out-of-memory fallback ] rule 7: an op on plain tensors the allocator
        refused, run again after evicting; ``error`` again where rule 1 forbids it."""
        if info.written or info.random:
            raise error
        return self._after_refusal(error, lambda: info.func(*args, **kwargs))

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        """A copy the session makes of a plain tensor (NOTE [ In-place versions ] rule 2,
        NOTE [ Leaf gradients ] rule 6), retried like an op if the allocator refuses it
        (NOTE [ Out-of-memory fallback ] rule 7)."""
        try:
            return t.clone()
        except RuntimeError as e:
            return self._after_refusal(e, t.clone)

    def _after_refusal(self, error: RuntimeError, fn, keep=()):
        """``fn()``, which raised ``error``, again after evicting (never the storages ``keep``),
        while the allocator refuses it and something is evictable (NOTE [ Out-of-memory
        fallback ] rules 2, 6 and 7); else the allocator's error. The one retry loop of the
        session's own work: a recomputation, a plain op, a copy (an op's is in ``_call``)."""
        core, attempt = self.core, 0
        if not core.evicting or not is_oom(error):
            raise error
        while True:
            if not evict_for_retry(core, attempt, keep):
                raise error
            attempt += 1
            try:
                return fn()
            except RuntimeError as e:
                if not is_oom(e):
                    raise
                error = e

    def _special(self, info, args, kwargs):
        """The rare cases, decided before an op is tracked: the op's result, or ``_TRACK``."""
        if info.inert:
            return info.func(*args, **kwargs)  # NOTE [ What is tracked ] rule 6
        if info.inplace_view and type(args[0]) in WRAPPER_TYPES:
            return restride(info.func, args, kwargs)  # NOTE [ Op semantics ] rule 6
        if self.closed:
            return boundary.call_plain(info, args, kwargs)
        if info.alias:  # NOTE [ Op semantics ] rule 12
            src = args[0]
            if type(src) in WRAPPER_TYPES and src._cell.session is self:
                node = _autograd_node()  # AccumulateGrad's detach: rule 4's hook, full path
                if node is None or type(node) is not _AccumulateGrad:
                    return view_wrapper(src, src, src._view)
        if info.uninit and not _any_wrapper(info, args, kwargs):
            try:
                return info.func(*args, **kwargs)  # NOTE [ What is tracked ] rule 5
            except RuntimeError as e:
                return self._retry_plain(info, args, kwargs, e)
        if info.written:
            self._freeze_if_read(info, args, kwargs)
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

    def _freeze_if_read(self, info, args, kwargs) -> None:
        """NOTE [ Parameter writes ] (boundary.py): freeze before op ``info`` writes plain
        memory the session's recipes read, once per clock tick."""
        if self.core.now != self.frozen_at and boundary.writes_leaf(self, info, args, kwargs):
            self.freeze()

    def _call(self, info, args, kwargs, grad: bool):
        """One tracked op (NOTE [ One op's path ]): its arguments bound, it run, its outputs
        wrapped, through the core in the order of NOTE [ Op protocol ] in core/core.py."""
        core, call = self.core, OpCall(info, args, kwargs, grad)
        self.depth += 1
        try:
            self._bind(call)
            out = self._wrap(call, self._run(call))
            if self.observer is not None:
                self.observer.op(call, out)
            if call.blanks:  # NOTE [ Overwriting ops ] rule 2, once the observer has seen it
                inputs = call.inputs
                for k, desc in call.blanks:
                    inputs[k] = inputs[k]._replace(source=desc, version=None, mode=BLANK)
        except BudgetError:  # the op did not run (NOTE [ Recording a trace ] rule 8)
            if self.observer is not None:
                self.observer.attempted(info, args, kwargs)
            raise
        finally:
            if core.recomputed or core.deferred or core.input_locks:  # an error: the op's locks
                core.release_inputs()
            if self.absorbed:  # NOTE [ Fused versions ] rule 5: before ``end`` frees the ids
                for s in self.absorbed:
                    s.sid = -1
                self.absorbed.clear()
            self.depth -= 1
        st = self.stats
        st.ops += 1
        st.op_counts[info.name] += 1
        core.end(call.cost)
        if self.timer is not None:  # NOTE [ Cost models ] rule 10: apply what completed
            self.timer.done()
        return out

    def _bind(self, call: OpCall) -> None:
        """Rule 1 of NOTE [ One op's path ]: every tensor argument of ``call`` to the plain
        value the op runs on, recorded as an ``Input``; its tracked storages resident and kept
        so through ``Core.enter``."""
        info, args, core = call.info, call.args, self.core
        pargs, inputs, parents = call.pargs, call.inputs, call.parents
        written = info.written
        if info.flat is not None:  # single positional tensors: walk them directly
            n = len(args)
            for i in info.flat:
                if i >= n:
                    break
                v = args[i]
                if type(v) is DTRTensor and i not in written:  # _in's hot case
                    cell = v._cell
                    s = cell.storage
                    if cell.session is self and s.recipe is not None:
                        parents.append(s.sid)
                        inputs.append(_new_tuple(Input, (i, -1, s, v._view, None, READ)))
                        continue
                if v is not None:
                    pargs[i] = self._in(call, v, i, -1, i in written)
        else:
            call.pkw = dict(call.kwargs)
            self._walk(call)
        if written and (call.wrote or info.fresh):  # NOTE [ In-place versions ] rule 2
            for k, e in enumerate(inputs):  # before enter: a retried copy evicts no input
                if e.mode == PLAIN and e.key in written:
                    copy = self._copy(e.source)
                    inputs[k] = e._replace(source=copy, version=None, mode=SNAPSHOT)
        core.enter(info.name, parents)  # resident and kept so: their buffers now
        if self.host_link.pending:  # NOTE [ Host copies on CUDA ] rule 5
            self.host_link.order(parents)
        if parents:
            pkw = call.pkw
            for e in inputs:
                if e.mode <= WRITE:
                    buf, view = e.source.buf, e.view
                    if view is not None:
                        buf = derive(buf, view)
                    key, j = e.key, e.index
                    if j < 0:
                        (pargs if type(key) is int else pkw)[key] = buf
                    else:
                        (pargs if type(key) is int else pkw)[key][j] = buf
            if info.overwrites and call.wrote:
                call.blanks = blank_writes(inputs, pargs, pkw, parents)

    def _run(self, call: OpCall):
        """Rule 2 of NOTE [ One op's path ]: the op on its plain arguments, timed and priced,
        retried after an out-of-memory error (NOTE [ Out-of-memory fallback ] in oom.py);
        then ``release_inputs``. Returns its plain result."""
        info, core, timer = call.info, self.core, self.timer
        pargs, pkw = call.pargs, call.pkw
        if info.random:
            call.rng = rng = capture_rng(info, _device_of(pargs, pkw), pargs, pkw)
        else:
            rng = None
        func, attempt = info.run, 0
        while True:
            if timer is not None:  # NOTE [ Cost models ] rule 10
                timer.start()
            t0 = _now_ns()
            try:
                out = func(*pargs, **pkw)
                break
            except RuntimeError as e:  # NOTE [ Out-of-memory fallback ] in oom.py
                if not core.evicting or info.written or not is_oom(e):
                    raise  # rule 1: a write may have been applied in part
                if core.lazy:  # NOTE [ Lazy engine ] rule 2; then lock as synced ops do
                    core.sync()
                    for inp in call.inputs:
                        if inp.mode <= WRITE and inp.source.buf is not None:
                            core.lock_input(inp.source.sid)
                if rng is not None:  # NOTE [ Out-of-memory fallback ] rule 3
                    rewind_rng(rng)
                if not evict_for_retry(core, attempt):
                    raise
                attempt += 1
        cost = float(_now_ns() - t0)
        if self._streams is not None:  # NOTE [ Side streams ]
            self._side_streams(call.inputs)
        if info.bump:  # NOTE [ Op semantics ] rule 11
            bump_versions(info, call.args, call.kwargs)
        if self.cost_fn is not None:  # NOTE [ Cost models ]: before anything is tracked
            if self.cost_fn is _UNRESOLVED:
                cost = self._first_cost(info.func, pargs, pkw, out, cost)
            else:
                cost = price(self.cost_fn, info.func, tuple(pargs), pkw, out)
            if timer is not None:
                timer.stop(cost)
        call.cost = cost
        core.release_inputs()
        return out

    def _wrap(self, call: OpCall, out):
        """Rule 3 of NOTE [ One op's path ]: the op's plain result ``out`` as the program
        sees it, its outputs tracked (``hand_out`` / ``new`` through :meth:`track`) and
        wrapped: one fresh tensor, an in-place write of the first argument and one view here,
        every other case in outputs.py."""
        info, core = call.info, self.core
        if info.fresh1:  # one fresh output: outputs' common case
            if (
                out is not None
                and out.layout is _STRIDED
                and not out.is_nested  # NOTE [ What is tracked ] rule 3
                and (out.device == core.device or self.adopts_device(out, info))
                and (_in_backward() < 0 or not self.leaf_grad(out))
            ):
                rec = Recipe(call)
                out = fresh(self, out, rec, 0, -1, tuple(call.parents), call.cost)
                seal(self, rec, call.pargs, call.pkw)
        elif info.inplace1 and len(call.wrote) == 1 and call.inputs[0].key == 0:  # add_
            cell = call.wrote[0]
            old = cell.storage  # NOTE [ In-place versions ] rule 1
            rec = Recipe(call)
            rec.outs = ((-1, 0),)
            buf, pinned = old.buf, core.pinned[old.sid]
            if info.nondet and not pinned:  # NOTE [ Nondeterministic ops ] rule 2
                pinned = pins_nondeterministic(info, buf)
            core.hand_out(old.sid)
            cost, parents = call.cost, tuple(call.parents)
            cell.storage = self.track(buf, rec, 0, parents, cost, pinned, old.sid)
            out = call.args[0]
            seal(self, rec, call.pargs, call.pkw)
        elif info.view1 is not None:  # one view: outputs' other common case
            src = call.args[info.view1]
            if type(src) in WRAPPER_TYPES and src._cell.session is self:
                psrc = call.pargs[info.view1]
                if not info.may_copy or aliases(out, psrc):  # NOTE [ Op semantics ] 10
                    out = view_of(out, src, psrc)
        else:
            out = outputs(self, call, out)
        return out

    def _first_cost(self, op, pargs, pkw, out, wall: float) -> float:
        """NOTE [ Cost models ] rule 8: the cost of an op before the session has a device,
        under a model that depends on it: the model of the op's output's device."""
        device = _tensor_device(out)
        if device is None or not devices.tracks(None, self._cuda, device):
            return wall  # nothing of it is tracked (NOTE [ Session device ] rule 2)
        fn = resolve(self.config.cost, device)  # ValueError: ``events`` on a CPU device
        return wall if fn is None else price(fn, op, tuple(pargs), pkw, out)

    def start(self, device: torch.device) -> None:
        """The session's device is known (``device=``, or its first tracked output's: NOTE [
        Session device ] in device.py): the core starts there, the cost model is chosen (NOTE
        [ Cost models ] rule 8 in cost.py), and on CUDA the counters become device time (NOTE
        [ Device time ] in events.py) and the stream and precision rules start."""
        if self.cost_fn is _UNRESOLVED:  # first: ``events`` on a CPU device raises here
            self.cost_fn = resolve(self.config.cost, device)
        self.core.start(device)
        if device.type == "cuda":
            self.clock = DeviceClock(self.stats, device=device)
            self.core.time_with(self.clock)
            if self.timer is not None:  # NOTE [ Device time ] rule 4
                self.timer.set_device(device)
            self._streams = torch.cuda.default_stream(device)  # NOTE [ Side streams ]
            self._default = (self._streams.device_index, self._streams.cuda_stream)
            self._precision = devices.precision_flags()  # NOTE [ Precision flags ]
        if self.config.offload is not None:  # NOTE [ Offload ] in core/core.py
            bw = self.config.offload
            self.core.set_link(Link(devices.link_bandwidth(device) if bw is True else bw))
            self.host_link = HostLink(device)

    def _walk(self, call: OpCall) -> None:
        """Every tensor argument of ``call`` (lists and kwargs too) to its plain value, via
        ``_in``."""
        args, kwargs, pargs, pkw = call.args, call.kwargs, call.pargs, call.pkw
        written = call.info.written
        for i, kind, name in call.info.args:
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
                pv = self._in(call, v, key, -1, w)
            else:
                pv = [self._in(call, t, key, j, w) for j, t in enumerate(v)]
            if name is None:
                pargs[i] = pv
            else:
                pkw[name] = pv

    def _in(self, call: OpCall, v, key, j: int, w: bool):
        """The plain value of tensor argument ``v`` of ``call`` (at ``key``, element ``j`` of
        a list or -1; ``w``: the op writes it); records it in ``call.inputs``."""
        if type(v) in WRAPPER_TYPES:
            cell = v._cell
            s = cell.storage
            if cell.session is self and s.recipe is not None:  # its buffer after Core.enter
                call.parents.append(s.sid)
                call.inputs.append(
                    _new_tuple(Input, (key, j, s, v._view, None, WRITE if w else READ))
                )
                if w:
                    call.wrote.append(cell)
                return None
            v = cell.session.value(v, escape=True)  # external storage or foreign
        elif not isinstance(v, torch.Tensor):  # a Python number in a Tensor slot
            return v
        elif v.requires_grad and _is_leaf(v):
            self.watch_leaf(v)
        elif self.leafgrads.pending and self.leafgrads.made(v):  # NOTE [ Leaf gradients ] 6
            call.inputs.append(_new_tuple(Input, (key, j, self._copy(v), None, None, SNAPSHOT)))
            return v
        try:
            version = v._version
        except RuntimeError:  # an inference tensor: no version counter (NOTE [ What is tracked ] 7)
            version = None
        call.inputs.append(_new_tuple(Input, (key, j, v, None, version, PLAIN)))
        return v

    # ----------------------------------------------------------------- storages
    def track(
        self,
        buf: torch.Tensor,
        recipe,
        out: int,
        parents: tuple,
        cost: float,
        pinned,
        writes=-1,
        alone=True,
    ):
        """A new tracked storage for ``buf``, computed by ``recipe`` from ``parents`` (sids);
        ``writes``: the sid it is a new version of (an in-place write), or -1; ``alone``: the
        op writes no other tracked storage."""
        nbytes = buf.untyped_storage().nbytes()
        core = self.core
        backward = core.pin_backward and _in_backward() >= 0
        sid = core.new(nbytes, cost, parents, recipe.info.name, pinned, backward, writes, alone)
        if writes >= 0 and core.state[writes] == FREE:  # NOTE [ Fused versions ] in core
            self.absorbed.append(self.storage(writes))
        s = Storage(buf, nbytes, sid, recipe, out, self.released)
        refs = self.storages
        ref = weakref.ref(s)
        if sid < len(refs):
            refs[sid] = ref
        else:
            refs.append(ref)
        if self.timer is not None:  # NOTE [ Cost models ] rule 10
            self.timer.made(ref)
        return s

    def leaf_grad(self, o: torch.Tensor) -> bool:
        """Whether fresh output ``o`` of the op in flight stays plain (NOTE [ Leaf gradients ]
        in leafgrad.py): a gradient only a plain leaf's ``.grad`` receives."""
        return (
            _in_backward() >= 0
            and not _grad_enabled()
            and o.numel() in self.leafgrads.numels
            and self.leafgrads.is_leaf_grad(o)
        )

    def storage(self, sid: int) -> Storage:
        s = self.storages[sid]()
        if s is None:
            raise AssertionError(f"bug of tritondtr: core storage {sid} has no live Storage")
        return s

    def died(self, storage: Storage) -> None:
        """The last wrapper of ``storage``'s buffer died (``Cell.__del__``): queued, applied by
        :meth:`drain` between ops (NOTE [ Storage lifetime ] rule 2)."""
        self.dead.append(storage)

    def observe(self, observer) -> None:
        """``observer`` (a ``tritondtr.trace`` recorder, or None) sees every op from now on."""
        self.observer = observer

    def drain(self) -> None:
        """Apply queued deaths (NOTE [ Storage lifetime ]); only between ops."""
        dead, released, core, observer = self.dead, self.released, self.core, self.observer
        while dead or released:
            while dead:
                s = dead.pop()
                if s.recipe is not None:
                    core.release(s.sid)
                    if observer is not None:
                        observer.released(s.sid)
            while released:
                sid = released.pop()
                if observer is not None:
                    observer.forgot(sid)
                core.forget(sid)

    # ------------------------------------------------------ the core's executor
    def recompute(self, sid: int, consume: int = -1) -> None:
        """Run the recipe of evicted ``sid`` again (its inputs are resident and locked), in
        the buffer of ``consume`` if >= 0 (NOTE [ Consumed versions ] in core/remat.py)."""
        s = self.storage(sid)
        rec = s.recipe
        src = self.storage(consume) if consume >= 0 else None
        self.stats.remat_counts[rec.info.name] += 1
        if self._precision is not None:  # NOTE [ Precision flags ] rule 2
            devices.check_precision(self._precision, rec.info.name)
        if self._side_seen:  # NOTE [ Side streams ] rule 4
            self._side_streams(rec.inputs)
        if self.host_link.pending:  # NOTE [ Host copies on CUDA ] rule 5
            self.host_link.order(self.core.inputs[sid])
            if consume >= 0:
                self.host_link.order((consume,))
        clock = self.clock  # NOTE [ Device time ] in events.py
        t0 = time.perf_counter() if clock is None else clock.start()
        try:
            buf = run_recipe(rec, (s.out,), self.fsdp.stand_in, src)[0]
        except RuntimeError as e:  # NOTE [ Out-of-memory fallback ] rules 1 and 6
            if src is not None:  # a replay into a consumed buffer may have written part of it
                raise
            stand_in = self.fsdp.stand_in
            buf = self._after_refusal(
                e, lambda: run_recipe(rec, (s.out,), stand_in, None)[0], self.core.inputs[sid]
            )
        if src is not None:
            src.buf = None
        if self._side_seen:  # NOTE [ Side streams ] rule 4: on the device, no host wait
            cur = torch.cuda.current_stream(self.core.device)
            if cur != self._streams:
                self._streams.wait_stream(cur)
        if clock is None:
            self.stats.recompute_s += time.perf_counter() - t0
        else:
            clock.stop(t0, "recompute_s")
        if buf.untyped_storage().nbytes() != s.nbytes:  # NOTE [ Replay context ] rule 2
            raise AssertionError(
                f"bug of tritondtr: recomputing {rec.info.name} gave a buffer of "
                f"{buf.untyped_storage().nbytes()} bytes, the first execution {s.nbytes}"
            )
        s.buf = buf

    def free(self, sid: int) -> None:
        """Drop the buffer of ``sid`` (evicted, dropped or handed out)."""
        s = self.storages[sid]()
        if s is not None:  # else its buffer died with it (NOTE [ Storage lifetime ] rule 5)
            s.buf = None

    def keep(self, sid: int) -> None:
        """``sid`` became external for good: it keeps its buffer, its recipe is dropped; a
        copy out still reading the buffer is waited for on the device, since the program
        may write it next (a parameter write: NOTE [ Host copies on CUDA ] rule 5)."""
        if self.host_link.pending:
            self.host_link.order((sid,))
        self.storage(sid).recipe = None

    def copy_out(self, sid: int) -> None:
        """NOTE [ Asynchronous offload ] in core/offload.py: the bytes of resident ``sid``'s
        storage into host memory; its buffer stays until :meth:`free`. On CUDA a pinned
        block, copied on the session's copy stream (NOTE [ Host copies on CUDA ]). On a CPU
        device nothing is saved: the copy exists so that tests and the twin exercise
        offload (docs/runtime.md)."""
        s = self.storages[sid]()
        if s is None:  # its buffer died with it (NOTE [ Storage lifetime ] rule 5): no copy,
            return  # and nothing will ask for it
        buf = s.buf
        if self._side_seen:  # NOTE [ Side streams ]: a side stream may still be writing it
            torch.cuda.synchronize(buf.device)
        host = self.host_link.copy_out(sid, buf)
        s.host = (host, buf.dtype, buf.size(), buf.stride(), buf.storage_offset())

    def fetch(self, sid: int, hint: bool = False) -> None:
        """Offloaded ``sid``'s storage back on the device, byte for byte, in the layout it
        left in (a new buffer; retried after evicting if the allocator refuses it, unless
        ``hint``: a prefetch, given up). The host copy stays (NOTE [ Asynchronous offload ]
        rule 1)."""
        s = self.storage(sid)
        link = self.host_link

        def back() -> torch.Tensor:
            return link.copy_back(sid, *s.host)

        try:
            s.buf = back()
        except RuntimeError as e:  # NOTE [ Out-of-memory fallback ] rule 6
            if hint:
                raise
            s.buf = self._after_refusal(e, back)

    def drop_copy(self, sid: int) -> None:
        """``sid`` left the core, became external or is dropped: its host copy goes (a copy
        in flight finishes on its own: NOTE [ Host copies on CUDA ] rule 2)."""
        s = self.storages[sid]()
        if s is not None:
            s.host = None

    @opaque
    def evict_all(self) -> int:
        """Evict every evictable storage now (tests, measurements); returns how many."""
        if self.core.device is None:
            return 0
        with _disable_current_modes():
            self.drain()
            if self.observer is not None:  # NOTE [ Recording a trace ] rule 8
                self.observer.evicted_all()
            return self.core.evict_all()

    # ------------------------------------------------------------------ values
    def value(self, t: DTRTensor, *, escape: bool) -> torch.Tensor:
        """The plain value of ``t`` (see :func:`boundary.value`)."""
        return boundary.value(self, t, escape=escape)

    def freeze(self) -> None:
        """NOTE [ Parameter writes ] (boundary.py)."""
        if boundary.freeze(self):
            self.frozen_at = self.core.now
            if self.timeline is not None:  # NOTE [ Memory timeline ] rule 6
                self.timeline.froze()

    def check_invariants(self) -> None:
        """Raise AssertionError if the session disagrees with its core (debug mode)."""
        boundary.check_invariants(self)

    def in_flight(self) -> _InFlight:
        """``with session.in_flight():`` the runtime's own work between ops counts as an op
        in flight (made per use: an attribute would be a reference cycle, and a closed
        session must go by reference counting, NOTE [ Session lifetime ])."""
        return _InFlight(self)

    def watch_leaf(self, p: torch.Tensor) -> None:
        """NOTE [ What is tracked ] rules 4 and 8: hook leaf ``p``'s gradient accumulation;
        the entry goes when ``p`` dies."""
        if self.watches(p):
            return
        key = id(p)
        ref = weakref.ref(p, _unhook(self._hooks, key))
        self._hooks[key] = _LeafHook(ref, p.register_post_accumulate_grad_hook(self._on_grad))
        self.reads.leaf(p, self.fsdp.keys)
        self.leafgrads.numels.add(p.numel())  # NOTE [ Leaf gradients ] rule 4

    def watches(self, t: torch.Tensor) -> bool:
        """Whether plain tensor ``t`` is a leaf this session hooked (:meth:`watch_leaf`)."""
        h = self._hooks.get(id(t))
        return h is not None and h.leaf() is t

    @opaque  # called by autograd: NOTE [ Dynamo never traces the runtime ] rule 3
    def _on_grad(self, p: torch.Tensor) -> None:
        g = p.grad
        if type(g) in WRAPPER_TYPES and g.grad_fn is None and g.shape == p.shape:
            # Another shape: ``p.data`` took another shape under a live graph; autograd set
            # the graph's shape, which the Python setter refuses: the wrapper stays.
            p.grad = g._cell.session.value(g, escape=True)


def _unhook(hooks: dict, key: int):
    """NOTE [ What is tracked ] rule 8: the weak-reference callback that drops a dead leaf's
    entry; it holds the dict, not the session (the dict is cleared at exit)."""

    def gone(ref) -> None:  # a dict update: safe inside the collector
        h = hooks.get(key)
        if h is not None and h.leaf is ref:
            del hooks[key]

    return gone


def _is_leaf(t: torch.Tensor) -> bool:
    """``t.is_leaf``, False where autograd raises for it (a multi-output view, ``unbind``'s,
    whose base was written in place: a view, so no leaf anyway)."""
    try:
        return t.is_leaf
    except RuntimeError:
        return False


def _any_wrapper(info, args, kwargs) -> bool:
    for i, kind, name in info.args:
        v = (args[i] if i < len(args) else None) if name is None else kwargs.get(name)
        if v is None:
            continue
        if kind == ONE:
            if type(v) in WRAPPER_TYPES:
                return True
        elif any(type(t) in WRAPPER_TYPES for t in v):
            return True
    return False


def _tensor_device(out) -> torch.device | None:
    """The device of ``out``'s first tensor (an op's result), None if it has none."""
    while type(out) in (list, tuple) and out:
        out = out[0]
    return out.device if isinstance(out, torch.Tensor) else None


def _device_of(pargs, pkw) -> torch.device | None:
    """The device a random op draws on (NOTE [ RNG replay ] rule 3)."""
    d = pkw.get("device")
    if d is not None:
        return torch.device(d)
    for a in pargs:
        if isinstance(a, torch.Tensor):
            return a.device
    return None

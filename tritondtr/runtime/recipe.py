"""Storages, alias cells and recipes: the runtime's objects below the wrapper tensors, and
:func:`run_recipe`, which runs a recipe again.

A :class:`Storage` is one *version* of the contents of one buffer. Its ``buf`` is the plain
tensor that owns the memory while it is resident (``None`` while evicted); its ``recipe`` says
how to compute it again. A :class:`Cell` is what the wrapper tensors of one buffer share: an
in-place op points the cell at a new version, so every alias sees the new contents while
recipes keep referring to the old version they read.

# NOTE [ Storage lifetime ]
# 1. Wrappers hold cells, cells hold their current storage, recipes hold the storages they
#    read. Nothing else holds a storage strongly (the runtime's slot map is weak).
# 2. When the last wrapper of a cell dies, ``Cell.__del__`` queues the storage; the runtime
#    frees its buffer at the next op it dispatches, before that op allocates anything. The
#    storage keeps its recipe: dependents may still need it (it is then an evicted storage).
# 3. When no recipe refers to a storage either, ``Storage.__del__`` queues its slot, and the
#    engine forgets it at the same point.
# 4. ``__del__`` only appends to a list: it can run inside any allocation (cyclic GC), so it
#    never touches the engine or the byte counts itself.
# 5. So within one op the core may still hold a storage that died: the freeze of NOTE
#    [ Parameter writes ] runs inside the optimizer's first parameter write, drops recipes,
#    and its recomputations can choose such a storage as a victim. Freeing it is a no-op
#    (its buffer died with it); it is never recomputed (no wrapper and no recipe needs it).
# 6. A recipe lives as long as its storages, usually past a few of Python's young
#    collections, so what it holds is kept lean for the cyclic collector: its call's
#    positional arguments and its ``outs`` are tuples (a tuple of ints and Nones is
#    untracked by the collector's first pass; a list never is). On the GRU loop the two lists
#    per recipe were ~15 % of the objects a step left to the collector, whose full
#    collections cost ~150 ms each on the 2-core AMD EPYC guest (docs/benchmarks.md, "What do
#    Python's garbage collections cost a step?").

# NOTE [ RNG replay ]
# 1. A random op (NOTE [ Op semantics ] rule 4) captures the states of the generators it may
#    draw from just before its first execution; it never forks, seeds or advances them.
# 2. A replay saves the current states of those generators, sets the captured ones, runs the
#    op and restores the saved ones in ``finally``, so replays are invisible to the program's
#    random streams.
# 3. Which generators: for an ATen op, its ``Generator`` argument if one is given, else the
#    default generator of the op's device (its ``device=`` argument, else its first tensor
#    argument's device, else CPU; ``rand_like(x, device="cuda")`` of a CPU ``x`` draws on
#    CUDA), as ATen's kernels do. For an op outside ATen (rule 4c there) nothing says what
#    its body draws from, so every generator it could reach is captured: each ``Generator``
#    argument given, the default CPU generator (a CUDA op's body may draw masks on the CPU)
#    and the default generator of every initialized CUDA device
#    (``torch.cuda.default_generators``, empty before CUDA starts; no device is initialized
#    to capture it). Capturing a generator the op does not use costs its ``get_state`` and
#    changes nothing; missing one would replay other draws silently.
# 4. An op that ran out of memory and is retried after an eviction (NOTE [ Budget
#    accounting ]) first gets the captured states back: the attempt that failed may have
#    drawn, and the retry must draw what the recipe will replay (and what eager draws).
# 5. A replay is exact only if the op's randomness lives in PyTorch's generators. An op that
#    seeds itself elsewhere (NumPy, Python's ``random``, a counter or clock of its own, a
#    state tensor it updates without declaring it) cannot be replayed: the program must pin
#    its outputs with ``enable(never_evict=fn)``, where ``fn(op_name, output)`` returns True
#    for that op (docs/runtime.md, Randomness). cuDNN's RNN dropout is such a state tensor,
#    declared in semantics.py as a hidden write, so its replays draw from the state the
#    first execution read. What rules 1 to 3 cost per op: docs/benchmarks.md, "What does
#    capturing a random op's generators cost?".

# NOTE [ Replay context ]
# 1. Some kernels read the grad mode: ``_sparse_mm_reduce_impl`` computes its ``arg_out``
#    output only when grad mode is on, and its backward reads that output without checking
#    its size (a replay under the backward's no-grad mode gave an empty tensor and a
#    segfault). A replay therefore runs under the grad mode of the first execution.
# 2. A replay whose output has another byte size than the first execution is a bug, not a
#    value: ``Session.recompute`` raises instead of handing out a wrong-sized buffer.
# 3. Autocast acts above the mode: its dispatch keys (``AutocastCPU``, ``AutocastCUDA``, ...)
#    come before Autograd and Python, so an op reaches ``__torch_dispatch__`` already cast
#    (or passed through unchanged, if autocast has no rule for it), and a recipe records the
#    cast op with its cast inputs. A replay calls that op again from the top of the
#    dispatcher, under the autocast state active *then*: the mode's handler mostly runs with
#    every key above Python excluded, but replays also start in ops that arrive without that
#    exclusion (the autograd engine's ``detach``), in the post-accumulate-grad hook and in
#    boundary calls (``.tolist()``, ``unwrap``, printing). An ``mm`` first run in float32
#    outside autocast and recomputed in a backward under CPU bfloat16 autocast was cast to
#    bfloat16 (issue 10). A replay therefore runs with every autocast key excluded
#    (``torch._C._DisableAutocast``, the guard aot_autograd puts around graphs whose
#    autocast is already applied): the recorded op runs as it first ran, whatever autocast
#    state is active. The first execution needs no guard: an op autocast casts is then
#    called with autocast's own key excluded, and any other op autocast passes through.
#    The guard's cost per replay: docs/benchmarks.md, Measurements behind the NOTEs, Replay
#    guards.
# 4. A replay never runs under ``torch.inference_mode``: an op there hands its wrapper
#    arguments out (NOTE [ What is tracked ] rule 7), recomputing them if evicted, and a
#    buffer made under inference mode is an inference tensor (no version counter, no in-place
#    write outside inference mode, no view with a version counter): the session's own
#    buffers would fail later ordinary ops that eager runs.

# NOTE [ Replay copies ]
# 1. A replay of an in-place op writes a copy of the version it read (a ``WRITE`` input): a
#    copy of the whole storage, seen with the source buffer's geometry and math bits. When
#    the source buffer covers its storage exactly (contiguous, offset 0, its bytes those of
#    the storage, no conj or neg bit), as a fresh op output does, that copy is
#    ``buf.clone()``: the same bytes, and for a non-overlapping dense tensor the same sizes
#    and strides (``empty_strided`` of its own). Otherwise it is the storage's clone put
#    under the buffer's geometry (``torch.empty`` plus ``set_``), ~4x the cost on a small
#    buffer (7.4 against 1.9 us for 32 x 768 float32 on the 2-core AMD EPYC guest:
#    docs/history/benchmarks-log.md, Replay bookkeeping).
# 2. A recipe whose tensor arguments are all single positional tensors (``OpInfo.flat``) is
#    replayed on a shallow copy of its argument list and on its own keyword dict: the replay
#    fills only positional slots, and ATen never writes the lists it is given. Other recipes
#    copy every list (tensor lists are filled in place).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import torch

from .dynamo import opaque
from .errors import StaleInputError
from .nondeterministic import deterministic_mode

__all__ = [
    "Cell",
    "Input",
    "Mode",
    "OpCall",
    "Recipe",
    "Storage",
    "blank",
    "derive",
    "geometry",
    "run_recipe",
    "storage_ptr",
]


class Mode(enum.IntEnum):
    """How a recipe reads one tensor argument (:class:`Input`). ``READ`` and ``WRITE`` read a
    tracked storage: they are the storage's parents (``mode <= WRITE``)."""

    READ = 0  # a tracked storage version (version: None)
    WRITE = 1  # a tracked storage the op wrote: the replay writes a copy
    SNAPSHOT = 2  # a plain tensor the op wrote: source is a copy taken before the op
    PLAIN = 3  # a plain tensor read: ``version`` is checked before a replay
    BLANK = 4  # a tracked storage the op overwrote entirely (NOTE [ Overwriting ops ])


READ, WRITE, SNAPSHOT, PLAIN, BLANK = (int(m) for m in Mode)  # the hot paths compare ints

_below_autograd = torch._C._AutoDispatchBelowADInplaceOrView  # NOTE [ Replay context ] 1
_no_autocast = torch._C._DisableAutocast  # NOTE [ Replay context ] 3
_set_deterministic = torch._C._set_deterministic_algorithms  # NOTE [ Nondeterministic ops ] 4
_grad_enabled = torch.is_grad_enabled
_inference_mode = torch.is_inference_mode_enabled  # NOTE [ Replay context ] 4
_inference_off = torch._C._InferenceMode


class Input(NamedTuple):
    """One tensor argument of a recipe: where it goes in the call and what it reads.

    ``key``: positional index or keyword name; ``index``: position in a list argument, -1
    for a single tensor; ``source``: the :class:`Storage` (READ, WRITE), the plain tensor
    (PLAIN, SNAPSHOT: a copy) or :func:`blank`'s description (BLANK); ``view``: the geometry
    read on the storage (None: the storage's own); ``version``: ``_version`` of a PLAIN
    tensor; ``mode``: a :class:`Mode`.
    """

    key: int | str
    index: int
    source: object
    view: tuple | None
    version: int | None
    mode: int


class Storage:
    """One version of one buffer's contents (see NOTE [ Storage lifetime ]).

    ``buf``: the plain tensor owning the memory, or None while evicted. ``nbytes``: bytes of
    its untyped storage. ``sid``: its id in the session's DTR core (which holds its residency,
    clocks, pins and parents), -1 for a storage the core never tracked. ``recipe`` / ``out``:
    how to recompute it (``out`` indexes ``recipe.outs``); ``recipe`` is None for an
    *external* storage (memory shared with plain tensors the user holds: never evicted, not
    counted; recipes that read it record ``buf._version``), including one the core turned
    external (NOTE [ Parameter writes ]). ``released``: the session's list its death is
    queued in (the list, not the session: NOTE [ Session lifetime ] in session.py). ``host``:
    while offloaded (NOTE [ Offload ] in core/core.py), its bytes in host memory and the
    layout to rebuild ``buf`` from them.
    """

    __slots__ = ("__weakref__", "buf", "host", "nbytes", "out", "recipe", "released", "sid")

    def __init__(self, buf, nbytes: int, sid: int, recipe, out: int, released: list) -> None:
        self.buf = buf
        self.host = None  # while offloaded: (host bytes, dtype, size, stride, offset)
        self.nbytes = nbytes
        self.sid = sid
        self.recipe = recipe
        self.out = out
        self.released = released

    @opaque  # runs wherever GC runs: NOTE [ Dynamo never traces the runtime ]
    def __del__(self) -> None:  # NOTE [ Storage lifetime ] rules 3 and 4
        if self.sid >= 0:
            try:  # noqa: SIM105 (cheaper than contextlib.suppress on this per-tensor path)
                self.released.append(self.sid)
            except Exception:  # interpreter shutdown
                pass


class Cell:
    """Shared by all wrappers of one buffer; ``storage`` is its current version."""

    __slots__ = ("session", "storage")

    def __init__(self, storage: Storage, session) -> None:
        self.storage = storage
        self.session = session

    @opaque  # runs wherever GC runs: NOTE [ Dynamo never traces the runtime ]
    def __del__(self) -> None:  # NOTE [ Storage lifetime ] rule 2
        try:  # noqa: SIM105 (cheaper than contextlib.suppress on this per-tensor path)
            self.session.died(self.storage)
        except Exception:  # interpreter shutdown
            pass


class OpCall:
    """One tracked op in flight, from its arguments to its wrapped outputs (NOTE [ One op's
    path ] in session.py; after ``torch.utils.checkpoint``'s ``_CheckpointFrame``). It lives
    for the op; the :class:`Recipe` made from it is what stays.

    ``info`` / ``args`` / ``kwargs``: the op and its call as the program made it; ``grad``:
    the grad mode it runs in. Binding fills ``pargs`` / ``pkw`` (the call with each tensor
    as the plain value the op runs on), ``inputs`` (an :class:`Input` per tensor argument,
    in argument order), ``parents`` (core ids of the tracked storages it reads, in argument
    order, duplicates too), ``wrote`` (cells of the tracked storages it writes in place) and
    ``blanks`` ((index, :func:`blank` description) of the inputs it overwrites: NOTE [
    Overwriting ops ] in outputs.py, or None). Running fills ``rng`` (captured generator
    states or None: NOTE [ RNG replay ]) and ``cost`` (ns).
    """

    __slots__ = (
        "args", "blanks", "cost", "grad", "info", "inputs", "kwargs", "parents", "pargs",
        "pkw", "rng", "wrote",
    )  # fmt: skip

    def __init__(self, info, args: tuple, kwargs: dict, grad: bool) -> None:
        self.info = info
        self.args = args
        self.kwargs = kwargs
        self.grad = grad
        self.pargs = list(args)
        self.pkw = kwargs
        self.inputs: list[Input] = []
        self.parents: list[int] = []
        self.wrote: list[Cell] = []
        self.blanks: list[tuple[int, tuple]] | None = None
        self.rng = None
        self.cost = 0.0


class Recipe:
    """How to run one op again.

    ``args`` / ``kwargs``: the call with every tensor position set to None (lists copied).
    ``inputs``: one :class:`Input` per tensor argument. ``rng``: ((generator, state), ...) of
    a random op (NOTE [ RNG replay ]), else None.
    ``outs``: per produced storage, ``(r, j)`` for return ``r`` (element ``j`` of a list
    return, else -1) or ``(-1, k)`` for the copy written through ``inputs[k]``. ``grad``: the
    grad mode of the first execution, restored for replays, which also run with autocast off
    (NOTE [ Replay context ]). ``det``: for an op nondeterministic on CUDA, the
    deterministic-algorithms setting of the first execution, restored for replays (NOTE [
    Nondeterministic ops ] rule 4), else None.
    """

    __slots__ = (
        "__weakref__", "aliased", "args", "det", "grad", "info", "inputs", "kwargs", "outs",
        "rng",
    )  # fmt: skip

    def __init__(self, call: OpCall) -> None:
        """The recipe of the op ``call`` ran (its plain call, inputs and generators)."""
        info = self.info = call.info
        self.args = call.pargs
        self.kwargs = call.pkw
        self.inputs = call.inputs
        self.rng = call.rng
        self.grad = call.grad
        self.det = deterministic_mode() if info.nondet else None
        self.outs: tuple[tuple[int, int], ...] = ()  # tuples: NOTE [ Storage lifetime ] rule 6
        self.aliased = False  # an input reads a storage another writes (In-place versions 3)


def geometry(t: torch.Tensor) -> tuple:
    """The view of ``t`` on its storage: (size, stride, storage_offset, dtype, conj, neg);
    ``conj`` / ``neg`` are its math bits (``is_conj()``, ``is_neg()``), which a view such as
    ``aten._conj`` changes without touching memory."""
    return (t.size(), t.stride(), t.storage_offset(), t.dtype, t.is_conj(), t.is_neg())


def derive(buf: torch.Tensor, view: tuple | None) -> torch.Tensor:
    """The plain tensor of ``view`` (from :func:`geometry`, or None for ``buf`` itself) on
    ``buf``'s storage."""
    if view is None:
        return buf
    size, stride, offset, dtype, conj, neg = view
    if dtype == buf.dtype:
        out = buf.as_strided(size, stride, offset)
    else:
        out = torch.empty((0,), dtype=dtype, device=buf.device)
        out.set_(buf.untyped_storage(), offset, size, stride)
    return _with_bits(out, conj, neg)


def _with_bits(t: torch.Tensor, conj: bool, neg: bool) -> torch.Tensor:
    """``t`` with the math bits ``conj`` / ``neg`` (views that toggle them if needed)."""
    if t.is_conj() != conj:
        t = t.conj()
    if t.is_neg() != neg:
        t = torch._neg_view(t)
    return t


def clone_buffer(buf: torch.Tensor, nbytes: int | None = None) -> torch.Tensor:
    """A copy of ``buf``'s whole storage, seen with ``buf``'s geometry and math bits.
    ``nbytes``: the storage's byte size if known (NOTE [ Replay copies ])."""
    if (
        nbytes is not None
        and buf.nbytes == nbytes
        and buf.is_contiguous()
        and not buf.storage_offset()
        and not buf.is_conj()
        and not buf.is_neg()
    ):  # buf covers its whole storage: the tensor's own clone copies exactly that
        return buf.clone()
    return _on_storage(buf.untyped_storage().clone(), buf.device, geometry(buf))


def blank(buf: torch.Tensor) -> tuple:
    """What a replay needs to make a fresh, uninitialized buffer like ``buf``: (storage
    bytes, device, :func:`geometry`)."""
    return (buf.untyped_storage().nbytes(), buf.device, geometry(buf))


def _on_storage(st, device: torch.device, view: tuple) -> torch.Tensor:
    size, stride, offset, dtype, conj, neg = view
    out = torch.empty((0,), dtype=dtype, device=device)
    out.set_(st, offset, size, stride)
    return _with_bits(out, conj, neg)


def generator_of(device: torch.device | None, gen=None) -> torch.Generator:
    """``gen``, else the default generator of ``device`` (NOTE [ RNG replay ] rule 3)."""
    if gen is not None:
        return gen
    if device is None or device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[idx]
    raise NotImplementedError(
        f"tritondtr: random ops on {device} are not supported (no "
        "generator state to capture); run them outside the context"
    )


def capture_rng(info, device: torch.device | None, pargs, pkw) -> tuple:
    """((generator, state), ...) of every generator the random op ``info`` may draw from,
    called with ``pargs`` / ``pkw`` on ``device`` (NOTE [ RNG replay ] rules 1 and 3)."""
    gens = []
    for key in info.generators:
        g = (pargs[key] if key < len(pargs) else None) if type(key) is int else pkw.get(key)
        if g is not None and all(g is not h for h in gens):
            gens.append(g)
    if info.rng_defaults:
        if device is not None and device.type not in ("cpu", "cuda"):
            generator_of(device)  # raises: no generator state to capture there
        for g in (torch.default_generator, *torch.cuda.default_generators):
            if all(g is not h for h in gens):
                gens.append(g)
    elif not gens:
        gens.append(generator_of(device))
    return tuple([(g, g.get_state()) for g in gens])


def rewind_rng(rng: tuple) -> None:
    """Set every generator of ``rng`` (from :func:`capture_rng`) to its captured state
    (NOTE [ RNG replay ] rule 4)."""
    for g, state in rng:
        g.set_state(state)


def run_recipe(rec, want, stand_in=None, consume=None) -> list[torch.Tensor]:
    """Run ``rec`` again on its (resident) inputs; returns the buffers of ``rec.outs[i]`` for
    ``i`` in ``want``. Raises :class:`StaleInputError` if an outside input changed.
    ``stand_in``: None, or ``fn(t) -> tensor`` giving what to read for the plain input ``t``
    (a copy while ``t``'s memory is away: NOTE [ FSDP2 ] in fsdp.py). ``consume``: None, or
    the :class:`Storage` of a written input whose buffer the replay writes itself instead of
    a copy (NOTE [ Consumed versions ] in core/remat.py)."""
    if _inference_mode():  # NOTE [ Replay context ] rule 4
        with _inference_off(False):
            return run_recipe(rec, want, stand_in, consume)
    info = rec.info
    if info.flat is not None:  # NOTE [ Replay copies ] rule 2: only single positional tensors
        args, kwargs = list(rec.args), rec.kwargs
    else:
        args = [list(a) if type(a) is list else a for a in rec.args]
        kwargs = {k: (list(v) if type(v) is list else v) for k, v in rec.kwargs.items()}
    copies: dict[int, torch.Tensor] = {}
    if rec.aliased:  # NOTE [ In-place versions ] rule 3: reads see the buffer written
        for e in rec.inputs:
            if e.mode == WRITE:
                _written(e.source, copies, stand_in, consume)
    for pos, j, src, view, version, mode in rec.inputs:
        if mode == READ:
            buf = src.buf
            if buf is None:  # a version this recipe absorbed (NOTE [ Fused versions ])
                buf = _absorbed(src, copies, stand_in, consume)
            elif copies and id(src) in copies:  # a storage this op writes (rule 3 there)
                buf = copies[id(src)]
            elif version is not None and buf._version != version:
                raise StaleInputError(info.name, buf.shape, version, buf._version)
            v = buf if view is None else derive(buf, view)
        elif mode == WRITE:
            c = _written(src, copies, stand_in, consume)
            v = c if view is None else derive(c, view)
        elif mode == BLANK:  # NOTE [ Overwriting ops ]: the op writes every element
            nbytes, device, geom = src
            st = torch.empty((nbytes,), dtype=torch.uint8, device=device).untyped_storage()
            c = copies[id(src)] = _on_storage(st, device, geom)
            v = derive(c, view)
        elif mode == SNAPSHOT:
            v = src.clone()
        else:  # PLAIN (version None: an inference tensor, NOTE [ What is tracked ] rule 7)
            if version is not None and src._version != version:
                raise StaleInputError(info.name, src.shape, version, src._version)
            v = src if stand_in is None else stand_in(src)
        where = args if type(pos) is int else kwargs
        if j < 0:
            where[pos] = v
        else:
            where[pos][j] = v
    grad = _grad_enabled()
    if grad != rec.grad:  # NOTE [ Replay context ] rule 1
        torch._C._set_grad_enabled(rec.grad)
    try:
        # plain tensors: no graph, no view tracking, no second cast (NOTE [ Replay context ] 3)
        with _below_autograd(), _no_autocast():
            if rec.rng is None and rec.det is None:
                out = info.run(*args, **kwargs)
            else:
                out = _run(rec, args, kwargs)
    finally:
        if grad != rec.grad:
            torch._C._set_grad_enabled(grad)
    outs = rec.outs
    if len(info.rets) == 1 and len(want) == 1:  # one return: outputs' common case
        r, j = outs[want[0]]
        if r < 0:
            return [copies[id(rec.inputs[j][2])]]
        return [out if j < 0 else out[j]]
    res = []
    for i in want:
        r, j = outs[i]
        if r < 0:
            res.append(copies[id(rec.inputs[j][2])])
        else:
            o = out if len(info.rets) == 1 else out[r]
            res.append(o if j < 0 else o[j])
    return res


def _written(src, copies: dict, stand_in, consume) -> torch.Tensor:
    """The buffer a replay writes for the written input ``src`` (once per run): ``src``'s own
    buffer if the core lets the replay consume it (NOTE [ Consumed versions ]), ``src``
    rebuilt if the recipe absorbed it (NOTE [ Fused versions ]), else a copy of it."""
    c = copies.get(id(src))
    if c is None:
        if src.buf is None:
            c = _absorbed(src, copies, stand_in, consume)
        else:
            c = copies[id(src)] = src.buf if src is consume else clone_buffer(src.buf, src.nbytes)
    return c


def _absorbed(src, copies: dict, stand_in, consume) -> torch.Tensor:
    """The buffer of version ``src``, which the recipe being run absorbed (NOTE [ Fused
    versions ] in core/core.py): ``src``'s own recipe run again (``consume`` is the chain's
    first written version, NOTE [ Consumed versions ]), once per run, so that every argument
    reading ``src`` sees the one buffer the op writes, as in the first execution."""
    c = copies.get(id(src))
    if c is None:
        if src.sid >= 0 or src.recipe is None:
            raise AssertionError(
                "bug of tritondtr: a recipe reads an evicted storage the core did not make "
                f"resident ({src.recipe.info.name if src.recipe else 'external'})"
            )
        c = copies[id(src)] = run_recipe(src.recipe, (src.out,), stand_in, consume)[0]
    return c


def _run(rec, args, kwargs):
    det = rec.det
    if det is not None and det != deterministic_mode():  # NOTE [ Nondeterministic ops ] 4
        saved = deterministic_mode()  # the C setting only: inductor's own flag is untouched
        _set_deterministic(det[0], warn_only=det[1])
        try:
            return _run_seeded(rec, args, kwargs)
        finally:
            _set_deterministic(saved[0], warn_only=saved[1])
    return _run_seeded(rec, args, kwargs)


def _run_seeded(rec, args, kwargs):
    rng = rec.rng
    if rng is None:
        return rec.info.run(*args, **kwargs)
    saved = [g.get_state() for g, _ in rng]  # NOTE [ RNG replay ] rule 2
    try:
        rewind_rng(rng)
        return rec.info.run(*args, **kwargs)
    finally:
        for (g, _), state in zip(rng, saved):
            g.set_state(state)


def storage_ptr(t: torch.Tensor) -> int:
    """The address of ``t``'s storage, or 0 if it has none a write could reach (not strided,
    no memory, a storage FSDP2 freed, a subclass without one)."""
    if t.layout is not torch.strided:
        return 0
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):  # as fsdp._key: a subclass
        return 0

"""Op semantics: what the runtime must know about an ATen op, in one table.

Most of it is read once per op overload from its schema (which arguments are tensors, which
are written, which returns are views of which argument), from its tags and namespace (random
ops). What a schema does not say is written down here, in one table filled by :func:`register`,
which refuses duplicates: hidden mutation (batch norm's running statistics), ops whose outputs are
never evicted, and ops the runtime refuses. The dispatch path reads the resulting
:class:`OpInfo` and has no op-specific branches.

# NOTE [ Op semantics ]
# 1. Views never own memory: a return with a non-write alias annotation aliases the argument
#    carrying the same alias set (for ``Tensor(a)[]`` returns, the first aliased argument);
#    the runtime re-derives it from that argument's storage.
# 2. A written argument (``Tensor(a!)``, in-place, ``out=``) and a hidden mutation are handled
#    alike: a tracked storage gets a new version (NOTE [ In-place versions ] in outputs.py);
#    a plain tensor is mutated for real and replays mutate a snapshot instead.
# 3. A return with a write annotation is the written argument itself: the caller's object is
#    returned (autograd requires in-place ops to return their input).
# 4. An op is random (``OpInfo.random``: its generator states are captured at first execution
#    and replayed, NOTE [ RNG replay ] in recipe.py) if it is not known to be deterministic:
#    a. an ATen op tagged ``nondeterministic_seeded``;
#    b. any op with a ``Generator`` argument (in torch 2.13 every ATen op of the dispatcher
#       that takes one carries the tag too; the five without it, ``manual_seed.generator``,
#       ``seed``, ``initial_seed``, ``_no_grad_normal_`` and ``_no_grad_uniform_``, are
#       TorchScript builtins that never reach a dispatch mode: checked by a test);
#    c. every op outside the ``aten`` and ``prims`` namespaces (``torch.library.custom_op``,
#       external fused dropout and attention kernels): its body runs below the mode, so
#       whatever it draws (``rand_like``, ``bernoulli_``, a ``Generator`` argument) is
#       invisible to the runtime, and nothing tells a deterministic custom op from a random
#       one. Such an op captures every generator it could draw from (``rng_defaults``).
#    Decided once per overload here; the dispatch path reads the flags.
# 5. Outputs of ops nondeterministic on CUDA (PyTorch's list, and the tag
#    ``nondeterministic_bitwise``) are pinned there unless deterministic algorithms are on
#    (NOTE [ Nondeterministic ops ] in nondeterministic.py): ``nondet``, decided per overload.
# 6. In-place view ops (tag ``inplace_view``: ``t_``, ``transpose_``, ``squeeze_``,
#    ``unsqueeze_``, ``as_strided_``, ``swapdims_``, ``detach_``) change only the wrapper's own
#    size, strides and offset: the new geometry is computed on a meta stand-in, written into
#    the wrapper (``tensor.restride``) and into its ``_view``; the buffer, its storage version
#    and every recipe are untouched (recipes keep the view tuple they read). Ops of that tag
#    that change the storage itself (``set_``, ``resize_``, ``resize_as_``) are refused with
#    a clear error when an argument is a tracked tensor.
# 7. Some autograd formulas branch on ``isTensorSubclassLike`` (a composite-compliant path for
#    tensor subclasses, PyTorch's own LoggingTensor included) and give gradients that differ
#    from eager in the last bits. No wrapper subclass can avoid that, so such ops are refused
#    when they would be differentiated (``unsupported_grad``); without grad they run. Which
#    formulas branch depends on the torch version: ``cumprod``'s does before 2.13 (measured
#    on 2.11, the GPU machines' torch: last-bit gradients in float32 and float64), so it is
#    refused there only. ``masked_select``'s formula branches on its grad and mask and runs:
#    the out-of-place ``masked_scatter`` it takes for a subclass clones contiguous, so the
#    gradient it returns for a non-contiguous input has contiguous strides where eager's
#    keeps the input's layout. Values are equal and a leaf's ``.grad`` is restrided by
#    autograd's accumulation; ``autograd.grad``'s result and hooks see the other strides.
# 8. Some ops return views their schema does not annotate (``_unsafe_view``, which
#    ``matmul`` and ``reshape`` decompositions use on a fresh intermediate; ``unsafe_split``
#    and ``unsafe_split_with_sizes``, which ``unsafe_chunk`` and CPU ``lstm_cell`` use on
#    their gates; PyTorch's ``schema_check_mode`` lists them as intentionally mis-annotated):
#    the table's ``hidden_alias`` names the argument the return (one tensor or each tensor of
#    a list) aliases, and rule 1 applies. Taken as fresh outputs, they count the same bytes
#    twice (once per wrapper), and an in-place write through one (``lstm_cell`` applies
#    ``sigmoid_`` to its chunks) changes the argument's buffer behind the runtime's back: a
#    replay that reads it then gives a wrong value.
# 9. Some in-place ops overwrite every element of their written argument without reading it
#    (``copy_``, ``fill_``, ``zero_`` and the random fills such as ``bernoulli_``, which CPU
#    dropout applies to an ``empty_like``): ``overwrites`` in the table. Their recipes do not
#    depend on the old version (NOTE [ Overwriting ops ] in outputs.py).
# 10. Composite ops whose return only *may* alias their argument (``to``, ``contiguous``,
#    ``reshape``: a ``CompositeImplicitAutograd`` kernel) are decomposed above the mode and
#    never reach it, except where that decomposition is off: PyTorch's zero-tensor fallback
#    in a double backward calls ``to(device="meta")``, and under ``inference_mode`` the same
#    happens (NOTE [ What is tracked ] rule 7). There they may return a copy (another dtype or
#    device): ``may_copy``. Such a return is a view (rule 1) only if it shares the argument's
#    memory; a copy stays plain, like an output on another device.
# 11. The in-place foreach ops (``_foreach_add_``, the optimizers' ``foreach`` path) have no
#    ``ADInplaceOrView`` kernel: their kernels bump each written tensor's version themselves
#    (per tensor on the CPU). Run below autograd by the mode, the plain kernel's bumps reach
#    the plain tensors inside only, so the caller's tensors' ``_version`` would not move:
#    autograd's "modified by an inplace operation" check and recipes' version checks would
#    miss the write, and views taken before it keep a stale ``grad_fn``. ``bump``: the written
#    arguments the session bumps after the op, once, as eager does, one tensor per
#    ``increment_version`` call. (Other ops that write without that kernel,
#    ``native_batch_norm``'s running statistics or the fused optimizers, are bumped, or not,
#    by their autograd kernel above the mode, as in eager.)
# 12. ``detach`` and ``alias`` (``_ALIASES``) return their argument as it is, a view of the
#    same geometry, and read no data. Autograd detaches every output it saves for the
#    backward (``SavedVariable`` of a Python subclass dispatches ``detach``: 244 a step of
#    the GRU loop). On a wrapper of the session such an op is answered at once, as a view
#    wrapper of the argument (``alias``): no plain op, no clock tick, no use of the storage
#    (an evicted argument stays evicted), no recipe, no trace event, not in ``stats.ops``.
#    Except inside ``AccumulateGrad``, which detaches the gradient it stores: that one takes
#    the full path, after which NOTE [ What is tracked ] rule 4 hooks the leaf.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .nondeterministic import listed as _nondeterministic

__all__ = ["OpInfo", "bump_versions", "op_info", "register", "registered"]

aten = torch.ops.aten
Tensor = torch.Tensor
_increment_version = torch.autograd.graph.increment_version  # NOTE [ Op semantics ] 11

# Kinds of a tensor-carrying argument or return.
ONE, LIST, OTHER = 0, 1, 2


@dataclass(frozen=True)
class Semantics:
    """The part of an op's semantics that its schema does not show (one table entry).

    Attributes:
        hidden_mutation: argument positions the op writes although the schema does not say so.
        never_evict: outputs are pinned (never evicted).
        unsupported: a reason; the op raises :class:`UnsupportedOpError` on tracked tensors.
        unsupported_grad: a reason; the op raises :class:`UnsupportedOpError` when grad mode
            is on and an argument at a position of ``grad_args`` requires grad
            (NOTE [ Op semantics ] rule 7).
        grad_args: see ``unsupported_grad``.
        hidden_alias: position of the argument the op's single return (a tensor, or a list
            of tensors) is a view of although the schema does not say so (NOTE [ Op
            semantics ] rule 8), else None.
        overwrites: the op writes every element of its written argument and reads none of
            its old values (NOTE [ Op semantics ] rule 9).
    """

    hidden_mutation: tuple[int, ...] = ()
    never_evict: bool = False
    unsupported: str | None = None
    unsupported_grad: str | None = None
    grad_args: tuple[int, ...] = (0,)
    hidden_alias: int | None = None
    overwrites: bool = False


_TABLE: dict[str, Semantics] = {}


def register(*ops, **semantics) -> Callable:
    """Record :class:`Semantics` for ``ops`` (OpOverloads or ``"aten::name.overload"``).

    Used as a decorator on a function whose docstring says why (the function itself is not
    called); refuses an op that already has an entry.
    """
    entry = Semantics(**semantics)

    def deco(fn: Callable) -> Callable:
        for op in ops:
            key = op if isinstance(op, str) else op.name()
            if key in _TABLE:
                raise ValueError(
                    f"op semantics for {key} are already registered; "
                    "edit the existing entry instead of adding a second one"
                )
            _TABLE[key] = entry
        return fn

    return deco


def registered() -> dict[str, Semantics]:
    """A copy of the table (op name -> :class:`Semantics`), for docs and tests."""
    return dict(_TABLE)


@register(
    aten.native_batch_norm.default,
    aten.cudnn_batch_norm.default,
    aten.miopen_batch_norm.default,
    hidden_mutation=(3, 4),
)
def _batch_norm_running_stats():
    """Batch norm updates running_mean / running_var (arguments 3 and 4) in training mode
    although the schema does not mark them as written; a replay must not update them twice."""


@register(aten._cudnn_rnn.default, hidden_mutation=(15,))
@register(aten.miopen_rnn.default, hidden_mutation=(13,))
def _rnn_dropout_state():
    """With dropout in training, cuDNN's RNN draws its masks from ``dropout_state`` and
    advances that buffer in place (6.5 MB for a 2-layer LSTM on an H100, torch 2.11), not
    from a generator: NOTE [ RNG replay ] rule 5. Declared written (NOTE [ Op semantics ]
    rule 2), a plain buffer is snapshotted before the op (6.5 MB of device memory the budget
    does not count, per call) and each replay draws from a copy of the snapshot; a tracked
    one (made inside the session) gets a new version. (MIOpen's is assumed to work the same
    way.)"""


@register(
    aten.set_.default,
    aten.set_.source_Storage,
    aten.set_.source_Storage_storage_offset,
    aten.set_.source_Tensor,
    aten.set_.source_Tensor_storage_offset,
    aten.resize_.default,
    aten.resize_as_.default,
    unsupported="it replaces or resizes the tensor's storage, which the runtime owns",
)
def _storage_changing_views():
    """NOTE [ Op semantics ] rule 6: a wrapper's buffer cannot be swapped or grown from
    below autograd."""


_SUBCLASS_FORMULA = (
    "its backward formula takes another path for tensor subclasses "
    "(isTensorSubclassLike), so its gradient would differ from eager in the "
    "last bits"
)


@register(
    aten.prod.default,
    aten.prod.dim_int,
    aten.linalg_eig.default,
    unsupported_grad=_SUBCLASS_FORMULA,
)
def _prod_eig_subclass_formula():
    """prod_backward and linalg_eig_backward (PyTorch's FunctionsManual.cpp) check
    isTensorSubclassLike on the input (NOTE [ Op semantics ] rule 7)."""


# Ops whose formula branches only on older torch (NOTE [ Op semantics ] rule 7).
if torch.__version__ < (2, 13):

    @register(
        aten.cumprod.default,
        aten.cumprod_.default,
        unsupported_grad=_SUBCLASS_FORMULA + " on torch < 2.13",
    )
    def _cumprod_subclass_formula():
        """cumprod_backward checks isTensorSubclassLike before torch 2.13 (gradients of a
        wrapper differ from eager in the last bits on torch 2.11; equal on 2.13)."""


@register(
    aten.masked_fill.Tensor,
    aten.masked_fill_.Tensor,
    grad_args=(2,),
    unsupported_grad=_SUBCLASS_FORMULA + " for the fill value",
)
def _masked_fill_subclass_formula():
    """masked_fill_backward (the gradient of the fill value) sums with ``where`` for
    subclasses and with ``masked_select`` otherwise (NOTE [ Op semantics ] rule 7)."""


@register(aten._unsafe_view.default, hidden_alias=0)
def _unsafe_view_alias():
    """``_unsafe_view`` is ``view`` without autograd's view tracking: its result shares the
    argument's storage (NOTE [ Op semantics ] rule 8)."""


@register(aten.unsafe_split.Tensor, aten.unsafe_split_with_sizes.default, hidden_alias=0)
def _unsafe_split_alias():
    """``unsafe_split`` is ``split`` without autograd's view tracking: every tensor of its
    result shares the argument's storage (NOTE [ Op semantics ] rule 8). ``unsafe_chunk``
    decomposes into it; CPU ``lstm_cell`` chunks its gates so and writes them in place."""


@register(
    aten.copy_.default,
    aten.copy_.Tensor,
    aten.fill_.Scalar,
    aten.fill_.Tensor,
    aten.zero_.default,
    aten.bernoulli_.float,
    aten.bernoulli_.Tensor,
    aten.uniform_.default,
    aten.normal_.default,
    aten.random_.default,
    "aten::random_.from",
    aten.random_.to,
    aten.exponential_.default,
    aten.geometric_.default,
    aten.cauchy_.default,
    aten.log_normal_.default,
    overwrites=True,
)
def _overwriting_ops():
    """Every element of ``self`` is written from the other arguments (and the generator)
    alone (NOTE [ Op semantics ] rule 9)."""


@register(aten.linalg_lstsq.default, never_evict=True)
def _lstsq_alignment():
    """LAPACK's gelsy (the CPU default driver) gives other last bits depending on the
    alignment of its buffers (89 of 200 eager runs on the same inputs differed on a 2-core
    Xeon, torch 2.13): a replay must not replace the first result."""


@dataclass(frozen=True, eq=False)
class OpInfo:
    """Everything the dispatch path needs about one op overload, computed once.

    ``args``: (position, kind, kwarg name or None) of every tensor-carrying argument.
    ``written``: positions (or names) of arguments the op writes, schema or hidden.
    ``rets``: per return, (kind, view_of, written_arg) where view_of / written_arg is the
    argument position (or name) it aliases, else None.
    ``flat``: the positions of the tensor arguments when every one is a single positional
    tensor (the common case the dispatch path walks directly), else None. ``fresh1``: the op
    returns exactly one fresh tensor and writes nothing. ``view1``: the op returns exactly
    one tensor, a view of the positional argument ``view1`` (else None). ``inplace1``: the
    op writes its first argument only and returns it (``add_``, ``relu_``). ``special``: one
    of the rare cases (in-place view, a written argument, refused, uninitialized memory,
    inert) applies: checked before tracking. ``inert``: the op takes no tensor and returns
    none (the profiler's ``record_function`` markers; NOTE [ What is tracked ] rule 6).
    ``run``: ``func`` called without ``OpOverload.__call__``'s Python frame (its whole body
    is ``self._op(*args, **kwargs)``; 0.35 us less per call on the 2-core AMD EPYC guest).
    ``random``: its generator states are captured and replayed (NOTE [ Op semantics ] rule
    4); ``generators`` and ``rng_defaults`` say which (NOTE [ RNG replay ] rule 3).
    """

    func: torch._ops.OpOverload
    run: Callable  # ``func``'s C entry: what ``func(...)`` calls, without its Python frame
    name: str
    args: tuple[tuple[int, int, str | None], ...]
    written: tuple[int | str, ...]
    rets: tuple[tuple[int, int | str | None, int | str | None], ...]
    random: bool
    nondet: bool  # NOTE [ Op semantics ] rule 5
    fresh: bool  # some tensor return is neither a view nor a written argument
    inplace_view: bool  # NOTE [ Op semantics ] rule 6: changes the tensor's own geometry
    flat: tuple[int, ...] | None
    fresh1: bool
    view1: int | None
    inplace1: bool
    special: bool
    never_evict: bool
    unsupported: str | None
    unsupported_grad: str | None
    uninit: bool  # returns uninitialized memory (NOTE [ What is tracked ] rule 5)
    overwrites: bool  # NOTE [ Op semantics ] rule 9
    inert: bool = False  # no tensor in, no tensor out (NOTE [ What is tracked ] rule 6)
    may_copy: bool = False  # a view return that may be a copy (NOTE [ Op semantics ] rule 10)
    bump: tuple[int | str, ...] = ()  # written args whose version the session bumps (rule 11)
    alias: bool = False  # returns its argument, same geometry, reads nothing (rule 12)
    generators: tuple[int | str, ...] = ()  # positions (or names) of Generator arguments
    rng_defaults: bool = False  # outside ATen: every default generator is captured (rule 4c)
    semantics: Semantics = field(default_factory=Semantics)


_CACHE: dict[object, OpInfo] = {}

# Ops that return their argument as it is (NOTE [ Op semantics ] rule 12).
_ALIASES = frozenset({"aten::detach", "aten::alias"})

# Namespaces whose ops are known: random only as rule 4a/4b say (NOTE [ Op semantics ] 4c).
_ATEN_NAMESPACES = frozenset({"aten", "prims"})

# Ops whose result is uninitialized memory (NOTE [ What is tracked ] rule 5 in session.py).
_UNINIT = frozenset(
    {
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_permuted",
        "aten::empty_like",
        "aten::new_empty",
        "aten::new_empty_strided",
    }
)


def op_info(func) -> OpInfo:
    """The :class:`OpInfo` of ``func`` (cached per overload)."""
    info = _CACHE.get(func)
    if info is None:
        info = _CACHE[func] = _analyze(func)
    return info


def _kind(t) -> int:
    if isinstance(t, torch._C.OptionalType):
        t = t.getElementType()
    if isinstance(t, torch._C.TensorType):
        return ONE
    if isinstance(t, torch._C.ListType):
        e = t.getElementType()
        if isinstance(e, torch._C.OptionalType):
            e = e.getElementType()
        if isinstance(e, torch._C.TensorType):
            return LIST
    return OTHER


def _is_generator(t) -> bool:
    """Whether an argument of schema type ``t`` is a ``Generator`` (or ``Generator?``)."""
    if isinstance(t, torch._C.OptionalType):
        t = t.getElementType()
    return str(t) == "Generator"


def _composite(func) -> bool:
    """Whether ``func`` has a ``CompositeImplicitAutograd`` kernel (NOTE [ Op semantics ] 10)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


def _analyze(func) -> OpInfo:
    schema = func._schema
    sem = _TABLE.get(func.name()) or _TABLE.get(schema.name) or Semantics()
    args, written, alias_of, first_alias, generators = [], [], {}, None, []
    for i, a in enumerate(schema.arguments):
        key = a.name if a.kwarg_only else i
        kind = _kind(a.type)
        if _is_generator(a.type):
            generators.append(key)
        if kind != OTHER:
            args.append((i, kind, a.name if a.kwarg_only else None))
        ai = a.alias_info
        if ai is not None:
            if ai.is_write:
                written.append(key)
            elif first_alias is None:
                first_alias = key
            for s in ai.before_set:
                alias_of[s] = key
    for i in sem.hidden_mutation:
        if i not in written:
            written.append(i)
    rets = []
    for r in schema.returns:
        kind, view, wrote = _kind(r.type), None, None
        ai = r.alias_info
        if ai is not None and kind != OTHER:
            target = next((alias_of[s] for s in ai.before_set if s in alias_of), None)
            if ai.is_write:
                wrote = target
            else:
                view = target if target is not None else first_alias
        rets.append((kind, view, wrote))
    if sem.hidden_alias is not None:  # NOTE [ Op semantics ] rule 8: a view (or list of them)
        rets = [(rets[0][0], sem.hidden_alias, None)]
    tags = func.tags
    inplace_view = torch.Tag.inplace_view in tags and sem.unsupported is None
    inert = not args and all(kind == OTHER for kind, _, _ in rets)
    alias = schema.name in _ALIASES and schema.overload_name == ""  # rule 12
    flat = tuple(i for i, _, _ in args) if all(k == ONE and n is None for _, k, n in args) else None
    outside = schema.name.split("::", 1)[0] not in _ATEN_NAMESPACES  # rule 4c
    return OpInfo(
        func=func,
        run=getattr(func, "_op", func),
        name=str(func),
        args=tuple(args),
        written=tuple(written),
        rets=tuple(rets),
        random=torch.Tag.nondeterministic_seeded in tags or bool(generators) or outside,
        fresh=any(k != OTHER and v is None and w is None for k, v, w in rets),
        nondet=_nondeterministic(func),
        inplace_view=inplace_view,
        flat=flat,
        fresh1=not written and tuple(rets) == ((ONE, None, None),),
        view1=rets[0][1]
        if (not written and len(rets) == 1 and rets[0][0] == ONE and type(rets[0][1]) is int)
        else None,
        inplace1=tuple(written) == (0,) and tuple(rets) == ((ONE, None, 0),),
        special=bool(
            inplace_view
            or written
            or sem.unsupported
            or sem.unsupported_grad
            or schema.name in _UNINIT
            or inert
            or alias
        ),
        never_evict=sem.never_evict,
        unsupported=sem.unsupported,
        unsupported_grad=sem.unsupported_grad,
        uninit=schema.name in _UNINIT,
        overwrites=sem.overwrites,
        inert=inert,
        may_copy=any(v is not None for _, v, _ in rets) and _composite(func),
        bump=tuple(written) if written and schema.name.startswith("aten::_foreach_") else (),
        alias=alias,
        generators=tuple(generators),
        rng_defaults=outside,
        semantics=sem,
    )


def bump_versions(info: OpInfo, args, kwargs) -> None:
    """Bump the version of every tensor in the arguments ``info.bump`` names, as eager's
    per-tensor calls would (NOTE [ Op semantics ] rule 11)."""
    for key in info.bump:
        v = (args[key] if key < len(args) else None) if type(key) is int else kwargs.get(key)
        for t in v if isinstance(v, (list, tuple)) else (v,):
            if isinstance(t, Tensor):
                _increment_version(t)

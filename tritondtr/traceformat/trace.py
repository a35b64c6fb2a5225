"""The trace: one training iteration as columnar arrays, the simulator's input.

A trace is a sequence of *events* over *ops* and *tensors*. Tensors are numbered densely in
creation order: the outputs of op ``o`` are the tensors ``out_ptr[o] .. out_ptr[o+1]-1``, so an
op's outputs need no id column. The on-disk forms (docs/trace-format.md) store these arrays
as they are; :mod:`tritondtr.traceformat.trace_io` reads and writes them.

# NOTE [ Trace semantics ]
# 1. Every tensor is born with one reference. ``retain`` adds one, ``release`` drops one; a
#    storage whose tensors hold no reference any more is dead (freed in the baseline, evicted
#    at once in budgeted runs, NOTE [ Replay semantics ]).
# 2. An output with ``alias >= 0`` is a view of input ``alias`` of its op: it shares that
#    input's storage and adds no memory (its ``size`` is ignored and stored as 0).
# 3. A constant is an op with no inputs and one fresh output (a weight, an input batch): it
#    exists before the iteration, costs nothing and is never recomputed or evicted.
# 4. ``output`` events name, in order, the tensors that must be resident at the end (the
#    loss, gradients, updated state); each is made resident once and then pinned.
# 5. Ops appear in the event stream in id order, each exactly once, and only use tensors
#    created by earlier ops; every tensor event names a tensor that already exists.

# NOTE [ Runtime annotations ]
# A trace recorded by ``tritondtr.trace`` also says what the runtime's DTR core saw, so that a
# replay in the runtime's semantics (``semantics="runtime"``, NOTE [ The twin ] in
# sim/twin.py) makes exactly the runtime's decisions. The paper's semantics ignores all of it.
# 1. ``flags`` per tensor (:class:`TensorFlag`): ``PINNED``, never evicted (never_evict);
#    ``BACKWARD``, created during a backward pass; ``UNTRACKED``, a placeholder output of an
#    op whose results the runtime did not track (NOTE [ Recording a trace ] rule 5);
#    ``UNTRACKED | FAILED``, the placeholder of an op that raised ``BudgetError`` before it
#    ran (its inputs were made resident and room was made, then it gave up; the program
#    caught the error and went on).
# 2. ``writes`` per tensor: -1, or the input position whose storage this output is the new
#    in-place version of; the runtime drops the old version just before it tracks the new.
# 3. ``in_flags`` per op input (:class:`InputFlag`): ``BLANK``, the op overwrote that input
#    entirely, so the new version does not depend on it (NOTE [ Overwriting ops ]).
# 4. Events: ``forget`` (the runtime forgot the storage of that tensor: nothing refers to it
#    any more), ``materialize`` (the program asked for that tensor's value outside an op),
#    ``freeze`` (NOTE [ Parameter writes ]), ``evict_all`` (the program called
#    ``session.evict_all()``). A ``release`` of a tensor's last reference is the moment the
#    runtime freed its buffer.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field

import numpy as np

__all__ = ["EventKind", "InputFlag", "TensorFlag", "Trace", "TraceError"]

FORMAT_NAME = "tritondtr-trace"
FORMAT_VERSION = (
    3  # 2: NOTE [ Runtime annotations ]; 3: evict_all, FAILED; older files read as before
)


class TraceError(ValueError):
    """A malformed trace: the message says where (line or event) and what was wrong."""


class EventKind(enum.IntEnum):
    """The ``kind`` column of the event stream; ``arg`` holds the id it refers to."""

    CALL = 0  # arg: op id
    CONSTANT = 1  # arg: op id (no inputs, one fresh output)
    RETAIN = 2  # arg: tensor id (one more reference, e.g. the DTR log's COPY)
    RELEASE = 3  # arg: tensor id (one reference fewer)
    OUTPUT = 4  # arg: tensor id (make resident and pin, NOTE [ Trace semantics ] 4)
    ANNOTATE = 5  # arg: index into ``annotations`` (e.g. "BACKWARD"; informational)
    FORGET = 6  # arg: tensor id (NOTE [ Runtime annotations ] 4)
    MATERIALIZE = 7  # arg: tensor id
    FREEZE = 8  # arg: 0
    EVICT_ALL = 9  # arg: 0 (NOTE [ Runtime annotations ] 4)


class TensorFlag(enum.IntFlag):
    """Bits of the ``flags`` column (NOTE [ Runtime annotations ] 1)."""

    PINNED = 1
    BACKWARD = 2
    UNTRACKED = 4
    FAILED = 8


class InputFlag(enum.IntFlag):
    """Bits of the ``in_flags`` column (NOTE [ Runtime annotations ] 3)."""

    BLANK = 1


_OP_KINDS = (EventKind.CALL, EventKind.CONSTANT)
_TENSOR_KINDS = (
    EventKind.RETAIN,
    EventKind.RELEASE,
    EventKind.OUTPUT,
    EventKind.FORGET,
    EventKind.MATERIALIZE,
)


@dataclass(eq=False)
class Trace:
    """One iteration as columnar arrays (E events, O ops, T tensors, I op inputs).

    ==============  ==========  =======================================================
    array           shape/dtype meaning
    ==============  ==========  =======================================================
    kind            [E] int8    an :class:`EventKind`
    arg             [E] int64   op id, tensor id or annotation index (by ``kind``)
    op_cost         [O] float64 compute cost of the op, in ns (any consistent unit)
    op_name         [O] int32   index into ``names``
    in_ptr          [O+1] int64 inputs of op o are ``inputs[in_ptr[o]:in_ptr[o+1]]``
    inputs          [I] int64   tensor ids (a tensor may appear twice)
    out_ptr         [O+1] int64 outputs of op o are tensors ``out_ptr[o]..out_ptr[o+1]-1``
    size            [T] int64   bytes of the fresh storage an output allocates (0 for views)
    alias           [T] int32   -1, or the input position of op o whose storage it views
    flags           [T] int8    :class:`TensorFlag` bits (NOTE [ Runtime annotations ])
    writes          [T] int32   -1, or the input position this output is a new version of
    in_flags        [I] int8    :class:`InputFlag` bits per op input
    ==============  ==========  =======================================================

    ``names`` are op names (``aten::mm``, ``constant``), ``annotations`` the texts of
    ANNOTATE events, ``meta`` free-form JSON-able provenance (source file, model, units).
    See NOTE [ Trace semantics ]; :meth:`validate` checks rules 2, 3 and 5.
    """

    kind: np.ndarray
    arg: np.ndarray
    op_cost: np.ndarray
    op_name: np.ndarray
    in_ptr: np.ndarray
    inputs: np.ndarray
    out_ptr: np.ndarray
    size: np.ndarray
    alias: np.ndarray
    names: list[str] = field(default_factory=list)
    annotations: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    flags: np.ndarray | None = None  # None: all 0
    writes: np.ndarray | None = None  # None: all -1
    in_flags: np.ndarray | None = None  # None: all 0

    def __post_init__(self) -> None:
        self.kind = np.ascontiguousarray(self.kind, dtype=np.int8)
        self.arg = np.ascontiguousarray(self.arg, dtype=np.int64)
        self.op_cost = np.ascontiguousarray(self.op_cost, dtype=np.float64)
        self.op_name = np.ascontiguousarray(self.op_name, dtype=np.int32)
        self.in_ptr = np.ascontiguousarray(self.in_ptr, dtype=np.int64)
        self.inputs = np.ascontiguousarray(self.inputs, dtype=np.int64)
        self.out_ptr = np.ascontiguousarray(self.out_ptr, dtype=np.int64)
        self.size = np.ascontiguousarray(self.size, dtype=np.int64)
        self.alias = np.ascontiguousarray(self.alias, dtype=np.int32)
        n_t, n_in = self.size.shape[0], self.inputs.shape[0]
        self.flags = _column(self.flags, n_t, np.int8, 0)
        self.writes = _column(self.writes, n_t, np.int32, -1)
        self.in_flags = _column(self.in_flags, n_in, np.int8, 0)
        self.names = list(self.names)
        self.annotations = list(self.annotations)

    # ------------------------------------------------------------------ shape
    @property
    def num_events(self) -> int:
        return int(self.kind.shape[0])

    @property
    def num_ops(self) -> int:
        return int(self.op_cost.shape[0])

    @property
    def num_tensors(self) -> int:
        return int(self.size.shape[0])

    def op_of_tensor(self) -> np.ndarray:
        """[T] int64: the op that created each tensor."""
        counts = np.diff(self.out_ptr)
        return np.repeat(np.arange(self.num_ops, dtype=np.int64), counts)

    def is_constant_op(self) -> np.ndarray:
        """[O] bool: ops issued by CONSTANT events."""
        out = np.zeros(self.num_ops, dtype=bool)
        out[self.arg[self.kind == EventKind.CONSTANT]] = True
        return out

    def total_cost(self) -> float:
        """Sum of all op costs: the compute of one run with no rematerialization."""
        return float(self.op_cost.sum())

    def summary(self) -> dict:
        """Counts for printing: events, ops, tensors, constants, total cost."""
        return {
            "events": self.num_events,
            "ops": self.num_ops,
            "tensors": self.num_tensors,
            "constants": int((self.kind == EventKind.CONSTANT).sum()),
            "releases": int((self.kind == EventKind.RELEASE).sum()),
            "outputs": int((self.kind == EventKind.OUTPUT).sum()),
            "total_cost": self.total_cost(),
        }

    def __repr__(self) -> str:
        s = self.summary()
        return (
            f"Trace(events={s['events']}, ops={s['ops']}, tensors={s['tensors']}, "
            f"constants={s['constants']}, meta={json.dumps(self.meta)[:80]})"
        )

    # ------------------------------------------------------------- validation
    def validate(self) -> Trace:
        """Check the structural rules (NOTE [ Trace semantics ] 2, 3, 5) with array operations.

        Raises :class:`TraceError` naming the first offending event, op or tensor. Returns
        ``self`` so that loaders can write ``return Trace(...).validate()``.
        """
        n_ev, n_ops, n_t = self.num_events, self.num_ops, self.num_tensors
        _check(self.arg.shape == (n_ev,), f"kind has {n_ev} entries, arg {self.arg.shape[0]}")
        _check(
            self.op_name.shape == (n_ops,),
            f"op_cost has {n_ops} entries, op_name {len(self.op_name)}",
        )
        _check(
            self.in_ptr.shape == (n_ops + 1,) and self.out_ptr.shape == (n_ops + 1,),
            f"in_ptr and out_ptr must have {n_ops + 1} entries (ops + 1)",
        )
        _check(self.alias.shape == (n_t,), f"size has {n_t} entries, alias {len(self.alias)}")
        for name, ptr, n in (
            ("in_ptr", self.in_ptr, self.inputs.shape[0]),
            ("out_ptr", self.out_ptr, n_t),
        ):
            _check(
                ptr[0] == 0 and ptr[-1] == n and (np.diff(ptr) >= 0).all(),
                f"{name} must rise from 0 to {n}",
            )
        bad = np.flatnonzero((self.kind < 0) | (self.kind > max(EventKind)))
        _check(bad.size == 0, lambda: f"event {bad[0]}: unknown kind {self.kind[bad[0]]}")
        bad = np.flatnonzero(~np.isfinite(self.op_cost) | (self.op_cost < 0))
        _check(
            bad.size == 0,
            lambda: f"op {bad[0]}: cost {self.op_cost[bad[0]]} is not a finite number >= 0",
        )
        _check(
            not self.names
            or (
                self.op_name.size == 0
                or (self.op_name.min() >= 0 and self.op_name.max() < len(self.names))
            ),
            f"op_name must index names (0..{len(self.names) - 1})",
        )
        bad = np.flatnonzero(self.size < 0)
        _check(bad.size == 0, lambda: f"tensor {bad[0]}: negative size {self.size[bad[0]]}")
        # Rule 5: ops in id order, each once.
        is_op = np.isin(self.kind, _OP_KINDS)
        op_args = self.arg[is_op]
        if op_args.size != n_ops:
            raise TraceError(
                f"the trace has {n_ops} ops but {op_args.size} CALL/CONSTANT events; "
                "each op must be issued exactly once"
            )
        bad = np.flatnonzero(op_args != np.arange(n_ops))
        _check(
            bad.size == 0,
            lambda: (
                f"ops must be issued in id order: op event {bad[0]} "
                f"issues op {op_args[bad[0]]}, expected op {bad[0]}"
            ),
        )
        n_in = np.diff(self.in_ptr)
        n_out = np.diff(self.out_ptr)
        op_of_tensor = self.op_of_tensor()
        if self.inputs.size:
            owner = np.repeat(np.arange(n_ops, dtype=np.int64), n_in)
            ok = (self.inputs >= 0) & (self.inputs < n_t)
            ok[ok] = op_of_tensor[self.inputs[ok]] < owner[ok]
            bad = np.flatnonzero(~ok)
            _check(
                bad.size == 0,
                lambda: (
                    f"op {owner[bad[0]]}: input tensor "
                    f"{self.inputs[bad[0]]} is not an output of an earlier op"
                ),
            )
        # Rule 2: aliases point at an input; views allocate nothing.
        bad = np.flatnonzero((self.alias < -1) | (self.alias >= n_in[op_of_tensor]))
        _check(
            bad.size == 0,
            lambda: (
                f"tensor {bad[0]} (op {op_of_tensor[bad[0]]}): alias "
                f"{self.alias[bad[0]]} is not -1 or an input position of its op"
            ),
        )
        bad = np.flatnonzero((self.alias >= 0) & (self.size != 0))
        _check(
            bad.size == 0,
            lambda: (
                f"tensor {bad[0]}: a view (alias "
                f"{self.alias[bad[0]]}) must have size 0, got {self.size[bad[0]]}"
            ),
        )
        # Rule 3: constants.
        const = self.arg[self.kind == EventKind.CONSTANT]
        bad = const[(n_in[const] != 0) | (n_out[const] != 1)]
        _check(
            bad.size == 0,
            lambda: f"op {bad[0]}: a constant must have no inputs and exactly one output",
        )
        if const.size:
            bad = const[self.alias[self.out_ptr[const]] != -1]
            _check(bad.size == 0, lambda: f"op {bad[0]}: a constant cannot be a view")
        # Rule 5: tensor events name existing tensors.
        is_t = np.isin(self.kind, _TENSOR_KINDS)
        ops_before = np.cumsum(is_op) - is_op  # ops issued strictly before each event
        targ = self.arg[is_t]
        ok = (targ >= 0) & (targ < n_t)
        ok[ok] = op_of_tensor[targ[ok]] < ops_before[is_t][ok]
        bad = np.flatnonzero(is_t)[~ok]
        _check(
            bad.size == 0,
            lambda: (
                f"event {bad[0]} ({EventKind(self.kind[bad[0]]).name}): "
                f"tensor {self.arg[bad[0]]} does not exist yet"
            ),
        )
        # NOTE [ Runtime annotations ].
        _check(
            self.flags.shape == (n_t,) and self.writes.shape == (n_t,),
            f"flags and writes must have {n_t} entries (one per tensor)",
        )
        _check(
            self.in_flags.shape == self.inputs.shape,
            f"in_flags must have {self.inputs.shape[0]} entries (one per op input)",
        )
        bad = np.flatnonzero((self.flags < 0) | (self.flags > sum(TensorFlag)))
        _check(bad.size == 0, lambda: f"tensor {bad[0]}: unknown flags {self.flags[bad[0]]}")
        bad = np.flatnonzero((self.in_flags < 0) | (self.in_flags > sum(InputFlag)))
        _check(bad.size == 0, lambda: f"input {bad[0]}: unknown in_flags {self.in_flags[bad[0]]}")
        bad = np.flatnonzero(
            (self.writes < -1)
            | (self.writes >= n_in[op_of_tensor])
            | ((self.writes >= 0) & (self.alias >= 0))
        )
        _check(
            bad.size == 0,
            lambda: (
                f"tensor {bad[0]} (op {op_of_tensor[bad[0]]}): writes {self.writes[bad[0]]} "
                "is not -1 or an input position of its op (and a view writes nothing)"
            ),
        )
        ann = self.arg[self.kind == EventKind.ANNOTATE]
        _check(
            ann.size == 0 or (ann.min() >= 0 and ann.max() < len(self.annotations)),
            "an ANNOTATE event indexes past the annotations list",
        )
        return self


def _column(a, n: int, dtype, fill) -> np.ndarray:
    if a is None:
        return np.full(n, fill, dtype=dtype)
    return np.ascontiguousarray(a, dtype=dtype)


def _check(ok, message) -> None:
    if not ok:
        raise TraceError(message() if callable(message) else message)

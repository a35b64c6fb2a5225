"""The recorder behind ``tritondtr.trace``: the session's observer, told of each executed op and
of each event the session gives its DTR core from outside an op, that writes the program into
a :class:`~tritondtr.traceformat.builder.TraceBuilder`.

# NOTE [ Recording a trace ]
# 1. The trace is the program, not the schedule: one CALL per op the session tracked (after its
#    first execution); evictions and rematerializations are not events, the core's own
#    decisions. The runtime's counters go into ``trace.meta["runtime"]`` for comparison.
# 2. One trace tensor per wrapper an op returns. A fresh output's size is the bytes of its
#    untyped storage, as the core counts it (NOTE [ Budget accounting ]); a view (a return
#    aliasing an argument, ``detach`` included) is an output with ``alias`` = that argument's
#    input position and 0 bytes.
# 3. An input wrapper maps to the trace tensor of its storage version with the same view
#    geometry, else to that version's base tensor. Plain tensors an op reads (parameters,
#    the batch, buffers handed out earlier) are constants, one per untyped storage, hoisted to
#    the start of the trace (they exist before the iteration, NOTE [ Trace semantics ] 3).
#    The recorder keeps those storages alive until it closes, so addresses stay unique.
# 4. Every event the core is given between ops is recorded where it happens, in order: the
#    last wrapper of a buffer died or its buffer was handed out (a ``release`` of every trace
#    tensor of that version), the core forgot a storage (``forget``), the program asked for a
#    value outside an op (``materialize``, only when it was evicted), a write to a parameter
#    froze the held storages (``freeze``). An in-place write is copy-on-write
#    (docs/trace-format.md): the CALL outputs the new version with ``writes`` naming the
#    input it replaces, then the old version's tensors are released.
# 5. An op that returns no tracked tensor (``.item()``, adding a gradient into a plain
#    ``.grad``, an op on plain tensors only) gets one 0-byte output flagged ``UNTRACKED``,
#    released at once: the core still advanced its clock and made room for it.
# 6. Costs are the numbers the core scored with, from the session's cost model (NOTE [ Cost
#    models ] in cost.py): by default the op's first execution's host wall time in ns (on
#    CUDA, launch time); under ``analytic`` or a callable, that model's cost, so the replay
#    scores exactly as the run did. ``meta["cost_model"]`` names the model. Under ``events``
#    the trace holds each op's device time instead, read from its events when the trace is
#    built (the session's exit has waited for them): the costs a GPU step really has, for
#    the policy's questions offline, but not the estimates the run scored with before the
#    times arrived, so rule 9 does not hold for it.
# 7. ``BACKWARD`` is annotated at the first op of each backward pass; each tensor created in
#    one carries the ``BACKWARD`` flag, never-evicted ones ``PINNED``, overwritten inputs
#    ``BLANK`` (NOTE [ Runtime annotations ]).
# 8. An op that raised ``BudgetError`` before it ran (the program caught it and went on: its
#    inputs were made resident and room was made, recomputing and evicting) is recorded as a
#    CALL of its tracked inputs with one 0-byte placeholder flagged ``UNTRACKED | FAILED``,
#    cost 0, released at once; ``session.evict_all()`` as an ``evict_all`` event.
# 9. So a replay of the trace in the runtime's semantics at the recorded budget and heuristic
#    makes exactly the recorded run's decisions (NOTE [ The twin ] in sim/twin.py), unless the
#    run hit an out-of-memory retry or an op raised another error after its inputs were
#    made resident (a cost callable's ``CostError``), neither of which is recorded, or the
#    program caught a BudgetError raised outside an op (a value asked for, ``.item()``, whose
#    recomputation did not fit): the replay then stops there as ``oom``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..traceformat.builder import TraceBuilder
from ..traceformat.trace import InputFlag, TensorFlag, Trace
from .recipe import PLAIN, WRITE
from .semantics import ONE, OTHER
from .tensor import WRAPPER_TYPES

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Recorder"]

_in_backward = torch._C._current_graph_task_id
_CALL, _RELEASE, _ANNOTATE, _FORGET, _MATERIALIZE, _FREEZE, _EVICT_ALL = range(7)
_PINNED, _BACKWARD, _UNTRACKED, _FAILED = (int(f) for f in TensorFlag)
_BLANK = int(InputFlag.BLANK)


class _Version:
    """The trace tensors of one storage version: ``views`` maps a view geometry (None for
    the whole buffer) to the tensor last made with it; ``tids`` are the unreleased ones."""

    __slots__ = ("base", "tids", "views")

    def __init__(self, tid: int) -> None:
        self.base = tid
        self.tids = [tid]
        self.views: dict = {None: tid}


class Recorder:
    """The session observer: collects events with its own tensor ids (constants apart, so
    that :meth:`build` can issue them first)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.core = session.core
        self.events: list[tuple] = []
        self.constants: list[tuple[int, int]] = []  # (tensor id, bytes)
        self.next_id = 0
        self.versions: dict[int, _Version] = {}  # core sid -> its trace tensors
        self.const_of: dict[tuple, int] = {}  # (device, data_ptr) -> constant tensor id
        self.keep: list = []  # untyped storages of the constants (NOTE rule 3)
        self.backward = False
        self.closed = False
        self.ops = self.untracked = self.inplace_bytes_max = 0
        self.timed: list[tuple] = []  # (index of a CALL in events, its op's events): rule 6

    # ------------------------------------------------------------ observer hooks
    def op(self, call, out) -> None:
        """Called by the session after each executed op (``call``, an ``OpCall``, with its
        wrapped result ``out``: NOTE [ One op's path ] in session.py)."""
        info, args, kwargs, inputs = call.info, call.args, call.kwargs, call.inputs
        wrote, cost, blanks = call.wrote, call.cost, call.blanks
        ins = []
        in_flags = [0] * len(inputs)
        for key, j, src, view, _, mode in inputs:
            if mode <= WRITE:
                ins.append(self._input(src, view))
            else:  # a snapshot entry holds a copy: the constant is the caller's tensor
                ins.append(self._constant(src if mode == PLAIN else _arg(args, kwargs, key, j)))
        for k, _ in blanks or ():
            in_flags[k] = _BLANK
        backward = _in_backward() >= 0
        bw = _BACKWARD if backward else 0
        pinned = self.core.pinned
        # (bytes, alias, flags, writes, sid of a new storage or None, wrapper of a view)
        outs: list[tuple] = []
        rets = info.rets
        res = [out] if len(rets) == 1 else list(out) if rets else []
        for r, (kind, view, wrote_arg) in enumerate(rets):
            if kind == OTHER or wrote_arg is not None:
                continue
            for w in [res[r]] if kind == ONE else list(res[r] or ()):
                if type(w) not in WRAPPER_TYPES or w._cell.session is not self.session:
                    continue
                s = w._cell.storage
                if view is None:
                    flags = bw | (_PINNED if pinned[s.sid] else 0)
                    outs.append((s.nbytes, -1, flags, -1, s.sid, None))
                    continue
                k = _position(inputs, view, s)
                if k >= 0:  # a view of a tracked input
                    outs.append((0, k, 0, -1, None, w))
        olds, seen = [], set()
        for e, cell in zip((e for e in inputs if e.mode == WRITE), wrote):
            old = e.source
            if id(old) not in seen:
                seen.add(id(old))
                olds.append(old.sid)
                k = next(n for n, x in enumerate(inputs) if x.source is old)
                s = cell.storage
                flags = bw | (_PINNED if pinned[s.sid] else 0)
                outs.append((s.nbytes, -1, flags, k, s.sid, None))
        if not outs:  # NOTE [ Recording a trace ] rule 5
            outs.append((0, -1, _UNTRACKED, -1, None, None))
            self.untracked += 1
        if backward:
            if not self.backward:
                self.events.append((_ANNOTATE, "BACKWARD"))
                self.backward = True
        else:
            self.backward = False
        tids = list(range(self.next_id, self.next_id + len(outs)))
        self.next_id += len(outs)
        self.events.append(
            (
                _CALL,
                info.name,
                ins,
                [o[0] for o in outs],
                [o[1] for o in outs],
                cost,
                tids,
                [o[2] for o in outs],
                [o[3] for o in outs],
                in_flags,
            )
        )
        self.ops += 1
        timer = self.session.timer
        if timer is not None and timer.op is not None:  # ``events``: rule 6
            self.timed.append((len(self.events) - 1, timer.op))
        written = 0
        for tid, (nbytes, alias, _, writes, sid, w) in zip(tids, outs):
            if sid is not None:  # a fresh output or a new version written in place
                self.versions[sid] = _Version(tid)
                if writes >= 0:
                    written += nbytes
            elif w is not None:  # a view: same storage as its source
                ver = self.versions.get(inputs[alias].source.sid)
                if ver is not None:
                    ver.views[w._view] = tid
                    ver.tids.append(tid)
            else:  # rule 5
                self.events.append((_RELEASE, tid))
        self.inplace_bytes_max = max(self.inplace_bytes_max, written)
        for sid in olds:
            self.released(sid)

    def attempted(self, info, args, kwargs) -> None:
        """Called by the session when op ``info`` raised BudgetError before it ran (rule 8)."""
        if self.closed:
            return
        ins = []
        for i, kind, name in info.args:
            v = (args[i] if i < len(args) else None) if name is None else kwargs.get(name)
            for w in (v,) if kind == ONE else (v or ()):
                if type(w) not in WRAPPER_TYPES:
                    continue
                cell = w._cell
                s = cell.storage
                if cell.session is self.session and s.recipe is not None:
                    ins.append(self._input(s, w._view))
        tid = self.next_id
        self.next_id += 1
        flags = _UNTRACKED | _FAILED
        self.events.append((_CALL, info.name, ins, [0], [-1], 0.0, [tid], [flags], [-1], None))
        self.events.append((_RELEASE, tid))
        self.ops += 1

    def evicted_all(self) -> None:
        """The program called ``session.evict_all()`` (rule 8)."""
        if not self.closed:
            self.events.append((_EVICT_ALL,))

    def released(self, sid: int) -> None:
        """The core dropped ``sid`` for the program: its last wrapper died, or its buffer
        was handed out (rule 4)."""
        ver = self.versions.get(sid)
        if ver is None or self.closed:
            return
        for tid in ver.tids:
            self.events.append((_RELEASE, tid))
        ver.tids = []

    def forgot(self, sid: int) -> None:
        ver = self.versions.pop(sid, None)
        if ver is not None and not self.closed:
            self.events.append((_FORGET, ver.base))

    def materialized(self, sid: int) -> None:
        ver = self.versions.get(sid)
        if ver is not None and not self.closed:
            self.events.append((_MATERIALIZE, ver.base))

    def froze(self) -> None:
        if not self.closed:
            self.events.append((_FREEZE,))

    # ---------------------------------------------------------------- tensors
    def _input(self, storage, view) -> int:
        ver = self.versions.get(storage.sid)
        if ver is None or not ver.tids:
            raise AssertionError(
                "bug of tritondtr: the trace recorder has no tensor for a "
                f"tracked input of {storage.nbytes} bytes"
            )
        return ver.views.get(view, ver.base)

    def _constant(self, t: torch.Tensor) -> int:
        if t.layout is torch.strided:
            st = t.untyped_storage()
            key, nbytes = (t.device, st.data_ptr()), st.nbytes()
        else:  # sparse and friends: one constant per tensor object, 0 bytes counted
            st, key, nbytes = t, (t.device, "id", id(t)), 0
        tid = self.const_of.get(key)
        if tid is None:
            tid = self.const_of[key] = self.next_id
            self.next_id += 1
            self.constants.append((tid, nbytes))
            self.keep.append(st)
        return tid

    # ------------------------------------------------------------------ build
    def close(self) -> None:
        self.closed = True

    def build(self, meta: dict) -> Trace:
        """The trace: constants first (creation order), then the events in order; tensors
        still referenced become ``output`` events."""
        b = TraceBuilder(meta=meta)
        ids = [-1] * self.next_id
        for tid, nbytes in self.constants:
            ids[tid] = b.constant(nbytes)
        device_ns = {}  # rule 6: the session's exit waited for most (those that made storages)
        for i, op in self.timed:
            op.end.synchronize()
            device_ns[i] = max(op.start.elapsed_time(op.end) * 1e6, 1.0)
        for i, ev in enumerate(self.events):
            k = ev[0]
            if k == _CALL:
                _, name, ins, sizes, aliases, cost, tids, flags, writes, in_flags = ev
                cost = device_ns.get(i, cost)
                new = b.call(
                    name,
                    [ids[t] for t in ins],
                    sizes=sizes,
                    cost=cost,
                    aliases=aliases,
                    flags=flags,
                    writes=writes,
                    in_flags=in_flags,
                )
                for t, n in zip(tids, new):
                    ids[t] = n
            elif k == _RELEASE:
                b.release(ids[ev[1]])
            elif k == _FORGET:
                b.forget(ids[ev[1]])
            elif k == _MATERIALIZE:
                b.materialize(ids[ev[1]])
            elif k == _FREEZE:
                b.freeze()
            elif k == _EVICT_ALL:
                b.evict_all()
            else:
                b.annotate(ev[1])
        return b.build()


def _arg(args, kwargs, key, j):
    v = args[key] if type(key) is int else kwargs[key]
    return v if j < 0 else v[j]


def _position(inputs, key, storage) -> int:
    """Index in ``inputs`` of a view's source: the tracked input reading ``storage``, the
    argument ``key`` if several do; -1 if none does (the source was not tracked)."""
    found = -1
    for k, e in enumerate(inputs):
        if e.source is storage and e.mode <= WRITE:
            if e.key == key:
                return k
            if found < 0:
                found = k
    return found

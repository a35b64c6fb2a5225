"""The recorder behind ``tritondtr.trace``: the session's observer, called once after each
executed op, that writes the program into a :class:`~tritondtr.traceformat.builder.TraceBuilder`.

# NOTE [ Recording a trace ]
# 1. The trace is the program, not the schedule: one CALL per op the session dispatched
#    (after its first execution); evictions and rematerializations are not events. The
#    runtime's own counters go into ``trace.meta["runtime"]`` for comparison.
# 2. One trace tensor per wrapper an op returns. A fresh output's size is the bytes of its
#    untyped storage, as the runtime counts it (NOTE [ Budget accounting ] in core/core.py); a view
#    (a return aliasing an argument, ``detach`` included) is an output with ``alias`` = that
#    argument's input position and 0 bytes.
# 3. An input wrapper maps to the trace tensor of its storage version with the same view
#    geometry, else to that version's base tensor. Plain tensors an op reads (parameters,
#    the batch, buffers handed out earlier) are constants, one per untyped storage, hoisted to
#    the start of the trace (they exist before the iteration, NOTE [ Trace semantics ] 3).
#    The recorder keeps those storages alive until it closes, so addresses stay unique.
# 4. When the last wrapper of a buffer dies (a weakref callback, the moment the runtime queues
#    the buffer for freeing, NOTE [ Storage lifetime ]), every trace tensor of its storage
#    version is released, before the next recorded op, as the runtime frees it before the
#    next op allocates. An in-place write is copy-on-write (docs/trace-format.md): the CALL
#    outputs the new version (the whole storage), then the old version's tensors are released.
# 5. An op that reads tracked storages but returns no tracked tensor (``.item()``, adding a
#    gradient into a plain ``.grad``) gets one 0-byte output, released at once: a replay must
#    still make its inputs resident. An op that touches no tracked storage is not recorded.
# 6. Costs are the runtime's own measurement of the op's first execution: host wall time in
#    ns (on CUDA, launch time), the number the engine scores with.
# 7. ``BACKWARD`` is annotated at the first op of each backward pass.
# 8. Accounting (budget=None): ``baseline(trace).peak_bytes - constant_bytes`` equals the
#    session's ``peak_bytes``, except that (a) an in-place write on a tracked buffer counts
#    the new version before the old one is released (the simulator's copy-on-write, up to the
#    bytes written by one op), and (b) a buffer handed out as a plain tensor (``unwrap``,
#    ``.numpy()``, parameter writes) leaves the runtime's count at once but the trace's only
#    when its last wrapper dies. ``meta["recorder"]["inplace_bytes_max"]`` bounds (a).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch

from ..traceformat.builder import TraceBuilder
from ..traceformat.trace import Trace
from .recipe import PLAIN, WRITE
from .semantics import ONE, OTHER
from .tensor import DTRTensor

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Recorder"]

_in_backward = torch._C._current_graph_task_id
_CALL, _RELEASE, _ANNOTATE = 0, 1, 2


class _Version:
    """The trace tensors of one storage version: ``views`` maps a view geometry (None for
    the whole buffer) to the tensor last made with it; ``tids`` are all of them."""

    __slots__ = ("base", "ref", "tids", "views")

    def __init__(self, storage, tid: int) -> None:
        self.ref = weakref.ref(storage)
        self.base = tid
        self.tids = [tid]
        self.views: dict = {None: tid}


class _CellRec:
    """Live wrappers of one cell and the version they see (NOTE [ Recording a trace ] 4)."""

    __slots__ = ("count", "key", "version")

    def __init__(self, key: int, version: _Version | None) -> None:
        self.key, self.count, self.version = key, 0, version


class Recorder:
    """The session observer: collects events with its own tensor ids (constants apart, so
    that :meth:`build` can issue them first)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.events: list[tuple] = []
        self.constants: list[tuple[int, int]] = []  # (tensor id, bytes)
        self.next_id = 0
        self.versions: dict[int, _Version] = {}  # id(Storage) -> its trace tensors
        self.cells: dict[int, _CellRec] = {}  # id(Cell) -> record
        self.refs: dict[int, tuple] = {}  # id(weakref) -> (weakref to a wrapper, _CellRec)
        self.const_of: dict[tuple, int] = {}  # (device, data_ptr) -> constant tensor id
        self.keep: list = []  # untyped storages of the constants (NOTE rule 3)
        self.pending: list[_Version] = []  # versions whose last wrapper died
        self.backward = False
        self.closed = False
        self.ops = self.skipped = self.inplace_bytes_max = 0

    # ------------------------------------------------------------ observer hook
    def op(self, info, args, kwargs, inputs, out, wrote, cost: float) -> None:
        """Called by the session after each executed op (session.py ``_call``)."""
        self._flush()
        ins, tracked = [], False
        for key, j, src, view, _, mode in inputs:
            if mode <= WRITE:
                ins.append(self._input(src, view))
                tracked = True
            else:  # a snapshot entry holds a copy: the constant is the caller's tensor
                ins.append(self._constant(src if mode == PLAIN else _arg(args, kwargs, key, j)))
        outs: list[tuple] = []  # (bytes, alias, wrapper or None, new storage or None)
        rets = info.rets
        res = [out] if len(rets) == 1 else list(out) if rets else []
        for r, (kind, view, wrote_arg) in enumerate(rets):
            if kind == OTHER or wrote_arg is not None:
                continue
            for w in [res[r]] if kind == ONE else list(res[r] or ()):
                if type(w) is not DTRTensor or w._cell.session is not self.session:
                    continue
                if view is None:
                    outs.append((w._cell.storage.nbytes, -1, w, None))
                    continue
                k = _position(inputs, view, w._cell.storage)
                if k >= 0:  # a view of a tracked input
                    outs.append((0, k, w, None))
        olds, seen = [], set()
        for e, cell in zip((e for e in inputs if e.mode == WRITE), wrote):
            old = e.source
            if id(old) not in seen:
                seen.add(id(old))
                olds.append(self.versions.get(id(old)))
                outs.append((cell.storage.nbytes, -1, None, cell))
        if not outs:
            if not tracked:
                self.skipped += 1
                return
            outs.append((0, -1, None, None))
        if _in_backward() >= 0:
            if not self.backward:
                self.events.append((_ANNOTATE, "BACKWARD"))
                self.backward = True
        else:
            self.backward = False
        tids = list(range(self.next_id, self.next_id + len(outs)))
        self.next_id += len(outs)
        self.events.append(
            (_CALL, info.name, ins, [o[0] for o in outs], [o[1] for o in outs], cost, tids)
        )
        self.ops += 1
        written = 0
        for tid, (nbytes, alias, w, cell) in zip(tids, outs):
            if w is not None and alias < 0:  # a fresh output
                self._watch(w, self._new_version(w._cell.storage, tid))
            elif w is not None:  # a view: same cell as its source, same version
                ver = self.versions.get(id(inputs[alias][2]))
                if ver is not None:
                    ver.views[w._view] = tid
                    ver.tids.append(tid)
                self._watch(w, ver)
            elif cell is not None:  # a new version written in place
                written += nbytes
                ver = self._new_version(cell.storage, tid)
                rec = self.cells.get(id(cell))
                if rec is not None:
                    rec.version = ver
            else:  # NOTE [ Recording a trace ] rule 5
                self.events.append((_RELEASE, tid))
        self.inplace_bytes_max = max(self.inplace_bytes_max, written)
        for ver in olds:
            if ver is not None:
                self._release(ver)

    # ---------------------------------------------------------------- tensors
    def _input(self, storage, view) -> int:
        ver = self.versions.get(id(storage))
        if ver is None or ver.ref() is not storage or not ver.tids:
            raise AssertionError(
                "bug of tritondtr: the trace recorder has no tensor for a "
                f"tracked input of {storage.nbytes} bytes"
            )
        return ver.views.get(view, ver.base)

    def _new_version(self, storage, tid: int) -> _Version:
        ver = self.versions[id(storage)] = _Version(storage, tid)
        return ver

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

    def _watch(self, w: DTRTensor, ver: _Version | None) -> None:
        key = id(w._cell)
        rec = self.cells.get(key)
        if rec is None:
            rec = self.cells[key] = _CellRec(key, ver)
        rec.count += 1
        ref = weakref.ref(w, self._died)
        self.refs[id(ref)] = (ref, rec)

    def _died(self, ref) -> None:
        # May run inside any allocation: only bookkeeping on the recorder's own objects.
        entry = self.refs.pop(id(ref), None)
        if entry is None or self.closed:
            return
        rec = entry[1]
        rec.count -= 1
        if rec.count == 0:
            if self.cells.get(rec.key) is rec:
                del self.cells[rec.key]
            if rec.version is not None:
                self.pending.append(rec.version)

    def _flush(self) -> None:
        while self.pending:  # deaths during a release go to the next list
            pending, self.pending = self.pending, []
            for ver in pending:
                self._release(ver)

    def _release(self, ver: _Version) -> None:
        for tid in ver.tids:
            self.events.append((_RELEASE, tid))
        ver.tids = []
        s = ver.ref()
        if s is not None and self.versions.get(id(s)) is ver:
            del self.versions[id(s)]

    # ------------------------------------------------------------------ build
    def close(self) -> None:
        self._flush()
        self.closed = True
        self.refs.clear()

    def build(self, meta: dict) -> Trace:
        """The trace: constants first (creation order), then the events in order; tensors
        still referenced become ``output`` events."""
        b = TraceBuilder(meta=meta)
        ids = [-1] * self.next_id
        for tid, nbytes in self.constants:
            ids[tid] = b.constant(nbytes)
        for ev in self.events:
            if ev[0] == _CALL:
                _, name, ins, sizes, aliases, cost, tids = ev
                new = b.call(name, [ids[t] for t in ins], sizes=sizes, cost=cost, aliases=aliases)
                for t, n in zip(tids, new):
                    ids[t] = n
            elif ev[0] == _RELEASE:
                b.release(ids[ev[1]])
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

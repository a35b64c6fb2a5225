"""TraceBuilder: write a trace event by event (the runtime's recorder, generators, tests)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .trace import EventKind, Trace, TraceError

__all__ = ["TraceBuilder"]


class TraceBuilder:
    """Records one iteration and turns it into a :class:`Trace`.

    Tensor ids are handed out densely in creation order; every tensor starts with one
    reference (NOTE [ Trace semantics ]). Example, a two-layer forward with its loss::

        b = TraceBuilder(meta={"model": "mlp"})
        w1, w2 = b.constant(4096, name="w1"), b.constant(4096, name="w2")
        x = b.constant(1 << 20, name="input")
        (h,) = b.call("aten::mm", [x, w1], sizes=[1 << 20], cost=2.0e4)
        (v,) = b.call("aten::view", [h], sizes=[0], aliases=[0], cost=10.0)  # a view of h
        (y,) = b.call("aten::mm", [v, w2], sizes=[1 << 20], cost=2.0e4)
        b.release(h); b.release(v)
        trace = b.build()            # outputs: every tensor still referenced (y, w1, ...)

    ``sizes`` are bytes, ``cost`` is in ns (any unit works if it is used throughout).
    """

    def __init__(self, meta: dict | None = None) -> None:
        self.meta = dict(meta or {})
        self._kind: list[int] = []
        self._arg: list[int] = []
        self._cost: list[float] = []
        self._name: list[int] = []
        self._in_ptr: list[int] = [0]
        self._inputs: list[int] = []
        self._out_ptr: list[int] = [0]
        self._size: list[int] = []
        self._alias: list[int] = []
        self._flags: list[int] = []
        self._writes: list[int] = []
        self._in_flags: list[int] = []
        self._refs: list[int] = []
        self._op_of: list[int] = []
        self._names: dict[str, int] = {}
        self._annotations: dict[str, int] = {}
        self._outputs: set[int] = set()

    @property
    def num_tensors(self) -> int:
        return len(self._size)

    def refcount(self, tensor: int) -> int:
        """References currently held on ``tensor``."""
        return self._refs[self._tensor(tensor, "refcount")]

    def base(self, tensor: int) -> int:
        """The tensor whose fresh storage ``tensor`` views (itself if it is no view)."""
        t = self._tensor(tensor, "base")
        while self._alias[t] >= 0:
            op = self._op_of[t]
            t = self._inputs[self._in_ptr[op] + self._alias[t]]
        return t

    def storage_size(self, tensor: int) -> int:
        """Bytes of the storage ``tensor`` views."""
        return self._size[self.base(tensor)]

    # ------------------------------------------------------------------- events
    def constant(self, size: int, name: str = "constant") -> int:
        """A tensor that exists before the iteration (weight, input); returns its id."""
        return self._op(EventKind.CONSTANT, name, (), (size,), (-1,), 0.0)[0]

    def call(
        self,
        name: str,
        inputs: Sequence[int],
        sizes: Sequence[int],
        cost: float,
        aliases: Sequence[int] | None = None,
        *,
        flags: Sequence[int] | None = None,
        writes: Sequence[int] | None = None,
        in_flags: Sequence[int] | None = None,
    ) -> list[int]:
        """An operator call; returns the ids of its ``len(sizes)`` outputs.

        ``sizes[i]`` is the bytes of output i's fresh storage; ``aliases[i]`` (default -1) is
        the position in ``inputs`` whose storage output i views, in which case its size is
        ignored. In-place ops are recorded copy-on-write: a call whose output is the new
        version, then ``release`` of the old one (as the DTR log importer does). ``flags``
        (per output), ``writes`` (per output) and ``in_flags`` (per input) are the runtime's
        annotations (NOTE [ Runtime annotations ]; default 0, -1 and 0).
        """
        if aliases is None:
            aliases = (-1,) * len(sizes)
        if len(aliases) != len(sizes):
            raise TraceError(f"call {name!r}: {len(sizes)} sizes but {len(aliases)} aliases")
        for what, col, n in (("flags", flags, sizes), ("writes", writes, sizes)):
            if col is not None and len(col) != len(n):
                raise TraceError(f"call {name!r}: {len(sizes)} sizes but {len(col)} {what}")
        if in_flags is not None and len(in_flags) != len(inputs):
            raise TraceError(f"call {name!r}: {len(inputs)} inputs but {len(in_flags)} in_flags")
        if not sizes:
            raise TraceError(f"call {name!r}: an op needs at least one output")
        for t in inputs:
            self._tensor(t, f"call {name!r}")
        for a in aliases:
            if not (-1 <= a < len(inputs)):
                raise TraceError(
                    f"call {name!r}: alias {a} is not -1 or an input position "
                    f"(0..{len(inputs) - 1})"
                )
        first = len(self._size)
        new = self._op(EventKind.CALL, name, inputs, sizes, aliases, cost)
        if flags is not None:
            self._flags[first:] = [int(f) for f in flags]
        if writes is not None:
            self._writes[first:] = [int(w) for w in writes]
        if in_flags is not None:
            self._in_flags[len(self._in_flags) - len(inputs) :] = [int(f) for f in in_flags]
        return new

    def forget(self, tensor: int) -> None:
        """The runtime forgot the storage of ``tensor`` (NOTE [ Runtime annotations ] 4)."""
        self._event(EventKind.FORGET, self._tensor(tensor, "forget"))

    def materialize(self, tensor: int) -> None:
        """The program asked for the value of ``tensor`` outside an op."""
        self._event(EventKind.MATERIALIZE, self._tensor(tensor, "materialize"))

    def freeze(self) -> None:
        """The runtime made every held storage external (NOTE [ Parameter writes ])."""
        self._event(EventKind.FREEZE, 0)

    def evict_all(self) -> None:
        """The program evicted every evictable storage (``session.evict_all()``)."""
        self._event(EventKind.EVICT_ALL, 0)

    def retain(self, tensor: int) -> None:
        """One more reference to ``tensor`` (a new handle to it)."""
        t = self._tensor(tensor, "retain")
        self._refs[t] += 1
        self._event(EventKind.RETAIN, t)

    def release(self, tensor: int) -> None:
        """One reference fewer; raises if none is left."""
        t = self._tensor(tensor, "release")
        if self._refs[t] <= 0:
            raise TraceError(f"release of tensor {t}, which holds no reference any more")
        self._refs[t] -= 1
        self._event(EventKind.RELEASE, t)

    def output(self, tensor: int) -> None:
        """``tensor`` must be resident at this point and stay so (loss, gradients)."""
        t = self._tensor(tensor, "output")
        self._outputs.add(t)
        self._event(EventKind.OUTPUT, t)

    def annotate(self, text: str) -> None:
        """An informational marker, e.g. ``"BACKWARD"``."""
        idx = self._annotations.setdefault(str(text), len(self._annotations))
        self._event(EventKind.ANNOTATE, idx)

    def build(self, outputs: str = "auto") -> Trace:
        """The finished trace. ``outputs="auto"`` first adds an ``output`` event for every
        tensor still referenced and not yet output, in creation order; ``"none"`` adds none."""
        if outputs not in ("auto", "none"):
            raise ValueError(f"outputs must be 'auto' or 'none', got {outputs!r}")
        if outputs == "auto":
            for t, r in enumerate(self._refs):
                if r > 0 and t not in self._outputs:
                    self.output(t)
        return Trace(
            kind=np.array(self._kind, dtype=np.int8),
            arg=np.array(self._arg, dtype=np.int64),
            op_cost=np.array(self._cost, dtype=np.float64),
            op_name=np.array(self._name, dtype=np.int32),
            in_ptr=np.array(self._in_ptr, dtype=np.int64),
            inputs=np.array(self._inputs, dtype=np.int64),
            out_ptr=np.array(self._out_ptr, dtype=np.int64),
            size=np.array(self._size, dtype=np.int64),
            alias=np.array(self._alias, dtype=np.int32),
            flags=np.array(self._flags, dtype=np.int8),
            writes=np.array(self._writes, dtype=np.int32),
            in_flags=np.array(self._in_flags, dtype=np.int8),
            names=list(self._names),
            annotations=list(self._annotations),
            meta=dict(self.meta),
        )

    # ---------------------------------------------------------------- internals
    def _op(self, kind, name, inputs, sizes, aliases, cost) -> list[int]:
        cost = float(cost)
        if not (cost >= 0.0) or cost == float("inf"):
            raise TraceError(f"op {name!r}: cost must be a finite number >= 0, got {cost}")
        op = len(self._cost)
        self._cost.append(cost)
        self._name.append(self._names.setdefault(str(name), len(self._names)))
        self._inputs.extend(int(t) for t in inputs)
        self._in_flags.extend([0] * len(inputs))
        self._in_ptr.append(len(self._inputs))
        first = len(self._size)
        for s, a in zip(sizes, aliases):
            s = int(s)
            if s < 0:
                raise TraceError(f"op {name!r}: output size must be >= 0 bytes, got {s}")
            self._size.append(0 if a >= 0 else s)
            self._alias.append(int(a))
            self._flags.append(0)
            self._writes.append(-1)
            self._refs.append(1)
            self._op_of.append(op)
        self._out_ptr.append(len(self._size))
        self._event(kind, op)
        return list(range(first, len(self._size)))

    def _event(self, kind: EventKind, arg: int) -> None:
        self._kind.append(int(kind))
        self._arg.append(arg)

    def _tensor(self, tensor, what: str) -> int:
        t = int(tensor)
        if not (0 <= t < len(self._size)):
            raise TraceError(f"{what}: unknown tensor id {tensor!r} ({len(self._size)} exist)")
        return t

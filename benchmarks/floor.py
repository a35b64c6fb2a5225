"""Reference points for the runtime benchmarks: what any Python interposition costs.

``ModeOnly`` is a ``TorchDispatchMode`` that calls every op and returns its result: the cost
of reaching Python once per op. ``WrapperFloor`` is the least a wrapper-subclass runtime (the
design of tritondtr, NOTE [ What is tracked ]) must do: every output becomes a wrapper that
holds the plain tensor, every op unwraps its arguments, runs, and wraps its outputs; an op
returning one of its arguments (in place) returns the caller's wrapper. Nothing else: no
accounting, no recipes, no metadata. The gap between it and eager is the floor of this design
on a given machine; the gap between tritondtr and it is tritondtr's own work.

Both are benchmark instruments only (they make no attempt at full coverage: ``out=`` lists,
sparse layouts and other devices are not handled).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["ModeOnly", "WrapperFloor"]


class ModeOnly(TorchDispatchMode):
    """Calls every op, nothing else."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as tritondtr's mode: no dynamo-disable shim per op (torch >= 2.12)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class Counting(ModeOnly):
    """Calls every op and counts it: the ATen calls any dispatch mode sees (``calls``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


class _Wrapped(torch.Tensor):
    """A wrapper subclass holding a plain tensor in ``_plain``."""

    __slots__ = ("_plain",)

    @staticmethod
    def __new__(cls, plain: torch.Tensor):
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            plain.size(),
            strides=plain.stride(),
            storage_offset=plain.storage_offset(),
            dtype=plain.dtype,
            device=plain.device,
        )
        r._plain = plain
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    def tolist(self):  # a boundary call (the TreeLSTM reads its token ids)
        return self._plain.tolist()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        with WrapperFloor():  # reached only outside the mode (e.g. printing after it exits)
            return func(*args, **(kwargs or {}))


def _unwrap(v):
    if type(v) is _Wrapped:
        return v._plain
    if type(v) in (list, tuple) and any(type(t) is _Wrapped for t in v):
        return [t._plain if type(t) is _Wrapped else t for t in v]
    return v


class WrapperFloor(TorchDispatchMode):
    """Unwrap, call, wrap: the floor of a wrapper-subclass runtime."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        pargs = [_unwrap(a) for a in args]
        pkw = {k: _unwrap(v) for k, v in kwargs.items()} if kwargs else {}
        out = func(*pargs, **pkw)
        if isinstance(out, torch.Tensor):
            return self._wrap(out, args, pargs)
        if type(out) in (tuple, list):
            return type(out)(
                self._wrap(o, args, pargs) if isinstance(o, torch.Tensor) else o for o in out
            )
        return out

    @staticmethod
    def _wrap(o: torch.Tensor, args, pargs):
        for a, p in zip(args, pargs):
            if o is p:  # an in-place op returns its argument: give back the caller's object
                return a
        return _Wrapped(o)

"""``p.data = new`` on a plain tensor while a session is active.

# NOTE [ Plain .data assignment ]
# 1. ``p.data = new`` runs in C++ (autograd's ``set_data``, a composite op below every
#    dispatch mode): no session sees it. On a plain ``p`` in a session it went wrong two
#    ways. ``new`` a wrapper (manual SGD's ``p.data = p.data - lr * p.grad``): ``p`` took the
#    wrapper's storage, which has no data, and the next op on ``p`` crashed the process.
#    ``new`` anything, ``p`` read by a recipe: a recomputation read ``p``'s new memory, and
#    no version counter moved to say so (a silent wrong value).
# 2. So while a session is active, ``torch.Tensor`` has a ``data`` property (installed when
#    the first session enters, removed, in ``finally``, when the last one exits). Its getter
#    is autograd's. Its setter first tells every session active on this thread (their
#    dispatch modes are :class:`WatchesPlainData`), which freezes if its recipes read ``p``
#    (NOTE [ Parameter writes ]: the swap is a write to ``p``), or if ``p`` is empty (an empty
#    storage has no address to watch; such swaps are rare), then hands a wrapper ``new``
#    out (NOTE [ Escaping tensors ] rule 2), so ``p`` shares its buffer as eager's ``p``
#    shares ``new``'s memory, then runs autograd's setter.
# 3. A wrapper's own ``.data`` setter is ``DTRTensor.data`` (a subclass property, found
#    first).
# 4. Not covered: ``p.data = w`` with no session active (after exit, ``w`` an escaped
#    wrapper) gives ``p`` the wrapper's empty storage, as rule 1 says. Assign
#    ``tritondtr.runtime.unwrap(w)`` there (docs/runtime.md, Limitations).
"""

from __future__ import annotations

import threading

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from .dynamo import opaque
from .tensor import WRAPPER_TYPES

__all__ = ["WatchesPlainData", "install", "uninstall"]

_DATA = torch._C.TensorBase.data  # autograd's descriptor
_lock = threading.Lock()
_installed = 0  # sessions active in the process (rule 2)


class WatchesPlainData:
    """A dispatch mode that wants to hear of ``p.data = new`` on a plain ``p`` (rule 2)."""

    def before_set_data(self, p: torch.Tensor) -> None:
        raise NotImplementedError


@opaque  # NOTE [ Dynamo never traces the runtime ]
def _get(self: torch.Tensor) -> torch.Tensor:
    return _DATA.__get__(self)


@opaque
def _set(self: torch.Tensor, new: torch.Tensor) -> None:
    for mode in _get_current_dispatch_mode_stack():
        if isinstance(mode, WatchesPlainData):
            mode.before_set_data(self)
    if type(new) in WRAPPER_TYPES:
        new = new._cell.session.value(new, escape=True)
    _DATA.__set__(self, new)


_PROPERTY = property(_get, _set, doc=_DATA.__doc__)


def install() -> None:
    """A session enters (rule 2)."""
    global _installed
    with _lock:
        if _installed == 0 and "data" not in torch.Tensor.__dict__:
            torch.Tensor.data = _PROPERTY
        _installed += 1


def uninstall() -> None:
    """A session exits (rule 2)."""
    global _installed
    with _lock:
        _installed -= 1
        if _installed == 0 and torch.Tensor.__dict__.get("data") is _PROPERTY:
            del torch.Tensor.data

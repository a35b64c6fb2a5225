"""The wrapper tensor: what user code and autograd hold while the runtime owns the memory."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves

from .dynamo import opaque

__all__ = ["DTRTensor", "is_tracked", "restride", "unwrap"]


class DTRTensor(torch.Tensor):
    """A tensor whose memory the tritondtr runtime owns; it can be evicted and recomputed.

    It has the shape, strides, dtype and device of the tensor it stands for, but no storage
    of its own: ``_cell`` leads to the current storage version, ``_view`` (None, or
    (size, stride, storage_offset, dtype, conj, neg), see :func:`.recipe.geometry`) says where
    it lies in that storage and with which math bits. Every op on it
    goes through the runtime, also after the context exits (NOTE [ Escaping tensors ] in
    session.py). ``.item()``, ``.tolist()``, ``.numpy()``, printing and ``data_ptr()`` work.
    """

    __slots__ = ("_cell", "_view")

    @staticmethod
    def __new__(cls, cell, plain: torch.Tensor, view):
        # storage_size: the whole buffer, so in-place view ops may move anywhere in it.
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            plain.size(),
            strides=plain.stride(),
            storage_offset=plain.storage_offset(),
            dtype=plain.dtype,
            device=plain.device,
            storage_size=cell.storage.nbytes,
        )
        if plain.is_conj():  # the math bits live on the wrapper too (conj views, FFTs)
            torch._C._set_conj(r, True)
        if plain.is_neg():
            torch._C._set_neg(r, True)
        r._cell = cell
        r._view = view
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    @opaque  # NOTE [ Dynamo never traces the runtime ]
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Reached only when no tritondtr mode is active (after exit, or another thread).
        for t in tree_leaves((args, kwargs)):
            if type(t) is DTRTensor:
                return t._cell.session.dispatch(func, args, kwargs or {})
        raise AssertionError("bug of tritondtr: __torch_dispatch__ without a DTRTensor")

    # ------------------------------------------------------------ boundary calls
    def __repr__(self, *, tensor_contents=None) -> str:
        text = repr(self._cell.session.value(self, escape=False))
        if self.grad_fn is not None:
            text = text[:-1] + f", grad_fn=<{type(self.grad_fn).__name__}>)"
        elif self.requires_grad:
            text = text[:-1] + ", requires_grad=True)"
        return text

    def tolist(self):
        return self._cell.session.value(self, escape=False).tolist()

    def numpy(self, *, force: bool = False):
        if self.requires_grad and not force:
            raise RuntimeError(
                "Can't call numpy() on Tensor that requires grad. "
                "Use tensor.detach().numpy() instead."
            )
        return self._cell.session.value(self, escape=True).numpy(force=force)

    def __array__(self, dtype=None, copy=None):
        a = self.numpy(force=True) if not self.requires_grad else self.detach().numpy()
        return a if dtype is None else a.astype(dtype, copy=False)

    def data_ptr(self) -> int:
        return self._cell.session.value(self, escape=True).data_ptr()

    def untyped_storage(self):
        return self._cell.session.value(self, escape=True).untyped_storage()


def restride(func, args, kwargs) -> DTRTensor:
    """Apply the in-place view op ``func`` (``t_``, ``squeeze_``, ``as_strided_``, ...) to the
    wrapper ``args[0]``: NOTE [ Op semantics ] rule 6 in semantics.py. Returns ``args[0]``."""
    t = args[0]
    # The new geometry, from a stand-in on the meta device with the buffer's extent.
    n = t._cell.storage.nbytes // t.element_size()
    stand = torch.empty((n,), dtype=t.dtype, device="meta").as_strided(
        t.size(), t.stride(), t.storage_offset()
    )
    func(stand, *args[1:], **kwargs)
    size, stride, offset = stand.size(), stand.stride(), stand.storage_offset()
    with torch._C._DisableTorchDispatch():  # the wrapper's own (data-less) metadata
        torch.ops.aten.as_strided_.default(t, size, stride, offset)
    t._view = (size, stride, offset, t.dtype, t.is_conj(), t.is_neg())
    return t


def is_tracked(t) -> bool:
    """Whether ``t`` is a tensor whose memory a tritondtr session owns."""
    return type(t) is DTRTensor


def unwrap(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor with ``t``'s values (``t`` itself if it is plain), recomputed if evicted.

    The plain tensor shares memory with ``t``: that buffer is handed out, the runtime stops
    evicting or counting it, and in-place changes through either are seen by both.
    """
    if type(t) is not DTRTensor:
        return t
    return t._cell.session.value(t, escape=True)

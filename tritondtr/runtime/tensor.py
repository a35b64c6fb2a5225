"""The wrapper tensor: what user code and autograd hold while the runtime owns the memory.

# NOTE [ View chains ]
# 1. Autograd gives every view of a tensor with the Python dispatch key (every wrapper) a
#    function that replays the view from its base (the view-replay condition of PyTorch's
#    tools/autograd/gen_inplace_or_view_type.py includes ``is_python_dispatch()``), and a
#    view of such a view gets a deep copy of its source's function composed with its own
#    (``ViewInfo::chain`` in torch/csrc/autograd/variable.cpp: a ``ChainedViewFunc`` of
#    ``view_fn_->clone_and_set()`` and the new one). Making a view ``d`` views deep from a
#    tensor made by an op therefore costs O(d), and so does freeing it: ``y = y.view(n)``
#    ``k`` times is O(k^2). Plain tensors record nothing (``as_strided`` replays them). No
#    wrapper argument changes this, and the dispatch mode, below autograd, cannot either:
#    a source's replay function is fixed when the source is made.
# 2. So a wrapper counts ``_depth``, the views between it and a wrapper made by an op (0).
#    From depth ``VIEW_CHAIN_LIMIT`` on it is a :class:`DeepView`, the only wrapper class
#    with a ``__torch_function__`` (every other op pays nothing): an op on it runs as usual,
#    and a new view it returns that is deeper than the limit is replaced by the same view
#    made again from its autograd base in one step (``as_strided``, ``_depth`` 1). A chain
#    then costs O(``VIEW_CHAIN_LIMIT``) per view at any length.
# 3. The replacement is the output of an identity autograd Function of the deep view: its
#    gradient runs through the deep view's own backward node, so the graph, the order in
#    which gradients are summed and every gradient bit are eager's (a gradient sent to the
#    base directly would be summed there in another order). It has the deep view's storage
#    cell, geometry, version counter and autograd creation meta (the in-place rules for
#    views made in no-grad mode or by multi-output ops hold as in eager).
# 4. A view is replaced only if it has its base's dtype and math bits (``as_strided`` keeps
#    the base's). After an in-place op on the base, autograd rebuilds the replacement's
#    ``grad_fn`` with one ``AsStridedBackward0`` instead of the deep chain's nodes: the same
#    copies if no element is repeated, sums in another order if some are. So a view made in
#    grad mode is replaced only if neither it nor its base overlaps itself; one made in
#    no-grad mode (backward's gradients too) has no such rebuild (eager raises instead).
#    Otherwise the view stays, and its chain grows (``expand`` views in grad mode).
# 5. The backward of a chain of views is a chain of views of the gradient, made by autograd's
#    nodes in C++ (no ``__torch_function__``): the identity Function of rule 3 re-roots a
#    deep gradient on its way, so backward chains are bounded too.
# 6. The limit is far above the view depth of ordinary model code (a reshape of a transpose
#    of a slice is 3), which keeps eager's autograd graph node for node. Timings:
#    docs/benchmarks.md, "What does a view at the end of a chain of views cost?".

# NOTE [ Copies and pickles ]
# 1. ``copy.deepcopy`` of a wrapper is its ``clone()`` (with ``requires_grad``, ``.grad`` and
#    the instance ``__dict__`` copied as eager does): inside a session a tracked tensor that
#    reads the original, after exit a plain one. PyTorch's own ``__deepcopy__`` clones a
#    wrapper subclass only when ``data_ptr()`` is 0; a wrapper's ``data_ptr()`` hands its
#    buffer out (NOTE [ Escaping tensors ] in session.py), so PyTorch took its storage path,
#    whose ``set_`` the runtime refuses. Lightning deep-copies its logged metrics for
#    ``ModelCheckpoint`` inside every validation. Like eager, only leaves are copied; unlike
#    eager, two views of one buffer become two buffers (as for any wrapper subclass).
# 2. Pickling (``torch.save``, ``pickle``, ``multiprocessing``) writes the plain tensor of its
#    value, recomputed if evicted, without handing the buffer out: a loaded tensor is plain,
#    as no session exists to own it. Before, the wrapper's slots (a weak reference) made
#    every pickle raise ``TypeError``; Lightning saves its logged metrics in checkpoints.
"""

from __future__ import annotations

import copy

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves

from .dynamo import opaque
from .errors import UnsupportedOpError

__all__ = [
    "VIEW_CHAIN_LIMIT",
    "WRAPPER_TYPES",
    "DTRTensor",
    "DeepView",
    "is_tracked",
    "restride",
    "unwrap",
    "view_wrapper",
]

VIEW_CHAIN_LIMIT = 16  # NOTE [ View chains ] rule 2

_DisableTorchFunctionSubclass = torch._C.DisableTorchFunctionSubclass
_DATA = torch._C.TensorBase.data  # the C descriptor of ``.data``
_get_creation_meta = torch._C._autograd._get_creation_meta
_set_creation_meta = torch._C._autograd._set_creation_meta
_CreationMeta = torch._C._autograd.CreationMeta
_NO_REBUILD = (_CreationMeta.NO_GRAD_MODE, _CreationMeta.INFERENCE_MODE)  # rule 4


class DTRTensor(torch.Tensor):
    """A tensor whose memory the tritondtr runtime owns; it can be evicted and recomputed.

    It has the shape, strides, dtype and device of the tensor it stands for, but no storage
    of its own: ``_cell`` leads to the current storage version, ``_view`` (None, or
    (size, stride, storage_offset, dtype, conj, neg), see :func:`.recipe.geometry`) says where
    it lies in that storage and with which math bits; ``_depth`` counts the views between it
    and a wrapper made by an op (NOTE [ View chains ]). Every op on it
    goes through the runtime, also after the context exits (NOTE [ Escaping tensors ] in
    session.py). ``.item()``, ``.tolist()``, ``.numpy()``, printing and ``data_ptr()`` work.
    """

    __slots__ = ("_cell", "_depth", "_view")

    @staticmethod
    def __new__(cls, cell, plain: torch.Tensor, view, depth: int = 0):
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
        r._depth = depth
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    @opaque  # NOTE [ Dynamo never traces the runtime ]
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Reached only when no tritondtr mode is active (after exit, or another thread).
        for t in tree_leaves((args, kwargs)):
            if type(t) in WRAPPER_TYPES:
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
        plain = self._cell.session.value(self, escape=False)
        with _disable_current_modes():  # a conj or neg bit is resolved by a dispatched op
            return plain.tolist()

    @property
    def data(self) -> torch.Tensor:
        return _DATA.__get__(self)

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        """``t.data = new``: autograd's ``set_data`` copies ``new``'s metadata into ``t``; the
        wrapper also takes ``new``'s cell and view, so its value is ``new``'s (left alone, it
        kept reading its old storage: a silent wrong value)."""
        if type(new) not in WRAPPER_TYPES:  # set_data would give it a storage of its own
            raise UnsupportedOpError(
                "assigning a plain tensor to .data",
                "a tracked tensor can only take the data of another tracked tensor",
                "Write it in place (t.copy_(new)), or use the plain tensor itself.",
            )
        _DATA.__set__(self, new)
        self._cell, self._view, self._depth = new._cell, new._view, new._depth

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

    def __deepcopy__(self, memo):
        """NOTE [ Copies and pickles ] rule 1: ``clone()``, as PyTorch deep-copies a wrapper
        subclass without storage (its storage path would ``set_`` a wrapper, refused)."""
        if id(self) in memo:
            return memo[id(self)]
        if not self.is_leaf:  # eager's rule and message (torch.Tensor.__deepcopy__)
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the "
                "deepcopy protocol at the moment."
            )
        with torch.no_grad():
            new = self.clone()
        if self.requires_grad:
            new.requires_grad_()
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        if self.__dict__:
            new.__dict__ = copy.deepcopy(self.__dict__, memo)
        memo[id(self)] = new
        return new

    def __reduce_ex__(self, protocol):
        """NOTE [ Copies and pickles ] rule 2: pickled (``torch.save``, ``pickle``) as the
        plain tensor of its value."""
        plain = self._cell.session.value(self, escape=False)
        with _disable_current_modes():
            plain = plain.detach()  # a tensor of its own: the buffer's object is the runtime's
            if self.requires_grad:
                plain.requires_grad_()
            if self.__dict__:
                plain.__dict__.update(self.__dict__)
            return plain.__reduce_ex__(protocol)


class DeepView(DTRTensor):
    """A wrapper at the end of a chain of ``VIEW_CHAIN_LIMIT`` or more views: NOTE [ View
    chains ] rule 2. Its ops pass through ``__torch_function__``, which makes a deeper view
    it returns again from the view's base, in one step."""

    __slots__ = ()

    @classmethod
    @opaque  # NOTE [ Dynamo never traces the runtime ]
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with _DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
            if type(out) is DeepView:
                if out._depth > VIEW_CHAIN_LIMIT and not _is_argument(out, args, kwargs):
                    return _reroot(out)
            elif type(out) is tuple and any(
                type(o) is DeepView and o._depth > VIEW_CHAIN_LIMIT for o in out
            ):  # split, unbind, chunk
                return tuple(
                    _reroot(o)
                    if type(o) is DeepView
                    and o._depth > VIEW_CHAIN_LIMIT
                    and not _is_argument(o, args, kwargs)
                    else o
                    for o in out
                )
        return out


WRAPPER_TYPES = frozenset((DTRTensor, DeepView))


def view_wrapper(src: DTRTensor, plain: torch.Tensor, view) -> DTRTensor:
    """The wrapper of ``plain``, a view of wrapper ``src`` (``view``: its geometry, see
    :func:`.recipe.geometry`, or None): on ``src``'s cell, one view deeper."""
    depth = src._depth + 1
    cls = DTRTensor if depth < VIEW_CHAIN_LIMIT else DeepView
    return cls(src._cell, plain, view, depth)


def _reroot(t: DeepView) -> DTRTensor:
    """NOTE [ View chains ] rules 3 and 4: ``t`` made again from its autograd base by one
    view, where that is exactly equivalent; else ``t``."""
    with _DisableTorchFunctionSubclass():
        base = t._base
        if (
            type(base) not in WRAPPER_TYPES
            or base._cell is not t._cell
            or base.dtype != t.dtype
            or base.is_conj() != t.is_conj()
            or base.is_neg() != t.is_neg()
        ):
            return t
        meta = _get_creation_meta(t)
        if meta not in _NO_REBUILD and not (_disjoint(t) and _disjoint(base)):
            return t
        if t.grad_fn is not None:
            r = _Reroot.apply(t, (base,))
        else:
            r = base.as_strided(t.size(), t.stride(), t.storage_offset())
            if r.requires_grad != t.requires_grad:  # a leaf view with a gradient of its own
                return t
        if _get_creation_meta(r) != meta:
            _set_creation_meta(r, meta)
    r._depth = 1
    return r


class _Reroot(torch.autograd.Function):
    """View ``t`` made from ``base[0]`` (not an input: no edge to it); the gradient goes to
    ``t`` unchanged (NOTE [ View chains ] rule 3)."""

    @staticmethod
    def forward(ctx, t, base):
        ctx.set_materialize_grads(False)  # an undefined gradient stays undefined, as in eager
        return base[0].as_strided(t.size(), t.stride(), t.storage_offset())

    @staticmethod
    def backward(ctx, grad):
        # NOTE [ View chains ] rule 5
        if type(grad) is DeepView and grad._depth > VIEW_CHAIN_LIMIT:
            grad = _reroot(grad)
        return grad, None


def _disjoint(t: torch.Tensor) -> bool:
    """Whether no two elements of ``t`` share memory (a sufficient test: in increasing order
    of stride, each stride passes the extent of the dimensions before it)."""
    extent = 0
    for stride, size in sorted((st, sz) for sz, st in zip(t.size(), t.stride()) if sz != 1):
        if size == 0:
            return True
        if stride <= extent:
            return False
        extent += (size - 1) * stride
    return True


def _is_argument(t: torch.Tensor, args, kwargs) -> bool:
    """Whether ``t`` is an argument of the call (an in-place or ``out=`` op returns it)."""
    return any(a is t for a in args) or any(v is t for v in kwargs.values())


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
    return type(t) in WRAPPER_TYPES


def unwrap(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor with ``t``'s values (``t`` itself if it is plain), recomputed if evicted.

    The plain tensor shares memory with ``t``: that buffer is handed out, the runtime stops
    evicting or counting it, and in-place changes through either are seen by both.
    """
    if type(t) not in WRAPPER_TYPES:
        return t
    return t._cell.session.value(t, escape=True)

"""Ops whose CUDA kernels may give other bits when run again on the same inputs.

# NOTE [ Nondeterministic ops ]
# 1. ``NONDETERMINISTIC_CUDA`` lists the ATen ops that PyTorch itself calls nondeterministic
#    on CUDA: the docstring of ``torch.use_deterministic_algorithms`` in torch 2.13.0, both
#    its lists (the ops that "act deterministically when mode=True" and those that "throw a
#    RuntimeError when mode=True"; without the flag both run nondeterministic kernels, mostly
#    atomic adds whose order varies, or duplicate-index writes where any one may win). Each
#    Python-level name is mapped to the ATen ops that reach the dispatch mode (the forward op,
#    or the backward op its autograd formula calls), plus the ops those decompose into where
#    they are public ATen ops a program may call itself. A name is an overload packet
#    (``"aten::index_add"``: every overload) or one overload (``"aten::scatter.src"``).
#    No ATen op of torch 2.13 carries the tag ``nondeterministic_bitwise``; it is read as a
#    second source all the same (a later torch, or a custom op, may set it).
# 2. An output of such an op on a CUDA tensor (a fresh output, or the new version an
#    in-place or ``out=`` write makes) is pinned: a replay could give other bits, and
#    gradients must equal the unlimited run exactly. Except when the op runs with
#    ``torch.use_deterministic_algorithms(True)`` on (PyTorch then runs a deterministic
#    kernel or raises); with ``warn_only=True`` the ops of the second list still run their
#    nondeterministic kernels (they only warn), so it counts as off.
# 3. Argument-dependent entries are pinned whatever the arguments: ``index_put`` both with
#    and without ``accumulate`` (both are on the lists), ``scatter_reduce`` for every
#    ``reduce``, ``bincount`` with or without weights, ``cumsum`` for every dtype,
#    ``_embedding_bag_backward`` for every mode, the convolutions (cuDNN chooses the
#    algorithm). Pinning too much costs memory, never a wrong bit. Not listed: ``bmm`` with a
#    sparse argument (pinning every CUDA ``bmm`` would pin every attention score; such a
#    call is rare and is not covered), ``__getitem__``'s backward on the CPU (the list's only
#    CPU-only entries, like ``index_put`` with ``accumulate=True`` on the CPU, are not
#    pinned: CPU outputs never are), and ``resize_`` of a quantized tensor (refused anyway).
# 4. A replay of an op of the table runs under the deterministic-algorithms setting of its
#    first execution (the recipe keeps it): an output left evictable because the setting was
#    on is recomputed by the same deterministic kernel even if the program turned it off
#    since, and an output computed with it off is not replayed with another kernel.
# 5. Not covered yet: an in-place write to a pinned version hands that version out (NOTE [
#    In-place versions ] rule 1); it is evicted with its recipe, and a storage that read it,
#    recomputed later, replays the op (``y = x + 1`` after ``x.index_add_(...)``, then
#    ``x.mul_(2)``, and ``y`` evicted). ``never_evict`` outputs share this limit.
# 6. Beyond the docstring's lists, the backwards of the fused attention kernels are listed:
#    memory-efficient attention's backward splits keys and adds with atomics by default (its
#    kernel warns "Memory Efficient attention defaults to a non-deterministic algorithm"),
#    and flash attention's backward accumulates dq with atomics unless deterministic
#    algorithms are on. Hugging Face models use ``sdpa`` by default, so their dq / dk / dv
#    would otherwise be evictable and replayed with other bits.
"""

from __future__ import annotations

import torch

__all__ = ["NONDETERMINISTIC_CUDA", "deterministic_mode", "listed", "pins_nondeterministic"]

# NOTE [ Nondeterministic ops ] rule 1, in the docstring's order.
NONDETERMINISTIC_CUDA = frozenset(
    {
        # torch.nn.Conv1d/2d/3d, ConvTranspose1d/2d/3d (cuDNN)
        "aten::convolution",
        "aten::convolution_backward",
        "aten::_convolution",
        "aten::cudnn_convolution",
        "aten::cudnn_convolution_transpose",
        # torch.nn.ReplicationPad1d/2d/3d, differentiated
        "aten::replication_pad1d_backward",
        "aten::replication_pad2d_backward",
        "aten::replication_pad3d_backward",
        # Tensor.index_put (both accumulate values, rule 3), and __getitem__'s backward
        "aten::index_put",
        "aten::index_put_",
        "aten::_index_put_impl_",
        "aten::_unsafe_index_put",
        # Tensor.put_ (both accumulate values)
        "aten::put",
        "aten::put_",
        # Tensor.scatter_add_, and torch.gather's backward
        "aten::scatter_add",
        "aten::scatter_add_",
        # torch.index_add, and the backward of torch.index_select and torch.repeat_interleave
        "aten::index_add",
        "aten::index_add_",
        # Tensor.index_copy
        "aten::index_copy",
        "aten::index_copy_",
        # Tensor.scatter with a Tensor src
        "aten::scatter.src",
        "aten::scatter_.src",
        "aten::scatter.src_out",
        "aten::scatter.reduce",
        "aten::scatter_.reduce",
        "aten::scatter.reduce_out",
        # Tensor.scatter_reduce (every reduce, rule 3)
        "aten::scatter_reduce",
        "aten::scatter_reduce_",
        # torch.nn.MaxPool3d, differentiated
        "aten::max_pool3d_with_indices_backward",
        # torch.nn.AvgPool3d, AdaptiveAvgPool2d/3d, AdaptiveMaxPool2d, differentiated
        "aten::avg_pool3d_backward",
        "aten::_adaptive_avg_pool2d_backward",
        "aten::_adaptive_avg_pool3d_backward",
        "aten::adaptive_avg_pool3d_backward",
        "aten::adaptive_max_pool2d_backward",
        # torch.nn.FractionalMaxPool2d/3d, differentiated
        "aten::fractional_max_pool2d_backward",
        "aten::fractional_max_pool3d_backward",
        # torch.nn.MaxUnpool1d/2d/3d (1d runs max_unpool2d)
        "aten::max_unpool2d",
        "aten::max_unpool3d",
        # interpolate linear/bilinear/bicubic/trilinear (antialiased too), differentiated
        "aten::upsample_linear1d_backward",
        "aten::upsample_bilinear2d_backward",
        "aten::upsample_bicubic2d_backward",
        "aten::upsample_trilinear3d_backward",
        "aten::_upsample_bilinear2d_aa_backward",
        "aten::_upsample_bicubic2d_aa_backward",
        # torch.nn.ReflectionPad1d/2d/3d, differentiated
        "aten::reflection_pad1d_backward",
        "aten::reflection_pad2d_backward",
        "aten::reflection_pad3d_backward",
        # torch.nn.NLLLoss (cross_entropy too), forward and backward
        "aten::nll_loss_forward",
        "aten::nll_loss_backward",
        "aten::nll_loss2d_forward",
        "aten::nll_loss2d_backward",
        # torch.nn.CTCLoss, differentiated
        "aten::_ctc_loss_backward",
        # torch.nn.EmbeddingBag mode="max", differentiated (every mode, rule 3)
        "aten::_embedding_bag_backward",
        "aten::_embedding_bag_dense_backward",
        # torch.histc, torch.bincount (rule 3)
        "aten::histc",
        "aten::bincount",
        # torch.median with indices
        "aten::median.dim",
        "aten::median.dim_values",
        # torch.nn.functional.grid_sample, differentiated
        "aten::grid_sampler_2d_backward",
        "aten::grid_sampler_3d_backward",
        "aten::cudnn_grid_sampler_backward",
        # torch.cumsum (every dtype, rule 3)
        "aten::cumsum",
        "aten::cumsum_",
        # Not in the docstring (rule 6): the fused attention backwards (scaled_dot_product_
        # attention differentiated), which accumulate with atomics on CUDA
        "aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::_scaled_dot_product_cudnn_attention_backward",
        "aten::_efficient_attention_backward",
        "aten::_flash_attention_backward",
    }
)

# Device types whose kernels for the ops above are nondeterministic (rule 2). A module
# constant so that a test can let the CPU play CUDA.
_DEVICE_TYPES = frozenset({"cuda"})

_deterministic = torch._C._get_deterministic_algorithms
_warn_only = torch._C._get_deterministic_algorithms_warn_only


def listed(func) -> bool:
    """Whether op overload ``func`` is nondeterministic on CUDA (rule 1): in the table, by
    overload or by packet, or tagged ``nondeterministic_bitwise``."""
    name = func.name()
    return (
        name in NONDETERMINISTIC_CUDA
        or func._schema.name in NONDETERMINISTIC_CUDA
        or torch.Tag.nondeterministic_bitwise in func.tags
    )


def deterministic_mode() -> tuple[bool, bool]:
    """``(use_deterministic_algorithms, warn_only)`` as set now (two C calls)."""
    return _deterministic(), _warn_only()


def pins_nondeterministic(info, t: torch.Tensor) -> bool:
    """Whether ``t``, an output (or written version) of op ``info`` made just now, is pinned
    (rule 2). Callers test ``info.nondet`` first: this runs for the table's ops only."""
    return (
        info.nondet
        and t.device.type in _DEVICE_TYPES
        and not (_deterministic() and not _warn_only())
    )

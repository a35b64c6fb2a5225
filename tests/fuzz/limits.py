"""The known limits the differential fuzzer leaves out, by name (NOTE [ Differential fuzzer ]
rule 3 in check.py). Each is documented where it is cited; the generator (templates/) and
the checker (check.py) call the predicates below, so that a failure the fuzzer reports
is a new bug, not one of these.

Remove an entry when its limit is fixed, and let the fuzzer find out whether it really is.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

import tritondtr.runtime as rt


class KnownLimit(NamedTuple):
    """One open limit: ``name`` (cited in the code that avoids it), ``where`` it is documented,
    ``what`` goes wrong, and ``excluded``: what the fuzzer does not generate or run."""

    name: str
    where: str
    what: str
    excluded: str


KNOWN_LIMITS = (
    KnownLimit(
        "inplace-view-op-with-grad",
        "docs/runtime.md, Semantics that users see: Not supported",
        "an in-place view op (t_, transpose_, swapdims_, unsqueeze_, ...) on a tracked tensor "
        "that requires grad, with views of it and a backward through them: a wrong gradient "
        "(silent) or 'returned an invalid gradient' (fuzz seeds 72619, 73618)",
        "in-place view ops only on tensors that do not require grad",
    ),
    KnownLimit(
        "tolist-of-conj-view",
        "docs/runtime.md, Semantics that users see: Known, loud",
        ".tolist() of a conjugate view of a plain tensor in a session raises 'unallocated "
        "storage' (fuzz seed 72582)",
        "no .tolist() of a tensor whose conjugate bit is set",
    ),
    KnownLimit(
        "write-to-empty-input",
        "docs/runtime.md, Semantics that users see: Known, loud",
        "an in-place write to an empty plain input a tracked op read gives StaleInputError at "
        "the recomputation: an empty storage has no address to watch (seeds 61776, 70098)",
        "no in-place write to a tensor with no elements",
    ),
    KnownLimit(
        "unwatched-writes",
        "NOTE [ Parameter writes ] rule 4 (tritondtr/runtime/boundary.py)",
        "a write the session cannot see (after exit, or in a second session to memory the first "
        "one's recipes read) makes a later recomputation raise StaleInputError or read the new "
        "contents",
        "after exit, in-place writes only to a clone made after exit; a run split in two "
        "sessions splits after the body's last line that writes memory in place",
    ),
    KnownLimit(
        "median-of-overlapping-memory",
        "PyTorch (eager is wrong): torch 2.13 CPU",
        "median(dim) and nanmedian(dim) of a tensor with a stride-0 dimension (an expand) give "
        "wrong values in eager PyTorch: the reference itself is wrong (seeds 60083, 71549)",
        "median and nanmedian only of tensors with no stride-0 dimension of size > 1",
    ),
    KnownLimit(
        "masked-select-grad-strides",
        "NOTE [ Op semantics ] rule 7 (tritondtr/runtime/semantics.py)",
        "the gradient masked_select's backward returns for a non-contiguous input that requires "
        "grad is contiguous where eager's keeps the input's layout (PyTorch's formula takes an "
        "out-of-place masked_scatter, which clones contiguous, when grad or mask is a tensor "
        "subclass); values equal, a leaf's .grad is restrided by autograd, autograd.grad's "
        "result is not (seed 104688)",
        "masked_select only of contiguous tensors or tensors that do not require grad",
    ),
    KnownLimit(
        "hand-assigned-wrapper-grad",
        "tests/runtime/test_grads_after_exit.py (strict xfail, fuzz seed 300075; seeds 300282 and "
        "300351, the plain-leaf case, are fixed and stay excluded until the limit goes)",
        "a wrapper assigned by hand to the .grad of a tensor the session made stays a "
        "wrapper after exit (autograd's own accumulation gives a plain .grad there)",
        "a hand-assigned .grad only on the program's first leaves (a0, a1, ...) and only a "
        "plain tensor (made under no_grad from the leaf)",
    ),
    KnownLimit(
        "plain-data-of-wrapper-after-exit",
        "docs/runtime.md, Limitations and unsupported ops; NOTE [ Plain .data assignment ] "
        "rule 4 (tritondtr/runtime/plaindata.py); strict xfail in "
        "tests/runtime/test_data_assignment.py",
        "p.data = w for a plain p and a wrapper w with no session active gives p the "
        "wrapper's empty storage: the next op on p crashes the process",
        "after exit, .data is assigned only tensors made after exit",
    ),
    KnownLimit(
        "values-only-linalg-under-a-mode",
        "PyTorch (composite ops branch on any dispatch mode): docs/runtime.md, Limitations "
        "and unsupported ops; strict xfail in tests/runtime/test_op_semantics.py",
        "linalg.svdvals, eigvalsh and eigvals (and matrix_norm 'nuc' / 2 / -2, cond, "
        "matrix_rank built on them) compute the vectors too whenever a dispatch mode is "
        "active (_may_require_fw_or_bw_grad's isTensorSubclassLike), and LAPACK's values then "
        "differ from eager's in the last bits where the input does not require grad (seeds 34, "
        "65 of the linalg template)",
        "those ops only on inputs that require grad (eager then takes the same path)",
    ),
    KnownLimit(
        "leaf-data-reshaped-under-a-graph",
        "docs/runtime.md, Limitations and unsupported ops; strict xfail in "
        "tests/runtime/test_data_assignment.py",
        "p.data given another shape while a graph built on p's old shape lives: autograd "
        "accumulates a gradient of the old shape, which Python's .grad setter refuses, so a "
        "gradient computed in the session stays a wrapper after exit (before: the session's "
        "hook raised inside backward, fuzz seed 400168)",
        ".data of another shape only on tensors that are not leaves requiring grad",
    ),
    KnownLimit(
        "view-replay-after-data-reshape",
        "PyTorch (autograd replays a wrapper subclass's views by their ops, a plain tensor's "
        "by as_strided): docs/runtime.md, Limitations and unsupported ops; strict xfail in "
        "tests/runtime/test_data_assignment.py",
        "an autograd view written in place whose base's .data then took another shape, and "
        "written again: regenerating its grad_fn replays the view's ops on the new shape and "
        "raises (is_leaf, grad_fn), where eager's as_strided gives a node (fuzz seed 501702)",
        ".data of another shape only on tensors that are not autograd views and of which the "
        "namespace holds no autograd view",
    ),
    KnownLimit(
        "data-swap-shares-version",
        "docs/runtime.md, Semantics that users see: Known, loud; strict xfail in "
        "tests/runtime/test_data_assignment.py",
        "v.data = new keeps the version counter v shares with its base or views (PyTorch's "
        "set_data), so a later in-place write to v's new memory moves the base's _version: a "
        "recomputation reading the unchanged plain base raises StaleInputError (fuzz seed "
        "601102; eager raises the same only where autograd saved the base)",
        ".data assigned only to tensors that are not views and share memory with no other "
        "tensor of the namespace",
    ),
    KnownLimit(
        "det-double-backward-under-a-mode",
        "PyTorch (det's backward branches on any dispatch mode): docs/runtime.md, Limitations "
        "and unsupported ops; strict xfail in tests/runtime/test_autograd.py",
        "the gradient of linalg.det with create_graph=True differs from eager's in the last "
        "bits under any dispatch mode, a no-op one too (fuzz seed 405550)",
        "linalg.det only of inputs that do not require grad",
    ),
)

_BY_NAME = {k.name: k for k in KNOWN_LIMITS}


def limit(name: str) -> KnownLimit:
    """The known limit called ``name``; KeyError for a name not in :data:`KNOWN_LIMITS`."""
    return _BY_NAME[name]


def may_inplace_view_op(t: torch.Tensor) -> bool:
    """inplace-view-op-with-grad."""
    return not t.requires_grad


def may_tolist(t: torch.Tensor) -> bool:
    """tolist-of-conj-view."""
    return not t.is_conj()


def may_write(t: torch.Tensor) -> bool:
    """write-to-empty-input."""
    return t.numel() > 0


def may_median(t: torch.Tensor) -> bool:
    """median-of-overlapping-memory."""
    return all(s != 0 or n <= 1 for s, n in zip(t.stride(), t.shape))


def may_masked_select(t: torch.Tensor) -> bool:
    """masked-select-grad-strides."""
    return t.is_contiguous() or not t.requires_grad


def may_values_only_linalg(t: torch.Tensor) -> bool:
    """values-only-linalg-under-a-mode."""
    return t.requires_grad and torch.is_grad_enabled()


def may_reshape_data(t: torch.Tensor, ns: dict | None = None) -> bool:
    """leaf-data-reshaped-under-a-graph (a multi-output view written in place raises for
    ``is_leaf``: not reshaped either); with the namespace ``ns``, view-replay-after-data-
    reshape too."""
    try:
        if t.is_leaf and t.requires_grad:
            return False
    except RuntimeError:
        return False
    if ns is None:
        return True
    return t._base is None and not any(
        isinstance(v, torch.Tensor) and v._base is t for v in ns.values()
    )


def may_swap_data(t: torch.Tensor, ns: dict) -> bool:
    """data-swap-shares-version: ``t`` shares its version counter with no tensor of ``ns``: it
    is no autograd view and no other tensor there is a view of it or shares its memory (a
    ``view(dtype)`` of a tensor requiring grad is no autograd view, yet shares both)."""

    def ptr(v: torch.Tensor) -> int:
        try:
            return v.untyped_storage().data_ptr()
        except RuntimeError:  # no storage (sparse, ...)
            return 0

    if t._base is not None:
        return False
    p = ptr(t)
    return not any(
        isinstance(v, torch.Tensor) and v is not t and (v._base is t or (p and ptr(v) == p))
        for v in ns.values()
    )


def may_assign_grad(name: str) -> bool:
    """hand-assigned-wrapper-grad: ``name`` is one of the leaves made before the session."""
    return name.startswith("a")


def split_points(writes: list[bool]) -> range:
    """unwatched-writes: the body lines where a second session may start, given which body
    lines write memory in place (a split at ``k`` runs lines ``[0, k)`` in the first session):
    after the last writing line, and leaving each session at least one line."""
    last = max((i for i, w in enumerate(writes) if w), default=-1)
    return range(max(last + 1, 1), len(writes))


def expected_refusal(e: BaseException) -> bool:
    """Whether UnsupportedOpError ``e`` is a refusal docs/runtime.md documents (Limitations:
    ``t.data = plain`` for a tracked ``t``): raised by the wrapper's ``.data`` setter with a
    plain ``new`` (read from the setter's frame: in a second session, ``c.data =
    c.detach()[1:]`` of a first session's ``c`` assigns a plain tensor too)."""
    setter = rt.DTRTensor.data.fset.__code__
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is setter:
            new = tb.tb_frame.f_locals.get("new")
            return isinstance(new, torch.Tensor) and not rt.is_tracked(new)
        tb = tb.tb_next
    return False

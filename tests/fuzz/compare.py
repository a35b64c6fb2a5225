"""What the differential fuzzer compares (NOTE [ Differential fuzzer ] rule 2 in check.py):
a :func:`snapshot` of every tensor a program's namespace holds (plain values, as
``tritondtr.runtime.unwrap`` gives them), and :func:`compare` of two snapshots, exactly."""

from __future__ import annotations

from typing import NamedTuple

import torch

import tritondtr.runtime as rt

from .programs import HEADER_NAMES


class Entry(NamedTuple):
    """One tensor of a snapshot: copies of its value and ``.grad`` (None when it has none)
    and its metadata. ``stride`` is None for non-strided layouts."""

    value: torch.Tensor
    grad: torch.Tensor | None
    requires_grad: bool
    is_leaf: bool | str
    shape: tuple[int, ...]
    stride: tuple[int, ...] | None
    grad_type: str | None


class Scalar(NamedTuple):
    """A Python number the program computed (``.item()``, ``.sum().item() + 0``)."""

    value: int | float | bool


def _entry(t: torch.Tensor) -> Entry:
    try:
        is_leaf: bool | str = t.is_leaf
        g = t.grad if (is_leaf or t.retains_grad) else None
    except RuntimeError as e:  # a multi-output view written in place: its grad_fn raises
        is_leaf, g = f"raises {str(e)[:60]}", None
    return Entry(
        rt.unwrap(t).detach().clone(),
        None if g is None else rt.unwrap(g).detach().clone(),
        t.requires_grad,
        is_leaf,
        tuple(t.shape),
        tuple(t.stride()) if t.layout == torch.strided else None,
        None if g is None else type(g).__name__,
    )


def snapshot(ns: dict) -> dict[str, Entry | Scalar | None]:
    """Name -> entry for every tensor, list or tuple of tensors (``name[i]``; None for a
    None item, as ``autograd.grad(allow_unused=True)`` gives) and Python number in ``ns``."""
    out: dict[str, Entry | Scalar | None] = {}
    for n, v in list(ns.items()):
        if n.startswith("__") or n in HEADER_NAMES:
            continue
        if isinstance(v, torch.Tensor):
            out[n] = _entry(v)
        elif isinstance(v, (tuple, list)) and v and all(t is None or _is_t(t) for t in v):
            for j, t in enumerate(v):
                out[f"{n}[{j}]"] = None if t is None else _entry(t)
        elif isinstance(v, (bool, int, float)):
            out[n] = Scalar(v)
    return out


def _is_t(v) -> bool:
    return isinstance(v, torch.Tensor)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal`` with NaN equal to NaN in the same places, and dtypes equal."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point or a.dtype.is_complex:
        na, nb = a.isnan(), b.isnan()
        return torch.equal(na, nb) and torch.equal(a.masked_fill(na, 0), b.masked_fill(nb, 0))
    return torch.equal(a, b)


def same_entry(r, g) -> bool:
    return not _diff("", r, g)


def compare(ref: dict, got: dict, *, allow_missing: bool = False) -> list[str]:
    """One line per difference of ``got`` from ``ref`` (empty: equal). ``allow_missing``:
    names of ``ref`` absent from ``got`` are not differences."""
    diffs: list[str] = []
    for k, r in ref.items():
        if k not in got:
            if not allow_missing:
                diffs.append(f"{k} missing")
            continue
        diffs += _diff(k, r, got[k])
    return diffs


def _diff(k: str, r, g) -> list[str]:
    if r is None or g is None or isinstance(r, Scalar) or isinstance(g, Scalar):
        if type(r) is not type(g):
            return [f"{k}: eager {type(r).__name__}, tritondtr {type(g).__name__}"]
        if r is None:
            return []
        nan = r.value != r.value and g.value != g.value
        if not (r.value == g.value or nan):
            return [f"{k}: Python value eager {r.value!r}, tritondtr {g.value!r}"]
        return []
    out = []
    if not same_values(r.value, g.value):
        out.append(
            f"{k}: VALUE differs (eager {r.value.dtype} {r.shape}, tritondtr {g.value.dtype})"
        )
    if (r.grad is None) != (g.grad is None):
        out.append(f"{k}: .grad eager {r.grad is not None}, tritondtr {g.grad is not None}")
    elif r.grad is not None and not same_values(r.grad, g.grad):
        out.append(f"{k}: GRAD differs")
    for field in ("requires_grad", "is_leaf", "shape", "stride"):
        a, b = getattr(r, field), getattr(g, field)
        if a != b:
            out.append(f"{k}: {field} eager {a}, tritondtr {b}")
    if g.grad_type not in (None, "Tensor") and g.is_leaf is True:
        out.append(f"{k}: a leaf's .grad is a {g.grad_type} after exit")
    return out

"""Backend dispatch of scoring and selection: Triton kernels or their torch twins."""

from __future__ import annotations

import enum
import functools
import os
import warnings

import torch

from .heuristics import CustomHeuristic, Heuristic, get_heuristic
from .scoring import random_base, score_torch, select_torch

__all__ = [
    "Backend",
    "check_now",
    "resolve_backend",
    "score",
    "select",
    "selection",
    "triton_available",
]


class Backend(str, enum.Enum):
    """Where scoring runs. ``auto``: Triton on CUDA tensors, torch elsewhere. ``triton``: the
    Triton kernels (CPU tensors only under ``TRITON_INTERPRET=1``). ``torch``: the twins."""

    AUTO = "auto"
    TRITON = "triton"
    TORCH = "torch"


@functools.cache
def triton_available() -> bool:
    """Whether the Triton kernels can be imported (triton installed and importable)."""
    try:
        from .. import kernels  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _warn_fallback() -> None:
    """Once per process: a CUDA table scores with the torch twin (same victims, slower)."""
    warnings.warn(
        "tritondtr: the Triton kernels cannot be imported (is triton installed?); CUDA tables "
        "score with the torch twins (the same victims, slower). stats.backend says which ran.",
        stacklevel=3,
    )


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_backend(
    backend: Backend | str, device: torch.device, heuristic: Heuristic | CustomHeuristic
) -> Backend:
    """The concrete backend (``triton`` or ``torch``) for ``device`` and ``heuristic``."""
    try:
        backend = Backend(backend)
    except ValueError:
        raise ValueError(
            f"unknown backend {backend!r}; expected one of {[b.value for b in Backend]}"
        ) from None
    custom = isinstance(heuristic, CustomHeuristic)
    if backend is Backend.AUTO:
        if device.type == "cuda" and not custom:
            if triton_available():
                return Backend.TRITON
            _warn_fallback()
        return Backend.TORCH
    if backend is Backend.TRITON:
        if custom:
            raise ValueError(
                f"heuristic {heuristic.name!r} is a user heuristic: it has no Triton kernel; "
                "use backend='torch' or 'auto'"
            )
        if not triton_available():
            raise ValueError("backend='triton' needs the triton package; install it or use 'torch'")
        if device.type != "cuda" and not _interpreting():
            raise ValueError(
                f"backend='triton' on a {device.type} table needs TRITON_INTERPRET=1 set before "
                "tritondtr.kernels is imported; use backend='torch' or 'auto' on CPU (a "
                "session's table is on the host unless enable(table='device'))"
            )
    return backend


def _args(cols: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return cols["cost"], cols["size"], cols["last_access"], cols["nbhd_cost"], cols["state"]


def score(
    heuristic: Heuristic | CustomHeuristic | str,
    cols: dict[str, torch.Tensor],
    now: int,
    *,
    backend: Backend | str = Backend.AUTO,
    seed: int = 0,
    clock_bounds: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Scores of all slots of ``cols`` (see :meth:`MetadataTable.score`). ``cols`` may hold
    the table's derived ``evictable_size``; it and ``clock_bounds`` (every last_access lies in
    [lo, hi]) only speed up the torch twin (:func:`tritondtr.policy.scoring.score_torch`)."""
    h = get_heuristic(heuristic)
    now = check_now(now)
    b = resolve_backend(backend, cols["cost"].device, h)
    if b is Backend.TORCH:
        return score_torch(h, *_args(cols), now, seed, cols.get("evictable_size"), clock_bounds)
    from .. import kernels

    return kernels.score(h.value, *_args(cols), now=now, rand_base=random_base(seed, now))


def select(
    heuristic: Heuristic | CustomHeuristic | str,
    cols: dict[str, torch.Tensor],
    now: int,
    *,
    k: int = 1,
    backend: Backend | str = Backend.AUTO,
    seed: int = 0,
    clock_bounds: tuple[int, int] | None = None,
    host: bool = True,
) -> torch.Tensor:
    """Victim slots of ``cols``, [min(k, #candidates)] int64 on the host, best first;
    ``evictable_size`` and ``clock_bounds`` as for :func:`score`. ``host=False``: on the
    columns' device, unread, [k] padded with -1 past the candidates (the caller reads it:
    NOTE [ Private stream ] in table.py)."""
    h = get_heuristic(heuristic)
    now = check_now(now)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    b = resolve_backend(backend, cols["cost"].device, h)
    if b is Backend.TORCH:
        evs = cols.get("evictable_size")
        ids = select_torch(h, *_args(cols), now, k, seed, evs, clock_bounds)
        return ids.cpu() if host else ids
    from .. import kernels

    ids = kernels.select(h.value, *_args(cols), now=now, rand_base=random_base(seed, now), k=k)
    if not host:
        return ids
    ids = ids.cpu()  # the one device-to-host read of a decision
    return ids[ids >= 0]


def selection(
    heuristic: Heuristic | CustomHeuristic | str,
    cols: dict[str, torch.Tensor],
    *,
    k: int = 1,
    backend: Backend | str = Backend.AUTO,
):
    """A prepared Triton selection over ``cols`` for repeated decisions, or None where the
    torch twin selects (a CPU table, a user heuristic, ``backend='torch'``).

    ``sel.victims(now, random_base(seed, now))`` then gives what :func:`select` gives, as a
    list, without validating ``cols`` or allocating again (NOTE [ One-launch selection ] rule
    7 in kernels/topk_select.py). The columns' storage must outlive it unchanged.
    """
    h = get_heuristic(heuristic)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if resolve_backend(backend, cols["cost"].device, h) is Backend.TORCH:
        return None
    from .. import kernels

    return kernels.Selection(h.value, _args(cols), k=k)


def check_now(now) -> int:
    """``now`` as the int logical clock every score reads; ValueError if it is none."""
    if isinstance(now, torch.Tensor) or not isinstance(now, (int,)) or isinstance(now, bool):
        try:
            now = int(now)
        except (TypeError, ValueError):
            raise ValueError(f"now must be an int logical clock, got {now!r}") from None
    return now

"""Runtime configuration: a frozen dataclass validated on construction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import torch

from ..core.link import parse_bandwidth
from ..policy.backend import Backend
from ..policy.heuristics import CustomHeuristic, Heuristic, get_heuristic
from ..units import parse_bytes
from .cost import CostFn, CostModel
from .device import MemoryShare, parse_device, parse_share

__all__ = ["NeverEvict", "RuntimeConfig", "TablePlace"]

NeverEvict = Callable[[str, torch.Tensor], bool]
"""``fn(op_name, output) -> bool``: True pins the output's storage (never evicted).
``op_name`` is like ``"aten.mm.default"``, ``output`` the plain tensor just computed."""


class TablePlace(str, Enum):
    """Where a session's metadata table lives (NOTE [ Decisions on the host ] in core/core.py):
    ``host`` (numpy arrays; the bounded choice), ``device`` (the session's device: the Triton
    selection on a private stream)."""

    HOST = "host"
    DEVICE = "device"


@dataclass(frozen=True)
class RuntimeConfig:
    """Options of :func:`tritondtr.enable`.

    Args:
        budget: bytes (int), a string with a unit (``"512MiB"``, ``"1.5GB"``), a share of the
            device memory free at entry (``"auto"``: 90 %, or ``"80%"``; a
            :class:`~tritondtr.runtime.device.MemoryShare` after validation, resolved at
            entry: NOTE [ Memory share budgets ] in device.py), or None: track without
            evicting (measures the baseline peak in the same accounting).
        heuristic: eviction heuristic name (see :func:`tritondtr.heuristic_names`).
        backend: scoring backend, ``auto`` / ``triton`` / ``torch``.
        stress: evict everything evictable after every op (testing); takes no budget.
        debug: check the engine's and the runtime's invariants after every op (slow).
        never_evict: predicate ``fn(op_name, output) -> bool`` pinning outputs.
        pin_backward: storages created during the backward pass are evicted only when nothing
            else can be (NOTE [ Backward storages ] in core/backward.py).
        cost: how an op is priced (NOTE [ Cost models ] in cost.py): ``"auto"``
            (``measured`` on a CPU session, the H100 model on a CUDA one), ``"measured"``
            (its wall time), ``"analytic"`` (FLOPs and bytes: a nominal machine on CPU, an
            H100 SXM on CUDA, the same on every run), ``"events"`` (CUDA only: CUDA event
            times of ops' first executions), or a callable ``fn(op, args, kwargs, out) ->
            float`` in ns; normalized to a :class:`CostModel` or the callable.
        device: the device whose outputs are tracked (NOTE [ Session device ] in device.py);
            None: the first CUDA output's when CUDA is available, else the first output's.
        table: where the metadata table lives, ``host`` or ``device`` (:class:`TablePlace`).
        timeline: record the memory timeline (``stats.timeline``, NOTE [ Memory timeline ] in
            timeline.py): a row per op with the tracked bytes, the counts so far and the
            phase; off, the per-op path does no work for it.
        offload: victims may also be copied to host memory (NOTE [ Offload ] in
            core/core.py): False (the default); True (the link's bandwidth measured once per
            device); or the bandwidth, bytes per second, ``"25GB/s"`` or a named link
            (``pcie4``, ``pcie5``, ``nvlink-c2c``). Normalized to None, True or a float.
    """

    budget: int | None = None
    heuristic: Heuristic | CustomHeuristic | str = "dtr_eq"
    backend: Backend | str = "auto"
    stress: bool = False
    debug: bool = False
    never_evict: NeverEvict | None = None
    pin_backward: bool = True
    cost: CostModel | CostFn | str = "auto"
    device: torch.device | str | None = None
    table: TablePlace | str = "host"
    timeline: bool = False
    offload: bool | float | str | None = False

    def __post_init__(self) -> None:
        share = parse_share(self.budget) if isinstance(self.budget, str) else None
        if share is not None:
            object.__setattr__(self, "budget", share)
        elif self.budget is not None and not isinstance(self.budget, MemoryShare):
            try:
                b = parse_bytes(self.budget)
            except ValueError as e:
                raise ValueError(
                    f"budget: {e}; 'auto' or 'P%' for a share of the free device memory; or "
                    "None to track without evicting"
                ) from None
            object.__setattr__(self, "budget", b)
        object.__setattr__(self, "device", parse_device(self.device))
        object.__setattr__(self, "table", _member(TablePlace, self.table, "table place"))
        object.__setattr__(self, "heuristic", get_heuristic(self.heuristic))
        object.__setattr__(self, "backend", _member(Backend, self.backend, "backend"))
        for name in ("stress", "debug", "pin_backward", "timeline"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.stress and self.budget is not None:
            raise ValueError(
                f"stress=True evicts everything evictable after every op and takes "
                f"no budget; got budget={self.budget!r}; pass budget=None"
            )
        if self.offload is False or self.offload is None:
            object.__setattr__(self, "offload", None)
        elif self.offload is not True:
            try:
                object.__setattr__(self, "offload", parse_bandwidth(self.offload))
            except ValueError as e:
                raise ValueError(f"offload: {e}; or True to measure it, False for none") from None
        if self.never_evict is not None and not callable(self.never_evict):
            raise ValueError(
                "never_evict must be a callable fn(op_name, output) -> bool, got "
                f"{type(self.never_evict).__name__}"
            )

        if isinstance(self.cost, str):
            try:
                object.__setattr__(self, "cost", CostModel(self.cost))
            except ValueError:
                raise ValueError(
                    f"unknown cost model {self.cost!r}; expected one of "
                    f"{[c.value for c in CostModel]} or a callable fn(op, args, kwargs, out) "
                    "-> float (ns)"
                ) from None
            if self.cost is CostModel.EVENTS and not torch.cuda.is_available():
                raise ValueError(
                    "cost='events' times ops with CUDA events, and CUDA is not available "
                    f"(torch {torch.__version__}): use cost='measured' (exact on CPU: its ops "
                    "are synchronous) or cost='analytic'"
                )
        elif not callable(self.cost):
            raise ValueError(
                f"cost must be {[c.value for c in CostModel]} or a callable fn(op, args, "
                f"kwargs, out) -> float (ns), got {type(self.cost).__name__}"
            )

    @property
    def evicting(self) -> bool:
        """Whether anything is ever evicted (a budget, or stress)."""
        return self.budget is not None or self.stress


def _member(enum: type[Enum], value, what: str):
    """``enum(value)``, or a ValueError naming ``what`` and the expected values."""
    try:
        return enum(value)
    except ValueError:
        raise ValueError(
            f"unknown {what} {value!r}; expected one of {[m.value for m in enum]}"
        ) from None

"""``tritondtr.enable``: the runtime's entry point."""

from __future__ import annotations

import torch

from ..policy.backend import Backend
from ..policy.heuristics import CustomHeuristic, Heuristic
from .config import NeverEvict, RuntimeConfig, TablePlace
from .cost import CostFn, CostModel
from .dynamo import opaque
from .session import Session

__all__ = ["enable"]


@opaque
def enable(
    budget: int | str | None = None,
    *,
    heuristic: Heuristic | CustomHeuristic | str = "dtr_eq",
    backend: Backend | str = "auto",
    stress: bool = False,
    debug: bool = False,
    never_evict: NeverEvict | None = None,
    pin_backward: bool = True,
    cost: CostModel | CostFn | str = "auto",
    device: torch.device | str | None = None,
    table: TablePlace | str = "host",
    timeline: bool = False,
    offload: bool | float | str = False,
) -> Session:
    """Run eager PyTorch code under a byte budget, recomputing what was evicted.

    Use as ``with tritondtr.enable(budget="2GiB") as session:`` around forward, backward and
    the optimizer step; ``session.stats`` tells what happened. Gradients equal those of the
    same code without tritondtr, bit for bit. See docs/runtime.md.

    Sessions do not nest: entering one (``enable`` or ``tritondtr.trace``) while another is
    active on the same thread raises. One session is one budget; put it around the whole
    step, or exit the outer session first (NOTE [ Nested sessions ] in session.py).

    Args:
        budget: bytes (int) or a string with a unit (``"512MiB"``, ``"1.5GB"``);
            ``"auto"`` (90 % of the device memory free at entry) or a share such as ``"80%"``
            (NOTE [ Memory share budgets ] in runtime/device.py); ``None`` tracks without
            evicting and so measures the baseline peak in the same accounting.
        heuristic: eviction heuristic (``dtr_eq``, ``dtr``, ``dtr_local``, ``msps``, ``lru``,
            ``size``, ``random``, or a registered user heuristic).
        backend: scoring backend: ``auto``, ``triton`` or ``torch``.
        stress: evict everything evictable after every op (tests); needs ``budget=None``.
        debug: check invariants after every op (slow).
        never_evict: ``fn(op_name, output) -> bool``; True pins that output.
        pin_backward: evict storages made by the backward pass only as a last resort.
        cost: what an op costs the heuristics (NOTE [ Cost models ] in runtime/cost.py):
            ``"auto"`` (the default: ``measured`` on CPU, the H100 model on CUDA),
            ``"measured"`` (wall time of its first execution, ns; on CUDA the launch only),
            ``"analytic"`` (FLOPs and bytes read and written on a nominal machine on CPU, on
            an H100 SXM on CUDA: the same decisions on every run;
            :class:`~tritondtr.runtime.AnalyticCost` for other constants), ``"events"``
            (CUDA only: the H100 model until CUDA events measured the op's kernels), or a
            callable ``fn(op, args, kwargs, out) -> float``, ns, finite and > 0, called once
            per op on plain tensors.
        device: the device whose outputs are tracked (``"cuda"``, ``"cuda:1"``, ``"cpu"``);
            None: the first CUDA output's when CUDA is available, else the first output's
            (NOTE [ Session device ] in runtime/device.py). Outputs elsewhere stay plain.
        table: where the eviction metadata lives: ``"host"`` (default: decisions never wait
            for the device) or ``"device"`` (the Triton selection on a private stream; NOTE
            [ Decisions on the host ] in core/core.py).
        timeline: record the memory of the step op by op (``session.stats.timeline``, drawn
            by :func:`tritondtr.plot_memory`; NOTE [ Memory timeline ] in
            runtime/timeline.py). Off (the default), the per-op path does no work for it.
        offload: victims may also be copied to host memory and back, whichever of that and
            recomputing is cheaper per victim (NOTE [ Offload ] in core/core.py): ``False``
            (the default), ``True`` (the link's bandwidth measured once per device), or its
            bandwidth (``"25GB/s"``, bytes per second, ``"pcie5"``). On a CPU session the
            host copy is CPU memory too: no memory is saved; it is there for tests and the
            twin. Copies are made ahead of the budget and brought back ahead of the read in
            the previous step's order (NOTE [ Asynchronous offload ] in core/offload.py).
            ``stats`` counts ``offloads``, ``offloaded_bytes``, ``fetches``,
            ``prefetches``, ``fetched_bytes``, ``link_busy_ns`` and ``link_wait_ns``.

    Raises:
        ValueError: an argument is invalid (the message says what was expected).
        CostError: inside the block, a ``cost`` callable raised or gave no finite cost > 0.
        RuntimeError: at entry, inside another active tritondtr session.
    """
    config = RuntimeConfig(
        budget=budget,
        heuristic=heuristic,
        backend=backend,
        stress=stress,
        debug=debug,
        never_evict=never_evict,
        pin_backward=pin_backward,
        cost=cost,
        device=device,
        table=table,
        timeline=timeline,
        offload=offload,
    )
    return Session(config)

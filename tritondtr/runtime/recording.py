"""``tritondtr.trace(...)``: record a real run in the simulator's trace format.

A :class:`Recording` runs a session (as :func:`tritondtr.enable` does) with a recorder
attached to the session's observer hook, and turns what the program did into a
:class:`tritondtr.sim.Trace` that ``tritondtr simulate`` and :func:`tritondtr.sim.simulate`
replay, so the simulator's prediction can be compared with what the runtime did.

What is recorded: NOTE [ Recording a trace ] in recorder.py.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from ..policy.backend import Backend
from ..policy.heuristics import CustomHeuristic, Heuristic
from ..traceformat.trace import Trace
from ..traceformat.trace_io import save_trace
from .config import NeverEvict, RuntimeConfig
from .cost import CostFn, CostModel, describe
from .dynamo import opaque
from .recorder import Recorder
from .session import Session

__all__ = ["Recording", "trace"]


class Recording:
    """A session that records its run as a :class:`~tritondtr.sim.Trace`; see
    :func:`tritondtr.trace`.

    Attributes:
        session: the :class:`~tritondtr.runtime.Session` that runs the code (budget, stats).
        path: where the trace is written on a clean exit, or None.
        trace: the recorded :class:`~tritondtr.sim.Trace`, set when the context exits (also
            after an exception; the file is then not written).
    """

    def __init__(
        self, session: Session, path: str | os.PathLike | None, meta: dict, compress: bool
    ) -> None:
        self.session = session
        self.path = None if path is None else Path(path)
        self.trace: Trace | None = None
        self._meta = meta
        self._compress = compress
        self._recorder: Recorder | None = None

    @property
    def stats(self):
        """The session's :class:`~tritondtr.runtime.SessionStats` (live)."""
        return self.session.stats

    @opaque
    def __enter__(self) -> Recording:
        if self._recorder is not None:
            raise RuntimeError(
                "a tritondtr Recording is entered once; call tritondtr.trace() again for a new one"
            )
        self._recorder = Recorder(self.session)
        self.session.observe(self._recorder)
        self.session.__enter__()
        return self

    @opaque
    def __exit__(self, *exc) -> bool:
        rec = self._recorder
        try:
            self.session.__exit__(*exc)
        finally:
            self.session.observe(None)
            rec.close()
            self.trace = rec.build(self._metadata(rec))
            rec.keep.clear()
        if exc[0] is None and self.path is not None:
            save_trace(self.trace, self.path, compress=self._compress)
        return False

    def _metadata(self, rec: Recorder) -> dict:
        cfg, core = self.session.config, self.session.core
        h = cfg.heuristic
        st = self.session.stats  # not asdict: it would rebuild the Counter from pairs
        stats = {f.name: getattr(st, f.name) for f in dataclasses.fields(st)}
        stats["op_counts"] = dict(st.op_counts)
        meta = {
            "source": "tritondtr.trace",
            "cost_unit": "ns",
            "cost_model": describe(cfg.cost, core.device),  # NOTE [ Cost models ]
            # NOTE [ Recording a trace ] rule 6: what the costs are
            "costs": "device time (CUDA events)" if rec.timed else "as the run scored",
            "size_unit": "bytes",
            "torch": torch.__version__,
            "device": None if core.device is None else str(core.device),
            "runtime": {
                "heuristic": str(getattr(h, "value", None) or getattr(h, "name", h)),
                "pin_backward": cfg.pin_backward,
                "stress": cfg.stress,
                "budget": core.budget,
                # NOTE [ Offload ] in core/core.py: the twin replays with the same link
                "offload_bandwidth": None if core.link is None else core.link.bandwidth,
                # NOTE [ Asynchronous offload ] rule 7: which copies the twin refuses
                "refused": list(core.copies.refused),
                **stats,
            },
            "recorder": {
                "ops": rec.ops,
                "untracked_ops": rec.untracked,
                "constants": len(rec.constants),
                "inplace_bytes_max": rec.inplace_bytes_max,
            },
        }
        meta.update(self._meta)
        return meta


@opaque  # NOTE [ Dynamo never traces the runtime ]
def trace(
    path: str | os.PathLike | None = None,
    *,
    budget: int | str | None = None,
    heuristic: Heuristic | CustomHeuristic | str = "dtr_eq",
    backend: Backend | str = "auto",
    stress: bool = False,
    debug: bool = False,
    never_evict: NeverEvict | None = None,
    pin_backward: bool = True,
    cost: CostModel | CostFn | str = "auto",
    meta: dict | None = None,
    compress: bool = True,
    offload: bool | float | str = False,
) -> Recording:
    """Run eager PyTorch code as :func:`tritondtr.enable` does and record it as a trace.

    ``with tritondtr.trace("step.npz") as rec:`` around forward, backward and the optimizer
    step; afterwards ``rec.trace`` is a :class:`tritondtr.sim.Trace` (op costs in ns, sizes in
    bytes, constants first) and ``rec.session.stats`` what the runtime did, also stored in
    ``rec.trace.meta["runtime"]``. The run itself is the same as under ``enable`` with the
    same options (budget, evictions, rematerializations); only the program is recorded,
    never the runtime's schedule (NOTE [ Recording a trace ]).

    Args:
        path: write the trace here on a clean exit; the form follows the suffix (``.npz``,
            ``.jsonl``, either + ``.gz``, see docs/trace-format.md). None: keep it in memory.
        budget, heuristic, backend, stress, debug, never_evict, pin_backward, cost, offload:
            as for :func:`tritondtr.enable` (``budget=None``: no eviction, the baseline run).
            The trace's costs are the ones the run scored with, and ``meta["cost_model"]``
            says which model gave them; under ``cost="events"`` (CUDA) each op's device time
            instead (``meta["costs"]`` says which). With ``offload``, ``meta["runtime"]``
            keeps the link's bandwidth, which the twin replays with.
        meta: extra JSON-able provenance merged into ``trace.meta`` (e.g. ``{"model": ...}``).
        compress: zip-compress a ``.npz`` file.

    Raises:
        ValueError: an option is invalid (the message says what was expected).
    """
    if path is not None:
        name = Path(path).name.removesuffix(".gz")
        if not name.endswith((".npz", ".jsonl", ".json")):
            raise ValueError(
                f"cannot tell the trace form from {Path(path).name!r}: use a .npz "
                "or .jsonl suffix, optionally followed by .gz"
            )
    if meta is not None and not isinstance(meta, dict):
        raise ValueError(f"meta must be a dict of JSON-able values, got {type(meta).__name__}")
    config = RuntimeConfig(
        budget=budget,
        heuristic=heuristic,
        backend=backend,
        stress=stress,
        debug=debug,
        never_evict=never_evict,
        pin_backward=pin_backward,
        cost=cost,
        offload=offload,
    )
    return Recording(Session(config), path, dict(meta or {}), compress)

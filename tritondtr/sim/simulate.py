"""Simulation runs and sweeps: budgets from ratios, one engine per run, results as rows."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

from ..core.link import Link
from ..core.tuning import CANDIDATES, choose
from ..traceformat.trace import Trace
from ..units import parse_bytes
from .baseline import baseline
from .program import compile_trace
from .replay import replay_program
from .twin import replay_runtime

__all__ = [
    "DEFAULT_RATIOS",
    "SEMANTICS",
    "SimResult",
    "make_engine",
    "runtime_peak",
    "simulate",
    "sweep",
]

DEFAULT_RATIOS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
SEMANTICS = ("paper", "runtime")


@dataclass(frozen=True)
class SimResult:
    """One budgeted replay (NOTE [ Replay semantics ]).

    ``status``: ``ok``, ``oom`` (an eviction was needed and nothing was evictable) or
    ``thrash`` (rematerialization compute exceeded ``(overhead_limit - 1) x`` the baseline).
    ``overhead``: compute (ns, the clock) / baseline compute, at the point of failure if any.
    ``evictions`` counts heuristic choices; ``eager_evictions`` storages evicted at their last
    release; ``remats`` rematerializing op runs; ``selections`` victim choices asked of the engine,
    ``scorings`` the full scorings it ran for them (it serves several choices from one, NOTE
    [ Exact batched choice ]); ``wall_s`` the replay's wall time in seconds.
    """

    trace: str
    heuristic: str
    ratio: float | None
    budget: int
    status: str
    overhead: float
    compute: float
    peak_bytes: int
    evictions: int
    eager_evictions: int
    remats: int
    remat_compute: float
    selections: int
    scorings: int
    wall_s: float
    action: str = "recompute"  # NOTE [ Offload ] in core/core.py: or "offload", "both"
    offloads: int = 0  # copies to the host (NOTE [ Asynchronous offload ] in core/offload.py)
    prefetches: int = 0  # copies back before the read
    link_wait: float = 0.0  # ns the ops waited for the link
    copy_scale: float = 1.0  # NOTE [ Copy price scale ] in core/tuning.py: at the run's end

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_dict(self) -> dict:
        return asdict(self)


def make_engine(
    heuristic: str, *, backend: str = "auto", device=None, seed: int = 0, capacity: int = 1024
):
    """A fresh :class:`tritondtr.engine.Engine` for one run."""
    from ..engine.engine import Engine

    return Engine(heuristic, device=device, backend=backend, seed=seed, capacity=capacity)


def simulate(
    trace: Trace,
    heuristic: str = "dtr_eq",
    *,
    ratio: float | None = None,
    budget: int | str | None = None,
    overhead_limit: float | None = None,
    backend: str = "auto",
    device=None,
    seed: int = 0,
    ties: str = "slot",
    engine_factory: Callable[..., object] | None = None,
    semantics: str = "paper",
    pin_backward: bool | None = None,
    offload_bandwidth: float | str | None = None,
    action: str = "both",
    ahead: bool = True,
    prefetch: bool | str = True,
    copy_scale: float | str | None = None,
) -> SimResult:
    """Replay ``trace`` under a memory budget with one heuristic.

    Give either ``ratio`` (of the baseline peak, :meth:`Baseline.budget`) or ``budget`` (bytes,
    or a string such as ``"2GiB"``). ``ties="simrd"`` breaks score ties in the reference
    simulator's order instead of the engine's lowest slot id (NOTE [ Tie order ]).
    ``engine_factory(heuristic)`` replaces the default engine (tests, instrumented engines).

    ``semantics``: ``"paper"`` (NOTE [ Replay semantics ], the DTR paper's simulator: every
    storage counted, constants included) or ``"runtime"`` (NOTE [ The twin ]: the runtime's
    own DTR core; the budget counts tracked storages only, the number ``tritondtr.enable``
    takes, and ``ratio`` is of the runtime's unlimited peak, :func:`runtime_peak`). In
    runtime semantics ``pin_backward`` defaults to the recorded run's setting (else True),
    and ``ties`` and ``engine_factory`` do not apply. ``overhead_limit`` (a multiple of the
    trace's compute; a run stops as ``thrash`` above it) defaults to 2.0 in the paper's
    semantics and to none in the runtime's (the runtime has none; it raises ThrashError).
    ``offload_bandwidth`` (bytes per second, ``"25GB/s"`` or a named link: NOTE [ Offload
    link ]; runtime semantics only; None: the recorded run's, if it offloaded): victims may be
    copied to the host over that link,
    ``action="both"`` (the cheaper of a drop and an offload, NOTE [ Offload ]),
    ``"offload"`` (every victim) or ``"recompute"`` (no link, whatever was recorded);
    ``ahead``: copies out before the budget binds; ``prefetch``: copies back in the previous
    step's order of reads (True), none (False) or in the trace's own order (``"trace"``: a
    recorded single step replayed as a step that repeats); True and True are the runtime's
    (NOTE [ Asynchronous offload ] in core/offload.py, NOTE [ The twin ] rule 8).
    ``copy_scale``: what a copy's price is multiplied by against a drop's (NOTE [ Copy price
    scale ] in core/tuning.py): None chooses it as the runtime does, by rehearsing the
    trace's first two steps (a single step stays at 1), a number fixes it, ``"trace"``
    replays the trace as a step that repeats: once at each candidate scale, the run the
    choice would keep on identical steps returned (:func:`~tritondtr.core.tuning.choose`;
    ``SimResult.copy_scale`` says which).
    Returns a :class:`SimResult`.
    """
    if prefetch not in (True, False, "trace"):
        raise ValueError(f"prefetch must be True, False or 'trace', got {prefetch!r}")
    if copy_scale is not None and copy_scale != "trace" and not _is_scale(copy_scale):
        raise ValueError(
            f"copy_scale must be None, 'trace' or a number >= 0 (inf: never copy), "
            f"got {copy_scale!r}"
        )
    if action not in ("both", "offload", "recompute"):
        raise ValueError(f"action must be 'both', 'offload' or 'recompute', got {action!r}")
    if action == "offload" and semantics != "runtime":
        raise ValueError("action='offload' is modelled in semantics='runtime' only")
    if copy_scale is not None and semantics != "runtime":
        raise ValueError("copy_scale is modelled in semantics='runtime' only")
    if offload_bandwidth is not None:
        if semantics != "runtime":
            raise ValueError("offload_bandwidth is modelled in semantics='runtime' only")
        Link(offload_bandwidth)  # a bad bandwidth fails before anything runs
    if (ratio is None) == (budget is None):
        raise ValueError("give exactly one of ratio= (of the baseline peak) or budget= (bytes)")
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")
    if overhead_limit is not None and not overhead_limit >= 1.0:
        raise ValueError(
            f"overhead_limit must be >= 1.0 (a multiple of the baseline compute), "
            f"got {overhead_limit!r}"
        )
    if semantics == "runtime":
        return _simulate_runtime(
            trace, heuristic, ratio, budget, overhead_limit, backend, device, pin_backward,
            offload_bandwidth, action, ahead, prefetch, copy_scale,
        )  # fmt: skip
    if overhead_limit is None:
        overhead_limit = 2.0
    base = baseline(trace)
    nbytes = base.budget(ratio) if ratio is not None else parse_bytes(budget)
    prog = compile_trace(trace)
    if engine_factory is None:
        engine = make_engine(
            heuristic,
            backend=backend,
            device=device,
            seed=seed,
            capacity=max(1024, prog.num_storages),
        )
    else:
        engine = engine_factory(heuristic)
    limit = base.compute * (overhead_limit - 1.0)
    stats = replay_program(prog, engine, nbytes, limit, ties=ties)
    scorings = int(getattr(engine, "selections", -1))
    return _result(trace, heuristic, ratio, nbytes, stats, base.compute, scorings)


def _result(trace, heuristic, ratio, nbytes: int, stats, compute: float, scorings: int):
    """The :class:`SimResult` of one replay's :class:`RunStats` (``compute``: the trace's
    compute without rematerialization, the overhead's denominator)."""
    return SimResult(
        trace=str(trace.meta.get("name", trace.meta.get("source", "trace"))),
        heuristic=str(getattr(heuristic, "value", heuristic)),
        ratio=ratio,
        budget=nbytes,
        status=stats.status,
        overhead=stats.clock / compute if compute > 0 else math.nan,
        compute=stats.clock,
        peak_bytes=stats.peak_bytes,
        evictions=stats.evictions,
        eager_evictions=stats.eager_evictions,
        remats=stats.remats,
        remat_compute=stats.remat_compute,
        selections=stats.selections,
        scorings=scorings,
        wall_s=stats.wall_s,
    )


def runtime_peak(trace: Trace, pin_backward: bool | None = None) -> int:
    """The runtime's unlimited peak of ``trace``: the most bytes of tracked storages resident
    at once with ``budget=None`` (NOTE [ The twin ] rule 5); what ratios multiply in runtime
    semantics."""
    stats, _ = replay_runtime(
        trace, "dtr_eq", None, pin_backward=_pin_backward(trace, pin_backward)
    )
    return stats.peak_bytes


def _pin_backward(trace: Trace, given: bool | None) -> bool:
    if given is not None:
        return bool(given)
    return bool(trace.meta.get("runtime", {}).get("pin_backward", True))


def _is_scale(x) -> bool:
    """Whether ``x`` is a number >= 0 (a copy price scale; ``inf`` included)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and x >= 0.0


def _simulate_runtime(
    trace, heuristic, ratio, budget, overhead_limit, backend, device, pin_backward,
    offload_bandwidth, action, ahead, prefetch, copy_scale,
) -> SimResult:  # fmt: skip
    if copy_scale == "trace":  # the choice on a step that repeats
        args = (trace, heuristic, ratio, budget, overhead_limit, backend, device, pin_backward)
        tail = (offload_bandwidth, action, ahead, prefetch)
        runs = {scale: _simulate_runtime(*args, *tail, scale) for scale in CANDIDATES}
        ok = {scale: r.compute for scale, r in runs.items() if r.ok}
        return runs[choose(ok)] if ok else runs[CANDIDATES[0]]
    pin = _pin_backward(trace, pin_backward)
    if action == "recompute":
        offload_bandwidth = None
    elif offload_bandwidth is None:  # a run recorded with offload replays with its link
        offload_bandwidth = (trace.meta.get("runtime") or {}).get("offload_bandwidth")
        if offload_bandwidth is None and action == "offload":
            raise ValueError("action='offload' needs offload_bandwidth (none was recorded)")
    if ratio is not None:
        if not (math.isfinite(ratio) and ratio > 0):
            raise ValueError(f"ratio must be a finite number > 0, got {ratio!r}")
        nbytes = int(ratio * runtime_peak(trace, pin))
    else:
        nbytes = parse_bytes(budget)
    compute = trace.total_cost()
    limit = None if overhead_limit is None else compute * (overhead_limit - 1.0)
    link = None if offload_bandwidth is None else Link(offload_bandwidth)
    stats, core = replay_runtime(
        trace,
        heuristic,
        nbytes,
        backend=backend,
        device=device,
        pin_backward=pin,
        remat_limit=limit,
        link=link,
        always_offload=action == "offload",
        ahead=ahead,
        prefetch=prefetch,
        copy_scale=copy_scale,
        refuse=_recorded_refusals(
            trace, heuristic, nbytes, link, action, ahead, prefetch, copy_scale
        ),
    )
    scorings = -1 if core.engine is None else core.engine.selections
    res = _result(trace, heuristic, ratio, nbytes, stats, compute, scorings)
    if offload_bandwidth is None:
        return res
    st = core.stats
    return replace(
        res,
        action=action,
        offloads=st.offloads,
        prefetches=st.prefetches,
        link_wait=st.link_wait_ns,
        copy_scale=core.tuner.value,
    )


def _recorded_refusals(trace, heuristic, nbytes, link, action, ahead, prefetch, copy_scale):
    """NOTE [ The twin ] rule 9: the copies the recorded run's host refused, for a replay of
    that run (its budget, heuristic and link, both actions, copies ahead, its prefetches,
    its own scale); none for another, which numbers its copies otherwise."""
    run = trace.meta.get("runtime") or {}
    same = (
        link is not None
        and action == "both"
        and ahead
        and prefetch is True
        and copy_scale is None
        and run.get("budget") == nbytes
        and run.get("offload_bandwidth") == link.bandwidth
        and run.get("heuristic") == str(getattr(heuristic, "value", heuristic))
    )
    return list(run.get("refused", ())) if same else []


def sweep(
    trace: Trace,
    heuristics: Sequence[str],
    ratios: Sequence[float] = DEFAULT_RATIOS,
    *,
    stop_at_failure: bool = True,
    progress: Callable[[SimResult], None] | None = None,
    **kwargs,
) -> list[SimResult]:
    """``simulate`` for every heuristic at every ratio, ratios in the order given (usually
    descending). With ``stop_at_failure`` a heuristic stops at its first failing ratio, as in
    the reference evaluation. ``progress(result)`` is called after each run (a tqdm hook)."""
    rows = []
    for h in heuristics:
        for r in ratios:
            res = simulate(trace, h, ratio=r, **kwargs)
            rows.append(res)
            if progress is not None:
                progress(res)
            if stop_at_failure and not res.ok:
                break
    return rows

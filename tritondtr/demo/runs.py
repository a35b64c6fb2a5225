"""The demo's runs: a GPT-like model trained under decreasing memory budgets, beside
``torch.utils.checkpoint`` and the simulator's predictions (``tritondtr demo``, cli.py).

# NOTE [ The demo ]
# 1. Runs, all from the same weights, batches and dropout seeds, so that every loss and
#    gradient must equal the eager reference's bit for bit: ``eager`` (the reference, no
#    tritondtr); ``unlimited`` (``enable(budget=None)``: tritondtr's accounting of the
#    baseline peak, the number budgets are fractions of); the budgets (ratios in order until
#    one fails, then bisection towards the lowest that works); ``checkpoint`` (rule 3).
#    One session per training step; counters are summed over the steps, peaks are the
#    largest step's, step times medians.
# 2. The twin (NOTE [ The twin ] in sim/twin.py): the unlimited run is run once more under
#    ``tritondtr.trace`` (the recorder costs ~15 % of a step, so the timed row runs without
#    it), one trace per step. A budget's prediction replays each step's trace at that budget
#    with the same heuristic in runtime semantics and sums the counts. At the recorded
#    budget (unlimited) the replay is exact; at another budget the op costs the runtime
#    scores with are those measured in that run, not the recorded ones, so the counts are a
#    prediction. The predicted step time is the unlimited step time plus the twin's
#    recomputation cost (the recorded op costs, ns): it leaves out the runtime's eviction
#    and bookkeeping work, so it is a lower estimate.
# 3. ``checkpoint``: every block under ``torch.utils.checkpoint.checkpoint(...,
#    use_reentrant=False)``, the usual way to checkpoint a GPT. Its step time and gradients
#    come from a plain eager run (as users run it); its peak from a second run under
#    ``enable(budget=None)``, the measure of every tritondtr row (tracked storages,
#    NOTE [ Budget accounting ]); its recomputations are the ops that run dispatched beyond
#    the unlimited run's (the block forwards its backward reran).
# 4. Two regimes (``REGIMES`` in regimes.py, ``--regime large|small|both``). tritondtr's
#    price is paid per op (tens of microseconds of Python on a CPU thread; docs/benchmarks.md,
#    "What does the runtime cost per op?"), so what a run shows depends on how long its ops
#    take. ``large``, the default: TinyGPT of width 256, 256 tokens, 4 blocks, batch 4,
#    3 steps, whose step time is mostly in ops of milliseconds, as a GPU user's model is
#    beside that price: the GPU's regime, small enough to train in about a minute of a
#    2-core CPU (4 blocks, not 8: the time; 4 blocks still give per-block checkpoint a
#    point well below the peak). ``small``: 8 blocks of width 128, 64 tokens, batch 8,
#    4 steps, ops of tens to hundreds of microseconds, where the per-op price is most of
#    what tracking adds on a CPU: this CPU's per-op price, not a GPU's. 8 blocks, not 4:
#    with 4, one op's working set (``gelu_backward`` reads two 1 MiB tensors while autograd
#    holds the residual stream's 256 KiB gradient, 2.25 MiB) is 8.8 % of the step's peak,
#    so no policy that does not re-run the backward from the loss trains it below that
#    (docs/history/simulator-log.md, "Tight budgets on TinyGPT"); 8 blocks double the peak
#    and keep that working set, so the small regime shows the policy down to ~5 %. The
#    output names the regime above its table and measures it in the run: tracked ops per
#    step, eager step time per op, and what tracking (the unlimited run) added per op. ``both`` runs
#    large, then small, one table each; demo.csv has a ``regime`` column, demo.png a line
#    per regime; the first regime's trace and memory picture keep their names, the
#    second's carry ``-small``. The op times: docs/benchmarks.md, "How long do the demo's
#    ops take?"; the runs: "How low does the demo train?". ``--layers`` and the other size
#    options apply to every regime run, and its label then says "(sizes from the options)":
#    the name no longer measures its ops.
# 5. The memory picture (``--timeline``; NOTE [ Memory timeline ] in runtime/timeline.py):
#    after the runs, the first step runs twice more, untimed: under ``budget=None`` and
#    under the budget drawn (the lowest that worked, by default), both with
#    ``timeline=True``, from the same weights, batch and dropout seed, so that the two
#    curves have the same op at the same index. Untimed: recording costs microseconds per
#    op, which the timed rows must not carry. The first step: every run starts there. The
#    runtime's decisions follow the op costs it measures, so a rerun at the lowest budget
#    may fail where the timed run worked; the next higher budget that worked is drawn then,
#    and the output says which budget it shows.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from ..units import format_bytes
from .regimes import REGIMES, Regime
from .tinygpt import GPTConfig, TinyGPT, batches

if TYPE_CHECKING:
    from ..runtime import SessionStats

__all__ = [
    "HEURISTIC",
    "DemoRow",
    "MemoryRuns",
    "lowest_working",
    "memory_runs",
    "run_demo",
]

HEURISTIC = "dtr_eq"  # of every budgeted run and of the twin's replays


@dataclass
class DemoRow:
    """One run (NOTE [ The demo ]); counts summed over the steps, peaks the largest step's.

    Attributes:
        run: ``eager``, ``unlimited``, ``checkpoint`` or the budget's ratio (``"50.0%"``).
        ratio: budget / the unlimited peak (1.0: unlimited; None: eager, checkpoint).
        budget_bytes: the budget (None: none).
        peak_bytes: tracked storages resident at once, tritondtr's accounting (None: eager,
            or the run failed).
        evictions, rematerializations: the runtime's counters; for ``checkpoint`` the ops
            its backward reran.
        step_s: median seconds per step (nan: the run failed).
        grads_equal: every loss and gradient equals the eager reference's (None: not run).
        error: why the budget failed ("" when it worked).
        first_loss, last_loss: the run's losses at its first and last step.
        twin_status, twin_evictions, twin_remats, twin_peak_bytes: the twin's replay of the
            unlimited run's traces at this budget (``twin_status`` "": no prediction; else
            ``ok``, ``oom`` or ``thrash``).
        predicted_step_s: the unlimited step time + the twin's recomputation cost.
        device_peak_bytes: on CUDA, the most bytes the process had allocated on the device
            during a step (``torch.cuda.max_memory_allocated``, everything included); None on
            a CPU.
        ops: the ops the run's sessions dispatched, summed over the steps (None: eager, or
            the run failed).
    """

    run: str
    ratio: float | None
    budget_bytes: int | None
    peak_bytes: int | None
    evictions: int
    rematerializations: int
    step_s: float
    grads_equal: bool | None
    error: str = ""
    first_loss: float | None = None
    last_loss: float | None = None
    twin_status: str = ""
    twin_evictions: int | None = None
    twin_remats: int | None = None
    twin_peak_bytes: int | None = None
    predicted_step_s: float | None = None
    device_peak_bytes: int | None = None
    ops: int | None = None


class _Run(NamedTuple):
    """What one training run did (NOTE [ The demo ] rule 1)."""

    losses: list[torch.Tensor]
    grads: list[list[torch.Tensor]]
    step_s: float  # median
    peak: int  # 0 without a session
    evictions: int
    remats: int
    ops: int  # ops the sessions dispatched
    traces: list  # one tritondtr.sim.Trace per step when recorded
    device_peak: int | None = None  # CUDA: max_memory_allocated over the steps
    stats: tuple = ()  # ``timeline`` mode: each step's SessionStats (NOTE [ The demo ] rule 5)


def _train(model0, data, budget, mode, seed, device, *, checkpoint=False) -> _Run:
    """Train a copy of ``model0`` on ``data``; ``mode``: ``eager``, ``tritondtr``,
    ``record`` (tritondtr, each step recorded as a trace) or ``timeline`` (tritondtr, each
    step recording its memory timeline)."""
    from ..runtime import enable
    from ..runtime.recording import trace

    model = copy.deepcopy(model0)
    model.checkpoint = checkpoint
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, grads, times, traces, stats = [], [], [], [], []
    peak = ev = remat = ops = 0
    cuda = torch.device(device).type == "cuda"
    dpeak = 0 if cuda else None
    for step, (x, y) in enumerate(data):
        _sync(device)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        if mode == "record":
            meta = {"name": "tinygpt", "step": step + 1, "steps": len(data)}
            ctx = trace(None, budget=budget, heuristic=HEURISTIC, meta=meta)
        elif mode in ("tritondtr", "timeline"):
            ctx = enable(budget=budget, heuristic=HEURISTIC, timeline=mode == "timeline")
        else:
            ctx = contextlib.nullcontext()
        with ctx:
            torch.manual_seed(seed + step)
            opt.zero_grad(set_to_none=True)
            logits = model(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
        if cuda:
            dpeak = max(dpeak, torch.cuda.max_memory_allocated(device))
        losses.append(loss.detach().clone())
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        if mode != "eager":
            st = ctx.stats
            peak = max(peak, st.peak_bytes)
            ev, remat, ops = ev + st.evictions, remat + st.rematerializations, ops + st.ops
        if mode == "record":
            traces.append(ctx.trace)
        if mode == "timeline":
            stats.append(st)
    return _Run(
        losses, grads, statistics.median(times), peak, ev, remat, ops, traces, dpeak, tuple(stats)
    )


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _equal(ref: _Run, got: _Run) -> bool:
    return all(torch.equal(a, b) for a, b in zip(ref.losses, got.losses)) and all(
        torch.equal(a, b) for ga, gb in zip(ref.grads, got.grads) for a, b in zip(ga, gb)
    )


def _row(name: str, ratio, budget, run: _Run, ref: _Run, **kw) -> DemoRow:
    return DemoRow(
        name,
        ratio,
        budget,
        run.peak,
        run.evictions,
        run.remats,
        run.step_s,
        _equal(ref, run),
        first_loss=run.losses[0].item(),
        last_loss=run.losses[-1].item(),
        device_peak_bytes=run.device_peak,
        ops=run.ops or None,
        **kw,
    )


def _predict(traces: list, budget: int, unlimited_step_s: float) -> dict:
    """The twin's prediction for ``budget`` (NOTE [ The demo ] rule 2), as DemoRow fields."""
    from ..sim import simulate

    sims = []
    for t in traces:  # the first step that fails is the prediction: the run stops there too
        sims.append(simulate(t, HEURISTIC, budget=budget, semantics="runtime"))
        if not sims[-1].ok:
            break
    failed = [s.status for s in sims if not s.ok]
    return {
        "twin_status": failed[0] if failed else "ok",
        "twin_evictions": sum(s.evictions for s in sims),
        "twin_remats": sum(s.remats for s in sims),
        "twin_peak_bytes": max(s.peak_bytes for s in sims),
        "predicted_step_s": None
        if failed
        else unlimited_step_s + statistics.median(s.remat_compute for s in sims) / 1e9,
    }


def run_demo(
    config: GPTConfig | None = None,
    *,
    steps: int = 4,
    batch: int = 8,
    ratios: tuple[float, ...] = (0.8, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05),
    refine: int = 2,
    seed: int = 0,
    device: str | torch.device = "cpu",
    time_limit_s: float = 60.0,
    trace_path: str | os.PathLike | None = None,
    log=print,
) -> list[DemoRow]:
    """The demo's runs (NOTE [ The demo ]): rows ``eager``, ``unlimited``, the budgets by
    decreasing ratio, ``checkpoint`` last.

    ``ratios`` are tried in order until one fails, then ``refine`` bisection steps run between
    the lowest that worked and the highest that failed. No new budget starts once
    ``time_limit_s`` seconds have passed. ``config``: the model's sizes (default: the
    large-op regime's, NOTE [ The demo ] rule 4). ``trace_path``: write the unlimited run's last
    step there as a trace (``.npz``: ``tritondtr simulate`` replays it)."""
    from ..runtime import BudgetError, ThrashError
    from ..sim import runtime_peak, save_trace

    config = config or REGIMES[Regime.LARGE].config

    torch.manual_seed(seed)
    model0 = TinyGPT(config).to(device)
    data = batches(config, steps, batch, seed, device)
    t_start = time.perf_counter()
    for mode, ckpt in (("eager", False), ("tritondtr", False), ("eager", True)):
        _train(model0, data[:1], None, mode, seed, device, checkpoint=ckpt)  # lazy init: warm-up
    ref = _train(model0, data, None, "eager", seed, device)
    rows = [
        DemoRow(
            "eager",
            None,
            None,
            None,
            0,
            0,
            ref.step_s,
            None,
            first_loss=ref.losses[0].item(),
            last_loss=ref.losses[-1].item(),
        )
    ]
    log(f"eager reference: {ref.step_s * 1e3:.1f} ms/step")
    unl = _train(model0, data, None, "tritondtr", seed, device)
    base = unl.peak
    traces = _train(model0, data, None, "record", seed, device).traces
    if trace_path is not None:
        save_trace(traces[-1], trace_path)
    rows.append(
        _row(
            "unlimited",
            1.0,
            None,
            unl,
            ref,
            twin_status="ok",
            twin_evictions=0,
            twin_remats=0,
            twin_peak_bytes=max(runtime_peak(t) for t in traces),
            predicted_step_s=unl.step_s,
        )
    )
    ck = _train(model0, data, None, "eager", seed, device, checkpoint=True)
    ck_mem = _train(model0, data, None, "tritondtr", seed, device, checkpoint=True)
    ck_row = dataclasses.replace(  # NOTE [ The demo ] rule 3
        _row("checkpoint", None, None, ck, ref),
        peak_bytes=ck_mem.peak,
        rematerializations=ck_mem.ops - unl.ops,
    )

    def attempt(r: float) -> bool:
        budget = int(base * r)
        twin = _predict(traces, budget, unl.step_s)
        try:
            run = _train(model0, data, budget, "tritondtr", seed, device)
        except BudgetError as e:
            why = (
                f"thrashes ({e.rematerializations} rematerializations)"
                if isinstance(e, ThrashError)
                else f"{e.op} needs {format_bytes(e.needed)}"
            )
            rows.append(DemoRow(f"{r:.1%}", r, budget, None, 0, 0, float("nan"), None, why, **twin))
            return False
        rows.append(_row(f"{r:.1%}", r, budget, run, ref, **twin))
        return True

    def out_of_time(r: float) -> bool:
        if time.perf_counter() - t_start <= time_limit_s:
            return False
        log(f"time limit of {time_limit_s:.0f} s reached: stopping before ratio {r:.1%}")
        return True

    ok, failed = 1.0, None
    for r in ratios:
        if out_of_time(r):
            break
        if not attempt(r):
            failed = r
            break
        ok = r
    for _ in range(refine if failed is not None else 0):  # bisect towards the lowest
        r = (ok + failed) / 2
        if out_of_time(r):
            break
        if attempt(r):
            ok = r
        else:
            failed = r
    rows[2:] = sorted(rows[2:], key=lambda row: -row.ratio)
    rows.append(ck_row)
    return rows


class MemoryRuns(NamedTuple):
    """The two runs of the memory picture (NOTE [ The demo ] rule 5)."""

    budget: DemoRow  # the row whose budget is drawn
    unlimited: SessionStats  # the first step under ``budget=None``, with its timeline
    budgeted: SessionStats  # the first step under ``budget.budget_bytes``, with its timeline


def memory_runs(
    config: GPTConfig,
    rows: list[DemoRow],
    *,
    batch: int,
    seed: int = 0,
    device: str | torch.device = "cpu",
    log=print,
) -> MemoryRuns | None:
    """NOTE [ The demo ] rule 5: the first step under ``budget=None`` and under the budget of
    the first of ``rows`` (budgeted rows, in the order to try) that works again, both with
    ``timeline=True``; None if none works (each failure is logged)."""
    from ..runtime import BudgetError

    torch.manual_seed(seed)  # the weights and the first batch of ``run_demo``
    model0 = TinyGPT(config).to(device)
    data = batches(config, 1, batch, seed, device)
    unlimited = None
    for row in rows:
        if unlimited is None:
            unlimited = _train(model0, data, None, "timeline", seed, device).stats[0]
        try:
            run = _train(model0, data, row.budget_bytes, "timeline", seed, device)
        except BudgetError as e:
            log(f"memory picture: {row.run} of the peak failed ({type(e).__name__} at {e.op})")
            continue
        return MemoryRuns(row, unlimited, run.stats[0])
    return None


def lowest_working(rows: list[DemoRow]) -> DemoRow | None:
    """The budgeted row of the lowest ratio that worked, or None."""
    worked = [r for r in rows if r.budget_bytes is not None and not r.error]
    return min(worked, key=lambda row: row.ratio) if worked else None

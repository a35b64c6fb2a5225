"""The memory timeline of a session (``enable(timeline=True)``, ``session.stats.timeline``):
tracked bytes, counts and the training phase after each op, for a picture of the step.

# NOTE [ Memory timeline ]
# 1. Opt-in: ``enable(timeline=True)`` enters a dispatch mode whose handler records a row
#    after each op (``_TimelineMode`` in session.py); without it the session enters its plain
#    mode, so the per-op path is the same code as before, with not even a flag to test. Why:
#    the per-op path is the runtime's cost on small ops (docs/runtime.md, Per-op dispatch
#    overhead), and a picture is asked for once in a while.
# 2. One row per op the session's mode dispatched and that returned: every ATen op inside
#    the block, tracked or not, so that the optimizer's ops on plain tensors (NOTE [ What is
#    tracked ] rule 2) give its phase its length. The row's index is the op's rank among
#    them (not ``stats.ops``, which counts tracked ops only). Recomputations and the
#    runtime's own work run below the mode: they are no rows, they show in the counts.
# 3. A row is sampled when its op returns: the core's resident tracked bytes (NOTE [ Budget
#    accounting ]), the session's peak so far, evictions and rematerializations so far, and
#    on a CUDA session ``torch.cuda.memory_allocated`` of its device (-1 while its device is
#    not fixed; the column is None when the session's device is not a CUDA one). Work
#    between two ops (the freeze of NOTE [ Parameter writes ], the recomputations of NOTE
#    [ Readers before release ], ``evict_all``) falls to the next row, and a last row,
#    ``exit``, is sampled after the session's exit: the last row's bytes and counts are the
#    stats', and the steps of the count columns are the markers of the picture.
# 4. Samples count what the core counts at that moment: a buffer whose last wrapper died
#    during the op is counted until the next op releases it (NOTE [ Storage lifetime ]). A
#    peak reached in flight (a recomputation's buffer counted before the op made room, NOTE
#    [ Budget accounting ] rule 2; an op's outputs before ``stress`` evicts them) may lie
#    above every sample, so the peak column is kept: it rises at the row of the op that
#    reached it. ``max(resident_bytes) <= peak_bytes[-1] == stats.peak_bytes``, equal when
#    nothing was evicted.
# 5. The phase of a row (:class:`Phase`), from the state after the row before (forward at
#    the start): an op that autograd's engine runs (``torch._C._current_graph_task_id() >=
#    0`` on the thread that runs it, the test of NOTE [ Backward storages ]) is backward;
#    outside it, an op under grad mode is forward, but one that returns no tensor keeps the
#    phase before it (``loss.item()``, a Python number; the profiler's range that
#    ``optimizer.step()`` opens before it turns grad mode off); an op without grad mode is
#    optimizer after a backward or an optimizer op, else forward.
# 6. Why grad mode and not the freeze at the optimizer's first parameter write (NOTE
#    [ Parameter writes ]): ``torch.optim``'s steps and ``clip_grad_norm_`` run without grad
#    mode, and an optimizer's first ops come before its first parameter write (AdamW counts
#    its step first); logging the loss between the backward and the step must not end the
#    backward. The freezes are marked on their own (``freezes``: the row of the op before
#    which each ran): one is where the step's held storages leave the count. Limits: a
#    no-grad evaluation after a backward is optimizer; a gradient accumulation's next
#    micro-batch is forward again, as it should be.
# 7. Recording costs one tuple per op (about 100 bytes) and a few microseconds: measured in
#    docs/benchmarks.md, "What does the memory timeline cost per op?".
"""

from __future__ import annotations

import csv
import enum
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["MemoryTimeline", "Phase", "TimelineRecorder"]

_in_backward = torch._C._current_graph_task_id
_grad_enabled = torch.is_grad_enabled
_TENSORS = (tuple, list)  # rule 5: what a forward op returns, beside a tensor
EXIT = "exit"  # the name of the last row (rule 3)


class Phase(enum.IntEnum):
    """The ``phase`` column (NOTE [ Memory timeline ] rule 5)."""

    FORWARD = 0
    BACKWARD = 1
    OPTIMIZER = 2

    @property
    def label(self) -> str:
        """``"forward"``, ``"backward"``, ``"optimizer"``."""
        return self.name.lower()


_FORWARD, _BACKWARD, _OPTIMIZER = Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER

# The columns a row is recorded with, in this order (a tuple per op: one allocation).
_COLUMNS = (
    "name",
    "phase",
    "resident_bytes",
    "peak_bytes",
    "evictions",
    "rematerializations",
    "device_bytes",
)


class TimelineRecorder:
    """The rows of a session recording a timeline (NOTE [ Memory timeline ]); the session
    calls :meth:`op` after each op, :meth:`froze` at each freeze and :meth:`exit` at its
    exit. It holds no reference to the session or its stats (NOTE [ Session lifetime ])."""

    __slots__ = ("_cached", "cuda", "freezes", "phase", "rows")

    def __init__(self) -> None:
        self.rows: list[tuple] = []  # one per op, as in ``_COLUMNS`` (the op, not its name)
        self.freezes: list[int] = []  # the row before whose op each freeze ran
        self.phase = _FORWARD  # the last row's (rule 5)
        self.cuda = False  # a row saw a CUDA session device (rule 3)
        self._cached: MemoryTimeline | None = None

    def op(self, func, out, stats, device: torch.device | None) -> None:
        """Op ``func`` returned ``out``; ``stats``: the session's, ``device``: its device."""
        phase = self.phase
        if _in_backward() >= 0:
            phase = _BACKWARD
        elif _grad_enabled():
            if type(out) in _TENSORS or isinstance(out, torch.Tensor):
                phase = _FORWARD
        elif phase is _BACKWARD:
            phase = _OPTIMIZER
        self.phase = phase
        self.rows.append(
            (
                func,
                phase,
                stats.resident_bytes,
                stats.peak_bytes,
                stats.evictions,
                stats.rematerializations,
                -1 if device is None or device.type != "cuda" else self._device_bytes(device),
            )
        )

    def _device_bytes(self, device: torch.device) -> int:
        """``memory_allocated`` of CUDA device ``device`` (rule 3)."""
        self.cuda = True
        return torch.cuda.memory_allocated(device)

    def froze(self) -> None:
        """A freeze (NOTE [ Parameter writes ]) runs before the next op."""
        self.freezes.append(len(self.rows))

    def exit(self, stats, device: torch.device | None) -> None:
        """The session exited: the last row (rule 3)."""
        self.rows.append(
            (
                EXIT,
                self.phase,
                stats.resident_bytes,
                stats.peak_bytes,
                stats.evictions,
                stats.rematerializations,
                -1 if device is None or device.type != "cuda" else self._device_bytes(device),
            )
        )

    def snapshot(self, budget: int | None) -> MemoryTimeline:
        """The rows so far as a :class:`MemoryTimeline` (kept until a row is added)."""
        cached = self._cached
        if cached is not None and len(cached) == len(self.rows):
            return cached
        n = len(self.rows)
        cols = list(zip(*self.rows)) if n else [()] * len(_COLUMNS)
        ints = {c: np.array(v, dtype=np.int64) for c, v in zip(_COLUMNS[2:], cols[2:])}
        device = ints.pop("device_bytes")
        self._cached = MemoryTimeline(
            name=tuple(f if type(f) is str else str(f) for f in cols[0]),
            phase=np.array(cols[1], dtype=np.int8),
            device_bytes=device if self.cuda else None,
            freezes=np.array(self.freezes, dtype=np.int64),
            budget=budget,
            **ints,
        )
        return self._cached


@dataclass(frozen=True, eq=False)
class MemoryTimeline:
    """A session's memory, op by op (NOTE [ Memory timeline ]): ``session.stats.timeline``
    of a session entered with ``tritondtr.enable(..., timeline=True)``. Row ``i`` is the
    ``i``-th op the session dispatched, sampled when it returned; the last row, ``exit``, is
    the session's exit. Bytes are those of the tracked storages (NOTE [ Budget accounting ]).

    Attributes:
        name: ``[N]`` op names (``"aten.mm.default"``); ``"exit"`` for the last row.
        phase: ``[N] int8`` :class:`Phase` codes (rule 5).
        resident_bytes: ``[N] int64`` tracked bytes resident after the op.
        peak_bytes: ``[N] int64`` the session's peak so far (rule 4).
        evictions, rematerializations: ``[N] int64`` counts so far; the work between two ops
            falls to the later one (rule 3).
        device_bytes: ``[N] int64`` ``torch.cuda.memory_allocated`` of the session's device
            after the op (-1 before that device was fixed); None on a session whose device
            is not a CUDA one.
        freezes: ``[K] int64`` the rows before whose op the session froze (NOTE [ Parameter
            writes ]: the optimizer's first parameter write, in a training step).
        budget: the session's budget in bytes, None for none.
    """

    name: tuple[str, ...]
    phase: np.ndarray
    resident_bytes: np.ndarray
    peak_bytes: np.ndarray
    evictions: np.ndarray
    rematerializations: np.ndarray
    device_bytes: np.ndarray | None
    freezes: np.ndarray
    budget: int | None

    def __len__(self) -> int:
        return len(self.name)

    @property
    def op(self) -> np.ndarray:
        """``[N] int64`` the row indices, the x axis of the picture."""
        return np.arange(len(self), dtype=np.int64)

    def eviction_ops(self) -> np.ndarray:
        """The row of each eviction, one entry per eviction (``len`` = the evictions)."""
        return _steps(self.evictions)

    def remat_ops(self) -> np.ndarray:
        """The row of each rematerialization, one entry per rematerialization."""
        return _steps(self.rematerializations)

    def phase_spans(self) -> list[tuple[Phase, int, int]]:
        """``(phase, first row, last row + 1)`` for each run of rows of one phase."""
        if not len(self):
            return []
        cut = np.flatnonzero(np.diff(self.phase)) + 1
        starts = [0, *cut.tolist()]
        stops = [*cut.tolist(), len(self)]
        return [(Phase(int(self.phase[a])), a, b) for a, b in zip(starts, stops)]

    def as_rows(self) -> list[dict[str, int | str | None]]:
        """One dict per row, the CSV's columns (bytes in bytes, the phase by name)."""
        device, budget = self.device_bytes, self.budget
        frozen = set(self.freezes.tolist())
        return [
            {
                "op": i,
                "name": self.name[i],
                "phase": Phase(int(self.phase[i])).label,
                "resident_bytes": int(self.resident_bytes[i]),
                "peak_bytes": int(self.peak_bytes[i]),
                "device_bytes": None if device is None or device[i] < 0 else int(device[i]),
                "evictions": int(self.evictions[i]),
                "rematerializations": int(self.rematerializations[i]),
                "freeze": i in frozen,
                "budget_bytes": budget,
            }
            for i in range(len(self))
        ]

    def to_csv(self, path: str | os.PathLike) -> Path:
        """Write :meth:`as_rows` to ``path`` (empty cells for None); returns the path."""
        return write_csv({"session": self}, path)


CSV_COLUMNS = (
    "run",
    "op",
    "name",
    "phase",
    "resident_bytes",
    "peak_bytes",
    "device_bytes",
    "evictions",
    "rematerializations",
    "freeze",
    "budget_bytes",
)


def write_csv(runs: dict[str, MemoryTimeline], path: str | os.PathLike) -> Path:
    """The rows of each timeline, its name in the ``run`` column, to the CSV file ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for run, timeline in runs.items():
            for row in timeline.as_rows():
                w.writerow({"run": run, **{k: "" if v is None else v for k, v in row.items()}})
    return path


def _steps(counts: np.ndarray) -> np.ndarray:
    """Each row's index repeated by how much ``counts`` rose at it."""
    rise = np.diff(counts, prepend=0)
    return np.repeat(np.arange(len(counts), dtype=np.int64), rise)

"""The scale of a copy's price, tuned over training steps by the device time they took.

# NOTE [ Copy price scale ]
# 1. Whether a victim is offloaded or dropped (NOTE [ Offload ] rule 1 in core.py), whether
#    a backed victim keeps its copy and whether a copy goes out ahead (NOTE [ Asynchronous
#    offload ] rules 2 and 3 in offload.py) compares a copy's price, the link's time, with a
#    drop's, the recomputation with its evicted neighbourhood. The copy's side is multiplied
#    by a scale: 1 prices it as the link's time, 0 copies every victim whose drop costs
#    anything (offload only), one above 1 copies only victims whose drop is that many times
#    dearer, ``inf`` none (recompute only).
# 2. Why a scale, and why tuned by steps: a price per victim cannot see what its copy does
#    to the rest of the step (the link's queue, the room a prefetch needs, what a copy back
#    evicts), nor what its drop does (its neighbourhood may never be recomputed). A step's
#    device time sees all of it, and training steps repeat (the twin, every recorded step,
#    90..10 %, three links: docs/simulator.md, Where does offload pay?).
# 3. The candidates copy at least what scale 1 copies (1, 0, 1/4): a candidate's step is the
#    user's, and one that copies less can fail where copying runs. Where a budget is reached
#    only by copying (the zoo LSTM at 5 % of its peak), a step at ``inf`` recomputed in
#    circles (``ThrashError``) and one at 64 could not fit an op (``BudgetError``), where 1
#    ran; bringing a victim back by its copy needs room for it alone, recomputing it room
#    for its inputs too. Scales above 1 are only what a caller fixes (``Core(copy_scale=)``,
#    ``simulate(copy_scale=)``).
# 4. The tuner: the first step runs at 1 and is not measured (it differs from the next
#    ones: lazy initialisations, no step plan to prefetch by). The first measured step
#    sets a step's length in ops; each later step of that length runs at the next of
#    :data:`CANDIDATES` not yet measured, and once all are, every step runs at the one whose
#    step took the least device time (:func:`choose`), unless 1 took at most :data:`MARGIN`
#    longer: several scales often make the same decisions, and which of them is least is
#    then left neither to nanoseconds nor to noise. A step of another length (an evaluation
#    pass, data-dependent control flow, or a freeze that is not a step's end: an optimizer
#    step inside the backward pass freezes once per parameter) measures nothing; after
#    :data:`MAX_UNLIKE` of them tuning stops at 1. A step ends where the step plan's does
#    (``Core.freeze``: the optimizer's parameter writes).
# 5. It depends only on the core's device time and op count, so the twin replays the
#    runtime's choices exactly (NOTE [ Offload link ] rule 2). A session given a fixed scale
#    never tunes.
# 6. What it costs: each candidate runs one whole step, the slower ones too. A session that
#    never writes its parameters never ends a step and stays at 1. Steps that repeat their
#    ops but not their shapes (dynamic padding) measure candidates on unlike work.
"""

from __future__ import annotations

import math

__all__ = ["CANDIDATES", "MARGIN", "MAX_UNLIKE", "CopyScale", "choose"]

CANDIDATES = (1.0, 0.0, 0.25)  # rules 3 and 4, in the order they are tried
MARGIN = 1e-3  # rule 4: how much faster than scale 1 another must be
MAX_UNLIKE = 256  # rule 4: steps of another length before tuning stops


def choose(times: dict[float, float]) -> float:
    """Rule 4: the scale whose step took the least of ``times`` (device time per scale; the
    first of equal ones), unless 1 took at most :data:`MARGIN` longer."""
    best = min(times, key=times.__getitem__)
    one = times.get(1.0)
    return 1.0 if one is not None and one <= times[best] * (1.0 + MARGIN) else best


class CopyScale:
    """The scale of a copy's price (NOTE [ Copy price scale ]); the one writer of its fields.

    ``value``: what the next decision multiplies a copy's price by. ``times``: device time
    (ns) of the measured step each candidate ran. ``start`` / ``start_ops``: the device time
    and op count the running step began at. ``length``: ops of the first measured step (the
    steps measured are that long). ``unlike``: steps of another length so far. ``ended``:
    steps ended. ``fixed``: a scale given, or tuning done or stopped."""

    __slots__ = ("ended", "fixed", "length", "start", "start_ops", "times", "unlike", "value")

    def __init__(self, scale: float | None = None) -> None:
        if scale is not None and not (scale >= 0.0):
            raise ValueError(f"a copy price scale is >= 0 (inf: never copy), got {scale!r}")
        self.fixed = scale is not None
        self.value = float(scale) if scale is not None else CANDIDATES[0]
        self.times: dict[float, float] = {}
        self.start = 0.0
        self.start_ops = 0
        self.length: int | None = None
        self.unlike = 0
        self.ended = 0

    def cheaper(self, copy: float, drop: float, or_equal: bool = False) -> bool:
        """Whether a copy priced ``copy`` (ns of link time) is priced below a drop priced
        ``drop`` (ns; no higher, with ``or_equal``) at this scale (rule 1)."""
        scale = self.value
        if scale == math.inf:
            return False
        price = scale * copy
        return price <= drop if or_equal else price < drop

    def step_ended(self, now: float, ops: int) -> None:
        """A step ended at device time ``now`` (ns) after ``ops`` ops in all: measure it,
        choose the next's scale (rule 4)."""
        took, self.start = now - self.start, now
        length, self.start_ops = ops - self.start_ops, ops
        self.ended += 1
        if self.fixed or self.ended == 1 or length == 0:  # 0: a freeze right after another
            return
        if self.length is None:
            self.length = length
        if length != self.length:
            self.unlike += 1
            if self.unlike >= MAX_UNLIKE:  # no steps to compare: the plain price
                self.value, self.fixed = 1.0, True
            return
        self.times.setdefault(self.value, took)
        todo = [c for c in CANDIDATES if c not in self.times]
        self.value = todo[0] if todo else choose(self.times)
        self.fixed = not todo

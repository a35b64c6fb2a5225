"""The scale of a copy's price, tuned over training steps by the device time they took.

# NOTE [ Copy price scale ]
# 1. Whether a victim is offloaded or dropped (NOTE [ Offload ] rule 1 in core.py), whether
#    a backed victim keeps its copy and whether a copy goes out ahead (NOTE [ Asynchronous
#    offload ] rules 2 and 3 in offload.py) compares a copy's price, the link's time, with a
#    drop's, the recomputation with its evicted neighbourhood. The copy's side is multiplied
#    by a scale: 1 prices it as the link's time, ``inf`` never copies (recompute only), 0
#    copies every victim whose drop costs anything (offload only).
# 2. Why a scale, and why tuned by steps: a price per victim cannot see what its copy does
#    to the rest of the step (the link's queue, the room a prefetch needs, what a copy back
#    evicts), nor what its drop does (its neighbourhood may never be recomputed). A step's
#    device time sees all of it, and training steps repeat. And 0 and ``inf`` among the
#    candidates make the tuned rule no slower than copying every victim or none, where a
#    price per victim alone lost to one of them (the twin, every recorded step, 90..10 %,
#    three links: docs/simulator.md, Where does offload pay?).
# 3. The tuner: the first step runs at 1 and is not measured (it differs from the next ones:
#    lazy initialisations, no step plan to prefetch by); each of the next steps runs at the
#    next of :data:`CANDIDATES` not yet measured, and once all are, every step runs at the
#    one whose step took the least device time (:func:`choose`), unless never copying, else
#    1, took at most :data:`MARGIN` longer: several scales often make the same decisions,
#    and which of them is least is then left neither to nanoseconds nor to noise. Never
#    copying first: it does the least host work (no copies, no looks for copies ahead, no
#    host memory); then the plain price. A step ends where the step plan's does
#    (``Core.freeze``: the optimizer's parameter writes).
# 4. It depends only on the core's device time, so the twin replays the runtime's choices
#    exactly (NOTE [ Offload link ] rule 2). A session given a fixed scale never tunes.
# 5. What it costs: each candidate runs one whole step, the slow ones too (copying every
#    victim on a conv step can take half as long again as recomputing: docs/simulator.md).
#    A session that never writes its parameters never ends a step and stays at 1; one that
#    writes them more than once a step tunes on parts of steps.
"""

from __future__ import annotations

import math

__all__ = ["CANDIDATES", "MARGIN", "CopyScale", "choose"]

CANDIDATES = (1.0, math.inf, 0.0, 0.25, 4.0)  # rule 3, in the order they are tried
MARGIN = 1e-3  # rule 3: how much faster than scale 1 another must be (the sweep's noise)


def choose(times: dict[float, float]) -> float:
    """Rule 3: the scale whose step took the least of ``times`` (device time per scale; the
    first of equal ones), unless ``inf``, else 1, took at most :data:`MARGIN` longer."""
    best = min(times, key=times.__getitem__)
    for kept in (math.inf, 1.0):
        t = times.get(kept)
        if t is not None and t <= times[best] * (1.0 + MARGIN):
            return kept
    return best


class CopyScale:
    """The scale of a copy's price (NOTE [ Copy price scale ]); the one writer of its fields.

    ``value``: what the next decision multiplies a copy's price by. ``times``: device time
    (ns) of the measured step each candidate ran. ``start``: the device time the running
    step began at. ``ended``: steps ended. ``fixed``: a scale given, never tuned."""

    __slots__ = ("ended", "fixed", "start", "times", "value")

    def __init__(self, scale: float | None = None) -> None:
        if scale is not None and not (scale >= 0.0):
            raise ValueError(f"a copy price scale is >= 0 (inf: never copy), got {scale!r}")
        self.fixed = scale is not None
        self.value = float(scale) if scale is not None else CANDIDATES[0]
        self.times: dict[float, float] = {}
        self.start = 0.0
        self.ended = 0

    def cheaper(self, copy: float, drop: float, or_equal: bool = False) -> bool:
        """Whether a copy priced ``copy`` (ns of link time) is priced below a drop priced
        ``drop`` (ns; no higher, with ``or_equal``) at this scale (rule 1)."""
        scale = self.value
        if scale == math.inf:
            return False
        price = scale * copy
        return price <= drop if or_equal else price < drop

    def step_ended(self, now: float) -> None:
        """A step ended at device time ``now`` (ns): measure it, choose the next's scale
        (rule 3)."""
        took, self.start = now - self.start, now
        self.ended += 1
        if self.fixed or self.ended == 1:
            return
        self.times.setdefault(self.value, took)
        todo = [c for c in CANDIDATES if c not in self.times]
        self.value = todo[0] if todo else choose(self.times)

"""The scale of a copy's price, chosen by the device time of rehearsed training steps.

# NOTE [ Copy price scale ]
# 1. Whether a victim is offloaded or dropped (NOTE [ Offload ] rule 1 in core.py), whether
#    a backed victim keeps its copy and whether a copy goes out ahead (NOTE [ Asynchronous
#    offload ] rules 2 and 3 in offload.py) compares a copy's price, the link's time, with a
#    drop's, the recomputation with its evicted neighbourhood. The copy's side is multiplied
#    by a scale: 1 prices it as the link's time, 0 copies every victim whose drop costs
#    anything (offload only), one above 1 copies only victims whose drop is that many times
#    dearer, ``inf`` none (recompute only).
# 2. Why a scale, and why chosen by steps: a price per victim cannot see what its copy does
#    to the rest of the step (the link's queue, the room a prefetch needs, what a copy back
#    evicts), nor what its drop does (its neighbourhood may never be recomputed). A step's
#    device time sees all of it, and training steps repeat (the twin, every recorded step,
#    90..10 %, three links: docs/simulator.md, Where does offload pay?).
# 3. The candidates: 1, 0 (every victim copied, offload only), 1/4, and ``inf`` (recompute
#    only). With the two ends among them, the chosen step is never slower than the better of
#    recompute only and offload only on the step it is chosen by; the sweep over the recorded
#    steps found nothing a finer grid (1/16 .. 16) adds (docs/simulator.md).
# 4. The choice: the first step runs at 1. Once a later step ends with at least as many ops
#    run since the first ended as the first had (the second step, as a rule), each
#    candidate's time is the device time of those ops in a rehearsal of everything so far at
#    that scale (NOTE [ Rehearsal ] in rehearsal.py), and every later step runs at the
#    candidate whose time was least (:func:`choose`), unless never copying or 1 (in that
#    order) took at most :data:`MARGIN` longer: several scales often make the same
#    decisions, and which of them is least is then left neither to nanoseconds nor to
#    noise; never copying first, because it costs the host nothing per op (no copy-ahead
#    looks: on a link too slow to pay, 10 MB/s, the zoo GPT at 30 % scored once per op at
#    scale 1 and copied nothing) and holds no host memory. A candidate whose rehearsal
#    failed (``BudgetError``, ``ThrashError``) is not chosen, so a scale that copies less
#    than 1 is chosen only where it ran what was rehearsed.
# 5. Steps: a step ends where the step plan's does (``Core.freeze``: the optimizer's
#    parameter writes); a freeze right after another ends none. Why as many ops as the
#    first step and not the second step: an optimizer step inside the backward pass freezes
#    once per parameter, and its second "step" is the few ops between two parameters'
#    writes, where every scale tied (the zoo GPT at 30 % over PCIe 4); so did half the
#    first step's ops, the early backward pass, where nothing is recomputed yet, and never
#    copying, kept on that tie, took 11 % longer over three steps than 1. As many ops as
#    the first is a whole step's worth. A first step longer than the next ones (ops that
#    happen once) makes it the third step's end. And not before the core evicted something
#    after the first step (the budget bound): a span where nothing was evicted ties every
#    scale and tells nothing (the zoo LSTM with its optimizer inside backward, where a
#    parameter's gradient is whole after 387 of 983 ops, kept never copying, 1.73x slower
#    than 1 over six steps; a batch that grows after the second step likewise); the choice
#    waits for a step end after an eviction.
# 6. It depends only on the calls the driver made, so the twin chooses as the runtime did
#    (NOTE [ Rehearsal ] rule 5). A scale given (``Core(copy_scale=)``) is never tuned.
# 7. What it misses: steps that differ (data-dependent control flow, dynamic padding) are
#    chosen for by the first ones; a session that never writes its parameters never ends a
#    step, and one whose budget never binds after its first step evicts nothing: both tape
#    until the tape is full (``MAX_TAPE`` calls, NOTE [ Rehearsal ] rule 3) and stay at 1.
"""

from __future__ import annotations

import math

__all__ = ["CANDIDATES", "MARGIN", "CopyScale", "choose"]

CANDIDATES = (1.0, 0.0, 0.25, math.inf)  # rule 3
MARGIN = 1e-3  # rule 4: how much faster than scale 1 another must be


def choose(times: dict[float, float]) -> float:
    """Rule 4: the scale whose step took the least of ``times`` (device time per scale; the
    first of equal ones), unless never copying or 1 took at most :data:`MARGIN` longer
    (never copying first); 1 if ``times`` is empty."""
    if not times:
        return 1.0
    best = min(times, key=times.__getitem__)
    limit = times[best] * (1.0 + MARGIN)
    for kept in (math.inf, 1.0):
        if times.get(kept, math.inf) <= limit:
            return kept
    return best


class CopyScale:
    """The scale of a copy's price (NOTE [ Copy price scale ]); the one writer of its fields.

    ``value``: what the next decision multiplies a copy's price by. ``fixed``: a scale given,
    or chosen. ``began``: the op count at the last step's end; ``first``: the first step's
    ops (None before it ended; rules 4 and 5). ``times``: the rehearsals' device time (ns)
    of what was rehearsed after the first step, per candidate that ran it (rule 4)."""

    __slots__ = ("began", "first", "fixed", "times", "value")

    def __init__(self, scale: float | None = None) -> None:
        if scale is not None and not (scale >= 0.0):
            raise ValueError(f"a copy price scale is >= 0 (inf: never copy), got {scale!r}")
        self.fixed = scale is not None
        self.value = float(scale) if scale is not None else CANDIDATES[0]
        self.times: dict[float, float] = {}
        self.began = 0
        self.first: int | None = None

    def cheaper(self, copy: float, drop: float, or_equal: bool = False) -> bool:
        """Whether a copy priced ``copy`` (ns of link time) is priced below a drop priced
        ``drop`` (ns; no higher, with ``or_equal``) at this scale (rule 1)."""
        scale = self.value
        if scale == math.inf:
            return False
        price = scale * copy
        return price <= drop if or_equal else price < drop

    def step_ended(self, ops: int) -> str | None:
        """A step may have ended after ``ops`` ops in all (rules 4 and 5): ``"first"`` if it
        was the first, ``"choose"`` if the choice is due now, else None (no op since the
        last end, not yet the first step's ops since it, or the scale fixed)."""
        if self.fixed or ops == self.began:
            return None
        if self.first is None:
            self.first = self.began = ops
            return "first"
        self.began = ops
        return "choose" if ops - self.first >= self.first else None

    def chose(self, times: dict[float, float]) -> None:
        """The rehearsals' ``times`` per candidate that ran (rule 4): the scale from now on."""
        self.times = dict(times)
        self.value, self.fixed = choose(self.times), True

    def stop(self) -> None:
        """No choice will be made (the tape is full): the plain price from now on."""
        self.value, self.fixed = 1.0, True

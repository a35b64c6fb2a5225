"""The tape of what a driver asked of the core, replayed on cores that only count: how the
copy price scale is chosen without running a training step at a bad one.

# NOTE [ Rehearsal ]
# 1. Why: the tuner (NOTE [ Copy price scale ] in tuning.py) compares the device time of a
#    step at each candidate scale. Run live, each candidate costs a whole step at a scale
#    that may be the worst (the one copying every victim took 23 ms against 4.8 ms on a
#    100 MB/s link), and a candidate that copies less than the plain price can fail the
#    user's step where the plain price trains (``ThrashError`` on the zoo LSTM at 5 % of its
#    peak, never copying). A rehearsal finds the same times without either.
# 2. The tape: while the scale is to be chosen, every call a driver makes on the core's
#    driver-facing methods (:data:`TAPED`) is appended with its arguments (lists copied), its
#    result (the id :meth:`~tritondtr.core.Core.new` handed out) or that it raised. The calls
#    the core makes on itself are not: they are the decisions a rehearsal makes again. The
#    core's class is the taped subclass of its own while it tapes (:func:`taped`), so a core
#    that does not tape pays nothing for it.
# 3. It starts with the core, when the core will offload and its scale is not given: built
#    with a link, or with ``prefetch`` (the runtime's, whose link comes with its device, as
#    its step plan records from the first op: NOTE [ Step plan ] in plan.py). It ends at the
#    choice, or unused after :data:`MAX_TAPE` calls (the scale stays 1), or at the core's
#    ``close``.
# 4. The choice (NOTE [ Copy price scale ] rule 4): for each candidate the whole tape is
#    played on a fresh core built as this one was (budget, heuristic, pins, stress, reuse, a
#    link of the same bandwidth, ahead, prefetch), its table on the host, an executor that
#    runs nothing (the core counts device time itself: NOTE [ Offload link ] rule 2) and the
#    scale fixed; the candidate's time is the device time of the calls taped after the first
#    step ended (:meth:`Tape.step_ended`). A candidate whose rehearsal raised where the
#    recorded call did not is not chosen; an error other than ``BudgetError`` there is a bug
#    of tritondtr, said in a warning, and the user's step goes on.
# 5. Why it is exact: the core's decisions depend only on the calls made and on its own
#    state, and the runtime and its twin make the same calls (NOTE [ The twin ] rule 1 in
#    sim/twin.py), so both tape the same calls and choose the same scale; the rehearsal at
#    the scale the steps ran at is the recorded run (its device time equals the core's,
#    tests/core/test_rehearsal.py). Ids are the same in every rehearsal (NOTE [ Fused
#    versions ] rule 5: which versions fuse does not depend on decisions); a rehearsal
#    that hands out another id is a bug of tritondtr (rule 4's warning).
# 6. What a rehearsal cannot see, as the twin cannot: a driver's call that depended on a
#    decision (a value asked outside an op is materialized only if it was evicted), an
#    executor's refusal (no host memory for a copy), the runtime's evictions when the
#    allocator refuses (NOTE [ Out-of-memory fallback ] in runtime/oom.py: made inside a
#    taped call) and measured costs that arrive later. It prefetches by its own step plan
#    whenever the core prefetches: a driver's own plan (the twin's ``"trace"``) is not
#    rehearsed. Its table is on the host and scored by torch, so where the run scores with
#    Triton on the device it breaks score ties as the host does.
# 7. What it costs: taping, a Python call per driver call, during the first two steps, and
#    ~133 bytes a call; each candidate one replay of them through the core, once (measured:
#    docs/benchmarks.md, "What does choosing the copy price scale cost?").
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from .errors import BudgetError
from .link import Link

__all__ = ["MAX_TAPE", "NOT_TAPED", "RAISED", "TAPED", "Call", "Idle", "Tape", "taped"]

# rule 2: what a driver calls (the runtime's session and its twin); reads are not taped
TAPED = (
    "start", "set_link", "set_cost", "new", "enter", "release_inputs", "end", "hand_out",
    "release", "forget", "materialize", "lock", "unlock", "lock_input", "sync", "evict_one",
    "evict_all", "freeze", "anchor", "unanchor", "grow_outside", "shrink_outside",
)  # fmt: skip
# and what a driver calls that a rehearsal does without: reads, the clock selections are
# timed by (statistics), a driver's own read order (rule 6), and the session's end (after
# the choice or instead of it)
NOT_TAPED = ("held_descendants", "check_invariants", "time_with", "set_plan", "close")
# rule 3: calls taped at most: ~35 MB at 133 bytes a call (the zoo GPT), two steps of ~30k
# ops at 4.3 calls an op
MAX_TAPE = 1 << 18
RAISED = object()  # a call's result when it raised
_HOST = torch.device("cpu")


@dataclass(slots=True)
class Call:
    """One taped call: the method's ``name``, its ``args`` and ``kwargs``, its ``result``
    (set by :meth:`Tape.returned`)."""

    name: str
    args: tuple
    kwargs: dict | None
    result: object = None


class Idle:
    """A rehearsal's executor: nothing runs (rule 4)."""

    def recompute(self, sid: int, consume: int = -1) -> None:
        pass

    def free(self, sid: int) -> None:
        pass

    def keep(self, sid: int) -> None:
        pass

    def copy_out(self, sid: int) -> None:
        pass

    def fetch(self, sid: int, hint: bool = False) -> None:
        pass

    def drop_copy(self, sid: int) -> None:
        pass


class Tape:
    """The calls a driver made on one core (rule 2). ``base``: the core's own class;
    ``calls``: the taped :class:`Call` records; ``mark``: how many were taped when the first
    step ended, ``evicted``: the core's evictions then; ``busy``: a taped call runs (the
    core's calls on itself pass)."""

    __slots__ = ("base", "busy", "calls", "evicted", "mark")

    def __init__(self, base: type) -> None:
        self.base = base
        self.calls: list[Call] = []
        self.busy = False
        self.mark = 0
        self.evicted = 0

    def record(self, name: str, args: tuple, kwargs: dict) -> Call:
        """A driver called ``name``: tape it; the core's calls on itself pass until
        :meth:`returned`."""
        if any(type(a) is list for a in args):  # the driver may reuse it
            args = tuple(tuple(a) if type(a) is list else a for a in args)
        call = Call(name, args, kwargs or None)
        self.calls.append(call)
        self.busy = True
        return call

    def returned(self, call: Call, result) -> None:
        """``call`` returned ``result`` (:data:`RAISED`: it raised)."""
        call.result = result
        self.busy = False

    @property
    def full(self) -> bool:
        """Rule 3: :data:`MAX_TAPE` calls taped."""
        return len(self.calls) >= MAX_TAPE

    def step_ended(self, evictions: int) -> None:
        """The first step ended, the core having evicted ``evictions`` storages: what is
        timed starts after the calls taped so far."""
        self.mark, self.evicted = len(self.calls), evictions

    def rehearse(self, core, scale: float) -> float | None:
        """Rule 4: the device time (ns) of the calls after the mark on a fresh core like
        ``core`` at ``scale``; None if the rehearsal raised where the recorded call did
        not."""
        try:
            twin = self.base(
                core.bytes.budget,
                core.heuristic,
                Idle(),
                backend="torch",
                stress=core.stress,
                pin_backward=core.pin_backward,
                reuse=core.reuse,
                table_device=_HOST,
                link=Link(core.link.bandwidth),
                always_offload=core.always_offload,
                ahead=core.ahead,
                prefetch=core.plan is not None,  # rule 6: by its own step plan
                copy_scale=scale,
            )
        except Exception as e:
            _bug(scale, f"building its core: {e!r}")
            return None
        start = 0.0
        for i, call in enumerate(self.calls):
            if i == self.mark:
                start = twin.elapsed
            name, args = call.name, call.args
            if name == "start":
                args = (_HOST,)
            elif name == "set_link":
                args = (None if args[0] is None else Link(args[0].bandwidth),)
            try:
                result = getattr(twin, name)(*args, **(call.kwargs or {}))
            except Exception as e:
                if call.result is RAISED:  # as the run did
                    continue
                if not isinstance(e, BudgetError):  # ThrashError is one
                    _bug(scale, f"{name}{args!r}: {e!r}")
                return None
            if name == "new" and result != call.result:
                _bug(scale, f"it made storage {result} where the run made {call.result}")
                return None
        return twin.elapsed - start


def _bug(scale: float, what: str) -> None:
    """Rule 4: a rehearsal's own error is a bug of tritondtr; the user's step goes on."""
    warnings.warn(
        f"tritondtr: the rehearsal of copy price scale {scale:g} failed ({what}); that scale "
        "is not chosen. This is a bug of tritondtr; please report it with this message.",
        RuntimeWarning,
        stacklevel=3,
    )


_TAPED_CLASSES: dict[type, type] = {}


def taped(cls: type) -> type:
    """The subclass of ``cls`` whose :data:`TAPED` methods tape the calls made on them from
    outside the core (rule 2); the core's ``tape`` is the :class:`Tape` they go to."""
    sub = _TAPED_CLASSES.get(cls)
    if sub is None:
        methods = {name: _taping(name, cls) for name in TAPED}
        methods["__module__"] = cls.__module__
        sub = _TAPED_CLASSES[cls] = type(cls.__name__, (cls,), methods)
        sub.__qualname__ = cls.__qualname__
    return sub


def _taping(name: str, cls: type):
    """``cls``'s method ``name``, taped; looked up on ``cls`` at each call, so the taped
    class runs what the class holds now."""

    def call(self, *args, **kwargs):
        method = getattr(cls, name)
        tape = self.tape
        if tape is None or tape.busy:
            return method(self, *args, **kwargs)
        rec = tape.record(name, args, kwargs)
        try:
            result = method(self, *rec.args, **kwargs)
        except BaseException:
            tape.returned(rec, RAISED)
            raise
        tape.returned(rec, result)
        if tape.full:
            self.stop_tape()
        return result

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(cls, name).__doc__
    return call

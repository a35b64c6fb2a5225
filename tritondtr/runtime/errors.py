"""The runtime's errors: each says what happened, with the numbers, and what to do."""

from __future__ import annotations

from ..core.errors import BudgetError, ThrashError

__all__ = ["BudgetError", "CostError", "StaleInputError", "ThrashError", "UnsupportedOpError"]


class StaleInputError(RuntimeError):
    """A tensor from outside the context (a parameter) changed after an op read it, and that
    op must now be recomputed: the recomputation would silently give other values."""

    def __init__(self, op: str, shape, recorded: int, now: int) -> None:
        super().__init__(
            f"tritondtr: cannot recompute {op}: its input of shape {tuple(shape)} from outside "
            f"the context (e.g. a parameter) was modified in place after the op first ran "
            f"(version {recorded} -> {now}), so a recomputation would give different values. "
            "Do in-place updates of parameters (optimizer.step) after backward, or keep them "
            "outside the tritondtr context."
        )


class UnsupportedOpError(NotImplementedError):
    """An op the runtime cannot run on tracked tensors; the message names it and why."""

    def __init__(self, op: str, why: str, fix: str | None = None) -> None:
        self.op = op
        fix = fix or (
            "Call it outside the context, or on tritondtr.runtime.unwrap(t) (a plain tensor)."
        )
        super().__init__(f"tritondtr: {op} is not supported on tracked tensors: {why}. {fix}")


class CostError(ValueError):
    """The session's cost model gave no usable cost for an op (NOTE [ Cost models ] rule 5 in
    cost.py): it raised, or returned something other than a finite number > 0."""

    def __init__(self, model: str, op: str, value, what: str) -> None:
        self.op, self.value = op, value
        shown = "" if value is None else f" ({value!r})"
        super().__init__(
            f"tritondtr: the cost model {model} {what}{shown} for {op}; a cost must be a finite "
            "number > 0 (estimated ns of the op). Make the callable return one for every op "
            "(e.g. max(cost, 1.0)), or pass cost='analytic' or cost='measured'. The op's "
            "outputs were not tracked: end the session."
        )

"""The record of one op in flight through ``Session._call``."""

from __future__ import annotations

__all__ = ["OpCall"]


class OpCall:
    """One op in flight, from binding its inputs to wrapping its outputs (after
    ``torch/utils/checkpoint.py``'s ``_CheckpointFrame``: one record owns the state of the
    call, and the steps read and fill it). Lives for the call only.

    Attributes:
        info: the op's ``OpInfo`` (runtime/semantics.py).
        args, kwargs: the call as the program made it (wrappers and all).
        pargs, pkw: the same with every tensor replaced by its plain value (``pkw`` is
            ``kwargs`` itself until a tensor keyword argument needs replacing).
        inputs: one ``Input`` record per tensor argument, in argument order (recipe.py).
        locked: the sids locked for this op (unlocked once it ran, or on error).
        parents: the sids its outputs' recipes read; a tuple once the op ran.
        wrote: the cells of the tracked storages it writes.
        rng: the generator states it drew from (NOTE [ RNG replay ]), or None.
        cost: its price in ns (NOTE [ Cost models ]), once it ran.
        blanks: NOTE [ Overwriting ops ]: the inputs it overwrites without reading, or None.
    """

    __slots__ = (
        "args",
        "blanks",
        "cost",
        "info",
        "inputs",
        "kwargs",
        "locked",
        "parents",
        "pargs",
        "pkw",
        "rng",
        "wrote",
    )

    def __init__(self, info, args: tuple, kwargs: dict) -> None:
        self.info, self.args, self.kwargs = info, args, kwargs
        self.pargs = list(args)
        self.pkw = kwargs
        self.inputs: list = []
        self.locked: list[int] = []
        self.parents: list[int] | tuple[int, ...] = []
        self.wrote: list = []
        self.rng = None
        self.cost = 0.0
        self.blanks = None

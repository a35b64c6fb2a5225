"""The demo's two regimes (NOTE [ The demo ] rule 4): a model whose ops take milliseconds, the
regime a GPU user is in, and the small model whose ops take microseconds, where tritondtr's
per-op Python price shows."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .tinygpt import GPTConfig

__all__ = ["REGIMES", "Regime", "RegimeSpec"]


class Regime(str, enum.Enum):
    """Which model the demo trains (``--regime``)."""

    LARGE = "large"
    SMALL = "small"


@dataclass(frozen=True)
class RegimeSpec:
    """A regime's model and run sizes; ``label`` names it in the table, the plot and the CSV."""

    regime: Regime
    label: str
    config: GPTConfig
    batch: int
    steps: int


REGIMES = {
    Regime.LARGE: RegimeSpec(
        Regime.LARGE,
        "large ops (ms): the GPU's regime",
        GPTConfig(block=256, width=256, layers=4),
        batch=4,
        steps=3,
    ),
    Regime.SMALL: RegimeSpec(
        Regime.SMALL,
        "small ops (us): this CPU's per-op price",
        GPTConfig(layers=8),
        batch=8,
        steps=4,
    ),
}

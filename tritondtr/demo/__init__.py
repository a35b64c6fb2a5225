"""The demo (``tritondtr demo``): TinyGPT trained under decreasing memory budgets, beside
``torch.utils.checkpoint`` and the twin's predictions.

``regimes`` (the large-op and small-op models), ``runs`` (the runs and their rows),
``report`` (the table, CSV and plot), ``cli`` (the command) and ``tinygpt`` (the model and
its data, also used by the benchmarks).
"""

from .regimes import REGIMES, Regime, RegimeSpec
from .runs import HEURISTIC, DemoRow, lowest_working, run_demo

__all__ = ["HEURISTIC", "REGIMES", "DemoRow", "Regime", "RegimeSpec", "lowest_working", "run_demo"]

"""The demo (``tritondtr demo``): TinyGPT trained under decreasing memory budgets, beside
``torch.utils.checkpoint`` and the twin's predictions.

``runs`` (the runs and their rows), ``report`` (the table, CSV and plot), ``cli`` (the
command) and ``tinygpt`` (the model and its data, also used by the benchmarks).
"""

from .runs import DEMO_CONFIG, HEURISTIC, DemoRow, lowest_working, run_demo

__all__ = ["DEMO_CONFIG", "HEURISTIC", "DemoRow", "lowest_working", "run_demo"]

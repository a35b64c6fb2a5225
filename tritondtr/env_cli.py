"""Print versions, device and Triton backend in use, for bug reports."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def run(args: argparse.Namespace) -> int:
    from .env import main

    main()
    return 0

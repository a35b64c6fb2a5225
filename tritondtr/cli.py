"""The ``tritondtr`` command: one subcommand per job, each defined in its own module."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

# name -> (module, help). Each module defines ``add_arguments(parser)`` and ``run(args) -> int``.
_COMMANDS = {
    "env": ("tritondtr.env", "print versions, device and Triton backend (for bug reports)"),
    "simulate": ("tritondtr.sim.cli", "replay traces under memory budgets (the paper's Figure 2)"),
    "demo": ("tritondtr.demo.cli", "train a small GPT under memory budgets (the main job)"),
}


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr and exit status 2: what is wrong and where to look,
    not the whole usage (``--help`` prints it). Subcommand parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="tritondtr", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name, (module, help_text) in _COMMANDS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(
            name,
            help=help_text,
            description=getattr(mod, "__doc__", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        modules[name] = mod
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

"""Versions, device and Triton backend in use, for bug reports: ``tritondtr env`` or
``python -m tritondtr.env``."""

from __future__ import annotations

import argparse
import os
import platform
import sys

__all__ = ["add_arguments", "main", "report", "run"]


def report() -> dict[str, str]:
    """Facts about this environment that matter to tritondtr, as name -> text."""
    import numpy
    import torch

    from . import __version__
    from .policy.backend import triton_available

    info = {
        "tritondtr": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "cuda available": str(torch.cuda.is_available()),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "not installed"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info["device"] = f"{p.name} ({p.total_memory / 2**30:.1f} GiB, cc {p.major}.{p.minor})"
        info["torch cuda"] = str(torch.version.cuda)
    else:
        info["device"] = f"cpu ({os.cpu_count()} cores)"
    interp = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if not triton_available():
        info["scoring backend (auto)"] = "torch (triton kernels not importable)"
    elif torch.cuda.is_available():
        info["scoring backend (auto)"] = "triton (CUDA)"
    else:
        info["scoring backend (auto)"] = "torch" + (
            "; backend='triton' runs under the interpreter"
            if interp
            else "; backend='triton' needs TRITON_INTERPRET=1"
        )
    return info


def main() -> None:
    info = report()
    width = max(map(len, info))
    for k, v in info.items():
        print(f"{k:<{width}}  {v}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``tritondtr env`` takes no options."""
    del parser


def run(args: argparse.Namespace) -> int:
    del args
    main()
    return 0


if __name__ == "__main__":
    main()

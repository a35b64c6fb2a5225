"""Byte quantities: parse ``"2GiB"``, ``"1.5GB"`` or ints, and format them back."""

from __future__ import annotations

import re

__all__ = ["format_bytes", "parse_bytes"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | str) -> int:
    """Bytes from an int or a string with a unit: ``"512MiB"``, ``"1.5GB"``, ``"2G"`` (binary).

    Raises ValueError for negative, non-integral or unparsable values.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a byte count (int) or a string like '2GiB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte count must be >= 0, got {value}")
        return value
    if isinstance(value, str):
        m = _PATTERN.match(value)
        if m and m.group(2).lower() in _UNITS:
            n = float(m.group(1)) * _UNITS[m.group(2).lower()]
            return round(n)
        raise ValueError(
            f"cannot read {value!r} as bytes; write an int or a number with a unit such as "
            f"'512MiB', '1.5GB' or '2GiB' (units: {', '.join(u for u in _UNITS if u)})"
        )
    raise ValueError(
        f"expected a byte count (int) or a string like '2GiB', got {type(value).__name__}"
    )


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.50 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")

"""Byte quantities: parse ``"2GiB"``, ``"1.5GB"`` or ints, and format them back."""

from __future__ import annotations

import numbers
import re
from decimal import Decimal
from fractions import Fraction

__all__ = ["format_bytes", "parse_bytes"]

_MAX_BYTES = 2**63 - 1  # accounting is int64

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
_PATTERN = re.compile(
    r"""\s*(?P<number>[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?|[+-]?(?:nan|inf(?:inity)?))
    \s*(?P<unit>[a-z]*)\s*""",
    re.IGNORECASE | re.VERBOSE,
)
_EXAMPLES = "an int, or a number with a unit such as '512MiB', '1.5GB' or '2GiB'"
_WHOLE = "write a whole number of bytes, or a unit that makes it one ('1.5KiB' = 1536 bytes)"


def parse_bytes(value: int | str) -> int:
    """Bytes from an int or a string with a unit: ``"512MiB"``, ``"1.5GB"``, ``"2G"`` (binary).

    Strings may have surrounding whitespace and a space before the unit; units are
    case-insensitive (``"1.5 gb"`` is 1500000000). The number is read exactly, so a fraction
    is fine when the product is a whole number of bytes (``"1.5KiB"`` = 1536, ``"0.4"`` is not).

    0 (and ``"-0"``) is a valid byte count. As a budget it is the tightest one, not "no limit"
    (that is None): ``enable(budget=0)`` fails with BudgetError at the first op that must keep
    anything resident, as any budget below the working set does; only running can tell how
    small is too small, so 0 is not singled out.

    Raises ValueError, saying what was wrong and what is expected, for negative, non-integral,
    NaN, infinite or unparsable values, for counts above 2**63 - 1 (int64, 8 EiB), and for types
    other than int and str (a float such as ``0.5 * peak`` would parse only when it happens
    to be whole: pass ``int(...)``).
    """
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, str)):
        raise ValueError(
            f"expected a byte count: {_EXAMPLES}; got {type(value).__name__} {value!r}"
        )
    if isinstance(value, numbers.Integral):
        return _checked(int(value), value)
    m = _PATTERN.fullmatch(value)
    if m is None:
        raise ValueError(f"cannot read {value!r} as bytes; write {_EXAMPLES}")
    unit = m["unit"].lower()
    if unit not in _UNITS:
        raise ValueError(
            f"cannot read {value!r} as bytes: unknown unit {m['unit']!r}; write {_EXAMPLES} "
            f"(units: {', '.join(u for u in _UNITS if u)}, in any case)"
        )
    number = Decimal(m["number"])  # exact, whatever the exponent
    if not number.is_finite():
        raise ValueError(f"a byte count must be a finite number, got {value!r}; write {_EXAMPLES}")
    if number.is_zero():
        return 0
    if number < 0:
        raise ValueError(f"a byte count must be >= 0, got {value!r}")
    # Bound the exponent before exact arithmetic: Fraction("1e-999999999") would build a
    # billion-digit denominator. Below 1e-20 nothing is a whole byte count, above 1e20 nothing
    # fits _MAX_BYTES, whatever the unit.
    if number.adjusted() < -20:
        raise ValueError(f"{value!r} is not a whole number of bytes; {_WHOLE}")
    if number.adjusted() > 20:
        raise _too_large(value)
    count = Fraction(number) * _UNITS[unit]
    if count.denominator != 1:
        raise ValueError(f"{value!r} is {float(count):.6g} bytes, not a whole number; {_WHOLE}")
    return _checked(int(count), value)


def _checked(count: int, value: int | str) -> int:
    if count < 0:
        raise ValueError(f"a byte count must be >= 0, got {value!r}")
    if count > _MAX_BYTES:
        raise _too_large(value)
    return count


def _too_large(value: int | str) -> ValueError:
    return ValueError(
        f"{value!r} is more bytes than tritondtr counts: at most 2**63 - 1 ({_MAX_BYTES}, 8 EiB)"
    )


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.50 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")

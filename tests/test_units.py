import numpy as np
import pytest

import tritondtr
from tritondtr.runtime.config import RuntimeConfig
from tritondtr.units import format_bytes, parse_bytes


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2GiB", 2 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("1.5 gb", 1_500_000_000),  # a space before the unit, units in any case
        (" 1GiB ", 2**30),  # surrounding whitespace
        ("1.1GB", 1_100_000_000),  # read exactly: 1.1 * 1e9 in floats is 1100000000.0000002
        ("1.5KiB", 1536),  # a fraction is fine when the product is whole
        ("100", 100),
        (" 3 kib ", 3072),
        ("2G", 2 * 2**30),
        ("1e3B", 1000),
        ("+5", 5),
        ("0", 0),  # a valid byte count; as a budget the tightest one (parse_bytes docstring)
        ("-0", 0),
        (4096, 4096),
        (0, 0),
        (np.int64(127), 127),
        (2**63 - 1, 2**63 - 1),
    ],
    ids=repr,
)
def test_parse(text, expected):
    n = parse_bytes(text)
    assert n == expected and type(n) is int


@pytest.mark.parametrize(
    "bad, message",
    [
        ("1e400", r"'1e400' is more bytes than tritondtr counts: at most 2\*\*63 - 1"),
        ("9.3e18", r"more bytes than tritondtr counts"),
        (2**63, r"more bytes than tritondtr counts"),
        ("1e999999999", r"more bytes than tritondtr counts"),
        ("0.4", r"'0.4' is 0.4 bytes, not a whole number; write a whole number of bytes"),
        ("1.5", r"not a whole number"),
        ("1e-999999999", r"not a whole number of bytes"),
        ("nan", r"a byte count must be a finite number, got 'nan'; write an int"),
        ("inf", r"a byte count must be a finite number, got 'inf'"),
        ("-Infinity", r"must be a finite number"),
        ("NaN GiB", r"must be a finite number"),
        ("-1GiB", r"a byte count must be >= 0, got '-1GiB'"),
        ("-0.5", r"must be >= 0"),
        (-5, r"a byte count must be >= 0, got -5"),
        ("two GB", r"cannot read 'two GB' as bytes; write an int, or a number with a unit"),
        ("3 parsecs", r"unknown unit 'parsecs'.*units: b, kb"),
        ("8EiB", r"unknown unit 'EiB'"),
        ("", r"cannot read '' as bytes"),
        ("1 0", r"cannot read '1 0' as bytes"),
        (1.5, r"expected a byte count: .*; got float 1.5"),
        (2e9, r"got float"),  # a float is whole only by chance (0.5 * peak): pass int(...)
        (True, r"got bool True"),
        (None, r"got NoneType None"),
    ],
    ids=repr,
)
def test_bad_values_are_explained(bad, message):
    with pytest.raises(ValueError, match=message):
        parse_bytes(bad)


@pytest.mark.parametrize("bad", ["1e400", "0.4", "nan", "inf", "-1GiB", "two GB"])
def test_enable_rejects_bad_budget_strings(bad):
    """``enable`` raises ValueError at the call, before any session starts: no OverflowError,
    no silent 0 bytes."""
    with pytest.raises(ValueError, match=r"^budget: .*; or None to track without evicting$"):
        tritondtr.enable(budget=bad)


@pytest.mark.parametrize("text, expected", [(" 1GiB ", 2**30), ("1.5 gb", 1_500_000_000), ("0", 0)])
def test_config_reads_budget_strings(text, expected):
    assert RuntimeConfig(budget=text).budget == expected


def test_format():
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(12) == "12 B"

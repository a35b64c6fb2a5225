import pytest

from tritondtr.units import format_bytes, parse_bytes


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2GiB", 2 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("100", 100),
        (" 3 kib ", 3072),
        ("2G", 2 * 2**30),
        ("1e3B", 1000),
        (4096, 4096),
    ],
)
def test_parse(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["-1GiB", "two GB", "3 parsecs", -5, 1.5, True, None, ""])
def test_bad_values_are_explained(bad):
    with pytest.raises(ValueError, match=r"bytes|byte count"):
        parse_bytes(bad)


def test_format():
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(12) == "12 B"

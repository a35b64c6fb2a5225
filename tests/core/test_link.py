"""NOTE [ Offload link ] in tritondtr/core/link.py: bandwidths read from numbers, texts and
link names; copies queued per direction; the price of an offload."""

from __future__ import annotations

import pytest

from tritondtr.core.link import LINKS, Link, offload_price, parse_bandwidth


@pytest.mark.parametrize(
    ("value", "bytes_per_s"),
    [
        (25e9, 25e9),
        (1, 1.0),
        ("25GB/s", 25e9),
        ("25 gb/s", 25e9),
        ("800 MB/s", 800e6),
        ("1.5TB/s", 1.5e12),
        ("2e1 GB/s", 20e9),
        ("16 GiB/s", 16 * 2**30),
        ("512MiB/s", 512 * 2**20),
        ("pcie5", 32e9 * 16 * 128 / 130 / 8),
        ("PCIe4", 16e9 * 16 * 128 / 130 / 8),
        ("NVLink-C2C", 450e9),
        ("nvlink_c2c", 450e9),
    ],
)
def test_bandwidths_are_read_from_numbers_texts_and_names(value, bytes_per_s):
    assert parse_bandwidth(value) == pytest.approx(bytes_per_s, rel=1e-12)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (0, "positive and finite"),
        (-5e9, "positive and finite"),
        (float("inf"), "positive and finite"),
        (float("nan"), "positive and finite"),
        ("0GB/s", "positive and finite"),
        ("fast", "cannot read bandwidth 'fast'"),
        ("25 GB", "cannot read bandwidth"),
        ("25 furlongs/s", "cannot read bandwidth"),
        ("", "cannot read bandwidth"),
        (True, "bytes per second"),
        (None, "a number or a text"),
        ([25e9], "a number or a text"),
    ],
)
def test_bad_bandwidths_say_what_is_accepted(value, match):
    with pytest.raises(ValueError, match=match):
        parse_bandwidth(value)
    with pytest.raises(ValueError, match=match):
        Link(value)


def test_copies_queue_per_direction_and_the_directions_are_independent():
    link = Link("1GB/s")  # 1 byte per ns
    assert link.duration(1000) == pytest.approx(1000.0)
    assert link.copy_out(1000, now=0) == pytest.approx(1000)
    assert link.copy_out(500, now=200) == pytest.approx(1500)  # waits for the first
    assert link.copy_out(100, now=5000) == pytest.approx(5100)  # the link was free
    assert link.copy_in(1000, now=0) == pytest.approx(1000)  # the other way: not waiting
    assert link.out_done(10, now=5050) == pytest.approx(5110)  # asking issues nothing
    assert link.out_busy == pytest.approx(5100)


def test_the_offload_price_is_the_wait_for_the_copy_out_and_the_copy_back():
    link = Link(LINKS["pcie5"])
    n = 64 * 2**20
    one = link.duration(n)
    assert offload_price(n, link, now=0) == pytest.approx(2 * one)
    assert offload_price(n, link, now=0, prefetched=True) == pytest.approx(one)
    link.copy_out(n, now=0)  # a copy in flight: the next one waits behind it
    assert offload_price(n, link, now=0) == pytest.approx(3 * one)
    assert offload_price(n, link, now=one) == pytest.approx(2 * one)

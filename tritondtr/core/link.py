"""The host link an offload copies over: its bandwidth, the copies in flight on it, and the
price of offloading a storage against recomputing it, in the core's time (ns).

Offload as a second action (drop and recompute, or copy to host and back): the model the DTR
core decides with (NOTE [ Offload ] in core.py), the same in the runtime and the twin.

# NOTE [ Offload link ]
# 1. A link has one bandwidth per direction (bytes per second; PCIe and NVLink-C2C are full
#    duplex, and a GPU has a copy engine each way), and copies in each direction run one
#    after another in the order they were issued: a copy issued at t starts when the
#    previous one in its direction is done, ``max(t, busy)``, and takes ``bytes /
#    bandwidth``. Issue latency (~34 us of host time per copy on the H200's host,
#    docs/benchmarks.md, GPU figures) is host time, not link time, and is not modelled.
# 2. Time is the core's device time in ns: the sum of the costs of what ran (ops and
#    recomputations, priced by the session's cost model), the same numbers the twin replays,
#    so the twin can model the link exactly as the runtime's core does; the runtime's real
#    copies only decide when memory may be reused safely (their events), never a decision.
# 3. Offloading a victim frees its device bytes when its device-to-host copy is done, not
#    when it is issued (they count against the budget until then), and getting it back costs
#    a host-to-device copy. So its price, against a drop's (the recomputation with its
#    evicted neighbourhood, the engine's cost + nbhd cost), is the wait until its copy out
#    would be done (the budget binds now: the op waits for those bytes) plus the copy back
#    (unless a prefetch hides it): ``offload_price``. The cheaper action is taken.
# 4. Bandwidths are given as bytes per second, a text ("25GB/s", "800 MB/s", "1.5TB/s";
#    decimal units, GiB/s and MiB/s binary) or a named link (:data:`LINKS`); anything else,
#    zero, a negative or a non-finite number is a ValueError that says what is accepted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["LINKS", "Link", "offload_price", "parse_bandwidth"]

# Nominal per-direction rates: PCIe 4.0 / 5.0 x16 are 16 / 32 GT/s x 16 lanes with 128b/130b
# coding; NVLink-C2C (Grace Hopper) is 900 GB/s in both directions together. Measured on the
# H200's PCIe 5.0 link: 53 to 55 GB/s with pinned memory (docs/benchmarks.md, GPU figures).
LINKS: dict[str, float] = {
    "pcie4": 16e9 * 16 * 128 / 130 / 8,  # 31.5 GB/s
    "pcie5": 32e9 * 16 * 128 / 130 / 8,  # 63.0 GB/s
    "nvlink-c2c": 450e9,
}
_UNITS = {
    "b/s": 1.0,
    "kb/s": 1e3,
    "mb/s": 1e6,
    "gb/s": 1e9,
    "tb/s": 1e12,
    "kib/s": 2.0**10,
    "mib/s": 2.0**20,
    "gib/s": 2.0**30,
    "tib/s": 2.0**40,
}
_TEXT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z/]+)\s*$", re.IGNORECASE)


def parse_bandwidth(value: float | int | str) -> float:
    """A link bandwidth in bytes per second (NOTE [ Offload link ] rule 4).

    Accepts a positive finite number of bytes per second, a text such as ``"25GB/s"`` or
    ``"800 MiB/s"``, or a named link: ``"pcie4"``, ``"pcie5"``, ``"nvlink-c2c"``."""
    if isinstance(value, bool):
        raise ValueError(f"a bandwidth is bytes per second, got {value!r}")
    if isinstance(value, (int, float)):
        bw = float(value)
    elif isinstance(value, str):
        key = value.strip().lower().replace(" ", "").replace("_", "-")
        if key in LINKS:
            return LINKS[key]
        m = _TEXT.match(value)
        unit = m and m.group(2).lower()
        if not m or unit not in _UNITS:
            raise ValueError(
                f"cannot read bandwidth {value!r}: give bytes per second (25e9), a rate with "
                f"a unit ('25GB/s', '800 MiB/s'; units {', '.join(_UNITS)}) or a named link "
                f"({', '.join(LINKS)})"
            )
        bw = float(m.group(1)) * _UNITS[unit]
    else:
        raise ValueError(f"a bandwidth is a number or a text like '25GB/s', got {value!r}")
    if not math.isfinite(bw) or bw <= 0:
        raise ValueError(f"a bandwidth must be positive and finite, got {value!r}")
    return bw


@dataclass
class Link:
    """A full-duplex link (NOTE [ Offload link ] rule 1) in the core's time, ns.

    Args:
        bandwidth: bytes per second each way, or anything :func:`parse_bandwidth` reads.
    """

    bandwidth: float
    out_busy: float = 0.0  # device -> host: when the last copy issued is done (ns)
    in_busy: float = 0.0  # host -> device

    def __post_init__(self) -> None:
        self.bandwidth = parse_bandwidth(self.bandwidth)

    def duration(self, nbytes: int) -> float:
        """ns that ``nbytes`` take on the link, once it is free."""
        return nbytes / self.bandwidth * 1e9

    def out_done(self, nbytes: int, now: float) -> float:
        """When a device -> host copy of ``nbytes`` issued at ``now`` would be done."""
        return max(now, self.out_busy) + self.duration(nbytes)

    def copy_out(self, nbytes: int, now: float) -> float:
        """Issue a device -> host copy at ``now``; returns when it is done."""
        self.out_busy = done = self.out_done(nbytes, now)
        return done

    def copy_in(self, nbytes: int, now: float) -> float:
        """Issue a host -> device copy at ``now``; returns when it is done."""
        self.in_busy = done = max(now, self.in_busy) + self.duration(nbytes)
        return done


def offload_price(nbytes: int, link: Link, now: float, prefetched: bool = False) -> float:
    """What offloading a storage of ``nbytes`` costs, ns (NOTE [ Offload link ] rule 3): the
    wait until its copy out would be done, plus the copy back unless a prefetch hides it.
    Compare with the recomputation's cost with its evicted neighbourhood."""
    wait = link.out_done(nbytes, now) - now
    return wait if prefetched else wait + link.duration(nbytes)

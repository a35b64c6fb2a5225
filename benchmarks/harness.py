"""The one benchmark harness of tritondtr: timing, rows of a fixed schema, files, tables, plots.

Every benchmark script under ``benchmarks/`` measures with :func:`measure`, turns timings into
:class:`Row` s (one schema for the whole project, see :data:`SCHEMA`), writes them with
:func:`write_csv` / :func:`write_json`, prints :func:`pivot_markdown` tables and draws
:func:`plot_rows` figures from the rows alone.

# NOTE [ Benchmark timing ]
# 1. A sample is ``loops`` back-to-back calls timed with ``time.perf_counter`` (wall clock);
#    the sample's value is its time divided by ``loops``. ``loops`` is calibrated from the
#    last warmup call so that a sample lasts at least ``min_sample_s``: timer resolution and
#    loop overhead stay negligible for microsecond calls.
# 2. On CUDA the device is synchronised before and after every sample, so a sample covers
#    all the work its calls launched. Wall clock, not CUDA events: what we want to know is
#    what the caller waits for, host overhead and device-to-host reads included.
# 3. The garbage collector is off during samples (as in ``timeit``) and restored after.
# 4. A row reports the median and the spread of the samples: interquartile range (q1, q3)
#    and min/max. Never the mean: a shared machine produces one-sided outliers.
# 5. Sampling stops after ``repeats`` samples, or earlier once ``max_time_s`` is spent and
#    at least 3 samples exist.
# 6. Every row carries its device (hardware in words), torch/triton/python versions, the git
#    sha (with ``-dirty`` when tracked files differ from it) and the UTC date of the run.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import gc
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "SCHEMA",
    "Env",
    "Row",
    "Stats",
    "Timing",
    "copy_bandwidth",
    "describe_device",
    "measure",
    "pivot_markdown",
    "plot_rows",
    "read_csv",
    "read_json",
    "write_csv",
    "write_json",
]


# ----------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class Stats:
    """Median and spread of one measured quantity, all in the same unit."""

    median: float
    q1: float
    q3: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        """Quantiles of ``samples`` (linear interpolation, as ``numpy.percentile``)."""
        xs = sorted(float(x) for x in samples)
        if not xs:
            raise ValueError("Stats.of needs at least one sample, got none")
        return cls(_quantile(xs, 0.5), _quantile(xs, 0.25), _quantile(xs, 0.75), xs[0], xs[-1])

    def map(self, f: Callable[[float], float]) -> Stats:
        """``f`` applied to every field; ``f`` must be monotone (a decreasing ``f`` such as
        ``lambda t: n / t`` swaps q1/q3 and min/max back into order)."""
        v = [f(x) for x in (self.median, self.q1, self.q3, self.min, self.max)]
        return Stats(v[0], min(v[1], v[2]), max(v[1], v[2]), min(v[3], v[4]), max(v[3], v[4]))


def _quantile(xs: list[float], q: float) -> float:
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    if xs[hi] == xs[lo]:  # also inf: inf - inf would be nan
        return xs[lo]
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Timing:
    """Result of :func:`measure`: ``samples`` are seconds per call, one per sample."""

    samples: tuple[float, ...]
    loops: int

    def stats(self, scale: float = 1.0) -> Stats:
        """Quantiles of the seconds per call, multiplied by ``scale`` (1e6 for microseconds)."""
        return Stats.of([s * scale for s in self.samples])


def _synchronize(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    fn: Callable[[], object],
    *,
    device: torch.device | str | None = None,
    warmup: int = 2,
    repeats: int = 10,
    min_sample_s: float = 2e-3,
    max_time_s: float | None = None,
) -> Timing:
    """Time ``fn()`` per NOTE [ Benchmark timing ].

    Args:
        fn: the call to time, no arguments; its result is discarded.
        device: where ``fn`` runs; a CUDA device is synchronised around every sample.
        warmup: untimed calls first (at least 1: the last one calibrates ``loops``).
        repeats: number of samples.
        min_sample_s: a sample lasts at least this long (seconds).
        max_time_s: stop sampling after this many seconds once 3 samples exist.
    """
    if warmup < 1 or repeats < 1:
        raise ValueError(f"measure needs warmup >= 1 and repeats >= 1, got {warmup}, {repeats}")
    dev = torch.device(device) if device is not None else None
    for _ in range(warmup):
        _synchronize(dev)
        t0 = time.perf_counter()
        fn()
        _synchronize(dev)
        once = time.perf_counter() - t0
    loops = max(1, min(100_000, math.ceil(min_sample_s / max(once, 1e-9))))
    samples: list[float] = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    start = time.perf_counter()
    try:
        for _ in range(repeats):
            _synchronize(dev)
            t0 = time.perf_counter()
            for _ in range(loops):
                fn()
            _synchronize(dev)
            samples.append((time.perf_counter() - t0) / loops)
            spent = time.perf_counter() - start
            if max_time_s is not None and spent > max_time_s and len(samples) >= 3:
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    return Timing(tuple(samples), loops)


def copy_bandwidth(
    device: torch.device | str, nbytes: int | None = None, *, repeats: int = 10
) -> tuple[Stats, Timing]:
    """Measured copy bandwidth of ``device`` in GB/s (1e9 bytes/s), counting read + write.

    Copies one buffer of ``nbytes`` into another with ``Tensor.copy_``: 2 * nbytes move per
    copy. Default 1 GiB on CUDA (far beyond any GPU's L2) and 256 MiB on CPU (source plus
    destination 512 MiB, beyond the L3 of common server CPUs). This is the practical ceiling a
    memory-bound kernel on the same device is compared with.
    """
    dev = torch.device(device)
    if nbytes is None:
        nbytes = (1 << 30) if dev.type == "cuda" else (256 << 20)
    src = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    timing = measure(
        lambda: dst.copy_(src), device=dev, warmup=2, repeats=repeats, min_sample_s=0.0
    )
    return timing.stats().map(lambda t: 2 * nbytes / t / 1e9), timing


# ------------------------------------------------------------------------ environment
def describe_device(device: torch.device | str) -> str:
    """The hardware of ``device`` in words, e.g.
    ``"NVIDIA H100 80GB HBM3 (79.1 GiB, cc 9.0, 132 SMs)"`` or
    ``"CPU: Intel(R) Xeon(R) Processor, 2 cores x86_64, 23 GiB RAM, torch threads: 2"``."""
    dev = torch.device(device)
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        return (
            f"{p.name} ({p.total_memory / 2**30:.1f} GiB, cc {p.major}.{p.minor}, "
            f"{p.multi_processor_count} SMs)"
        )
    if dev.type != "cpu":
        return str(dev)
    return (
        f"CPU: {_cpu_model()}, {os.cpu_count()} cores {platform.machine()}, "
        f"{_ram_gib():.0f} GiB RAM, torch threads: {torch.get_num_threads()}"
    )


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _ram_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return float("nan")


def _git_sha() -> str:
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "HEAD"], cwd=here, capture_output=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha.stdout.strip() + ("-dirty" if dirty.returncode == 1 else "")


@dataclass(frozen=True)
class Env:
    """What every row of one run shares: versions, git sha and date (NOTE rule 6)."""

    torch: str
    triton: str
    python: str
    git_sha: str
    date: str

    @classmethod
    def capture(cls) -> Env:
        try:
            import triton

            triton_version = triton.__version__
        except ImportError:
            triton_version = "not installed"
        now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
        return cls(
            torch.__version__, triton_version, sys.version.split()[0], _git_sha(), now.isoformat()
        )


# ------------------------------------------------------------------------------- rows
@dataclass(frozen=True)
class Row:
    """One measured quantity: the fixed schema of every benchmark result of the project.

    ``what`` names the quantity (``"decision_latency"``), ``provider`` the implementation
    (``"triton"``), ``size`` the problem size (N, an int), ``median`` .. ``max`` its value and
    spread in ``unit``; ``repeats`` samples of ``loops`` calls each; ``params`` the other
    parameters as ``key=value;...``; ``device`` the hardware in words; then versions, git sha
    and UTC date (:class:`Env`); ``note`` anything a reader must know (a cap, a mismatch).
    """

    what: str
    provider: str
    size: int
    median: float
    q1: float
    q3: float
    min: float
    max: float
    unit: str
    repeats: int
    loops: int
    params: str
    device: str
    torch: str
    triton: str
    python: str
    git_sha: str
    date: str
    note: str = ""

    @classmethod
    def of(
        cls,
        what: str,
        provider: str,
        size: int,
        stats: Stats,
        unit: str,
        *,
        device: str,
        env: Env,
        timing: Timing | None = None,
        params: str = "",
        note: str = "",
    ) -> Row:
        """A row from ``stats``; ``timing`` (when the stats come from one) gives repeats/loops."""
        repeats = len(timing.samples) if timing is not None else 1
        loops = timing.loops if timing is not None else 1
        return cls(
            what,
            provider,
            int(size),
            *dataclasses.astuple(stats),
            unit,
            repeats,
            loops,
            params,
            device,
            env.torch,
            env.triton,
            env.python,
            env.git_sha,
            env.date,
            note,
        )

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Row:
        """Inverse of ``dataclasses.asdict``, also from the strings of a CSV file."""
        missing = [f for f in SCHEMA if f not in d]
        if missing:
            raise ValueError(
                f"not a benchmark row: missing field(s) {missing}; "
                f"expected the schema {list(SCHEMA)}"
            )
        kw = {}
        for f in dataclasses.fields(cls):
            v = d[f.name]
            kw[f.name] = _TYPES[f.name](v) if v is not None else v
        return cls(**kw)

    def stats(self) -> Stats:
        return Stats(self.median, self.q1, self.q3, self.min, self.max)


SCHEMA: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Row))
"""Column names of every CSV and JSON result file, in order."""

_TYPES: dict[str, Callable[[object], object]] = {
    f: (
        int
        if f in ("size", "repeats", "loops")
        else float
        if f in ("median", "q1", "q3", "min", "max")
        else str
    )
    for f in SCHEMA
}


def write_csv(rows: Iterable[Row], path: str | Path) -> Path:
    """Write ``rows`` to ``path`` (header = :data:`SCHEMA`); floats keep full precision."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SCHEMA)
        w.writeheader()
        for r in rows:
            w.writerow(
                {
                    k: repr(v) if isinstance(v, float) else v
                    for k, v in dataclasses.asdict(r).items()
                }
            )
    return path


def read_csv(path: str | Path) -> list[Row]:
    with Path(path).open(newline="") as f:
        return [Row.from_dict(d) for d in csv.DictReader(f)]


def write_json(rows: Iterable[Row], path: str | Path) -> Path:
    """Write ``rows`` as a JSON list of objects (NaN and inf as JSON's ``NaN``/``Infinity``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1) + "\n")
    return path


def read_json(path: str | Path) -> list[Row]:
    return [Row.from_dict(d) for d in json.loads(Path(path).read_text())]


# ---------------------------------------------------------------------- tables, plots
def pivot_markdown(
    rows: Iterable[Row],
    what: str,
    fmt: Callable[[Row], str] = lambda r: f"{r.median:.4g}",
    providers: Sequence[str] | None = None,
) -> str:
    """A markdown table of the ``what`` rows: one line per size, one column per provider,
    cells ``fmt(row)``; a missing (provider, size) reads ``-``."""
    sel = [r for r in rows if r.what == what]
    if providers is None:
        providers = list(dict.fromkeys(r.provider for r in sel))
    unit = sel[0].unit if sel else ""
    cell = {(r.size, r.provider): fmt(r) for r in sel}
    sizes = sorted({r.size for r in sel})
    lines = [f"| N | {' | '.join(providers)} |", "|---:" + "|---:" * len(providers) + "|"]
    lines += [
        f"| {n:,} | " + " | ".join(cell.get((n, p), "-") for p in providers) + " |" for n in sizes
    ]
    return f"{what} ({unit})\n\n" + "\n".join(lines)


def plot_rows(
    rows: Iterable[Row],
    panels: Sequence[tuple[str, str]],
    path: str | Path,
    *,
    title: str = "",
    logy: bool = True,
) -> Path:
    """One panel per ``(what, y label)``: the median against ``size`` (log x), one line per
    provider, the interquartile range shaded. Written to ``path`` (format from its suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(rows)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (what, ylabel) in zip(axes[0], panels):
        sel = [r for r in rows if r.what == what]
        for provider in dict.fromkeys(r.provider for r in sel):
            pts = sorted((r.size, r.median, r.q1, r.q3) for r in sel if r.provider == provider)
            x, med, lo, hi = (list(c) for c in zip(*pts))
            (line,) = ax.plot(x, med, marker="o", ms=3.5, label=provider)
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
        ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel("N (slots)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

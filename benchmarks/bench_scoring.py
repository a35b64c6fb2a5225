"""How fast is one eviction decision, and how does it scale?

Scoring plus selection (k = 1) of N slots, per provider, including the device-to-host read of
the victim id. Run ``python benchmarks/bench_scoring.py`` (quick, under a minute on a laptop
CPU) or ``--full`` (the committed sweep); see benchmarks/README.md and docs/benchmarks.md.

# NOTE [ Scoring benchmark ]
# 1. Providers: ``triton`` (the kernels on CUDA, a selection prepared once over the columns,
#    as a CUDA table keeps one: NOTE [ One-launch selection ] rule 7), ``triton-unprepared``
#    (the same kernel through ``policy.select``, which validates and allocates per call),
#    ``torch-cuda`` (the unfused torch twin on CUDA tensors), ``torch`` (the twin on CPU, on
#    a table's columns), ``torch-bare`` (the twin on CPU on the five bare columns),
#    ``numpy`` (vectorised float32, same formula), ``python`` (a scan of the candidate
#    pool, one heuristic call per candidate, like the original DTR simulator). The four
#    GPU-free ones run on every machine.
# 2. One decision = ``tritondtr.policy.select(..., k=1)`` on prepared columns (already on the
#    device, nothing staged; for ``triton`` the prepared selection's ``victims``), ending
#    with the victim id on the host: for the device providers
#    the device-to-host read is inside the timed call. ``torch`` is
#    ``MetadataTable.select`` on a CPU table (which passes the twin its five columns, the
#    derived ``evictable_size`` and its clock bounds: NOTE [ Evictable size ], [ Clock
#    bounds ]); ``torch-bare`` is ``policy.select`` on the five columns only, as a caller
#    without a table (the twin then makes evictable_size per call and subtracts clocks in
#    int64); ``numpy`` and ``python`` get the five. The device providers get the table's
#    columns on the device.
# 3. Every provider's victim is checked against the torch twin's at every size before it is
#    timed; a mismatch is printed, noted in the rows and makes the exit status 2.
# 4. Bandwidth = BYTES_READ[heuristic] * N / latency (25 B/slot for dtr), compared with the
#    measured copy bandwidth of the same device in the same run (read + write bytes of a
#    large ``copy_``), so the fraction says how close a decision is to a pure stream.
# 5. Targets (issue 2, section 6), each from rows of this one run: on an H100, bandwidth
#    fraction >= 0.8 for N >= 2**24, <= 20 us at N = 1e6, >= 5x torch-cuda at N = 1e6; on
#    CPU, torch >= 100x python at N = 1e5. A target whose rows are missing is "not measured".
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from pathlib import Path

import torch
from harness import (
    Env,
    Row,
    Stats,
    copy_bandwidth,
    describe_device,
    measure,
    pivot_markdown,
    plot_rows,
    write_csv,
    write_json,
)
from scoring_baselines import (
    BYTES_READ,
    PyColumns,
    score_numpy,
    select_numpy,
    select_python,
    synthetic_columns,
    synthetic_table,
)
from tqdm import tqdm

from tritondtr import Heuristic, MetadataTable, policy
from tritondtr.policy.scoring import random_base

PROVIDERS = (
    "triton",
    "triton-unprepared",
    "torch-cuda",
    "torch",
    "torch-bare",
    "numpy",
    "python",
)
ON_CUDA = ("triton", "triton-unprepared", "torch-cuda")
QUICK_SIZES = (10**3, 10**4, 10**5, 10**6)
FULL_SIZES = tuple(int(m * 10**e) for e in range(3, 8) for m in (1, 3))[:-1]  # 1e3 .. 1e7
GPU_EXTRA = (2**24, 3 * 10**7, 10**8)


def parse_size(text: str) -> int:
    """``1000``, ``1e6``, ``16M`` (decimal suffixes K, M, G) or ``2^24``, as an int."""
    t = text.strip()
    if m := re.fullmatch(r"2\^(\d+)", t):
        return 2 ** int(m.group(1))
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(t[-1:].upper(), 1)
    try:
        n = int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        msg = f"not a size: {text!r}; write 1000, 1e6, 16M or 2^24"
        raise argparse.ArgumentTypeError(msg) from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return n


def decision(provider: str, h: Heuristic, cols: dict | MetadataTable, now: int, seed: int):
    """The zero-argument call that makes one decision, returning the victim ids (host).
    ``cols``: columns, or for ``torch`` the table (rule 2)."""
    if provider == "torch":
        return lambda: cols.select(h, now, k=1, backend="torch", seed=seed).tolist()
    if provider == "triton":
        sel = policy.selection(h, cols, k=1, backend="triton")
        return lambda: sel.victims(now, random_base(seed, now))
    if provider in ("triton-unprepared", "torch-cuda", "torch-bare"):
        backend = "torch" if provider.startswith("torch") else "triton"
        return lambda: policy.select(h, cols, now, k=1, backend=backend, seed=seed).tolist()
    if provider == "numpy":
        c = {k: v.numpy() for k, v in cols.items()}
        return lambda: select_numpy(h, c, now, seed)
    p = PyColumns.of(cols)
    return lambda: select_python(h, p, now, seed)


def triton_unavailable() -> str | None:
    """Why the triton provider cannot run here, or None."""
    if not torch.cuda.is_available():
        return "no CUDA device (Triton kernels only run on a GPU here)"
    try:
        from tritondtr import kernels
    except ImportError as e:
        return f"tritondtr.kernels not importable: {e}"
    return None if hasattr(kernels, "select") else "tritondtr.kernels has no select()"


def ratio(slow: Row, fast: Row) -> Stats:
    """slow / fast, with the widest spread the two interquartile ranges allow."""
    return Stats(
        slow.median / fast.median,
        slow.q1 / fast.q3,
        slow.q3 / fast.q1,
        slow.min / fast.max,
        slow.max / fast.min,
    )


def targets(rows: list[Row], make) -> tuple[list[Row], list[str]]:
    """Rows ``what="target"`` and printable verdicts (NOTE [ Scoring benchmark ] rule 5)."""
    lat = {(r.provider, r.size): r for r in rows if r.what == "decision_latency"}
    found: list[tuple[str, str, bool, Row] | tuple[str, None, None, None]] = []

    name = "GPU: triton >= 80 % of copy bandwidth for N >= 2^24"
    big = [
        r
        for r in rows
        if r.what == "bandwidth_fraction" and r.provider == "triton" and r.size >= 2**24
    ]
    found += [
        (
            f"{name} (N = {r.size:,})",
            f"{r.median:.2f}",
            r.median >= 0.8,
            make("target", "triton", r.size, r.stats(), r.unit),
        )
        for r in big
    ]
    if not big:
        found.append((name, None, None, None))
    name = "GPU: triton <= 20 us per decision at N = 1e6"
    if r := lat.get(("triton", 10**6)):
        found.append(
            (
                name,
                f"{r.median:.1f} us",
                r.median <= 20,
                make("target", "triton", r.size, r.stats(), "us"),
            )
        )
    else:
        found.append((name, None, None, None))
    for slow, fast, n, need, name in (
        ("torch-cuda", "triton", 10**6, 5, "GPU: triton >= 5x the unfused torch path at N = 1e6"),
        ("python", "torch", 10**5, 100, "CPU: torch >= 100x the Python loop at N = 1e5"),
    ):
        if (slow, n) in lat and (fast, n) in lat:
            s = ratio(lat[slow, n], lat[fast, n])
            mins = lat[slow, n].min / lat[fast, n].min  # the least disturbed samples
            found.append(
                (
                    name,
                    f"{s.median:.1f}x of medians (IQR bounds {s.q1:.1f}x to "
                    f"{s.q3:.1f}x; {mins:.1f}x of minima)",
                    s.median >= need,
                    make("target", f"{slow}/{fast}", n, s, "x", on=fast),
                )
            )
        else:
            found.append((name, None, None, None))
    out, lines = [], []
    for name, value, ok, row in found:
        if row is None:
            lines.append(f"----  {name}: not measured in this run (its rows are missing)")
            continue
        mark = "PASS" if ok else "FAIL"
        lines.append(f"{mark}  {name}: measured {value}")
        out.append(dataclasses.replace(row, note=f"{mark}: {name}"))
    return out, lines


def run_case(
    p: str,
    n: int,
    h: Heuristic,
    cols,
    now: int,
    ref: list[int],
    seed: int,
    repeats: int,
    budget: float,
    make,
    copy_gbs: dict[str, float],
) -> list[Row]:
    """Check provider ``p``'s victim against ``ref`` (rule 3), time it, return its rows."""
    fn = decision(p, h, cols, now, seed)
    got = fn()
    note = ""
    if got != ref and not (p == "python" and _float32_tie(h, cols, now, got, ref)):
        note = f"MISMATCH: victim {got}, the torch twin's is {ref}"
        print(f"{p} N = {n:,}: {note}", file=sys.stderr)
    dev = "cuda" if p in ON_CUDA else "cpu"
    t = measure(fn, device=dev, repeats=repeats, max_time_s=budget)
    lat = t.stats(1e6)
    rows = [
        make("decision_latency", p, n, lat, "us", t, note),
        make("throughput", p, n, lat.map(lambda us: n / us * 1e6), "candidates/s", t, note),
    ]
    if p != "python":  # a Python scan is nowhere near memory-bound: no bandwidth rows
        bw = lat.map(lambda us: BYTES_READ[h] * n / us * 1e-3)
        rows.append(make("bandwidth", p, n, bw, "GB/s", t, note))
        rows.append(
            make(
                "bandwidth_fraction",
                p,
                n,
                bw.map(lambda g: g / copy_gbs[dev]),
                "fraction of copy bandwidth",
                t,
                note,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", type=parse_size, help="N values (default: quick set)")
    ap.add_argument("--full", action="store_true", help="the full sweep, 1e3..1e7 (1e8 on GPU)")
    ap.add_argument("--quick", action="store_true", help="the quick default: 1e3..1e6")
    ap.add_argument("--providers", nargs="+", choices=PROVIDERS, default=list(PROVIDERS))
    ap.add_argument("--heuristic", default="dtr", choices=[h.value for h in Heuristic])
    ap.add_argument(
        "--evictable",
        type=float,
        default=1.0,
        help="fraction of the N slots that are candidates (default 1)",
    )
    ap.add_argument(
        "--python-max",
        type=parse_size,
        default=10**5,
        help="largest N for the Python loop (default 1e5: it is slow)",
    )
    ap.add_argument(
        "--cpu-max",
        type=parse_size,
        default=10**7,
        help="largest N for torch (CPU) and numpy (default 1e7)",
    )
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("out/bench"), help="output folder")
    ap.add_argument("--tag", help="file name tag (default: the hardware, e.g. cpu-2core)")
    args = ap.parse_args(argv)
    if args.full and args.quick:
        ap.error("--full and --quick exclude each other")

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    sizes = args.sizes or (FULL_SIZES if args.full else QUICK_SIZES)
    if not args.sizes and cuda:
        sizes = (*sizes, *(GPU_EXTRA if args.full else GPU_EXTRA[:1]))
    sizes = sorted(set(sizes))
    repeats, budget = (15, 5.0) if args.full else (7, 1.0)
    h = Heuristic(args.heuristic)
    env = Env.capture()
    caps = {
        "python": (args.python_max, "--python-max"),
        "torch": (args.cpu_max, "--cpu-max"),
        "torch-bare": (args.cpu_max, "--cpu-max"),
        "numpy": (args.cpu_max, "--cpu-max"),
    }
    providers, notes = [], []
    if hasattr(os, "getloadavg"):  # a busy machine is a noisy one: say how busy it was
        notes.append("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    for p in args.providers:
        why = triton_unavailable() if p.startswith("triton") else None
        if p == "torch-cuda" and not cuda:
            why = "no CUDA device"
        if why:
            notes.append(f"skipped {p}: {why}")
            continue
        providers.append(p)
        if p in caps and max(sizes) > caps[p][0]:
            notes.append(f"{p} capped at N <= {caps[p][0]:,} (raise with {caps[p][1]})")
    if not providers:
        print("\n".join(notes) + "\nnothing to measure: no requested provider can run here")
        return 1
    where = {
        d: describe_device(d)
        for d in {"cuda" if p in ON_CUDA else "cpu" for p in providers} | {"cpu"}
    }
    params = f"heuristic={h.value};k=1;evictable={args.evictable};seed={args.seed}"

    def make(what, provider, size, stats, unit, timing=None, note="", on=None):
        dev = where["cuda" if (on or provider) in ON_CUDA else "cpu"]
        return Row.of(
            what,
            provider,
            size,
            stats,
            unit,
            device=dev,
            env=env,
            timing=timing,
            params=params,
            note=note,
        )

    for line in notes:
        print(line)
    rows: list[Row] = []
    copy_gbs = {}
    for d in sorted({"cuda" if p in ON_CUDA else "cpu" for p in providers if p != "python"}):
        stats, timing = copy_bandwidth(d)
        copy_gbs[d] = stats.median
        rows.append(
            Row.of(
                "copy_bandwidth",
                f"copy_ ({d})",
                0,
                stats,
                "GB/s",
                device=where[d],
                env=env,
                timing=timing,
                params="read+write bytes of Tensor.copy_",
            )
        )

    todo = {n: [p for p in providers if n <= caps.get(p, (n,))[0]] for n in sizes}
    with tqdm(
        total=sum(map(len, todo.values())), desc="scoring", unit="case", file=sys.stderr
    ) as bar:
        for n, ps in todo.items():
            if not ps:
                continue
            bare, now = synthetic_columns(n, seed=args.seed, evictable=args.evictable)
            table = synthetic_table(bare)  # rule 2
            cpu_cols = table.columns()
            gpu_cols = {k: v.cuda() for k, v in cpu_cols.items()} if cuda else None
            ref_cols = gpu_cols if cuda else cpu_cols  # the twin, on the fastest device
            ref = policy.select(h, ref_cols, now, backend="torch", seed=args.seed).tolist()
            for p in ps:
                bar.set_postfix_str(f"{p} N={n:,}")
                cols = gpu_cols if p in ON_CUDA else table if p == "torch" else bare
                try:
                    rows += run_case(
                        p, n, h, cols, now, ref, args.seed, repeats, budget, make, copy_gbs
                    )
                except Exception as e:  # one provider failing must not lose the others' rows
                    notes.append(f"{p} failed at N = {n:,}: {type(e).__name__}: {e}")
                    print(notes[-1], file=sys.stderr)
                bar.update()
            del bare, table, cpu_cols, gpu_cols, ref_cols

    if h is Heuristic.DTR:
        target_rows, verdicts = targets(rows, make)
        rows += target_rows
    else:
        verdicts = ["----  the targets are defined for heuristic dtr; none evaluated"]
    tag = args.tag or _default_tag(cuda)
    files = [
        write_csv(rows, args.out / f"scoring_{tag}.csv"),
        write_json(rows, args.out / f"scoring_{tag}.json"),
    ]
    title = (
        f"scoring + selection (k=1, {h.value}), incl. D2H read of the victim\n"
        + "; ".join(sorted(set(where.values())))
        + f"\ntorch {env.torch}, "
        f"triton {env.triton}, git {env.git_sha}, {env.date}"
    )
    files.append(
        plot_rows(
            rows,
            [("decision_latency", "us per decision"), ("throughput", "candidates per second")],
            args.out / f"scoring_{tag}.png",
            title=title,
        )
    )
    report = _report(rows, where, copy_gbs, env, notes, verdicts, h)
    files.append(args.out / f"scoring_{tag}.md")
    files[-1].write_text(report.lstrip() + "\n")
    print(report)
    print("wrote " + ", ".join(map(str, files)))
    mismatched = any(r.note.startswith("MISMATCH") for r in rows)
    return 2 if mismatched else 0


def _float32_tie(h, cols, now, got, ref) -> bool:
    """Whether the Python loop's float64 choice ties the twin's in float32 (module docstring
    of scoring_baselines): then both are correct minima."""
    if len(got) != 1 or len(ref) != 1:
        return False
    s = score_numpy(h, {k: v.numpy() for k, v in cols.items()}, now)
    a, b = float(s[got[0]]), float(s[ref[0]])
    return a == b or abs(a - b) <= 1.2e-7 * abs(b)


def _default_tag(cuda: bool) -> str:
    if cuda:
        return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")
    return f"cpu-{os.cpu_count()}core"


def _report(rows, where, copy_gbs, env, notes, verdicts, h) -> str:
    lines = [
        "",
        f"# scoring + selection, k=1, heuristic {h.value} ({BYTES_READ[h]} bytes/slot read)",
        "",
    ]
    lines += [f"- {d}: {w}" for d, w in sorted(where.items())]
    lines += [f"- copy bandwidth ({d}): {g:.1f} GB/s (read + write)" for d, g in copy_gbs.items()]
    lines += [
        f"- torch {env.torch}, triton {env.triton}, python {env.python}, "
        f"git {env.git_sha}, {env.date}"
    ]
    lines += [f"- {n}" for n in notes]
    lines += [
        "",
        pivot_markdown(
            rows, "decision_latency", lambda r: f"{r.median:.4g} ({r.q1:.3g}-{r.q3:.3g})"
        ),
        "",
    ]
    lines += [pivot_markdown(rows, "throughput", lambda r: f"{r.median:.3g}"), ""]
    if any(r.what == "bandwidth_fraction" for r in rows):
        lines += [pivot_markdown(rows, "bandwidth_fraction", lambda r: f"{r.median:.3f}"), ""]
    lines += ["targets:"] + [f"  {v}" for v in verdicts]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m tests.fuzz``: the differential fuzzer from the command line (NOTE
[ Differential fuzzer ] in check.py). Bad arguments: one line on stderr, exit status 2."""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

from .check import Failure, Tally, check_program, write_repro

PROG = "python -m tests.fuzz"


class Hang(BaseException):
    """A seed ran past --timeout (a BaseException: the runs' own handlers let it through)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{PROG}: error: {message}\n")


def seed_range(text: str) -> range:
    """``START:STOP`` (STOP excluded), 0 <= START < STOP."""
    parts = text.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected START:STOP (e.g. 0:5000), got {text!r}")
    start, stop = int(parts[0]), int(parts[1])
    if start >= stop:
        raise argparse.ArgumentTypeError(f"START must be below STOP, got {text!r}")
    return range(start, stop)


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=seed_range, required=True, help="START:STOP, STOP excluded")
    p.add_argument("--models", action="store_true", help="fuzz networks instead of programs")
    p.add_argument(
        "--tight", action="store_true", help="budgets of 5-50 %% of the peak, more evict_all, twin"
    )
    p.add_argument("--out", type=Path, default=Path("fuzz-out"), help="folder for JSON repros")
    p.add_argument("--timeout", type=positive, default=300.0, help="seconds per seed (a hang)")
    p.add_argument("--progress", type=int, default=100, help="a progress line every N seeds")
    return p


def _alarm(signum, frame):
    raise Hang


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        print(f"{PROG}: error: --out {args.out} exists and is not a folder", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    if args.models:
        from .models import check_model as check
    else:
        check = check_program
    check = functools.partial(check, tight=args.tight)
    what = "model" if args.models else "program"
    tally, t0 = Tally(), time.monotonic()
    signal.signal(signal.SIGALRM, _alarm)
    for i, seed in enumerate(args.seeds):
        signal.setitimer(signal.ITIMER_REAL, args.timeout)
        try:
            failures = check(seed, tally)
        except Hang:
            failures = [Failure("hang", what, seed, None, f"over {args.timeout} s")]
        except Exception as e:
            tb = "".join(traceback.format_exception(e))[-3000:]
            failures = [Failure("harness", what, seed, None, tb)]
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for f in failures:
            path = write_repro(args.out, f)
            print(f"{f.line()} -> {path}", flush=True)
        tally.failures += sum(f.kind in ("hang", "harness") for f in failures)
        if args.progress and (i + 1) % args.progress == 0:
            print(f"... {what} seed {seed}: {tally} {time.monotonic() - t0:.0f} s", flush=True)
    print(
        f"done {what}s {args.seeds.start}:{args.seeds.stop}: {tally} {time.monotonic() - t0:.0f} s",
        flush=True,
    )
    return 1 if tally.failures else 0

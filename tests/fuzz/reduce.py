"""Reduce a failing program of the differential fuzzer: ``python -m tests.fuzz.reduce
REPRO.json [--match TEXT]``. Removes lines (post, body, pre; the seeding lines stay) while
the run of the repro's config still fails the same way (same kind, and ``TEXT`` in its
detail when given), then writes ``REPRO.reduced.json`` and a standalone ``REPRO.reduced.py``
and prints the script. Bad arguments: one line on stderr, exit status 2."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import warnings
from pathlib import Path

import torch

from .check import Failure, check_run, reference
from .programs import Program
from .run import RunConfig

PROG = "python -m tests.fuzz.reduce"


def fails(prog: Program, cfg: RunConfig, kind: str, match: str | None) -> bool:
    """Whether ``prog`` under ``cfg`` still fails as ``kind`` (with ``match`` in the detail)."""
    try:
        prog, ref = reference(prog)
        if ref is None:
            return False
        failures, _ = check_run(prog, cfg, ref)
    except Exception:  # a candidate that eager rejects, or one that breaks the checker
        return False
    return any(f.kind == kind and (match is None or match in f.detail) for f in failures)


def reduce(
    prog: Program, cfg: RunConfig, kind: str, match: str | None = None
) -> tuple[Program, RunConfig]:
    """The smallest program (and its config) line removal reaches that still fails as
    ``kind``."""
    if not fails(prog, cfg, kind, match):
        raise ValueError(f"the repro does not fail as {kind!r} any more")
    changed = True
    while changed:
        changed = False
        for sec in ("post", "body", "pre"):
            i = len(getattr(prog, sec)) - 1
            while i >= 0:
                lines = getattr(prog, sec)
                if lines[i].startswith("torch.manual_seed"):
                    i -= 1
                    continue
                cand = dataclasses.replace(prog, **{sec: lines[:i] + lines[i + 1 :]})
                c = cfg  # the raise and the split stay before the same lines
                if sec == "body" and prog.raise_at is not None and i < prog.raise_at:
                    cand = dataclasses.replace(cand, raise_at=prog.raise_at - 1)
                if sec == "body" and cfg.split is not None and i < cfg.split:
                    c = dataclasses.replace(cfg, split=cfg.split - 1 or None)
                if fails(cand, c, kind, match):
                    prog, cfg, changed = cand, c, True
                i -= 1
    return prog, cfg


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{PROG}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("repro", type=Path, help="a JSON repro written by python -m tests.fuzz")
    p.add_argument("--match", help="a text the failure's detail must keep containing")
    args = p.parse_args(argv)
    try:
        failure = Failure.from_json(json.loads(args.repro.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"{PROG}: error: {args.repro}: not a fuzzer repro ({e})", file=sys.stderr)
        return 2
    if failure.program is None or failure.config is None:
        print(
            f"{PROG}: error: {args.repro}: only a program's failing run can be reduced by "
            f"lines; rerun {failure.what} seed {failure.seed} with python -m tests.fuzz",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    try:
        prog, cfg = reduce(failure.program, failure.config, failure.kind, args.match)
    except ValueError as e:
        print(f"{PROG}: error: {args.repro}: {e}", file=sys.stderr)
        return 2
    stem = args.repro.with_suffix("")
    out = failure._replace(program=prog, config=cfg)
    Path(f"{stem}.reduced.json").write_text(json.dumps(out.to_json(), indent=1) + "\n")
    script = f"# {failure.kind}: {failure.detail[:200]!r}\n"
    if cfg.unexpressed() or cfg.trace or cfg.split is not None:
        script += f"# the failing run also had: {cfg.unexpressed()}, trace={cfg.trace}, "
        script += f"split={cfg.split} (replay the .reduced.json with {PROG})\n"
    script += prog.source(cfg.session())
    Path(f"{stem}.reduced.py").write_text(script)
    print(script, end="")
    print(f"-> {stem}.reduced.json, {stem}.reduced.py")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

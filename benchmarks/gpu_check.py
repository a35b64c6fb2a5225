"""The one command a GPU session runs: ``python benchmarks/gpu_check.py --out DIR``.

It checks what a CPU cannot (compiled kernels, CUDA streams, device memory, atomics) and
measures what only a GPU can tell, in stages of falling value. ``--tiny`` runs every stage on
the CPU at toy sizes: the test suite does (tests/benchmarks/test_gpu_check.py), so it cannot
rot between the rare sessions that have a GPU.

# NOTE [ GPU check ]
# 1. Stages run in order of value, in one process (a CUDA context and the imports are paid
#    once), each under its own time cap (SIGALRM raises in the stage; the next one starts)
#    and within the run's budget (``--budget-s``, 450 s by default: a GPU lease of 15
#    minutes holds the machine's start, one run and a rerun). The test stage alone runs
#    pytest in a subprocess.
# 2. A stage ends ``ok``, ``failed`` (a check that did not hold: a wrong bit, a wrong
#    backend), ``error`` (an exception), ``timeout`` or ``skipped`` (with why). A failed or
#    broken stage never stops the run; the exit status is 1 if any stage failed or broke.
# 3. After every stage, summary.json and summary.md (status, seconds, the checks, the key
#    figures) and rows.csv (every figure: stage, what, config, value, unit) are rewritten, so
#    a run cut short keeps what finished. Outputs stay within what the device tool brings
#    back (at most 8 files): those three, log.txt, gpu_tests.txt and the GPT-2 step's traces
#    (gpt2_step.npz and gpt2_step_checkpoint.npz: the step's program and sizes on the device,
#    for the twin offline; their costs are launch times, the stage's comment says why).
# 4. Bitwise checks compare against eager runs of the same code. On CUDA they run with
#    ``torch.use_deterministic_algorithms(True)`` where eager itself is not repeatable
#    otherwise (atomics in embedding and index backward); the default mode is checked too,
#    and says whether eager repeated itself there.

examples:
  python benchmarks/gpu_check.py --out out/gpu --sha abc1234   # one H200: ~4 minutes
  python benchmarks/gpu_check.py --out out/gpu --only env,bitwise
  python benchmarks/gpu_check.py --out out/tiny --tiny    # CPU, toy sizes, ~1 minute
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

# cuBLAS needs this before its first handle for deterministic matmuls (NOTE rule 4).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # and the root, for tests.zoo


class CheckFailed(AssertionError):
    """A check of a stage did not hold (status ``failed``)."""


class StageTimeout(Exception):
    """The stage ran past its cap (status ``timeout``)."""


class Skip(Exception):
    """The stage cannot run here; the message says why (status ``skipped``)."""


@dataclass
class Ctx:
    """What a stage gets: where it runs, at which size, where its figures go."""

    device: str
    tiny: bool
    out: Path
    rows: list = field(default_factory=list)
    checks: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    stage: str = ""

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {self.stage}: {msg}"
        print(line, flush=True)
        with open(self.out / "log.txt", "a") as f:
            f.write(line + "\n")

    def row(self, what: str, config: str, value, unit: str, note: str = "") -> None:
        self.rows.append(
            dict(stage=self.stage, what=what, config=config, value=value, unit=unit, note=note)
        )

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        """Record a check; a failed one fails the stage at its end (the rest still runs)."""
        self.checks[f"{self.stage}: {name}"] = "ok" if ok else f"FAILED {detail}".strip()
        self.log(f"check {name}: {'ok' if ok else 'FAILED ' + detail}")

    def figure(self, name: str, value) -> None:
        self.figures[f"{self.stage}: {name}"] = value


def _alarm(signum, frame):
    raise StageTimeout()


def run_stage(ctx: Ctx, name: str, fn, cap_s: float) -> dict:
    ctx.stage = name
    failed_before = sum(1 for v in ctx.checks.values() if v != "ok")
    t0 = time.perf_counter()
    status, why = "ok", ""
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, max(cap_s, 1.0))
    try:
        fn(ctx)
    except StageTimeout:
        status, why = "timeout", f"over its cap of {cap_s:.0f} s"
    except Skip as e:
        status, why = "skipped", str(e)
    except CheckFailed as e:
        status, why = "failed", str(e)
    except Exception as e:  # a broken stage never stops the run (NOTE [ GPU check ] rule 2)
        status, why = "error", f"{type(e).__name__}: {e}"
        ctx.log(traceback.format_exc())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if status == "ok" and sum(1 for v in ctx.checks.values() if v != "ok") > failed_before:
        status, why = "failed", "a check did not hold (see checks)"
    seconds = time.perf_counter() - t0
    ctx.log(f"{status} in {seconds:.1f} s {why}")
    if ctx.cuda:
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return dict(stage=name, status=status, seconds=round(seconds, 2), cap_s=cap_s, why=why)


def write_summary(ctx: Ctx, results: list[dict], meta: dict) -> None:
    """NOTE [ GPU check ] rule 3."""
    data = dict(meta=meta, stages=results, checks=ctx.checks, figures=ctx.figures)
    (ctx.out / "summary.json").write_text(json.dumps(data, indent=1, default=str))
    lines = [f"# GPU check: {meta.get('device', '?')}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "| stage | status | seconds | cap | why |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['stage']} | {r['status']} | {r['seconds']} | {r['cap_s']:.0f} | {r['why']} |"
        for r in results
    ]
    lines += ["", "## Checks", ""] + [f"- {k}: {v}" for k, v in ctx.checks.items()]
    lines += ["", "## Figures", ""] + [f"- {k}: {v}" for k, v in ctx.figures.items()]
    (ctx.out / "summary.md").write_text("\n".join(lines) + "\n")
    with open(ctx.out / "rows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["stage", "what", "config", "value", "unit", "note"])
        w.writeheader()
        w.writerows(ctx.rows)


def _git_sha() -> str:
    """The checkout's commit, or why there is none (a GPU machine gets the tree, no .git)."""
    import subprocess

    try:
        run = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True
        )
    except OSError:
        return "unknown (pass --sha)"
    return run.stdout.strip() if run.returncode == 0 else "unknown (pass --sha)"


def main(argv: list[str] | None = None) -> int:
    from gpu_check_stages import STAGES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output folder (created)")
    ap.add_argument("--tiny", action="store_true", help="every stage on the CPU, toy sizes")
    ap.add_argument("--only", help="comma-separated stage names (default: all)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="whole run, seconds")
    ap.add_argument(
        "--sha", default="", help="the git commit for the summary (default: git's, if any)"
    )
    args = ap.parse_args(argv)
    names = [name for name, _, _ in STAGES]
    only = names if not args.only else [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(names))
    if unknown:
        ap.error(f"unknown stage(s) {unknown}; stages are {names}")

    import torch

    if not args.tiny and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; use --tiny for the CPU check", file=sys.stderr)
        return 2
    if not args.tiny:
        from tritondtr import policy

        if not policy.triton_available():  # a checkout on a GPU machine, not installed
            print(
                "gpu_check: tritondtr.kernels cannot be imported: install the package "
                "(pip install -e .) or link it (ln -sfn ../kernels tritondtr/kernels)",
                file=sys.stderr,
            )
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "log.txt").write_text("")
    device = "cpu" if args.tiny else "cuda:0"
    ctx = Ctx(device, args.tiny, args.out)
    meta = dict(
        device=torch.cuda.get_device_name(0) if ctx.cuda else "cpu (--tiny)",
        torch=torch.__version__,
        cuda=str(torch.version.cuda),
        git_sha=args.sha or _git_sha(),
        date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        budget_s=args.budget_s,
    )
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = "not installed"
    start, results = time.perf_counter(), []
    for name, cap, fn in STAGES:
        if name not in only:
            continue
        left = args.budget_s - (time.perf_counter() - start)
        if left < 5:
            results.append(dict(stage=name, status="skipped", seconds=0, cap_s=cap, why="budget"))
            continue
        results.append(run_stage(ctx, name, fn, min(cap, left)))
        write_summary(ctx, results, meta)
    write_summary(ctx, results, meta)
    print((args.out / "summary.md").read_text())
    return 1 if any(r["status"] in ("failed", "error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

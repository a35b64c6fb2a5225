"""The differential fuzzer: random PyTorch programs (fuzz_programs.py) and small networks
(fuzz_models.py) run eagerly and under tritondtr, compared exactly.

Long runs: ``python tests/fuzz_check.py --seeds 0:5000 [--models] [--out DIR]`` (one line per
failure, a JSON repro per failure in DIR); reduce one with ``python tests/fuzz_reduce.py
REPRO.json``. ``tests/test_runtime_differential.py`` runs a fixed set of seeds.
"""

# NOTE [ Differential fuzzer ]
# 1. A program is source lines in three sections: ``pre`` (leaves and some graph before the
#    session: float64/float32/complex/int/bool tensors, empty, non-contiguous, stride 0),
#    ``body`` (inside) and ``post`` (after exit), and may raise an exception of its own in
#    the body. A line is an op, a view, an in-place write (through a view, ``out=``, index
#    assignment, a custom Function that marks its input dirty), a multi-output or random op,
#    a grad mode block, a new leaf, a boundary call (``.item()``, ``.tolist()``, ``repr``, a
#    branch on a value), a backward (twice, retained, ``autograd.grad``, double backward), an
#    optimizer step or ``session.evict_all()``. Every line ran in eager when it was made.
# 2. Each program runs eagerly twice (a program eager disagrees with itself on is skipped),
#    then under tritondtr with no budget, under stress, and at descending fractions of the
#    first run's peak until a BudgetError; heuristic, cost model, pin_backward, never_evict,
#    debug, tracing and splitting the body in two sessions are drawn from the seed. Costs are
#    never measured (the host clock would make a failure irreproducible): a seed and its JSON
#    repro replay the same run.
# 3. Compared, exactly (torch.equal, NaN equal to NaN): every tensor the program holds, by
#    name, its value, ``.grad``, requires_grad, is_leaf, shape and stride, and every Python
#    number; a leaf's ``.grad`` is plain after exit. Also checked: the peak stays within
#    budget + the largest op output; the twin's counters equal a traced run's (not with
#    ``evict_all``, which the trace does not record); the process is clean after every
#    session; a BudgetError comes only with a budget, is counted, and names the budget; after
#    one at body line k, every name line k leaves unchanged in eager holds eager's value
#    (line k may have done part of its work). An UnsupportedOpError at body line k is
#    expected only where docs/runtime.md lists it (``c.data = plain`` for a tracked ``c``,
#    fuzz_limits.expected_refusal); then every name holds eager's value before line k.
# 4. The open limits of docs/runtime.md are left out by name (fuzz_limits.KNOWN_LIMITS), so
#    that any failure is a new bug; remove a limit from the list when it is fixed.
# 5. The failure kinds: mismatch, crash, stale (StaleInputError), budget (a BudgetError
#    without a budget, uncounted or unnamed), after-budget, refused (an UnsupportedOpError the
#    docs do not list), after-refusal, peak, twin, state, hang (the CLI's --timeout), harness
#    (the generator or the checker itself raised).

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import NamedTuple

from fuzz_compare import compare, same_entry
from fuzz_limits import split_points
from fuzz_programs import Program, generate
from fuzz_run import Run, RunConfig, eager, process_state, run, twin, writes

HEURISTICS = ("dtr_eq", "dtr_eq", "dtr", "lru", "msps", "size", "random", "dtr_local")
FRACTIONS = (1.0, 0.9, 0.75, 0.6, 0.5, 0.4, 0.3, 0.2, 0.12, 0.06, 0.02)


class Failure(NamedTuple):
    """One failure: ``kind`` (rule 5), ``what`` failed (``"program"`` or ``"model"``) and its
    ``seed``, the run's ``config`` (None when no run was under way) and ``detail``
    (differences, message); ``program``: the program as run (None for models)."""

    kind: str
    what: str
    seed: int
    config: RunConfig | None
    detail: str
    program: Program | None = None

    def line(self) -> str:
        return (
            f"FAIL {self.kind} {self.what} seed={self.seed} {self.config} :: {self.detail[:300]!r}"
        )

    def to_json(self) -> dict:
        d = self._asdict()
        d["config"] = None if self.config is None else dataclasses.asdict(self.config)
        d["program"] = None if self.program is None else self.program.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict) -> Failure:
        cfg = None if d["config"] is None else RunConfig(**d["config"])
        prog = None if d["program"] is None else Program.from_json(d["program"])
        return cls(d["kind"], d["what"], d["seed"], cfg, d["detail"], prog)


@dataclasses.dataclass
class Tally:
    """Counters of a fuzzing run (printed at the end of the CLI)."""

    programs: int = 0
    runs: int = 0
    skipped_nondeterministic: int = 0
    budget_errors: int = 0
    refusals: int = 0
    runs_with_remats: int = 0
    failures: int = 0


def reference(prog: Program) -> tuple[Program, dict | None]:
    """Eager's snapshot of ``prog`` (None when eager disagrees with itself). A program that
    raises early may leave post lines naming what the body did not make: post is dropped."""
    try:
        ref = eager(prog)
    except Exception:
        prog = dataclasses.replace(prog, post=())
        ref = eager(prog)
    return prog, (ref if not compare(ref, eager(prog)) else None)


def configs(prog: Program, rng: random.Random) -> tuple[RunConfig, list[RunConfig], list[float]]:
    """The unlimited run, the stress run and the budgeted runs' templates (budget set from
    the unlimited peak by :func:`check_program`) with their fractions, drawn from ``rng``."""
    no_trace = any("_S.evict_all" in line for line in prog.body)  # rule 3
    base = RunConfig(
        heuristic=rng.choice(HEURISTICS),
        cost=rng.choice(("analytic", "analytic", "bytes")),
        pin_backward=rng.random() >= 0.2,
        never_evict_small=rng.random() < 0.2,
    )
    first = dataclasses.replace(base, trace=rng.random() < 0.5 and not no_trace)
    stress = dataclasses.replace(
        base, stress=True, trace=rng.random() < 0.5 and not no_trace, debug=rng.random() < 0.3
    )
    fractions = sorted(rng.sample(FRACTIONS, 6), reverse=True)
    split = None
    if rng.random() < 0.15 and prog.raise_at is None and len(prog.body) > 3:
        points = split_points(writes(prog))  # known limit unwatched-writes
        split = rng.choice(points) if points else None
    budgeted = [
        dataclasses.replace(
            base,
            trace=rng.random() < 0.6 and split is None and not no_trace,
            debug=rng.random() < 0.2,
            split=split,
        )
        for _ in fractions
    ]
    return first, [stress, *budgeted], fractions


def check_program(seed: int, tally: Tally | None = None) -> list[Failure]:
    """Every failure of the program of ``seed`` (rule 2's runs; empty: none)."""
    tally = tally if tally is not None else Tally()
    prog = generate(seed)
    prog, ref = reference(prog)
    tally.programs += 1
    if ref is None:
        tally.skipped_nondeterministic += 1
        return []
    first, rest, fractions = configs(prog, random.Random(seed * 31 + 7))
    failures, res = check_run(prog, first, ref, tally)
    if res.error not in (None, "user", "refused"):
        return failures
    peak = res.sessions[-1].stats.peak_bytes
    budgets = [None] + [max(0, int(peak * f)) for f in fractions]
    for cfg, budget in zip(rest, budgets):
        cfg = dataclasses.replace(cfg, budget=budget)
        more, res = check_run(prog, cfg, ref, tally)
        failures += more
        if res.error == "budget":
            break  # lower budgets fail too, mostly
    return failures


def check_run(
    prog: Program, cfg: RunConfig, ref: dict, tally: Tally | None = None
) -> tuple[list[Failure], Run]:
    """The failures of one run of ``prog`` under ``cfg`` against eager's snapshot ``ref``."""
    tally = tally if tally is not None else Tally()
    tally.runs += 1
    res = run(prog, cfg)
    out: list[Failure] = []
    fail = lambda kind, detail: out.append(Failure(kind, "program", prog.seed, cfg, detail, prog))
    state = process_state()
    if state:
        fail("state", "; ".join(state))
    if res.error in ("crash", "stale"):
        fail(res.error, res.message)
    elif res.error == "refused":
        tally.refusals += 1
        if not res.documented:
            fail("refused", f"an UnsupportedOpError docs/runtime.md does not list: {res.message}")
        else:
            diffs = compare(eager(prog, upto=res.line), res.snap)
            if diffs:
                fail("after-refusal", f"line {res.line}: " + "; ".join(diffs))
    elif res.error == "budget":
        tally.budget_errors += 1
        stats = res.sessions[-1].stats if res.sessions else None
        if cfg.budget is None or cfg.stress:
            fail("budget", f"BudgetError without a budget: {res.message}")
        elif stats is not None and stats.budget_errors < 1:
            fail("budget", f"BudgetError not counted (budget_errors={stats.budget_errors})")
        elif "budget" not in res.message.lower():
            fail("budget", f"BudgetError message names no budget: {res.message}")
        if res.line is not None and cfg.split is None:
            diffs = after_budget(prog, cfg, res.line)
            if diffs:
                fail("after-budget", f"line {res.line}: " + "; ".join(diffs))
    else:
        diffs = compare(ref, res.snap)
        if diffs:
            fail("mismatch", "; ".join(diffs))
        peak, largest = res.peak
        if cfg.budget is not None and not cfg.stress and peak > cfg.budget + largest:
            fail("peak", f"peak {peak} > budget {cfg.budget} + largest op output {largest}")
        if cfg.trace and res.error is None:
            detail = twin(res.recorder, cfg)
            if detail:
                fail("twin", detail)
        if any(s.stats.rematerializations for s in res.sessions):
            tally.runs_with_remats += 1
    tally.failures += len(out)
    return out, res


def after_budget(prog: Program, cfg: RunConfig, k: int) -> list[str]:
    """Rule 3's state after a BudgetError at body line ``k``: the names line ``k`` leaves
    unchanged in eager, against eager before line ``k``."""
    before, after = eager(prog, upto=k), eager(prog, upto=k + 1)
    res = run(prog, cfg, upto=k)
    if res.error == "crash":
        return [res.message]
    if res.error != "budget" or res.line != k:
        return []  # the rerun went otherwise; the first run was checked up to its error
    kept = {n: e for n, e in before.items() if n in after and same_entry(e, after[n])}
    return compare(kept, res.snap, allow_missing=True)


def write_repro(out: Path, failure: Failure) -> Path:
    """``out/<kind>-<program|model>-<seed>-<n>.json``, n counting repros of one seed."""
    stem = f"{failure.kind}-{failure.what}-{failure.seed}"
    n = len(list(out.glob(f"{stem}-*.json")))
    path = out / f"{stem}-{n}.json"
    path.write_text(json.dumps(failure.to_json(), indent=1) + "\n")
    return path


if __name__ == "__main__":
    from fuzz_cli import main

    raise SystemExit(main())

"""The differential fuzzer: random PyTorch programs (programs.py) and small networks
(models.py) run eagerly and under tritondtr, compared exactly.

Long runs, from the repository root: ``python -m tests.fuzz --seeds 0:5000 [--models]
[--tight] [--out DIR]`` (one line per failure, a JSON repro per failure in DIR); reduce one
with ``python -m tests.fuzz.reduce REPRO.json``. ``tests/fuzz/test_differential.py`` runs a
fixed set of seeds.
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
#    first run's peak until a BudgetError (rule 6: tight budgets); heuristic, cost model,
#    pin_backward, never_evict, debug, tracing and splitting the body in two sessions are
#    drawn from the seed. Costs are never measured (the host clock would make a failure
#    irreproducible): a seed and its JSON repro replay the same run.
# 3. Compared, exactly (torch.equal, NaN equal to NaN): every tensor the program holds, by
#    name, its value, ``.grad``, requires_grad, is_leaf, shape and stride, and every Python
#    number; a leaf's ``.grad`` is plain after exit. Also checked: the peak stays within
#    budget + the largest op output; the twin's counters equal a traced run's (``evict_all``
#    included: NOTE [ Recording a trace ] rule 8); the process is clean after every
#    session; a BudgetError comes only with a budget, is counted, and names the budget; after
#    one at body line k, every name line k leaves unchanged in eager holds eager's value
#    (line k may have done part of its work). An UnsupportedOpError at body line k is
#    expected only where docs/runtime.md lists it (``c.data = plain`` for a tracked ``c``,
#    limits.expected_refusal); then every name holds eager's value before line k.
# 4. The open limits of docs/runtime.md are left out by name (limits.KNOWN_LIMITS), so
#    that any failure is a new bug; remove a limit from the list when it is fixed.
# 5. The failure kinds: mismatch, crash, stale (StaleInputError), budget (a BudgetError
#    without a budget, uncounted or unnamed), after-budget, refused (an UnsupportedOpError the
#    docs do not list), after-refusal, peak, twin, state, hang (the CLI's --timeout), harness
#    (the generator or the checker itself raised).
# 6. ``tight`` (``--tight``): the budgets are drawn from 5-50 % of the peak (TIGHT) and every
#    one is tried (a BudgetError ends the descent only after two in a row; then two bisection
#    steps, :func:`descend`), the body gets 1-3
#    more ``_S.evict_all()`` lines (:func:`with_evictions`), and the stress and budgeted runs
#    are all traced, so the twin checks each one that ends normally. It aims at the decisions
#    taken only when the budget binds (NOTE [ Evicted inputs first ], NOTE [ Readers before
#    release ], NOTE [ Backward storages ] rule 4). The default draws stay as they were.

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import NamedTuple

from .compare import compare, same_entry
from .limits import split_points
from .programs import Program, generate
from .run import Run, RunConfig, eager, process_state, run, twin, writes

HEURISTICS = ("dtr_eq", "dtr_eq", "dtr", "lru", "msps", "size", "random", "dtr_local")
FRACTIONS = (1.0, 0.9, 0.75, 0.6, 0.5, 0.4, 0.3, 0.2, 0.12, 0.06, 0.02)
TIGHT = (0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.12, 0.1, 0.08, 0.06, 0.05)  # rule 6


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


def report(failures: list[Failure]) -> str:
    """The failures one per line (a test's assertion message)."""
    return "\n".join(f.line() for f in failures)


@dataclasses.dataclass
class Tally:
    """Counters of a fuzzing run (printed at the end of the CLI)."""

    programs: int = 0
    runs: int = 0
    skipped_nondeterministic: int = 0
    budget_errors: int = 0
    refusals: int = 0
    runs_with_remats: int = 0
    twins: int = 0
    evictions: int = 0
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


def with_evictions(prog: Program, rng: random.Random) -> Program:
    """``prog`` with ``_S.evict_all()`` before 1-3 body lines after the first (rule 6); a
    raise after such a line moves down with it."""
    body, raise_at = list(prog.body), prog.raise_at
    for _ in range(rng.randint(1, 3)):
        i = rng.randint(1, len(body))
        body.insert(i, "_S.evict_all()")
        if raise_at is not None and i <= raise_at:
            raise_at += 1
    return dataclasses.replace(prog, body=tuple(body), raise_at=raise_at)


def configs(
    prog: Program, rng: random.Random, tight: bool = False
) -> tuple[RunConfig, list[RunConfig], list[float]]:
    """The unlimited run, the stress run and the budgeted runs' templates (budget set from
    the unlimited peak by :func:`check_program`) with their fractions, drawn from ``rng``;
    ``tight``: rule 6."""
    base = RunConfig(
        heuristic=rng.choice(HEURISTICS),
        cost=rng.choice(("analytic", "analytic", "bytes")),
        pin_backward=rng.random() >= 0.2,
        never_evict_small=rng.random() < 0.2,
    )
    first = dataclasses.replace(base, trace=rng.random() < 0.5)
    stress = dataclasses.replace(
        base, stress=True, trace=rng.random() < 0.5 or tight, debug=rng.random() < 0.3
    )
    fractions = sorted(rng.sample(TIGHT if tight else FRACTIONS, 6), reverse=True)
    split = None
    if rng.random() < 0.15 and prog.raise_at is None and len(prog.body) > 3:
        points = split_points(writes(prog))  # known limit unwatched-writes
        split = rng.choice(points) if points else None
    budgeted = [
        dataclasses.replace(
            base,
            trace=(rng.random() < 0.6 or tight) and split is None,
            debug=rng.random() < 0.2,
            split=split,
        )
        for _ in fractions
    ]
    # NOTE [ Offload ] in core/core.py: a third of the programs offload, every victim over a
    # fast link or some over a slow one (drawn last: the draws above stay as they were)
    offload = rng.choice((None, None, None, None, "1TB/s", "100MB/s"))
    if offload is not None:
        stress, budgeted = (
            dataclasses.replace(stress, offload=offload),
            [dataclasses.replace(c, offload=offload) for c in budgeted],
        )
    return first, [stress, *budgeted], fractions


def check_program(seed: int, tally: Tally | None = None, tight: bool = False) -> list[Failure]:
    """Every failure of the program of ``seed`` (rule 2's runs; ``tight``: rule 6's; empty:
    none)."""
    tally = tally if tally is not None else Tally()
    prog = generate(seed)
    if tight:
        prog = with_evictions(prog, random.Random(seed * 17 + 3))
    prog, ref = reference(prog)
    tally.programs += 1
    if ref is None:
        tally.skipped_nondeterministic += 1
        return []
    first, rest, fractions = configs(prog, random.Random(seed * 31 + 7), tight)
    failures, res = check_run(prog, first, ref, tally)
    if res.error not in (None, "user", "refused"):
        return failures
    peak = res.sessions[-1].stats.peak_bytes
    failures += check_run(prog, rest[0], ref, tally)[0]
    templates = iter(rest[1:])

    def fits(budget: int) -> bool:
        cfg = dataclasses.replace(next(templates, rest[-1]), budget=budget)
        more, res = check_run(prog, cfg, ref, tally)
        failures.extend(more)
        return res.error != "budget"

    descend(peak, fractions, tight, fits)
    return failures


def descend(peak: int, fractions, tight: bool, fits) -> None:
    """Rule 2's budgeted runs: ``fits(budget)`` (False: the run raised BudgetError; None: stop)
    at ``fractions`` of ``peak``, descending, until a BudgetError; ``tight`` (rule 6): until
    two in a row, then two bisection steps between the lowest budget that fit and the
    highest below it that did not (where the budget binds hardest)."""
    ok, low, misses = peak, None, 0
    for f in fractions:
        budget = max(0, int(peak * f))
        got = fits(budget)
        if got is None:
            return
        if got:
            ok, misses = budget, 0
            low = None if low is not None and low >= budget else low
        else:
            low = budget if budget < ok and (low is None or budget > low) else low
            misses += 1
            if misses > tight:
                break  # lower budgets fail too, mostly
    for _ in range(2 if tight and low is not None else 0):
        mid = (ok + low) // 2
        if mid in (ok, low):
            return
        got = fits(mid)
        if got is None:
            return
        ok, low = (mid, low) if got else (ok, mid)


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
            tally.twins += 1
            detail = twin(res.recorder, cfg)
            if detail:
                fail("twin", detail)
        if any(s.stats.rematerializations for s in res.sessions):
            tally.runs_with_remats += 1
        tally.evictions += sum(s.stats.evictions for s in res.sessions)
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

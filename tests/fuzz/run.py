"""Running a program of the differential fuzzer (programs.py) eagerly, or under tritondtr
with one :class:`RunConfig`, and the checks of a run that need the session itself: the twin
(a traced run's counters replayed by the simulator) and the process state after exit."""

from __future__ import annotations

import dataclasses
import traceback
import warnings

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

import tritondtr
import tritondtr.runtime as rt
from tritondtr.core.link import Link
from tritondtr.sim import simulate
from tritondtr.sim.twin import replay_runtime

from .compare import snapshot
from .limits import expected_refusal
from .programs import Program, namespace, run_lines


def _cost_by_bytes(op, args, kwargs, out) -> float:
    return 1000.0 + (out.nbytes if isinstance(out, torch.Tensor) else 0)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """How one run goes: the options of ``tritondtr.enable`` (``cost="bytes"``: a callable
    cost, 1000 + output bytes; ``never_evict_small``: never evict outputs of < 8 elements),
    ``trace``: record a trace (then the twin is checked), ``split``: the body line where a
    second session takes over from a first one (None: one session), ``offload``: the link's
    bandwidth of ``enable(offload=...)`` (None: no offload)."""

    budget: int | None = None
    stress: bool = False
    heuristic: str = "dtr_eq"
    cost: str = "analytic"
    pin_backward: bool = True
    never_evict_small: bool = False
    debug: bool = False
    trace: bool = False
    split: int | None = None
    offload: str | None = None

    def options(self) -> dict:
        """Keyword arguments of ``tritondtr.enable`` / ``tritondtr.trace``."""
        kw = dict(budget=self.budget, stress=self.stress, heuristic=self.heuristic)
        kw.update(debug=self.debug, pin_backward=self.pin_backward)
        kw["cost"] = _cost_by_bytes if self.cost == "bytes" else self.cost
        if self.never_evict_small:
            kw["never_evict"] = lambda op, t: t.numel() < 8
        if self.offload is not None:
            kw["offload"] = self.offload
        return kw

    def session(self) -> str:
        """The session as source, for repro scripts; options a callable gives are left out
        (:meth:`unexpressed` names them)."""
        kw = {k: v for k, v in self.options().items() if not callable(v)}
        return "tritondtr.enable(" + ", ".join(f"{k}={v!r}" for k, v in kw.items()) + ")"

    def unexpressed(self) -> list[str]:
        """The options :meth:`session` leaves out."""
        return ["cost='bytes'"] * (self.cost == "bytes") + ["never_evict_small"] * (
            self.never_evict_small
        )


class UserRaised(Exception):
    """The exception a program raises at its ``raise_at`` line inside the session."""


@dataclasses.dataclass
class Run:
    """A run under tritondtr. ``error``: None, ``"user"`` (the program's own exception, then
    post ran), ``"budget"``, ``"stale"`` (StaleInputError), ``"refused"`` (UnsupportedOpError;
    ``documented``: a refusal docs/runtime.md lists, limits.expected_refusal) or
    ``"crash"`` (anything else, with its traceback in ``message``); ``line``: the body line
    that raised; ``snap``: the snapshot after post, or at a refusal (None unless the run got
    there); ``sessions``: the sessions, in order; ``peak``: (peak bytes, largest op output)
    of the last session at its exit."""

    error: str | None = None
    message: str = ""
    documented: bool = False
    line: int | None = None
    snap: dict | None = None
    sessions: list = dataclasses.field(default_factory=list)
    recorder: object = None
    peak: tuple[int, int] | None = None


def eager(prog: Program, upto: int | None = None) -> dict:
    """Snapshot of ``prog`` run eagerly: pre, the body up to ``raise_at`` (or ``upto``), and
    post unless ``upto`` is given. Raises the program's exception if eager fails."""
    ns = namespace()
    body = prog.body[: prog.raise_at if upto is None else upto]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lines in (prog.pre, body, () if upto is not None else prog.post):
            _, e = run_lines(ns, lines)
            if e is not None:
                raise e
        return snapshot(ns)


def writes(prog: Program) -> list[bool]:
    """For each body line, whether it writes in place memory the program holds (a version
    counter of a tensor in the namespace, or of a ``.grad``, moves; or ``.data =`` gives a
    tensor other memory), run eagerly."""
    ns = namespace()
    run_lines(ns, prog.pre)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for line in prog.body:
            before = _versions(ns)
            run_lines(ns, [line])
            after = _versions(ns)
            out.append(any(after.get(k, v) != v for k, v in before.items()))
    return out


def _versions(ns: dict) -> dict[int, tuple[int, int]]:
    seen: dict[int, tuple[int, int]] = {}
    for v in ns.values():
        for t in v if isinstance(v, (list, tuple)) else (v,):
            for u in (t, getattr(t, "grad", None) if isinstance(t, torch.Tensor) else None):
                if isinstance(u, torch.Tensor) and not u.is_inference():
                    seen[id(u)] = (u._version, u.untyped_storage().data_ptr())
    return seen


def run(prog: Program, cfg: RunConfig, *, upto: int | None = None) -> Run:
    """``prog`` under ``cfg``; ``upto``: run only the body's lines up to and including that
    one (for the state after a BudgetError there: no post, no snapshot unless it raised)."""
    res = Run()
    ns = namespace()
    i, e = run_lines(ns, prog.pre)
    assert e is None, f"pre line {i} fails: {e!r}"
    body: list[tuple[int, str | None]] = list(enumerate(prog.body))
    if prog.raise_at is not None:  # None: the line where the program raises
        body.insert(prog.raise_at, (prog.raise_at, None))
    if upto is not None:
        body = [(j, line) for j, line in body if j <= upto and line is not None]
    split = cfg.split if upto is None else None
    kw = cfg.options()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if split is not None:
                _session(res, ns, body[:split], rt.enable(**kw))
                body = body[split:]
            ctx = tritondtr.trace(None, **kw) if cfg.trace else rt.enable(**kw)
            res.recorder = ctx if cfg.trace else None
            _session(res, ns, body, ctx)
    except UserRaised:
        res.error = "user"
        res.peak = (res.sessions[-1].stats.peak_bytes, res.sessions[-1].stats.max_op_out_bytes)
    except rt.BudgetError as e:
        res.error, res.message = "budget", str(e)
    except rt.StaleInputError as e:
        res.error, res.message = "stale", str(e)
    except rt.UnsupportedOpError as e:  # documented or not: check.py decides (rule 3)
        res.error, res.message = "refused", str(e)
        res.documented = expected_refusal(e)
    except Exception as e:
        res.error, res.message = "crash", _tb(e)
    ns["_S"] = namespace()["_S"]
    if upto is not None:
        if res.error == "budget":
            _snapshot(res, ns, "snapshot after the BudgetError: ")
        return res
    if res.error == "refused":
        _snapshot(res, ns, "snapshot after the refusal: ")
    if res.error not in (None, "user"):
        return res
    i, e = run_lines(ns, prog.post)
    if e is not None:
        res.error, res.message = "crash", f"post line {i}: " + _tb(e)
        return res
    _snapshot(res, ns, "snapshot after exit: ")
    return res


def _snapshot(res: Run, ns: dict, what: str) -> None:
    try:
        res.snap = snapshot(ns)
    except Exception as e:
        res.error, res.message = "crash", what + _tb(e)


def _session(res: Run, ns: dict, body, ctx) -> None:
    with ctx as s:
        session = getattr(s, "session", s)  # a Recording holds its session
        res.sessions.append(session)
        ns["_S"] = session
        for j, line in body:
            res.line = j
            if line is None:
                raise UserRaised
            exec(line, ns)
        res.line = None
        res.peak = (session.stats.peak_bytes, session.stats.max_op_out_bytes)


def _tb(e: BaseException) -> str:
    return "".join(traceback.format_exception(e))[-3000:]


def twin(recorder, cfg: RunConfig) -> str | None:
    """The simulator's replay of a traced run's trace against its recorded counters
    (evictions, rematerializations, peak bytes): None if equal, else what differs."""
    t = recorder.trace
    m = t.meta["runtime"]
    want = (m["evictions"], m["rematerializations"], m["peak_bytes"], m.get("offloads", 0))
    if cfg.stress or m["budget"] is None:
        bw = m.get("offload_bandwidth")  # NOTE [ Offload ]: the recorded run's link
        st, core = replay_runtime(
            t,
            m["heuristic"],
            None,
            stress=cfg.stress,
            pin_backward=m["pin_backward"],
            link=None if bw is None else Link(bw),
            refuse=m.get("refused", ()),
        )
        got = (st.evictions, st.remats, st.peak_bytes, core.stats.offloads)
    else:
        r = simulate(t, m["heuristic"], budget=m["budget"], semantics="runtime")
        if r.status != "ok":
            return f"twin status {r.status} (recorded {want})"
        got = (r.evictions, r.remats, r.peak_bytes, r.offloads)
    if got == want:
        return None
    return f"twin (evictions, remats, peak, offloads) {got} != recorded {want}"


def process_state() -> list[str]:
    """What is wrong with the process after a session ended (any way): empty when clean."""
    probs = []
    if _get_current_dispatch_mode() is not None:
        probs.append("a dispatch mode is left active")
    x = torch.randn(3, requires_grad=True)
    y = (x * 2).sum()
    if type(y) is not torch.Tensor:
        probs.append(f"a plain op gives {type(y).__name__}")
    y.backward()
    try:
        with rt.enable(budget=None):
            (x * 3).sum().backward()
        if type(x.grad) is not torch.Tensor:
            probs.append("a new session leaves a wrapper .grad")
    except Exception as e:
        probs.append(f"a new session fails: {e!r}")
    return probs

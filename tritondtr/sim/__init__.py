"""The simulator: replays traces of training iterations on the engine, with no real tensors.

Load a trace (:func:`load_trace`: our ``.npz``/``.jsonl`` forms or a DTR prototype log), get
its :func:`baseline`, then :func:`simulate` one budget or :func:`sweep` many. Traces are
written with :class:`TraceBuilder` and :func:`save_trace`. Semantics: NOTE [ Replay semantics ]
in :mod:`tritondtr.sim.replay`; formats: docs/trace-format.md.
"""

from ..traceformat.builder import TraceBuilder
from ..traceformat.dtrlog import read_dtr_log
from ..traceformat.trace import EventKind, Trace, TraceError
from ..traceformat.trace_io import detect_format, load_trace, save_trace
from .baseline import Baseline, baseline
from .program import Program, compile_trace
from .replay import RunStats, replay_program
from .simulate import (
    DEFAULT_RATIOS,
    SEMANTICS,
    SimResult,
    make_engine,
    runtime_peak,
    simulate,
    sweep,
)

__all__ = [
    # traces
    "Trace",
    "EventKind",
    "TraceError",
    "TraceBuilder",
    "load_trace",
    "save_trace",
    "detect_format",
    "read_dtr_log",
    # runs
    "Baseline",
    "baseline",
    "SimResult",
    "simulate",
    "sweep",
    "DEFAULT_RATIOS",
    "SEMANTICS",
    "runtime_peak",
    "make_engine",
    # internals for generators and benchmarks
    "Program",
    "compile_trace",
    "RunStats",
    "replay_program",
]

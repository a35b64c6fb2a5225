"""The trace format: one training iteration as events over ops and tensors.

Below both the runtime (which records traces, ``tritondtr.trace``) and the simulator (which
replays them); it imports neither. :class:`Trace` is the model (NOTE [ Trace semantics ]),
:class:`TraceBuilder` the writer, :func:`load_trace` / :func:`save_trace` the files
(docs/trace-format.md), :func:`read_dtr_log` the importer of the DTR authors' logs.
"""

from .builder import TraceBuilder
from .dtrlog import read_dtr_log
from .trace import EventKind, Trace, TraceError
from .trace_io import detect_format, load_trace, save_trace

__all__ = [
    "Trace",
    "EventKind",
    "TraceError",
    "TraceBuilder",
    "load_trace",
    "save_trace",
    "detect_format",
    "read_dtr_log",
]

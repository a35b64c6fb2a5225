"""The trace format (tritondtr.traceformat): traces, their files, and the DTR log import."""

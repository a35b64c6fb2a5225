"""The copies an offloading session makes between device and host memory (NOTE [ Offload ] in
core/core.py decides them; this module makes them, and on CUDA keeps them off the ops' stream).

# NOTE [ Host copies on CUDA ]
# 1. One side stream per session carries every offload copy, both ways, in the order the core
#    issues them (the core models a queue per direction: NOTE [ Offload link ] rule 1; a
#    copy engine each way still serves them as the hardware allows).
# 2. Host buffers come from ``torch.empty(pin_memory=True)``: PyTorch's caching host
#    allocator, a reused pool of pinned blocks (a fresh pinned allocation took 2.9 ms for 3
#    MiB on the H200's host, a cached block 27 us: docs/benchmarks.md, GPU figures). A block
#    is reused only after the copies that used it completed (the allocator records an event
#    for every non-blocking copy of pinned memory).
# 3. Copy out: the side stream waits for the current stream (the bytes are written), copies,
#    and records an event; the buffer is marked used by the side stream
#    (``record_stream``), so when the core frees it the caching allocator hands its memory
#    out again only once the copy has completed: no host wait.
# 4. Copy back: a buffer allocated on the current stream; the side stream waits for the
#    current stream (the block may have been freed by work still queued there), copies and
#    records an event; the buffer is marked used by the side stream.
# 5. Before an op or a recomputation reads or writes a storage with a copy pending, before
#    it is unwrapped, and when it becomes external (a parameter write may follow), the
#    current stream waits for that copy's event, which is then forgotten: a copy back is
#    ordered before its reader, a copy out before a write into the same buffer. A copy of a
#    storage dropped or forgotten is not waited for (rule 3 keeps its memory until it is
#    done). The host waits for nothing. ``pending`` is empty unless copies are in flight,
#    so an op tests one dict.
# 6. On a CPU device the copies are plain and synchronous; nothing is pending. A CPU session
#    saves no memory by offloading (docs/runtime.md).
"""

from __future__ import annotations

import torch

__all__ = ["HostLink", "bytes_of"]


def bytes_of(buf: torch.Tensor) -> torch.Tensor:
    """The whole untyped storage under ``buf``, as a flat uint8 tensor (NOTE [ Offload ] in
    core/core.py): copied byte for byte, any layout, views and offsets included, comes back
    exact."""
    st = buf.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=buf.device).set_(st, 0, (st.nbytes(),), (1,))


class HostLink:
    """A session's copies to and from host memory on ``device`` (NOTE [ Host copies on
    CUDA ]). ``pending``: sid -> the event of its copy in flight (CUDA only)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.pending: dict[int, torch.cuda.Event] = {}

    def copy_out(self, sid: int, buf: torch.Tensor) -> torch.Tensor:
        """Rule 3: a host copy of the bytes of ``buf`` (storage ``sid``), as uint8."""
        data = bytes_of(buf)
        host = torch.empty(data.numel(), dtype=torch.uint8, pin_memory=self.cuda)
        if self.cuda:
            self._on_side(sid, host, data, data)
        else:
            host.copy_(data)
        return host

    def copy_back(
        self, sid: int, host: torch.Tensor, dtype, size, stride, offset: int
    ) -> torch.Tensor:
        """Rule 4: a new device buffer of ``host``'s bytes, in the layout given."""
        data = torch.empty(host.numel(), dtype=torch.uint8, device=self.device)
        if self.cuda:
            self._on_side(sid, data, host, data)
        else:
            data.copy_(host)
        out = torch.empty(0, dtype=dtype, device=self.device)
        return out.set_(data.untyped_storage(), offset, size, stride)

    def _on_side(self, sid: int, dst: torch.Tensor, src: torch.Tensor, mine) -> None:
        """Rules 3 and 4: ``dst.copy_(src)`` on the side stream once the current stream's
        work so far is done; device tensor ``mine`` is marked used by the side stream; the
        copy's event is pending for ``sid``."""
        side = self.stream
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            dst.copy_(src, non_blocking=True)
        mine.record_stream(side)
        ev = torch.cuda.Event()
        ev.record(side)
        self.pending[sid] = ev

    def order(self, sids) -> None:
        """Rule 5: the current stream waits for the pending copies of ``sids``."""
        pending = self.pending
        for sid in sids:
            ev = pending.pop(sid, None)
            if ev is not None:
                torch.cuda.current_stream(self.device).wait_event(ev)

    def settle(self) -> None:
        """The host waits for every copy in flight (debug checks read host copies)."""
        if self.pending:
            self.stream.synchronize()
            self.pending.clear()

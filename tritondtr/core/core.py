"""The DTR core: every decision of a DTR run, on ids, sizes, costs and flags, never a tensor.

The runtime drives a :class:`Core` with real tensors (its executor runs the recomputations the
core asks for and frees the buffers it evicts); the simulator drives the same class from a
trace (its executor only counts). The core owns residency, locks, the clock and the per-op
protocol (NOTE [ Op protocol ]); its parts own the storage graph (:mod:`.graph`), the byte
account (:mod:`.account`), the backward pins (:mod:`.backward`), the unheld scorer
(:mod:`.unheld`) and the anchors (:mod:`.anchors`); its own methods in :mod:`.evict` and
:mod:`.remat` choose victims through the :class:`~tritondtr.engine.Engine` and plan
rematerializations (NOTE [ Core parts ]).

Storages are *core ids* (``sid``): dense ints handed out by :meth:`Core.new`, reused after
:meth:`Core.forget` (a stack: the last forgotten is reused first). The engine has its own
slots; ``eslot[sid]`` maps one to the other once the engine is built.

# NOTE [ Core parts ]
# 1. The core is composed of parts that own their state; each field has one writer, the
#    class that declares it:
#    - ``Core`` (this file): the residency of each storage (the lists indexed by core id:
#      state, last use while lazy, held, pinned, backward, engine slot; the engine's slot
#      map and the live storages while lazy), the clock ``now``, the op's locks (NOTE [ Op
#      protocol ]), the engine, and the protocol itself;
#    - ``StorageGraph`` (graph.py): what each storage is and what it was computed from
#      (size, cost, creation clock, parents, op name, the version it writes, its reader
#      count, the readers map), the fused versions' records and the free ids;
#    - ``ByteAccount`` (account.py): the budget, resident, outside and op bytes, the peaks;
#    - ``BackwardPins`` (backward.py): NOTE [ Backward storages ];
#    - ``UnheldScorer`` (unheld.py): NOTE [ Unheld storages ];
#    - ``Anchors`` (anchors.py): NOTE [ Anchored storages ];
#    - ``HostCopies`` (offload.py): which storages have a host copy, the copies in flight
#      (NOTE [ Asynchronous offload ]);
#    - ``StepPlan`` (plan.py): NOTE [ Step plan ];
#    - ``CopyScale`` (tuning.py): NOTE [ Copy price scale ];
#    - ``Tape`` (rehearsal.py): NOTE [ Rehearsal ].
# 2. Eviction (``Evictor``, evict.py), offload (``Offloader``, offload.py) and
#    rematerialization (``Rematerializer``, remat.py) are the core's own methods in files
#    of their own; they declare and write no field, and change the core through its
#    methods (``drop``, ``tick``, ``recomputed_resident``, ``admit``, ``set_offloaded``,
#    ``wait_until``) and the parts through theirs. They stay methods, not objects: they
#    hold no state, and an object that keeps its core is a reference cycle, which NOTE [
#    Session lifetime ] in runtime/session.py forbids (a part that needs the core's
#    operations takes the core as an argument: ``Anchors.anchor(core, sid)``).
# 3. A part reads the core's lists through references given when it is made (lists the
#    core appends to and never replaces) and never writes them; the core reads the graph's
#    lists the same way (``self.size`` is ``graph.size``), so the hot paths index a list
#    as before, and writes them only through the graph's methods (``add``, ``fuse``,
#    ``link``, ``end_op``, ``set_cost``, ``read``, ``cut``, ``remove``).
# 4. tests/core/test_parts.py reads the source and checks rules 1 to 3, writes through
#    local names included.

# NOTE [ Budget accounting ]
# 1. Counted: the bytes of every tracked storage while it is resident. Not counted: external
#    storages (parameters, inputs from outside, buffers handed to the user as plain tensors),
#    parameter gradients (the runtime never tracks them: NOTE [ Leaf gradients ] in
#    runtime/leafgrad.py) and transient copies inside one op.
# 2. Before an op runs (a user op or a recomputation), its tracked inputs are made resident
#    and locked (:meth:`Core.use`), then victims are evicted until the resident bytes are <=
#    budget (:meth:`Core.begin`). Its outputs are counted when they are tracked, so the peak
#    never exceeds budget + the outputs of the one op in flight (outputs it computes and
#    drops, like the unused outputs of a replay, included).
# 3. If the budget is still exceeded with nothing left to evict, the op does not run:
#    :class:`BudgetError` names it, the bytes that must stay resident, the budget and what is
#    pinned or locked; locks are released by the caller, nothing else was changed.
# 4. ``stress``: after every op everything evictable is evicted, and no budget error exists.
# 5. Also counted: *outside* bytes, memory the rank holds beside the tracked storages that
#    the runtime is told about (FSDP2's unsharded parameters; NOTE [ Anchored storages ]
#    rule 5 in anchors.py). They are never evictable.

# NOTE [ Lazy engine ]
# 1. Nothing is evicted while the resident bytes stay within the budget, so until then the
#    engine's bookkeeping (a table row and neighbourhood update per storage, locks, access
#    times, releases) is pure overhead. The core starts *lazy*: a new storage keeps its cost
#    and its creation / last-use clocks in the core's lists only; inputs are not locked
#    (nothing can be evicted under an op); dropping a buffer only adjusts the byte count.
#    With ``budget=None`` (and no stress) the engine is never built.
# 2. The first op that starts with resident > budget (:meth:`Core.prepare`, before its
#    inputs are used, so no lock is pending), an out-of-memory retry, or :meth:`evict_all`
#    *syncs* the core: the engine is built and every live storage enters it in creation
#    order (parents first; edges from its inputs), with its clocks, pin and backward flag; a
#    storage whose buffer was dropped enters as evicted. From then on the engine is updated
#    event by event. ``stress`` starts synced.
# 3. So eviction decisions see the same live storages, costs, sizes, clocks and edges as if
#    the engine had been updated all along: :meth:`make_room` only evicts when resident >
#    budget, which a lazy core never reaches without syncing first. What differs: slot
#    numbers (ties between equal scores), dropped buffers enter as evicted all at once in
#    creation order, and storages forgotten before the sync never enter.


# NOTE [ Decisions on the host ]
# 1. The engine's metadata table lives where the core is told (``table_device``), not
#    necessarily beside the storages. The runtime keeps it on the host by default (``enable(
#    table="host")``), whatever the storages' device: a decision is then numpy work on host
#    arrays (the bounded choice, NOTE [ Bounded choice ] in engine/bounded.py) and never waits for
#    the device.
# 2. Why: on a CUDA table every decision flushes the staged rows and runs the selection on
#    the device, then reads the victims back; read on the compute stream, that read waits
#    behind every kernel the model has queued, so a decision costs the backlog (milliseconds
#    in a training step), and the runtime's tables are small (thousands of live storages a
#    step), where a host decision takes tens of microseconds. A table on the session's device
#    (``table="device"``) runs its flushes and selections on a private stream with a
#    persistent pinned buffer for the victims (NOTE [ Private stream ] in engine/table.py): it
#    waits only for its own work, once per selection, counted as a device synchronization
#    (``stats.device_syncs``; 0 on the host). Where the line lies (the ``latency`` stage of
#    ``benchmarks/gpu_check.py``; one H200, docs/benchmarks.md, GPU figures), with the
#    selection prepared once per table (NOTE [ One-launch selection ] rule 7 in
#    kernels/topk_select.py): with the GPU idle the host decided faster at 1e3 candidates
#    (38 against 52 us) and the device table from 1e4 (48 / 51 / 97 us at 1e4 / 1e5 / 1e6
#    against 62 / 411 / 424); behind 52 ms of queued matmuls the host took 0.3 to 1.2 ms,
#    the private stream 0.4 to 0.6 ms, and the compute stream the whole backlog. A step's
#    table holds a few thousand storages (GPT-2 small: 1,747 tensors), so the host stays the
#    default; GPT-2 small's step at 50 % took the same time with either table (620 ms).
# 3. The simulator's twin passes its own table device (``--device``) and so still uses the
#    device-resident table and kernels at millions of tensors; decisions are the same either
#    way (the torch twin and the kernels choose the same victims: tests/engine/test_engine.py).


# NOTE [ Deferred locks ]
# 1. An op's tracked inputs must stay resident until it ran (NOTE [ Budget accounting ] rule
#    2). Only an eviction can take them, and evictions happen at a few places only: the
#    room made before the op (``begin``, when over budget), the recomputation of another
#    input (``use`` of an evicted input), an out-of-memory retry (``evict_one``), and
#    ``stress``. Most ops reach none of them: locking and unlocking every input in the
#    engine was two table writes and a bounded-choice mark per input, for nothing.
# 2. So ``use`` of a resident input records it (``deferred``) and locks nothing; whatever
#    may evict next locks the deferred inputs first (``lock_inputs``: ``begin`` over
#    budget, ``use`` before recomputing, ``evict_one``). At every eviction decision the
#    same storages are locked as when every input was locked at once: the victims are the
#    same.
# 3. The driver calls ``release_inputs`` where it unlocks the inputs ``use`` reported
#    locked (after the op ran, and on any error): deferred inputs are dropped and the ones
#    locked since are unlocked.

# NOTE [ Op protocol ]
# 1. Both drivers, the runtime's session (``Session._call``) and the twin (``_Twin._call``),
#    take every op through the core in one order: ``enter(name, sids)`` with the op's
#    tracked inputs in argument order, duplicates too, which is ``prepare`` (NOTE [ Lazy
#    engine ] rule 2), ``use_evicted`` (rule 2), ``use`` of each input and ``begin(name)``
#    (the clock, room made), written once there; the driver reads the inputs' buffers only
#    after it; the op runs; ``release_inputs``; per output, fresh ones first: ``hand_out`` of
#    the storage an in-place write replaces, then ``new``; ``end``. An op that raises before
#    its outputs are tracked (BudgetError from ``enter``, the op's own error) gets
#    ``release_inputs`` and nothing more. While the core is lazy and within its budget,
#    ``enter`` records the accesses and advances the clock inline (NOTE [ Lazy engine ] rule
#    1): one call per op, which made the binding no slower than ``use`` per input had been
#    (dispatch rounds: -0.7 to +2.2 % per op, noise).
# 2. ``use_evicted`` is called once the engine is built, for two or more tracked inputs of
#    which one is evicted (NOTE [ Evicted inputs first ]): it does nothing otherwise.
# 3. The core holds the op's locks: an input that ``use`` or ``use_evicted`` recomputed
#    stays locked (``recomputed``), a resident one is locked only when something may evict
#    (NOTE [ Deferred locks ]); ``release_inputs`` unlocks all of them, recomputed ones
#    first. The drivers keep no list of locks.
# 4. Between ops: ``release`` when the program's last wrapper of a storage died (not for a
#    version an in-place write handed out: no wrapper holds it), ``forget`` when nothing
#    refers to a storage any more, ``materialize`` then ``unlock`` for a value read outside
#    an op, ``freeze``, ``evict_all``; the runtime drains its queues before the next op, at
#    the positions its trace records them.
# 5. So the two drivers make the same calls with the same arguments, one for one:
#    tests/sim/test_op_protocol.py logs both on the same steps (unlimited, 50 %, 30 %,
#    ``stress``) and compares the logs; the twin's counts agreeing follows from it.

# NOTE [ Readers before release ]
# 1. When the program's last wrapper of a resident storage ``x`` dies, ``release`` frees its
#    buffer. An evicted storage ``d`` that a wrapper still holds and that reads ``x`` (an
#    LSTM's ``tanh(c_t)``, saved for the backward, and ``c_t``) was one op away while ``x``
#    was resident; once ``x`` is freed, recomputing ``d`` means recomputing ``x`` and its
#    evicted ancestors first (``c_t`` from the gates, the gates from two ``addmm``).
# 2. So before freeing ``x``, each such ``d`` all of whose inputs are resident is
#    rematerialized, if that evicts nothing: only while the resident bytes are within the
#    budget (its buffer is then counted like any recomputation's output, NOTE [ Budget
#    accounting ] rule 2, and ``x``'s bytes leave right after). ``d`` keeps its last access
#    (the program did not read it: NOTE [ A recomputation is not a use ] in remat.py; with
#    ``now`` the twin's sweep was the same but for two runs: Llama at 30 % 27.0 % extra
#    compute against 23.4 %, the LSTM at 20 % 79.2 % against 81.5 %). Not under ``stress``,
#    nor once the session closed.
# 3. The core keeps, per storage, the storages whose recipes read it (``readers``, an
#    insertion-ordered dict per storage), built when the engine is built (a lazy core has
#    no evicted storage a wrapper holds) and kept by ``new``, ``externalize`` and ``forget``.
# 4. Measured on the twin (docs/history/simulator-log.md, Readers before release): the TreeLSTM's
#    extra compute at 50 % of its peak 29.6 % -> 20.7 %, the LSTM's 20.9 % -> 20.3 %; two runs
#    got worse (the LSTM at 20 %, Llama at 40 %), listed there.
# 5. A recomputation of rule 2 that raises (the executor's error: a device out of memory, a
#    stale input, the twin's overhead limit) still releases ``x`` before the error leaves
#    ``release`` or ``hand_out``: the runtime's ``drain`` has already taken the death off its
#    queue, and a storage left resident and held that no wrapper holds would stay counted.

# NOTE [ Evicted inputs first ]
# 1. ``use`` makes the inputs of an op resident one by one, in argument order, and each
#    stays locked until the op ran; so the recomputation of an evicted input runs beside
#    the inputs before it, locked. In a backward pass these are often large and cheap to
#    get back: ``gelu_backward(grad, h)`` locks the 1 MB gradient while the chain that
#    rebuilds ``h`` from the last resident activation needs that room.
# 2. So once the engine is built (nothing is ever evicted before), :meth:`Core.enter` first
#    hands the op's tracked inputs, in argument order, to :meth:`Core.use_evicted`, which
#    materializes the evicted ones (each left locked for the caller) before any resident
#    input is used; then ``use`` runs on every input as before. A resident input that the
#    first pass evicted is recomputed by its ``use``, beside the inputs already there. An op
#    with one tracked input needs no first pass (its ``use`` makes the same decisions):
#    ``use_evicted`` returns at once for fewer than two storages.
# 3. ``Core.enter`` calls it for both drivers, with the op's tracked inputs in the order the
#    op records them, and only when it can act: two or more of them, one evicted (NOTE [ Op
#    protocol ] rule 2). Measured on the twin: docs/history/simulator-log.md, Tight budgets
#    on TinyGPT.
# 4. The inputs it made resident stay locked while the next evicted one is recomputed; the
#    inputs that were resident are not locked, so a recomputation may evict one. So it runs
#    in rounds until every input is resident (at most one more round than inputs; ``use``
#    recomputes what is still evicted after that, under the locks). When a recomputation
#    raises BudgetError (not ThrashError), the inputs it made resident before are unlocked
#    and it is tried once more without them; a later round brings them back. The zoo's MLP
#    at 20 % of its peak needs both once NOTE [ Readers before release ] changed which
#    storages are resident in its backward (tests/runtime/test_zoo.py): ``mm(g, x)`` found
#    ``g`` resident and ``x`` evicted, ``x``'s recomputation evicted ``g``, and ``g``'s chain
#    did not fit beside ``x``. Nothing is held by the driver yet (the runtime reads no buffer
#    before this pass), so the memory given back is real.

# NOTE [ Fused versions ]
# 1. An in-place op makes a new version ``v`` of the storage ``p`` it writes (NOTE [ In-place
#    versions ] in runtime/outputs.py); ``p`` stays, evicted, as ``v``'s parent. When no other
#    storage reads ``p`` (no recipe but ``v``'s: ``nread``), ``p`` is needed for one thing
#    only, recomputing ``v``, and nothing can start reading it later (its buffer holds ``v``
#    now). Then ``v`` absorbs ``p`` (:meth:`Core.new`): ``v``'s parents are ``p``'s parents
#    and the op's other inputs, its cost is ``p``'s plus the op's, it is a version of what
#    ``p`` was a version of (``writes``, -1 for an op's fresh output: NOTE [ Consumed
#    versions ] in remat.py applies to the chain's first link), its recomputation replays
#    ``p``'s recipe, then the op on the buffer that gives (``run_recipe`` in
#    runtime/recipe.py), and ``p`` leaves the core at once.
# 2. So a chain of in-place ops (an RNN cell's gates: ``addmm``, then ``add_``, ``sigmoid_``,
#    ``mul_`` on chunks of that one buffer) is one storage, recomputed in one step, instead
#    of one evicted storage and one rematerialization per link.
# 3. Only when the op reads ``p`` (``p`` among its parents): an op that overwrites ``p``
#    without reading it (NOTE [ Overwriting ops ] in runtime/outputs.py) does not depend on
#    it, and its recipe does not keep ``p``'s parents alive, as every parent must be. And
#    only when the op writes no other tracked storage (``alone``, the drivers tell): a
#    replay of an op writing several (``_foreach_add_([a, b], [b, a])``) rebuilds every
#    version it absorbed, each by replaying an op that writes several in turn, so the
#    replays branched out at every level (a tree of recipes, not a chain; 8 ms per
#    rematerialization of a three-tensor rotation on the 2-core AMD EPYC guest, found by the
#    differential fuzzer).
# 4. At most ``MAX_LINKS`` (16, graph.py) ops per fused recipe: beyond, the new version
#    keeps ``p`` as an ordinary evicted parent (an in-place accumulation loop would
#    otherwise make a recipe as long as the loop, replayed by recursion).
# 5. The decision depends only on the events (which storages read which), not on the
#    budget, so every core fuses the same versions: the runtime and the twin at any budget,
#    stress and unlimited runs. ``p``'s id is reused only after the op ends (:meth:`end`),
#    so a driver still holding ``p`` during the op sees it ``FREE``, never another storage;
#    the drivers drop it then (the runtime's ``Storage.sid`` -1, the twin's map).
# 6. Every output of an op gets the op's parents, ``p`` among them, also an output made after the
#    version that absorbed ``p`` (the drivers make fresh outputs first, and rule 3 keeps ops writing
#    several storages out, so only a hand-built trace does this; it was how ``_foreach_add_([a,
#    b])`` broke before rule 3 had ``alone``, found by review and the differential fuzzer). That
#    output's recipe replays ``p``'s too, so for it ``p`` stands for its parents, its cost and its
#    nesting (``absorbed`` keeps them until the op ends), and rule 4 bounds the nesting as a fused
#    chain's.
# 7. Measured on the twin and the runtime: docs/history/benchmarks-log.md and
#    docs/history/simulator-log.md, Fused versions.

# NOTE [ Offload ]
# 1. With a link (``Core(link=...)``; NOTE [ Offload link ] in link.py), each victim the
#    heuristic chooses is either dropped (recomputed when needed) or offloaded (copied to the
#    host, copied back when needed), whichever is priced lower: the recomputation's cost with
#    its evicted neighbourhood (the engine's cost and nbhd cost of the victim) against
#    ``offload_price`` (the wait until its copy out would be done, plus the copy back). Which
#    victim is unchanged: the heuristic chooses, the action follows. A victim with a host
#    copy already (NOTE [ Asynchronous offload ] in offload.py) has nothing to copy out.
# 2. An offloaded storage is evicted for everything else (state ``EVICTED``, not counted,
#    scored and locked as any evicted storage), flagged ``offloaded``; while it has a host
#    copy, the engine's cost of its slot is the lower of its copy back and its cost (NOTE [
#    Asynchronous offload ] rule 3), so its neighbours' evicted neighbourhoods price getting
#    it back as a copy where that is cheaper. Its own cost (``cost``) stays.
# 3. Time: the op that needed the room waits for the copy out (``elapsed`` moves to when it
#    is done; ``stats.link_wait_ns``), so the bytes are free when the op runs, as a drop's
#    are; a fetch waits for its copy back likewise. Copies queue per direction on the link.
#    Copies made before they are needed (ahead of the budget, prefetches) are NOTE [
#    Asynchronous offload ]'s.
# 4. ``materialize`` fetches an offloaded storage where it would recompute it, and its
#    inputs need not be resident: a fetch is a leaf of the rematerialization plan. A fetch
#    makes room first, ticks the clock and is not a rematerialization (``stats.fetches``).
# 5. A storage forgotten or made external drops its host copy (``Executor.drop_copy``).
# 6. Decisions depend only on sizes, costs and the link, so the twin replays them as the
#    runtime's core makes them (``enable(offload=...)``; a recorded trace keeps the link).
# 7. NOTE [ Readers before release ] skips an offloaded reader: its host copy needs nothing
#    of the storage being released.
# 8. Without ``ahead`` and a plan every copy stalls the op that needed it (rule 3): an
#    offload costs twice its copy. NOTE [ Asynchronous offload ] moves copies off the ops'
#    path, and there the link's queue and the device time decide.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..engine.engine import Engine
from ..engine.residency import EVICTED, EXTERNAL, FREE, RESIDENT
from .account import ByteAccount
from .anchors import Anchors
from .backward import BackwardPins
from .errors import BudgetError, ThrashError
from .evict import Evictor
from .graph import StorageGraph
from .link import Link
from .offload import HostCopies, Offloader, ReadPlan
from .plan import StepPlan
from .rehearsal import Tape, taped
from .remat import Rematerializer
from .stats import CoreStats
from .tuning import CANDIDATES, CopyScale
from .unheld import UnheldScorer

__all__ = ["Core", "Executor"]


class Executor(Protocol):
    """What a :class:`Core` asks of its driver: the runtime runs real ops, the simulator
    only counts."""

    def recompute(self, sid: int, consume: int = -1) -> None:
        """Compute the buffer of evicted ``sid`` again (its inputs are resident and locked).
        ``consume`` >= 0: ``sid`` is an in-place version of storage ``consume``; write its
        buffer itself instead of a copy, and drop it from ``consume`` (NOTE [ Consumed
        versions ] in remat.py; the core has already counted it evicted)."""

    def free(self, sid: int) -> None:
        """Drop the buffer of resident ``sid`` (evicted or dropped; it stays recomputable)."""

    def keep(self, sid: int) -> None:
        """``sid`` became external for good (:meth:`Core.externalize`): keep its buffer,
        forget how to recompute it."""

    def copy_out(self, sid: int) -> None:
        """Copy the bytes of resident ``sid`` to the host and keep its buffer; :meth:`free`
        drops the buffer later (NOTE [ Asynchronous offload ] in offload.py; only with a
        link). A RuntimeError: no host memory (the core drops the victim instead)."""

    def fetch(self, sid: int, hint: bool = False) -> None:
        """Copy ``sid``'s host copy back to the device (room is made); the copy stays.
        ``hint``: a prefetch; a RuntimeError if the allocator refuses it, evicting nothing."""

    def drop_copy(self, sid: int) -> None:
        """``sid``'s host copy goes (it left the core or became external)."""


class Core(Evictor, Offloader, Rematerializer):
    """The decisions of one DTR run; see the NOTEs of this module and of :mod:`.remat`.

    Args:
        budget: bytes, or None (track without evicting).
        heuristic: for the :class:`~tritondtr.engine.Engine` (name, enum or user heuristic).
        executor: see :class:`Executor`.
        backend: the engine's scoring backend.
        stress: evict everything evictable after every op (takes no budget).
        pin_backward: NOTE [ Backward storages ].
        stats: where the counters go (a :class:`CoreStats` or a subclass).
        reuse: the engine's NOTE [ Stale batched choice ] (0: exact victims).
        table_device: where the engine's table lives (NOTE [ Decisions on the host ]); None:
            beside the storages.
        link: the host link a victim may be offloaded over (NOTE [ Offload ]); None: every
            victim is dropped.
        always_offload: with a link, offload every victim, priced or not (the sweeps'
            "offload only").
        ahead: with a link, copy victims out before the budget binds (NOTE [ Asynchronous
            offload ] rule 2 in offload.py).
        prefetch: record each step's order of reads from the first op on and, with a link,
            copy offloaded storages back in the previous step's (NOTE [ Asynchronous
            offload ] rule 5 in offload.py; NOTE [ Step plan ] in plan.py).
        copy_scale: with a link, what a copy's price is multiplied by against a drop's (0:
            every victim copied, ``inf``: none); None: chosen by rehearsing the first two
            steps (NOTE [ Copy price scale ] in tuning.py, NOTE [ Rehearsal ] in
            rehearsal.py).
    """

    def __init__(
        self,
        budget: int | None,
        heuristic,
        executor: Executor,
        *,
        backend="auto",
        stress: bool = False,
        pin_backward: bool = True,
        stats: CoreStats | None = None,
        reuse: int = 0,
        table_device: torch.device | str | None = None,
        link: Link | None = None,
        always_offload: bool = False,
        ahead: bool = True,
        prefetch: bool = False,
        copy_scale: float | None = None,
    ) -> None:
        self.table_device = None if table_device is None else torch.device(table_device)
        self.reuse = reuse
        self.heuristic = heuristic
        self.backend = backend
        self.executor = executor
        self.stress = stress
        self.evicting = budget is not None or stress
        self.pin_backward = pin_backward and self.evicting
        self.stats = stats if stats is not None else CoreStats()
        self.bytes = ByteAccount(budget, self.stats)  # NOTE [ Budget accounting ]
        self.engine: Engine | None = None
        self.device: torch.device | None = None
        self.lazy = not stress  # NOTE [ Lazy engine ]
        self.closed = False
        self.now = 0  # the clock: +1 per op and per recomputation
        self.elapsed = 0.0  # device time, ns: the costs of what ran (NOTE [ Offload link ])
        self.ops = 0  # ops ended (NOTE [ Copy price scale ] rule 4: a step's length)
        self.link = link  # NOTE [ Offload ]
        self.always_offload = always_offload
        self.ahead = ahead  # NOTE [ Asynchronous offload ] rule 2
        # rule 5: the previous step's reads, recorded from the op protocol (NOTE [ Step plan
        # ]), or a driver's own plan (``set_plan``)
        self.steps = StepPlan() if prefetch else None
        self.plan: ReadPlan | None = self.steps
        self.copies = HostCopies()  # NOTE [ Asynchronous offload ] in offload.py
        self.tuner = CopyScale(copy_scale)  # NOTE [ Copy price scale ] in tuning.py
        self.stats.copy_scale = self.tuner.value
        self.host, self.arriving = self.copies.host, self.copies.arriving  # read here
        # Per core id: the residency lists, indexed by sid, here; the storage graph's in
        # ``graph`` (graph.py), lent as references for reading (NOTE [ Core parts ] rule 3).
        self.state = bytearray()  # FREE / RESIDENT / EVICTED / EXTERNAL (engine/residency.py)
        self.seen: list[int] = []  # clock of the last use, while lazy (then the engine's)
        self.held = bytearray()  # a wrapper of the program holds it
        self.pinned = bytearray()  # never evicted while resident (never_evict)
        self.backward = bytearray()  # created during a backward pass
        self.eslot: list[int] = []  # engine slot, -1 while lazy or external
        self.offloaded = bytearray()  # evicted with its value on the host (NOTE [ Offload ])
        self.sid_of: list[int] = []  # engine slot -> sid, -1 if none
        self.lazy_live: dict[int, None] = {}  # live sids in creation order, while lazy
        g = self.graph = StorageGraph(self.state, budget is not None and not stress)
        self.size, self.cost, self.born, self.inputs = g.size, g.cost, g.born, g.inputs
        self.name, self.writes, self.nread, self.links = g.name, g.writes, g.nread, g.links
        self.absorbed, self.free_ids, self.readers = g.absorbed, g.free_ids, g.readers
        # The op in flight's inputs (NOTE [ Op protocol ]): those recomputed for it, locked;
        # those resident and not yet locked, and those locked since (NOTE [ Deferred locks ])
        self.recomputed: list[int] = []
        self.deferred: list[int] = []
        self.input_locks: list[int] = []
        self.scorer = UnheldScorer(  # NOTE [ Unheld storages ] in unheld.py
            self.state, self.held, self.inputs, self.cost, self.size, self.eslot, self.sid_of
        )
        self.pins = BackwardPins(  # NOTE [ Backward storages ] in backward.py
            self.state, self.pinned, self.backward, self.inputs, self.stats
        )
        self.scorer.price_copies(self.host, link)  # NOTE [ Asynchronous offload ] rule 3
        self.anchors = Anchors()  # NOTE [ Anchored storages ] in anchors.py
        self.anchored = self.anchors.anchored  # read here; the anchors write it
        self.clock = None  # NOTE [ Device time ] in runtime/events.py: None, wall time
        self.tape: Tape | None = None  # NOTE [ Rehearsal ] rule 3 in rehearsal.py
        if copy_scale is None and (link is not None or prefetch):
            self.tape = Tape(type(self))
            self.__class__ = taped(type(self))

    # ---------------------------------------------------------------- storages
    def start(self, device: torch.device) -> None:
        """The device of the tracked storages (the engine's table lives there)."""
        self.device = device
        if not self.lazy:
            self.engine = Engine(
                self.heuristic,
                device=self.table_device or device,
                backend=self.backend,
                reuse=self.reuse,
            )
            eng = self.engine
            self.stats.backend = f"{eng.backend.value} on {eng.table.device}"

    def time_with(self, clock) -> None:
        """Time selections with ``clock`` (NOTE [ Device time ] in runtime/events.py)
        instead of the host's wall clock."""
        self.clock = clock

    def new(
        self,
        size: int,
        cost: float,
        inputs: tuple[int, ...],
        name: str,
        pinned: bool = False,
        backward: bool = False,
        writes: int = -1,
        alone: bool = True,
    ) -> int:
        """A new resident storage of ``size`` bytes that op ``name`` computed in ``cost`` ns
        from the tracked storages ``inputs`` (its parents); returns its sid. ``backward``:
        created during a backward pass (the caller tests it only when ``pin_backward``).
        ``writes``: the storage (one of ``inputs``) of which this is a new version written in
        place, or -1; ``alone``: the op writes no other tracked storage (NOTE [ Fused
        versions ] rule 3)."""
        counted, p, links = inputs, -1, 0
        graph = self.graph
        if writes >= 0 or self.absorbed:  # NOTE [ Fused versions ]: in-place ops only
            inputs, counted, cost, writes, p, links = graph.fuse(inputs, cost, writes, alone)
        sid = graph.add(size, cost, self.now, inputs, counted, name, writes)
        if sid < len(self.state):  # a freed id
            self.seen[sid] = self.now
            self.state[sid], self.held[sid] = RESIDENT, 1
            self.pinned[sid], self.backward[sid] = pinned, backward
            self.offloaded[sid] = 0
        else:
            self.seen.append(self.now)
            self.state.append(RESIDENT)
            self.held.append(1)
            self.pinned.append(pinned)
            self.backward.append(backward)
            self.pins.grow()
            self.eslot.append(-1)
            self.offloaded.append(0)
            self.copies.grow()
        if self.lazy:  # NOTE [ Lazy engine ] rule 1
            self.lazy_live[sid] = None
        elif backward and not pinned and self.pins.keeps_out(self.readers is not None):
            self._keep_out(sid)  # NOTE [ Backward storages ] rule 5 in backward.py
        else:
            self._enter(sid, pinned, backward)
        self.bytes.grow(size)
        if self.steps is not None:  # NOTE [ Step plan ] rule 2
            self.steps.made(sid)
        if links:  # NOTE [ Fused versions ] rules 4 and 6: the recipes its replay nests
            graph.link(sid, links, p)
            if p >= 0:  # rule 1: ``p`` leaves; its id waits for the op's end (rule 5)
                self.forget(p, absorbed=True)
        return sid

    def set_cost(self, sid: int, cost: float) -> None:
        """A new cost (ns) for live storage ``sid``: a measurement replacing the estimate it
        was created with (NOTE [ Cost models ] rule 10 in runtime/cost.py). The engine and
        its bounded choice learn it as any cost change (NOTE [ Bounded choice ] rule 2), and
        the kept ancestor sums that count it are dropped (NOTE [ Unheld storages ] rule 6)."""
        self.graph.set_cost(sid, cost)
        slot = self.eslot[sid]
        if slot >= 0 and self.host[sid]:  # NOTE [ Asynchronous offload ] rule 3
            self._price_backed(sid)
        elif slot >= 0:
            self.engine.set_cost(slot, cost)
        if sid in self.scorer.inside:
            self.scorer.forget_ancestors(sid, False)

    def _keep_out(self, sid: int) -> None:
        """NOTE [ Backward storages ] rule 5 in backward.py: ``sid``, a backward storage
        pinned by rule 1, stays out of the engine."""
        if self.readers is not None:
            self.graph.read(sid)
        self.pins.keep_out(sid, self.state[sid] == RESIDENT)

    def admit(self, sid: int) -> None:
        """NOTE [ Backward storages ] rule 5 in backward.py: ``sid``, kept out of the engine,
        enters it as :meth:`sync` enters a storage (pinned if resident, evicted if not, its
        last use, its locks), with the edges from its inputs and to its readers there."""
        locks = self.pins.let_in(sid)
        eng, eslot = self.engine, self.eslot
        resident = self.state[sid] == RESIDENT
        parents = [eslot[i] for i in self.inputs[sid] if eslot[i] >= 0]
        slot = eng.new(self.cost[sid], self.size[sid], self.born[sid], parents, evictable=False)
        self._bind(sid, slot)
        if self.seen[sid] != self.born[sid]:
            eng.access(slot, self.seen[sid])
        if self.readers is not None:
            for d in self.readers.get(sid, ()):
                if eslot[d] >= 0:
                    eng.add_parents(eslot[d], (slot,))
        if resident:
            for _ in range(locks):
                eng.lock(slot)
        else:
            eng.evict(slot, unpin=True)

    def admit_backward(self) -> None:
        """NOTE [ Backward storages ] rule 5 in backward.py: every backward storage kept out
        of the engine enters it, in creation order; later ones enter as they are made."""
        for sid in self.pins.let_all_in():
            self.admit(sid)

    def _enter(self, sid: int, pinned: bool, backward: bool) -> None:
        if self.readers is not None:  # NOTE [ Readers before release ] rule 3
            self.graph.read(sid)
        eslot = self.eslot
        parents = [eslot[i] for i in self.inputs[sid] if eslot[i] >= 0]
        slot = self.engine.new(
            self.cost[sid], self.size[sid], self.born[sid], parents,
            evictable=not (pinned or backward),
        )  # fmt: skip
        self._bind(sid, slot)
        if backward and not pinned:
            self.pins.pin(sid)

    def _bind(self, sid: int, slot: int) -> None:
        """``sid`` is engine slot ``slot``."""
        self.eslot[sid] = slot
        sid_of = self.sid_of
        if slot >= len(sid_of):
            sid_of.extend([-1] * (slot + 1 - len(sid_of)))
        sid_of[slot] = sid

    @property
    def budget(self) -> int | None:
        """The budget in bytes (None: none); set through ``bytes.set_budget``."""
        return self.bytes.budget

    @property
    def resident(self) -> int:
        """The bytes counted against the budget (NOTE [ Budget accounting ])."""
        return self.bytes.resident

    def sync(self) -> None:
        """NOTE [ Lazy engine ] rule 2: build the engine and enter every live storage."""
        if not self.lazy:
            return
        live, self.lazy, self.lazy_live = list(self.lazy_live), False, {}
        if self.device is None:
            return
        self.start(self.device)
        eng, state, pins, readers = self.engine, self.state, self.pins, self.readers is not None
        for sid in live:
            resident = state[sid] == RESIDENT
            pinned = resident and self.pinned[sid]
            if self.backward[sid] and not self.pinned[sid] and pins.keeps_out(readers):
                self._keep_out(sid)  # NOTE [ Backward storages ] rule 5 in backward.py
                continue
            self._enter(sid, pinned, resident and self.backward[sid] and not pinned)
            if self.seen[sid] != self.born[sid]:
                eng.access(self.eslot[sid], self.seen[sid])
            if not resident:
                eng.evict(self.eslot[sid])

    # ------------------------------------------------------------------ ops
    def enter(self, name: str, sids: list[int]) -> None:
        """Op ``name`` is about to run with tracked inputs ``sids`` (in argument order,
        duplicates too): NOTE [ Op protocol ] rule 1 up to the op: :meth:`prepare`,
        :meth:`use_evicted`, :meth:`use` of each, :meth:`begin`. Both drivers call this;
        their inputs' buffers are resident (and kept so) once it returns."""
        if self.steps is not None:  # NOTE [ Step plan ] rule 2
            self.steps.read(name, sids)
        acc = self.bytes  # prepare, use and begin inline: once per op
        over = acc.budget is not None and acc.resident > acc.budget
        if self.lazy:
            if over:  # NOTE [ Lazy engine ] rule 2
                self.sync()
            else:  # NOTE [ Lazy engine ] rule 1: resident, nothing to lock
                seen, now = self.seen, self.now
                for sid in sids:
                    seen[sid] = now
                self.now = now + 1
                acc.op_bytes = 0
                return
        if len(sids) > 1:  # rule 2
            state = self.state
            for sid in sids:
                if state[sid] == EVICTED:
                    self.use_evicted(sids)
                    break
        use = self.use
        for sid in sids:
            use(sid)
        self.begin(name)

    def prepare(self) -> None:
        """Before an op reads its inputs: NOTE [ Lazy engine ] rule 2."""
        if self.lazy:
            acc = self.bytes  # acc.over(), inline: once per op
            if acc.budget is not None and acc.resident > acc.budget:
                self.sync()

    def use(self, sid: int) -> None:
        """``sid`` is a tracked input of the op about to run: make it resident, keep it
        resident until the op ran, record the access. A recomputed input stays locked, a
        resident one is locked only if something may evict before then (NOTE [ Deferred
        locks ]); :meth:`release_inputs` unlocks both (NOTE [ Op protocol ])."""
        if self.lazy:  # NOTE [ Lazy engine ] rule 1: resident, nothing to lock
            self.seen[sid] = self.now
            return
        if self.state[sid] != RESIDENT:
            if self.deferred:
                self.lock_inputs()
            self.materialize(sid)
            self.recomputed.append(sid)
        elif self.evicting:
            self.deferred.append(sid)
        if self.arriving and sid in self.arriving:  # NOTE [ Asynchronous offload ] rule 4
            self.wait_arrived(sid)
        slot = self.eslot[sid]
        if slot >= 0:
            self.engine.access(slot, self.now)
        else:  # NOTE [ Backward storages ] rule 5 in backward.py: its last use, for admit
            self.seen[sid] = self.now

    def use_evicted(self, sids: list[int]) -> None:
        """NOTE [ Evicted inputs first ]: make resident the evicted storages among ``sids``
        (the op's tracked inputs, in argument order) before any of its inputs is used; each
        one recomputed stays locked until :meth:`release_inputs`. Nothing for fewer than two
        (rule 2)."""
        if len(sids) < 2:
            return
        state, mine, locked = self.state, [], self.recomputed
        for _ in range(len(sids) + 1):  # rule 4: rounds, until every input is resident
            todo = [sid for sid in sids if state[sid] == EVICTED]
            if not todo:
                return
            for sid in todo:
                if state[sid] != EVICTED:  # listed twice
                    continue
                try:
                    self.materialize(sid)
                except ThrashError:
                    raise
                except BudgetError:
                    if not mine:
                        raise
                    self.stats.budget_errors -= 1  # rule 4: retried, not raised
                    for m in mine:  # rule 4: the inputs made resident before it give way
                        self.unlock(m)
                        locked.remove(m)
                    mine.clear()
                    self.materialize(sid)
                locked.append(sid)
                mine.append(sid)

    def lock_inputs(self) -> None:
        """NOTE [ Deferred locks ] rule 2: lock the inputs :meth:`use` deferred, now that
        something may evict before the op runs."""
        lock, locked = self.lock, self.input_locks
        for sid in self.deferred:
            lock(sid)
            locked.append(sid)
        self.deferred.clear()

    def lock_input(self, sid: int) -> None:
        """Lock resident input ``sid`` of the op in flight until :meth:`release_inputs`
        (the runtime's out-of-memory retry on a lazy core: NOTE [ Out-of-memory fallback ]
        in runtime/oom.py)."""
        self.lock(sid)
        self.input_locks.append(sid)

    def release_inputs(self) -> None:
        """The op in flight ran (or failed): unlock the inputs recomputed for it, then what
        :meth:`lock_inputs` locked, and forget what :meth:`use` deferred (NOTE [ Op
        protocol ], NOTE [ Deferred locks ] rule 3). Cheap when there is nothing to do."""
        if self.recomputed:
            unlock = self.unlock
            for sid in self.recomputed:
                unlock(sid)
            self.recomputed.clear()
        self.deferred.clear()
        locked = self.input_locks
        if locked:
            unlock = self.unlock
            for sid in locked:
                unlock(sid)
            locked.clear()

    def tick(self) -> int:
        """Advance the clock, by one per op and per recomputation; returns the new time."""
        now = self.now = self.now + 1
        return now

    def recomputed_resident(self, sid: int) -> None:
        """Evicted ``sid`` was recomputed (:meth:`recompute` in remat.py): resident again."""
        self.state[sid] = RESIDENT

    def begin(self, name: str) -> None:
        """Op ``name`` runs next: advance the clock and make room (NOTE [ Budget accounting ]
        rule 2)."""
        self.now += 1
        acc = self.bytes  # acc.over(), inline: once per op
        if acc.budget is not None and acc.resident > acc.budget:
            if self.deferred:  # NOTE [ Deferred locks ] rule 2
                self.lock_inputs()
            try:
                self.make_room(name)
            except BudgetError:
                self.stats.budget_errors += 1
                raise
        self.bytes.new_op()

    def end(self, cost: float = 0.0) -> None:
        """The op's outputs are tracked: NOTE [ Budget accounting ] rule 4; the ids of the
        versions it fused are free again (NOTE [ Fused versions ] rule 5). ``cost``: the op's
        (ns), the device time it took (NOTE [ Offload link ] rule 2)."""
        self.elapsed += cost
        self.ops += 1
        if self.steps is not None:  # NOTE [ Step plan ] rule 2
            self.steps.ran()
        if self.absorbed:
            self.graph.end_op()
        if self.stress:
            self.evict_all()
        elif self.link is not None and self.bytes.budget is not None and not self.lazy:
            self.after_op()  # NOTE [ Asynchronous offload ] rules 2 and 5

    def lock(self, sid: int) -> None:
        slot = self.eslot[sid]
        if slot >= 0:
            self.engine.lock(slot)
        else:  # NOTE [ Backward storages ] rule 5 in backward.py: counted until admitted
            self.pins.lock(sid)

    def unlock(self, sid: int) -> None:
        slot = self.eslot[sid]
        if slot >= 0:
            self.engine.unlock(slot)
        else:
            self.pins.unlock(sid)

    def lock_count(self, sid: int) -> int:
        slot = self.eslot[sid]
        return self.engine.lock_count(slot) if slot >= 0 else self.pins.out_locks.get(sid, 0)

    # ------------------------------------------------------------ releasing
    def release(self, sid: int) -> None:
        """The program's last wrapper of ``sid`` died: free its buffer now; it stays
        recomputable for its dependents until :meth:`forget`."""
        if self.state[sid] == RESIDENT and sid not in self.anchored:  # anchors: rule 2
            try:
                self._before_release(sid)
            finally:  # NOTE [ Readers before release ] rule 5: the release happens anyway
                self.held[sid] = 0
                self.drop(sid)
                self.stats.freed += 1
        self.held[sid] = 0

    def _before_release(self, sid: int) -> None:
        """NOTE [ Readers before release ] rule 2: rematerialize the evicted storages a
        wrapper holds that read resident ``sid`` and nothing else evicted, while nothing must
        be evicted for them. ``sid`` is still held: no recomputation takes its buffer (NOTE
        [ Consumed versions ] in remat.py)."""
        if not self.readers or self.lazy or self.closed:
            return
        readers = self.readers.get(sid)
        if not readers:
            return
        state, held, inputs = self.state, self.held, self.inputs
        offloaded = self.offloaded
        for d in list(readers):
            if (
                state[d] == EVICTED
                and not offloaded[d]  # NOTE [ Offload ]: its host copy needs nothing of sid
                and held[d]
                and not self.over_budget()
                and all(state[i] != EVICTED for i in inputs[d])
            ):
                self.materialize(d, use=False)
                self.unlock(d)

    def hand_out(self, sid: int, escape: bool = False) -> None:
        """``sid``'s buffer now belongs to a plain tensor outside: stop counting it (it
        stays in the graph, evicted, for its dependents). ``escape``: handed to the program
        as it is (not overwritten by an in-place op): NOTE [ Readers before release ] applies
        as it does to :meth:`release`, which the twin replays it as."""
        try:
            if escape and sid not in self.anchored:
                self._before_release(sid)
        finally:  # NOTE [ Readers before release ] rule 5
            self.held[sid] = 0
            self.drop(sid)

    def drop(self, sid: int, free: bool = True) -> None:
        """Free the buffer of resident ``sid``; it stays in the graph, evicted. ``free``
        False: the executor keeps the buffer for now (a consumed version, NOTE [ Consumed
        versions ] in remat.py: the recomputation it feeds takes it)."""
        slot = self.eslot[sid]
        if slot >= 0:
            eng = self.engine
            if eng.lock_count(slot):
                raise AssertionError(f"bug of tritondtr: dropping locked storage {sid}")
            eng.evict(slot, unpin=True)
        elif sid in self.pins.out_locks:  # NOTE [ Backward storages ] rule 5 in backward.py
            raise AssertionError(f"bug of tritondtr: dropping locked storage {sid}")
        self.pinned[sid] = 0
        if self.anchored:  # NOTE [ Anchored storages ] rule 2
            self.anchors.end(sid)
        self.state[sid] = EVICTED
        if self.scorer.border:  # NOTE [ Unheld storages ] rule 6 in unheld.py
            self.scorer.forget_ancestors(sid, True)
        size = self.size[sid]
        self.bytes.shrink(size)
        if self.host[sid]:  # NOTE [ Asynchronous offload ] rule 1: offloaded, copying nothing
            self.copies.went(sid, size)
            self.set_offloaded(sid, True)
            self.plan_read(sid)
        if free:
            self.executor.free(sid)

    def set_link(self, link: Link | None) -> None:
        """The link victims may be offloaded over from now on (NOTE [ Offload ]); the runtime
        gives it once the session's device is known."""
        self.link = link
        self.scorer.price_copies(self.host, link)  # NOTE [ Asynchronous offload ] rule 3

    def set_plan(self, plan: ReadPlan | None) -> None:
        """The order of reads prefetches follow from now on (NOTE [ Asynchronous offload ]
        rule 5 in offload.py); None: no prefetch."""
        self.plan = plan

    def set_offloaded(self, sid: int, away: bool) -> None:
        """``sid`` is evicted with its value on the host, or no longer (NOTE [ Offload ])."""
        self.offloaded[sid] = away

    def wait_until(self, t: float) -> None:
        """The device waits for the link until ``t`` (ns of device time; NOTE [ Asynchronous
        offload ] rule 4 in offload.py)."""
        if t > self.elapsed:
            self.stats.link_wait_ns += t - self.elapsed
            self.elapsed = t

    def ran(self, cost: float) -> None:
        """A recomputation of ``cost`` ns ran (NOTE [ Offload link ] rule 2)."""
        self.elapsed += cost

    def externalize(self, sid: int) -> None:
        """Turn resident, unlocked ``sid`` into an external storage for good: it keeps its
        buffer and value, leaves the engine and the byte count (NOTE [ Parameter writes ])."""
        if self.host[sid]:  # NOTE [ Asynchronous offload ] rule 1: its value may change
            self.discard_copy(sid)
        self.bytes.shrink(self.size[sid])
        if self.lazy:
            self.lazy_live.pop(sid, None)
        elif self.eslot[sid] >= 0:
            slot = self.eslot[sid]
            if self.engine.lock_count(slot):
                raise AssertionError(f"bug of tritondtr: externalizing locked storage {sid}")
            self.engine.release(slot)
            self.sid_of[slot] = self.eslot[sid] = -1
        else:  # NOTE [ Backward storages ] rule 5 in backward.py
            self.pins.externalize(sid)
        self.graph.cut(sid)
        self.state[sid], self.pinned[sid] = EXTERNAL, 0
        if self.anchored:  # NOTE [ Anchored storages ] rule 2
            self.anchors.end(sid)
        self.executor.keep(sid)

    def forget(self, sid: int, absorbed: bool = False) -> None:
        """Nothing refers to ``sid`` any more (no wrapper, no recipe): it leaves the core.
        ``absorbed``: a version another one absorbed (NOTE [ Fused versions ]): evicted, its
        reads passed to that one, its id free once the op ends."""
        if self.host[sid]:  # NOTE [ Offload ] rule 5
            self.discard_copy(sid)
        if not absorbed and self.state[sid] == RESIDENT:
            self.bytes.shrink(self.size[sid])
        kept_out = False
        if self.lazy:
            self.lazy_live.pop(sid, None)
        elif self.eslot[sid] >= 0:
            slot = self.eslot[sid]
            self.engine.release(slot)
            self.sid_of[slot] = self.eslot[sid] = -1
        else:  # NOTE [ Backward storages ] rule 5 in backward.py
            kept_out = True
        self.graph.remove(sid, absorbed)  # its id free at once unless absorbed
        self.state[sid] = FREE
        pins, scorer = self.pins, self.scorer  # the calls only when they have work: per op
        if kept_out or pins.in_bw[sid]:
            pins.forget(sid, kept_out)
        if self.anchored:  # NOTE [ Anchored storages ] rule 2
            self.anchors.end(sid)
        if scorer.unheld or scorer.sums or scorer.inside or scorer.border:
            scorer.forget(sid)  # NOTE [ Unheld storages ] rules 4 and 6

    # ------------------------------------------------- anchors, outside bytes
    def anchor(self, sid: int) -> None:
        """NOTE [ Anchored storages ] rule 1 in anchors.py."""
        self.anchors.anchor(self, sid)

    def unanchor(self, sid: int) -> None:
        """NOTE [ Anchored storages ] rule 3 in anchors.py."""
        self.anchors.unanchor(self, sid)

    def held_descendants(self, roots) -> list[int]:
        """The storages a wrapper holds among ``roots`` and everything computed from them,
        in creation order."""
        return Anchors.held_descendants(self, roots)

    def grow_outside(self, nbytes: int, what: str) -> None:
        """The rank now holds ``nbytes`` more outside the tracked storages (NOTE [ Anchored
        storages ] rule 5 in anchors.py): room is made as for an op named ``what``."""
        self.bytes.grow_outside(nbytes)
        if self.over_budget():
            self.sync()
            self.make_room(what)

    def shrink_outside(self, nbytes: int) -> None:
        self.bytes.shrink_outside(nbytes)

    def held_storages(self) -> list[int]:
        """The tracked storages a wrapper holds, in creation order while lazy, else in engine
        slot order (the order :meth:`freeze` visits them)."""
        held, state = self.held, self.state
        if self.lazy:
            order = self.lazy_live
        else:  # then those kept out of the engine (NOTE [ Backward storages ] rule 5)
            order = [s for s in self.sid_of if s >= 0]
            order.extend(self.pins.out)
        return [s for s in order if held[s] and state[s] != EXTERNAL]

    def freeze(self) -> None:
        """NOTE [ Parameter writes ]: every storage a wrapper holds becomes external, after
        being recomputed if it was evicted."""
        for sid in self.held_storages():
            if self.state[sid] != RESIDENT:
                self.materialize(sid)
                self.unlock(sid)
            self.externalize(sid)
        self.pins.step_ended()
        if self.steps is not None:  # NOTE [ Step plan ] rule 2
            self.steps.step()  # NOTE [ Backward storages ] rule 5, [ Unheld storages ] 5
        tape = self.tape
        if tape is not None and self.link is not None:  # NOTE [ Copy price scale ] rule 4
            step = self.tuner.step_ended(self.ops)
            if step == "first":
                tape.step_ended(self.stats.evictions)
            elif step == "choose" and self.stats.evictions > tape.evicted:  # rule 5
                times: dict[float, float] = {}
                try:
                    for c in CANDIDATES:
                        t = tape.rehearse(self, c)
                        if t is not None:
                            times[c] = t
                finally:  # a rehearsal's warning made an error: chosen all the same
                    self.tuner.chose(times)
                    self.stats.copy_scale = self.tuner.value
                    self.stop_tape()

    def stop_tape(self) -> None:
        """NOTE [ Rehearsal ] rule 3: the core tapes no more; unless the scale was chosen,
        it stays the plain price."""
        tape = self.tape
        if tape is not None:
            self.tape = None
            self.__class__ = tape.base
            if not self.tuner.fixed:
                self.tuner.stop()

    def close(self) -> None:
        """The session ended: nothing is evicted from now on (values still asked of wrappers
        are recomputed without a budget)."""
        self.closed = True
        self.stop_tape()

    # ------------------------------------------------------------ checking
    def check_invariants(self, ops_in_flight: bool = False) -> None:
        """Raise AssertionError if the core disagrees with itself or with its engine."""
        total, pins = 0, self.pins
        for sid, st in enumerate(self.state):
            if st == RESIDENT:
                total += self.size[sid]
            if self.lazy or st in (FREE, EXTERNAL):
                continue
            slot = self.eslot[sid]
            if sid in pins.out:  # NOTE [ Backward storages ] rule 5 in backward.py
                assert ops_in_flight or sid not in pins.out_locks, f"{sid} locked between ops"
                assert slot < 0 and self.backward[sid], f"storage {sid}: kept out, slot {slot}"
                assert st != RESIDENT or pins.in_bw[sid], f"storage {sid}: kept out, unlisted"
                continue
            assert not self.offloaded[sid] or st == EVICTED, f"storage {sid}: offloaded, {st}"
            assert self.host[sid] >= self.offloaded[sid], f"storage {sid}: offloaded, no copy"
            assert slot >= 0 and self.sid_of[slot] == sid, f"storage {sid}: engine slot map"
            assert self.engine.is_resident(slot) == (st == RESIDENT), (
                f"storage {sid}: residency vs engine"
            )
            if st == RESIDENT and not ops_in_flight:
                assert not self.engine.lock_count(slot), f"storage {sid} locked between ops"
        if self.engine is not None and not self.lazy:
            self.engine.check_invariants()
        self.scorer.check()
        backed = sum(  # NOTE [ Asynchronous offload ] in offload.py
            self.size[s] for s, h in enumerate(self.host) if h and self.state[s] == RESIDENT
        )
        assert backed == self.copies.backed, f"backed bytes {self.copies.backed} != {backed}"
        for sid, h in enumerate(self.host):
            assert not h or self.state[sid] in (RESIDENT, EVICTED), f"storage {sid}: a copy"
        acc = self.bytes
        assert total + acc.outside == acc.resident, (
            f"resident bytes {acc.resident} != storages {total} + outside {acc.outside}"
        )
        assert set(pins.out_locks) <= set(pins.out), "locks of storages not kept out"
        for sid in self.anchored:
            assert self.state[sid] == RESIDENT, f"storage {sid}: anchored, not resident"
        nread = [0] * len(self.nread)  # NOTE [ Fused versions ]
        for sid, st in enumerate(self.state):
            if st != FREE:
                for i in self.inputs[sid]:
                    assert self.state[i] != FREE, f"storage {sid} reads free storage {i}"
                    nread[i] += 1
        assert nread == self.nread, "storages' reader counts"
        if self.readers is not None and not self.lazy:  # NOTE [ Readers before release ]
            for sid, st in enumerate(self.state):
                if st in (RESIDENT, EVICTED):
                    for i in self.inputs[sid]:
                        if self.state[i] != EXTERNAL:
                            assert sid in self.readers.get(i, ()), f"{sid}: not a reader of {i}"

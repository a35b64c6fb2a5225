"""Evicted regions of the ``exact`` and ``ancestors`` neighbourhood modes.

The region of a resident slot r along a direction (parents "up", children "down") is the set
of evicted slots reachable from r through evicted slots only; ``exact`` takes the union of
both directions, ``ancestors`` the "up" one. :class:`Regions` computes their costs one slot at
a time (a graph search) or many at once (cached closure bitmasks), with identical results,
and marks the resident slots whose region a change may have touched. It works on the
containers of a :class:`~tritondtr.engine.neighborhood.Neighborhood`, shared, not copied.

# NOTE [ Batched regions ]
# 1. A flush with at least _BATCH_MIN dirty slots (exact/ancestors) computes them together.
#    Every evicted slot e has a closure mask per direction (a Python int over slot ids):
#    its own bit OR the masks of its evicted successors (parents for "up", children for
#    "down"). A resident's region is the OR of its evicted neighbours' masks over both
#    directions: a union, as e* is.
# 2. Masks are cached across flushes. The staging searches (NOTE [ Neighbourhood staging ])
#    visit exactly the evicted slots whose closure may have changed: the search down from the
#    touched slots drops their "up" masks, the search up their "down" masks, and the touched
#    slots lose both. A flush computes only the missing masks, by one iterative DFS
#    post-order that stops at cached slots.
# 3. The value is the correctly rounded exact sum of the costs selected by the mask, as in
#    the per-slot search (``math.fsum``), so both paths give identical values. Distinct masks
#    are summed at once as one int64 product: a float32 cost is a 24-bit integer times 2**e,
#    so scaled by the smallest e of the flush it is an exact int64 when the exponent range
#    plus 24 bits plus log2(#slots) fits in 62 bits; otherwise each mask uses ``math.fsum``.
# 4. The per-slot search costs the sum of the region sizes; the batch costs the invalidated
#    part of their union plus word-parallel ORs. It wins when regions overlap (recurrent
#    chains such as the lstm trace; measured: see docs/benchmarks.md, Measurements behind
#    the NOTEs, Batched regions).
# 5. A mask costs up to capacity/8 bytes and building it up to capacity/64 word operations
#    per edge, so the masks are bounded by _MAX_CACHE_BITS / capacity: the cache is dropped
#    when half full, and a flush that would need more new masks than fit (a long evicted
#    chain) uses the per-slot search, as do tables beyond _MAX_BATCH_CAPACITY slots and a
#    flush that meets a cycle (a successor that is still open in the DFS).
# 6. Masks pay off only when they stay cached. Where every flush drops most of them (a chain
#    whose released, evicted tail is reached from every rematerialized slot), rebuilding them
#    (DFS plus wide ORs) costs more than searching. So a batch first runs the per-slot search
#    with a budget of _MASK_COST node visits per mask dropped since masks were last built
#    (``dropped``, counted by the staging searches), and uses the masks only if the search
#    runs out. Either way the values are the same (rule 3).
# 7. A mask DFS that fails for room (rule 5) would fail again at the next batches: the long
#    evicted chain that filled it is still there (the Theorem 3.1 chain at N = 3e4: a failed
#    DFS walks much of that chain, and was retried at every batch; measured: see
#    docs/benchmarks.md, Measurements behind the NOTEs, Batched regions). So after a failure
#    the next 1, 2, 4, .. (doubling on every failure in a row, at most _MAX_BACKOFF) batches
#    use the per-slot search without trying; a DFS that succeeds resets the backoff.
"""

from __future__ import annotations

import math
from array import array

import numpy as np

from .residency import EVICTED, RESIDENT

__all__ = ["Regions"]

_BATCH_MIN = 4
_MAX_BATCH_CAPACITY = 1 << 20
_MAX_CACHE_BITS = 1 << 31  # 256 MiB of masks
_MASK_COST = 2  # rule 6: search visits one dropped mask is worth (docs/benchmarks.md)
_MAX_BACKOFF = 1024  # rule 7: batches skipped at most after failed mask DFS runs


def _post_order(
    roots: list[int], adj: list[list[int]], st: bytearray, done: dict[int, int], limit: int
) -> list[int] | None:
    """Evicted slots reachable from ``roots``' evicted neighbours along ``adj`` through
    evicted slots not in ``done``, in DFS post-order (a slot after its successors);
    ``None`` as soon as more than ``limit`` are found."""
    seen: set[int] = set()
    post: list[int] = []
    for r in roots:
        for p in adj[r]:
            if st[p] != EVICTED or p in seen or p in done:
                continue
            seen.add(p)
            if len(seen) > limit:
                return None
            stack = [(p, iter(adj[p]))]
            while stack:
                u, it = stack[-1]
                for v in it:
                    if st[v] == EVICTED and v not in seen and v not in done:
                        seen.add(v)
                        if len(seen) > limit:
                            return None
                        stack.append((v, iter(adj[v])))
                        break
                else:
                    stack.pop()
                    post.append(u)
    return post


def _unpack(raw: bytes) -> np.ndarray:
    """Little-endian bytes of a Python int -> its bits as uint8, bit i at index i."""
    return np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")


class Regions:
    """Region costs and closure masks over a neighbourhood's graph (NOTE [ Batched regions ]).

    Args: the neighbourhood's ``state`` (bytearray of residency codes), ``cost``
    (``array('f')``), ``parents`` and ``children`` (lists of slot lists), all shared; ``exact``
    says whether regions span both directions (mode ``exact``) or only parents
    (``ancestors``). ``clo_up`` / ``clo_down`` map an evicted slot to its cached closure mask.
    """

    def __init__(
        self,
        state: bytearray,
        cost: array,
        parents: list[list[int]],
        children: list[list[int]],
        exact: bool,
    ) -> None:
        self.state, self.cost = state, cost
        self.parents, self.children = parents, children
        self.exact = exact
        self.clo_up: dict[int, int] = {}
        self.clo_down: dict[int, int] = {}
        self.dropped = 0  # masks dropped since masks were last built (rule 6)
        self.skip = 0  # batches that use the per-slot search without a mask DFS (rule 7)
        self.backoff = 0  # the last skip granted, doubled on every failure in a row

    # -------------------------------------------------------------- per slot
    def region(self, r: int, adj: list[list[int]], limit: int = -1) -> set[int] | None:
        """Evicted slots reachable from ``r`` along ``adj`` through evicted slots only;
        ``None`` as soon as more than ``limit`` are found (``limit < 0``: no limit)."""
        st, seen, stack = self.state, set(), [r]
        while stack:
            for v in adj[stack.pop()]:
                if st[v] == EVICTED and v not in seen:
                    seen.add(v)
                    stack.append(v)
            if 0 <= limit < len(seen):
                return None
        return seen

    def value_ancestors(self, r: int) -> float:
        """Cost of the evicted ancestors of ``r`` (float64, correctly rounded)."""
        up = self.region(r, self.parents)
        cost = self.cost
        return math.fsum([cost[u] for u in up]) if up else 0.0

    def value_exact(self, r: int) -> float:
        """Cost of e*(r), both directions (float64, correctly rounded)."""
        region = self.region(r, self.parents)
        region |= self.region(r, self.children)  # disjoint in a DAG; a union in any case
        cost = self.cost
        return math.fsum([cost[u] for u in region]) if region else 0.0

    def values_within(self, slots: list[int], budget: int) -> list[float] | None:
        """The per-slot values of ``slots``, or ``None`` once their regions hold more than
        ``budget`` slots in all (NOTE [ Batched regions ] rule 6)."""
        dirs = (self.parents, self.children) if self.exact else (self.parents,)
        cost, vals = self.cost, []
        for r in slots:
            region: set[int] = set()
            for adj in dirs:
                part = self.region(r, adj, budget)
                if part is None:
                    return None
                budget -= len(part)
                region |= part
            vals.append(math.fsum([cost[u] for u in region]) if region else 0.0)
        return vals

    # ------------------------------------------------------------- staging
    def mark_from(self, starts, adj: list[list[int]], dirty: set[int]) -> None:
        """Add to ``dirty`` the resident slots met searching from every start along ``adj``
        through evicted slots; one shared ``seen`` set (NOTE [ Neighbourhood staging ]).
        The evicted slots met, and the starts, lose their cached masks (rule 2): searching
        down invalidates "up" closures and vice versa."""
        st, seen, stack = self.state, set(starts), list(starts)
        clo = self.clo_up if adj is self.children else self.clo_down
        held = len(clo)
        pop = clo.pop
        for s in starts:
            pop(s, None)
        while stack:
            for v in adj[stack.pop()]:
                if v in seen:
                    continue
                seen.add(v)
                s = st[v]
                if s == EVICTED:
                    pop(v, None)
                    stack.append(v)
                elif s == RESIDENT:
                    dirty.add(v)
        self.dropped += held - len(clo)

    # ------------------------------------------------------------- batched
    def batch_values(self, slots: list[int], max_bits: int = _MAX_CACHE_BITS) -> list[float] | None:
        """Values of many resident slots from cached closure masks; ``None`` where the
        per-slot search must serve (big table, too many new masks, cycle: rule 5).
        ``max_bits`` bounds the bits held by all cached masks together."""
        st = self.state
        if len(st) > _MAX_BATCH_CAPACITY:
            return None
        max_masks = max_bits // len(st)
        if self.dropped:  # rule 6
            vals = self.values_within(slots, _MASK_COST * self.dropped)
            if vals is not None:
                return vals
        if self.skip:  # rule 7
            self.skip -= 1
            return None
        if len(self.clo_up) + len(self.clo_down) > max_masks // 2:
            self.clo_up.clear()
            self.clo_down.clear()
        self.dropped = 0
        dirs = [(self.parents, self.clo_up)]
        if self.exact:
            dirs.append((self.children, self.clo_down))
        posts = []
        room = max_masks - len(self.clo_up) - len(self.clo_down)
        for adj, clo in dirs:
            post = _post_order(slots, adj, st, clo, room)
            if post is None:  # too many new masks: per-slot search (rule 5), back off (rule 7)
                self.backoff = self.skip = min(max(1, 2 * self.backoff), _MAX_BACKOFF)
                return None
            room -= len(post)
            posts.append(post)
        self.backoff = 0
        masks = [0] * len(slots)
        for (adj, clo), post in zip(dirs, posts):
            for u in post:
                m = 1 << u
                for v in adj[u]:
                    if st[v] == EVICTED:
                        c = clo.get(v)
                        if c is None:  # v is still open: a cycle
                            return None
                        m |= c
                clo[u] = m
            for i, r in enumerate(slots):
                m = masks[i]
                for p in adj[r]:
                    if st[p] == EVICTED:
                        m |= clo[p]
                masks[i] = m
        return self.mask_sums(masks)

    def mask_sums(self, masks: list[int]) -> list[float]:
        """The correctly rounded exact cost sum over each mask's slots (rule 3): distinct
        masks only, one int64 product when exact, else fsum."""
        distinct = list(dict.fromkeys(m for m in masks if m))
        if not distinct:
            return [0.0] * len(masks)
        union = 0
        for m in distinct:
            union |= m
        nbytes = (union.bit_length() + 7) // 8
        cols = np.flatnonzero(_unpack(union.to_bytes(nbytes, "little")))
        # a temporary view of array('f'): the fancy index copies, so it may grow again
        cost = np.frombuffer(self.cost, np.float32)[cols].astype(np.float64)
        mant, expo = np.frexp(cost)
        nz = cost > 0
        sums: dict[int, float] = {}
        if nz.any():
            e = expo - 24
            e_min = int(e[nz].min())
            shift = np.where(nz, e - e_min, 0)
            if int(shift.max()) + 24 + len(cols).bit_length() <= 62:
                fixed = np.where(nz, (mant * (1 << 24)).astype(np.int64) << shift, 0)
                rows = max(1, (1 << 21) // (8 * nbytes))  # <= 16 MiB of int64 per chunk
                for lo in range(0, len(distinct), rows):
                    chunk = distinct[lo : lo + rows]
                    raw = b"".join(m.to_bytes(nbytes, "little") for m in chunk)
                    bits = _unpack(raw).reshape(len(chunk), 8 * nbytes)[:, cols]
                    for m, n in zip(chunk, (bits.astype(np.int64) @ fixed).tolist()):
                        sums[m] = math.ldexp(float(n), e_min)
        if len(sums) < len(distinct):  # zero costs only, or too wide a range for int64
            pos = {int(c): i for i, c in enumerate(cols.tolist())}
            for m in distinct:
                if m not in sums:
                    idx = np.flatnonzero(_unpack(m.to_bytes(nbytes, "little")))
                    sums[m] = math.fsum(cost[[pos[i] for i in idx.tolist()]].tolist())
        return [sums[m] if m else 0.0 for m in masks]

    # ----------------------------------------------------------- debugging
    def check_invariants(self) -> None:
        """Every cached mask belongs to an evicted slot and equals its closure now."""
        st = self.state
        for adj, clo in ((self.parents, self.clo_up), (self.children, self.clo_down)):
            for e, m in clo.items():
                want = sum(1 << u for u in self.region(e, adj) | {e})
                assert st[e] == EVICTED and m == want, f"slot {e}: stale cached closure mask"

"""The program generator (programs.py): the same program for a seed, and none of the known
limits (limits.py) in what it generates."""

from __future__ import annotations

import torch

from tests.fuzz.check import reference
from tests.fuzz.limits import (
    KNOWN_LIMITS,
    may_inplace_view_op,
    may_masked_select,
    may_median,
    may_tolist,
    split_points,
)
from tests.fuzz.programs import generate


def test_generator_is_deterministic_per_seed():
    assert generate(7) == generate(7)
    assert generate(7) != generate(8)


def test_known_limits_are_named_and_split_points_follow_the_last_write():
    names = [k.name for k in KNOWN_LIMITS]
    assert len(names) == len(set(names)) and all(k.where for k in KNOWN_LIMITS)
    assert list(split_points([False, True, False, False])) == [2, 3]
    assert list(split_points([False, False, False])) == [1, 2]
    assert list(split_points([False, False, True])) == []


def test_generated_programs_avoid_the_known_limits(monkeypatch):
    """The programs of 70 seeds, run eagerly with the excluded calls watched: in-place view ops
    run (the template is alive) and only on tensors without grad; ``.tolist()``, median and
    masked_select never see what limits.py excludes."""
    seen, bad = [], []

    def watch(name, ok, owner=torch.Tensor):
        real = getattr(owner, name)

        def watched(self, *args, **kwargs):
            seen.append(name)
            if not ok(self):
                bad.append(name)
            return real(self, *args, **kwargs)

        monkeypatch.setattr(owner, name, watched)

    programs = [generate(s) for s in range(70)]
    for name in ("t_", "transpose_", "swapdims_", "unsqueeze_", "squeeze_", "as_strided_"):
        watch(name, may_inplace_view_op)
    watch("tolist", may_tolist)
    watch("median", may_median)
    watch("masked_select", may_masked_select, owner=torch)
    for prog in programs:
        reference(prog)
    assert not bad, bad
    assert {"tolist", "median", "masked_select"} <= set(seen) and len(set(seen)) > 3, sorted(
        set(seen)
    )

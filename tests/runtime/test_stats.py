"""What a session reports: ``print(session.stats)``, ``stats.as_dict()``, per-op
rematerializations, the warning when a byte budget never bound, and its ranges in the
profiler."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import tritondtr
import tritondtr.runtime as rt
from tests import zoo
from tests.runtime.eager_check import leaf


def _peak():
    c = zoo.make("gpt", seed=0)
    with tritondtr.enable(budget=None) as s:
        c.loss(c.model, c.inputs).backward()
    return s.stats.peak_bytes


def _run(**kw):
    c = zoo.make("gpt", seed=0)
    with tritondtr.enable(**kw) as s:
        c.loss(c.model, c.inputs).backward()
    return s.stats


def test_summary_is_a_short_readable_table():
    st = _run(budget=_peak() // 3)
    text = str(st)
    assert st.evictions > 0 and st.rematerializations > 0
    lines = text.splitlines()
    assert lines[0] == "tritondtr session" and len(lines) <= 16
    for label in ("budget", "peak (tracked)", "evictions", "rematerializations", "deciding"):
        assert any(line.strip().startswith(label) for line in lines), label
    assert f"{st.evictions:,}" in text and "heuristic dtr_eq" in text
    top, n = st.remat_counts.most_common(1)[0]
    assert f"{n:>6,}  {top}" in text


def test_the_summary_says_what_offload_did_only_with_offload():
    plain = str(_run(budget=_peak() // 3))
    assert "offload" not in plain
    st = _run(budget=_peak() // 3, offload="1TB/s")
    text = str(st)
    assert st.offloads > 0
    line = next(x for x in text.splitlines() if x.strip().startswith("offload"))
    assert f"{st.offloads:,} copies out" in line and f"{st.fetches:,} fetched" in line


def test_remat_counts_add_up():
    st = _run(budget=_peak() // 3)
    assert sum(st.remat_counts.values()) == st.rematerializations > 0


def test_as_dict_is_flat_and_serializable():
    st = _run(budget=_peak() // 2)
    d = st.as_dict()
    json.dumps(d)  # a logger can take it as it is
    assert d["evictions"] == st.evictions and d["budget_bytes"] == st.budget
    assert d["peak_bytes"] == st.peak_bytes and d["device_peak_bytes"] is None
    assert "op_counts" not in d and "remat_counts" not in d


def test_a_budget_that_never_bound_warns_once_at_exit():
    peak = _peak()
    with pytest.warns(UserWarning, match=r"never bound: the tracked peak was") as rec:
        _run(budget=4 * peak)
    assert len([w for w in rec if "never bound" in str(w.message)]) == 1


@pytest.mark.parametrize("kw", [{"budget": None}, {"stress": True}, {"budget": "auto"}, "half"])
def test_no_warning_when_the_budget_bound_or_was_not_a_byte_count(kw):
    if kw == "half":
        kw = {"budget": _peak() // 2}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run(**kw)


def test_an_empty_session_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tritondtr.enable(budget="1GiB"), torch.no_grad():
            torch.ones(3)  # nothing tracked


def test_the_warning_as_an_error_leaves_nothing_behind():
    """A warnings filter that makes the never-bound warning an error raises it after the
    session closed: nothing intercepted, a new session can start."""
    peak = _peak()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="never bound"):
            _run(budget=4 * peak)
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    assert not _get_current_dispatch_mode_stack()
    assert _run(budget=peak // 2).evictions > 0


def test_profiler_shows_named_ranges():
    x = leaf(16, 16)
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu) as prof, rt.enable(budget=3000):
        h = x
        for _ in range(6):
            h = h.tanh() * 1.5
        h.sum().backward()
    names = {e.name for e in prof.events()}
    assert {"tritondtr::evict", "tritondtr::select", "tritondtr::rematerialize"} <= names

"""Bugs planted in the runtime for the tests of the fuzzer itself: each one must be reported."""

import torch

import tritondtr.runtime.session as session_module


def plant_wrong_recomputation(monkeypatch):
    """Every recomputed floating-point buffer comes back off by one."""
    real = session_module.run_recipe

    def wrong(*args, **kwargs):
        out = real(*args, **kwargs)
        with torch.no_grad():
            for t in out:
                if t.dtype.is_floating_point:
                    t.add_(1)
        return out

    monkeypatch.setattr(session_module, "run_recipe", wrong)

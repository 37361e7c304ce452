"""mesh_store: gloo's address waits take the rendezvous's time, not the group's shortened timeout."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from slurmdist.mesh_store import mesh_store
from tests.conftest import require_module

torch = require_module("torch", "install torch (make venv does)")


def timed_wait(store, seconds: float) -> float:
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="[Tt]imeout"):
        store.wait(["never"], timedelta(seconds=seconds))
    return time.monotonic() - started


def test_waits_take_the_rendezvous_time_until_released_then_the_callers():
    store = mesh_store(torch.distributed.HashStore(), lambda: 0.3)
    assert timed_wait(store, 30) < 10  # asked for 30 s (gloo's shortened timeout would be the short one)
    assert timed_wait(store, 0.01) >= 0.25  # and not less than what the rendezvous has left either
    store.release()
    assert timed_wait(store, 0.5) >= 0.45  # the group's later waits are their callers' own


def test_everything_else_passes_through():
    inner = torch.distributed.HashStore()
    store = mesh_store(inner, lambda: 1.0)
    store.set("a", "1")
    assert inner.get("a") == b"1" and store.get("a") == b"1"
    assert store.add("n", 2) == 2 and store.compare_set("a", "1", "2") == b"2"
    assert store.check(["a"]) and store.num_keys() == inner.num_keys()
    assert store.delete_key("a") and not inner.check(["a"])

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


def test_torchs_cpp_callers_find_every_method():
    # torch keeps the C++ side and calls it by C++ names (getNumKeys, deleteKey, clone): through a PrefixStore,
    # as a group's own store calls it.
    inner = torch.distributed.HashStore()
    inner.set_timeout(timedelta(seconds=42))
    store = mesh_store(inner, None)
    through = torch.distributed.PrefixStore("group", store)  # torch joins prefix and key with "/"
    through.set("a", "1")
    assert through.num_keys() == inner.num_keys() == 1 and inner.check(["group/a"])
    assert through.delete_key("a") and not inner.check(["group/a"])
    inner.set("group/b", "2")
    assert through.clone().get("b") == b"2"  # a clone reaches the same keys
    assert store.timeout == timedelta(seconds=42)
    store.set_timeout(timedelta(seconds=7))
    assert store.timeout == inner.timeout == timedelta(seconds=7)


@pytest.mark.parametrize("backend, alone", [
    ("gloo", True), ("cpu:gloo,cuda:gloo", True), ("cpu:gloo, cuda:nccl", False), ("nccl", False),
])
def test_only_groups_that_are_gloo_alone_form_on_it(backend, alone):
    from slurmdist.process_group import _gloo_only

    assert _gloo_only(backend) is alone

"""The store gloo forms its mesh on, so that one timeout does not bound two different waits.

gloo's `init_process_group` uses its timeout T for two waits: reading each peer's address from the store (a
peer that comes late, which the rendezvous tolerates until its deadline), and, once it has every address,
waiting for each peer to connect, for 5 x T (gloo's "longer timeout when waiting for initial connect"). A rank
that checked in, published its address and then died (an OOM kill, a node lost while the others wait for a
straggler) left the others in that second wait for five times the rendezvous timeout: 25 minutes at the default.
The group is therefore formed with T = the remaining time / 5, and the store it is given waits for addresses as
long as the rendezvous still has. Once the group is formed, the store passes every timeout through unchanged.

torch keeps only the C++ side of a store written in Python: the caller must hold the Python object as long as
the group lives, or torch finds none of its methods ("Not implemented").
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any, Callable, List, Optional

# gloo waits this many timeouts for a peer to connect (tcp/pair.h: "Use a longer timeout when waiting for
# initial connect").
GLOO_CONNECT_FACTOR = 5

def mesh_store(inner: Any, address_wait: Optional[Callable[[], float]]) -> Any:
    """A store that behaves as `inner`, except that `wait()` waits `address_wait()` seconds whatever the caller
    asked, until `release()` is called on it."""
    return _define()(inner, address_wait)


@functools.lru_cache(maxsize=None)  # defined once, on first use: it subclasses torch's Store
def _define() -> Any:
    import torch.distributed as dist

    class MeshStore(dist.Store):  # type: ignore[misc]  # torch is not type-checked here
        """`inner` with the address wait of the mesh: see the module's docstring."""

        def __init__(self, inner: Any, address_wait: Optional[Callable[[], float]]) -> None:
            super().__init__()
            self.inner = inner
            self.address_wait = address_wait
            if getattr(inner, "timeout", None) is not None:  # a property on recent torch only
                dist.Store.set_timeout(self, inner.timeout)  # what C++ callers read as this store's timeout

        def release(self) -> None:
            """From now on every wait is the caller's own (later groups, new_group(), barriers)."""
            self.address_wait = None

        def wait(self, keys: List[str], timeout: Optional[timedelta] = None) -> None:
            if self.address_wait is not None:
                timeout = timedelta(seconds=self.address_wait())
            if timeout is None:
                return self.inner.wait(keys)
            return self.inner.wait(keys, timeout)

        def set(self, key: str, value: Any) -> None:
            self.inner.set(key, value)

        def get(self, key: str) -> bytes:
            return self.inner.get(key)

        def add(self, key: str, amount: int) -> int:
            return self.inner.add(key, amount)

        def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
            return self.inner.compare_set(key, expected, desired)

        def check(self, keys: List[str]) -> bool:
            return self.inner.check(keys)

        def delete_key(self, key: str) -> bool:
            return self.inner.delete_key(key)

        def num_keys(self) -> int:
            return self.inner.num_keys()

        def set_timeout(self, timeout: timedelta) -> None:
            self.inner.set_timeout(timeout)
            dist.Store.set_timeout(self, timeout)

        def clone(self) -> Any:  # torch's group splitting clones its parent's store (after release(): as is)
            return self.inner.clone()

        # torch calls these from C++ under their C++ names.
        deleteKey = delete_key
        getNumKeys = num_keys

    return MeshStore

"""The last bound on a rendezvous: cut this process's connections to a store that stopped answering.

torch's store client can block without end although every call got a timeout: when a `wait` times out it asks
the store to cancel it and then waits for that reply with no bound. A store whose process is frozen (SIGSTOP,
Ctrl-Z, a debugger), swapping, or behind a network partition never sends it, so the ranks that had joined hang
inside `init_process_group()`. At the rendezvous deadline plus a grace, the watchdog shuts down every socket of
this process connected to the store's port; the blocked call then fails at once and `init()` raises.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import threading
from typing import Iterator, List, Optional, Set, Tuple

# Where the open file descriptors of this process are listed (Linux, then the BSDs and macOS).
FD_DIRS = ("/proc/self/fd", "/dev/fd")


def open_fds() -> List[int]:
    """This process's open file descriptors; empty where no fd directory exists (then nothing is cut)."""
    for path in FD_DIRS:
        with contextlib.suppress(OSError):
            return [int(name) for name in os.listdir(path) if name.isdigit()]
    return []


def peer_of(fd: int) -> Optional[Tuple[str, int]]:
    """(address, port) a connected TCP socket talks to; None for anything else (files, listeners, closed)."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return None
        with socket.socket(fileno=os.dup(fd)) as sock:  # a duplicate: closing it leaves `fd` open
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                return None
            address = sock.getpeername()
    except OSError:
        return None
    return address[0], address[1]


def cut_connections(ports: Set[int]) -> int:
    """Shut down (both directions) every TCP connection of this process whose remote port is in `ports`, so a
    call blocked on one returns. The descriptors stay open for their owner to close. Returns how many."""
    cut = 0
    for fd in open_fds():
        peer = peer_of(fd)
        if peer is None or peer[1] not in ports:
            continue
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
            cut += 1
    return cut


class StoreWatchdog:
    """Cuts the connections to the store's port(s) if the rendezvous is still running `seconds` after it
    starts. `ports` can grow while it runs (an MPI launch learns its port from rank 0); `fired` says whether it
    cut, so the caller can say why the store call failed (once `running()` has ended, it no longer changes)."""

    def __init__(self, seconds: float, ports: Optional[Set[int]] = None) -> None:
        self.seconds = seconds
        self.ports: Set[int] = set(ports or ())
        self.fired = False
        self.cut = 0
        self._lock = threading.Lock()  # the rendezvous ending and the timer firing exclude each other
        self._over = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.name = "slurmdist-store-watchdog"

    def _fire(self) -> None:
        with self._lock:
            if not self._over:
                self.fired = True
                self.cut = cut_connections(self.ports)

    @contextlib.contextmanager
    def running(self) -> Iterator["StoreWatchdog"]:
        self._timer.start()
        try:
            yield self
        finally:
            with self._lock:
                self._over = True
            self._timer.cancel()

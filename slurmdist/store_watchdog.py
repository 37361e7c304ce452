"""The last bound on a rendezvous: cut this process's connections to a store that stopped answering.

torch's store client can block without end although every call got a timeout: when a `wait` times out it asks
the store to cancel it and then waits for that reply with no bound, and `add` or `get` on a store that accepted
the request never return. A store whose process is frozen (SIGSTOP, Ctrl-Z, a debugger), swapping, or behind a
network partition never replies, so the ranks that had joined hang inside `init_process_group()`. At the
rendezvous deadline plus a grace, the watchdog shuts down this process's connections to the store's address and
port (the endpoints the rendezvous registered on its `Deadline`); the blocked call then fails at once. The same
thread cuts them at once on Ctrl-C or SIGTERM (signal_cut), whose handler Python could not run meanwhile.

Linux only (the open sockets are found through /proc/self/fd); elsewhere nothing is cut.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from typing import Callable, Iterator, Optional, Set, Tuple

from . import background
from .bounds import readable_within
from .interfaces import ip_of
from .signal_cut import stopping, wakeup_pipe

FD_DIR = "/proc/self/fd"
Endpoint = Tuple[str, int]  # (IP address, port)


def normalized(address: str) -> str:
    """One spelling per IP address: an IPv4-mapped IPv6 address (`::ffff:127.0.0.1`, as torch's IPv6
    socket reports its peer) as IPv4, without a zone; a name unchanged."""
    parsed = ip_of(address)
    if parsed is None:
        return address
    mapped = getattr(parsed, "ipv4_mapped", None)
    return str(mapped or parsed)


def socket_fds() -> Iterator[int]:
    """This process's open socket descriptors. Read from the fd links alone: an fstat() of a file on NFS or
    Lustre can ask its server, which is what may be unreachable when the watchdog fires."""
    try:
        names = os.listdir(FD_DIR)
    except OSError:
        return
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            if os.readlink(os.path.join(FD_DIR, name)).startswith("socket:["):
                yield int(name)


def _shut_down_if(fd: int, wanted: Callable[[socket.socket], bool]) -> bool:
    """Shut down `fd` (both directions) when it is a TCP socket that `wanted` accepts. Checks and shuts down
    through one duplicate (a number closed and reused meanwhile is not touched by mistake), and leaves the
    descriptor's blocking mode as it was (a Python socket object would make it non-blocking under
    `socket.setdefaulttimeout()`, and the mode is shared with the original)."""
    try:
        duplicate = os.dup(fd)
    except OSError:
        return False
    blocking = os.get_blocking(duplicate)
    try:
        with socket.socket(fileno=duplicate) as sock:
            try:
                if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                    return False
                if not wanted(sock):
                    return False
                sock.shutdown(socket.SHUT_RDWR)
                return True
            finally:
                os.set_blocking(duplicate, blocking)
    except OSError:
        return False


def shut_down_sockets(wanted: Callable[[socket.socket], bool]) -> int:
    """Shut down every TCP socket of this process that `wanted` accepts; the descriptors stay open for their
    owner to close. Returns how many."""
    return sum(_shut_down_if(fd, wanted) for fd in socket_fds())


def cut_connections(endpoints: Set[Endpoint]) -> int:
    """Shut down every TCP connection of this process to one of `endpoints` ((IP, port), any spelling), so a
    call blocked on one returns. The descriptors stay open for their owner to close. Returns how many."""
    wanted = {(normalized(address), port) for address, port in endpoints}
    if not wanted:
        return 0

    def towards(sock: socket.socket) -> bool:
        peer = sock.getpeername()
        return (normalized(peer[0]), peer[1]) in wanted

    return shut_down_sockets(towards)


class StoreWatchdog:
    """Cuts the connections to `endpoints` if the rendezvous is still running `seconds` after it starts (None:
    never), and at once when a stopping signal (Ctrl-C, SIGTERM: see signal_cut) arrives meanwhile.
    `endpoints` is shared with the rendezvous, which adds a store's address once it dials it. `cut` says how
    many connections the deadline shut down, `signal` which signal cut them (neither changes once `running()`
    has ended)."""

    def __init__(self, seconds: Optional[float], endpoints: Optional[Set[Endpoint]] = None) -> None:
        self.seconds = seconds
        self.endpoints: Set[Endpoint] = endpoints if endpoints is not None else set()
        self.cut = 0
        self.signal: Optional[signal.Signals] = None
        self._lock = threading.Lock()  # the rendezvous ending and the watchdog cutting exclude each other
        self._ended = threading.Event()

    @property
    def has_cut(self) -> bool:
        """Whether the deadline or a stopping signal cut the connections under the rendezvous."""
        return bool(self.cut or self.signal)

    def _watch(self, pipe: Optional[Tuple[int, int]]) -> None:
        if pipe is None:
            if not self._ended.wait(self.seconds):
                self._cut(None)
            return
        read_end, previous = pipe
        try:
            self._hear_signals(read_end, previous)
        finally:
            os.close(read_end)

    def _hear_signals(self, read_end: int, previous: int) -> None:
        """Read the signal wake-up pipe until the rendezvous ends (its write end closes), cutting at each
        stopping signal, and once at the deadline. Read to the end: CPython's C handler writes to the pipe as
        long as it is the wake-up descriptor, and one without a reader is an EPIPE (or a SIGPIPE) there."""
        end = None if self.seconds is None else time.monotonic() + self.seconds
        while True:
            if not readable_within(read_end, None if end is None else max(0.0, end - time.monotonic())):
                self._cut(None)
                end = None
                continue
            try:
                received = os.read(read_end, 64)
            except OSError:
                return
            if not received:
                return
            heard = stopping(received, previous)
            if heard is not None:
                self._cut(heard)

    def _cut(self, heard: Optional[signal.Signals]) -> None:
        """Cut the connections, for the deadline (None) or a stopping signal, unless the rendezvous has ended:
        then the connection is the formed group's."""
        with self._lock:
            if self._ended.is_set():
                return
            if heard is None:
                self.cut = cut_connections(set(self.endpoints))
            else:
                self.signal = heard
                cut_connections(set(self.endpoints))

    @contextlib.contextmanager
    def running(self) -> Iterator["StoreWatchdog"]:
        with wakeup_pipe() as pipe:
            watching = False
            try:
                if pipe is not None or self.seconds is not None:
                    # Not threading.Timer: its start() waits for the thread to be scheduled, ms on busy cores.
                    background.start(self._watch, pipe)
                    watching = True
                yield self
            finally:
                with self._lock:
                    self._ended.set()
                if pipe is not None and not watching:  # no thread to read and close the pipe's end
                    os.close(pipe[0])

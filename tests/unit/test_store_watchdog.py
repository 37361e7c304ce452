"""The store watchdog over real loopback sockets: a peer that accepts and never answers, like a frozen store."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Iterator, Tuple

import pytest

from slurmdist.bounds import readable_within
from slurmdist.signal_cut import wakeup_pipe
from slurmdist.store_watchdog import StoreWatchdog, cut_connections, normalized, socket_fds
from tests.conftest import missing_prerequisite

BOUND = 30.0  # seconds: a bound on a hang, not a timing assertion
if not os.path.isdir("/proc/self/fd"):
    missing_prerequisite("the watchdog reads /proc/self/fd (Linux only)")


def silent_connection(host: str = "127.0.0.1", port: int = 0) -> Iterator[Tuple[socket.socket, int]]:
    with socket.create_server((host, port)) as listener:
        port = listener.getsockname()[1]
        with socket.create_connection((host, port)) as client:
            accepted, _ = listener.accept()
            with accepted:
                yield client, port


@pytest.fixture
def silent_peer() -> Iterator[Tuple[socket.socket, int]]:
    """A connection to a listener that accepts and never sends (the frozen store), and the listener's port."""
    yield from silent_connection()


def blocked_recv(sock: socket.socket) -> Tuple[threading.Thread, dict]:
    """A thread blocked reading `sock`, as torch's store client waits for a reply; `box` gets what it read."""
    box: dict = {}

    def read() -> None:
        try:
            box["data"] = sock.recv(1)
        except OSError as exc:
            box["error"] = exc

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    time.sleep(0.05)  # let it block in recv
    return thread, box


def test_ipv4_mapped_and_zoned_addresses_have_one_spelling():
    assert normalized("::ffff:127.0.0.1") == "127.0.0.1"  # how torch's IPv6 socket names an IPv4 peer
    assert normalized("fe80::1%eth0") == "fe80::1"
    assert normalized("10.0.0.7") == "10.0.0.7"
    assert normalized("node1") == "node1"


def test_only_sockets_are_listed(silent_peer, tmp_path):
    client, _ = silent_peer
    with open(tmp_path / "file", "w") as plain:
        found = set(socket_fds())
        assert client.fileno() in found
        assert plain.fileno() not in found


def test_cutting_ends_a_read_blocked_on_the_store(silent_peer):
    client, port = silent_peer
    thread, box = blocked_recv(client)
    assert cut_connections({("::ffff:127.0.0.1", port)}) == 1  # any spelling of the address
    thread.join(BOUND)
    assert not thread.is_alive()
    assert box.get("data") == b"" or "error" in box  # end of stream (or reset), not a hang
    assert client.fileno() >= 0  # shut down, not closed: its owner closes it


def test_the_same_port_on_another_address_is_left_alone(silent_peer):
    client, port = silent_peer
    try:
        other = silent_connection("127.0.0.2", port)  # a user's connection to another host, same port number
        other_client, _ = next(other)
    except OSError as exc:
        missing_prerequisite(f"no second loopback address (127.0.0.2) here: {exc}")
    thread, _ = blocked_recv(other_client)
    assert cut_connections({("127.0.0.1", port)}) == 1  # the store's connection only
    thread.join(0.2)
    assert thread.is_alive()
    assert cut_connections({("127.0.0.2", port)}) == 1
    thread.join(BOUND)
    other.close()


def test_cutting_keeps_every_socket_blocking_under_a_default_timeout(silent_peer):
    # socket.socket(fileno=...) makes a descriptor non-blocking when setdefaulttimeout() is set, and a duplicate
    # shares that flag with the original: the user's sockets must not change mode under them.
    client, port = silent_peer
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(5.0)
    try:
        cut_connections({("127.0.0.1", port + 1 if port < 65535 else port - 1)})  # looks at every socket
        assert os.get_blocking(client.fileno())
        cut_connections({("127.0.0.1", port)})
        assert os.get_blocking(client.fileno())
    finally:
        socket.setdefaulttimeout(previous)


def test_watchdog_cuts_only_when_the_rendezvous_outlives_it(silent_peer):
    client, port = silent_peer
    thread, _ = blocked_recv(client)
    watchdog = StoreWatchdog(0.2, {("127.0.0.1", port)})
    with watchdog.running():
        thread.join(BOUND)  # the rendezvous blocked on the store, as in init()
    assert watchdog.cut == 1
    assert not thread.is_alive()


def test_a_rendezvous_that_ends_in_time_is_never_cut(silent_peer):
    client, port = silent_peer
    watchdog = StoreWatchdog(0.2, {("127.0.0.1", port)})
    with watchdog.running():
        pass
    time.sleep(0.4)  # past the watchdog's time: it was cancelled
    assert watchdog.cut == 0
    thread, _ = blocked_recv(client)
    thread.join(0.2)
    assert thread.is_alive()  # the connection still works (nothing shut it)
    cut_connections({("127.0.0.1", port)})
    thread.join(BOUND)


def test_endpoints_registered_while_running_are_watched(silent_peer):
    client, port = silent_peer
    thread, _ = blocked_recv(client)
    endpoints: set = set()
    watchdog = StoreWatchdog(0.2, endpoints)
    with watchdog.running():
        endpoints.add(("127.0.0.1", port))  # the rendezvous dials the store after the watchdog started
        thread.join(BOUND)
    assert watchdog.cut == 1


@pytest.fixture
def sigterm_noted() -> Iterator[list]:
    """A SIGTERM handler that only takes note, as a job's checkpoint flag does (restored afterwards)."""
    noted: list = []
    previous = signal.signal(signal.SIGTERM, lambda number, _: noted.append(number))
    yield noted
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("seconds", [None, BOUND], ids=["rank 0's own store: no deadline", "a joined store"])
def test_a_stopping_signal_cuts_at_once(silent_peer, sigterm_noted, seconds):
    # The main thread blocks inside torch's store client, where Python runs no handler until the wait ends.
    client, port = silent_peer
    thread, box = blocked_recv(client)
    watchdog = StoreWatchdog(seconds, {("127.0.0.1", port)})
    with watchdog.running():
        os.kill(os.getpid(), signal.SIGTERM)
        thread.join(BOUND)
    assert not thread.is_alive() and box.get("data") == b""  # cut: the blocked read returned
    assert watchdog.signal == signal.SIGTERM and watchdog.cut == 0 and sigterm_noted == [signal.SIGTERM]


def test_a_requeue_warning_is_no_stopping_signal(silent_peer):
    client, port = silent_peer
    thread, _ = blocked_recv(client)
    noted: list = []
    previous = signal.signal(signal.SIGUSR2, lambda number, _: noted.append(number))
    try:
        watchdog = StoreWatchdog(None, {("127.0.0.1", port)})
        with watchdog.running():
            os.kill(os.getpid(), signal.SIGUSR2)  # `--signal=USR2@120`: save at the next step, and go on
            thread.join(0.5)
            assert thread.is_alive()  # the wait goes on
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert watchdog.signal is None and noted == [signal.SIGUSR2]
    cut_connections({("127.0.0.1", port)})
    thread.join(BOUND)


def test_the_wakeup_descriptor_it_replaced_still_hears_every_signal(sigterm_noted):
    # An asyncio loop in the main thread set its own: it is back afterwards, and got the byte meanwhile.
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end)
    try:
        with StoreWatchdog(None).running():
            os.kill(os.getpid(), signal.SIGTERM)
            assert readable_within(read_end, BOUND) and os.read(read_end, 8) == bytes([signal.SIGTERM])
        assert signal.set_wakeup_fd(previous) == write_end
    finally:
        os.close(read_end)
        os.close(write_end)


def test_outside_the_main_thread_nothing_hears_signals():
    seen: dict = {}

    def other() -> None:
        with wakeup_pipe() as pipe:
            seen["pipe"] = pipe

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(BOUND)
    assert seen == {"pipe": None}


def test_a_signal_as_the_rendezvous_ends_leaves_the_formed_groups_connection_alone(silent_peer, sigterm_noted):
    # A SIGTERM whose handler returns (submitit's, a checkpoint flag), arriving in the last Python steps of the
    # rendezvous: the watchdog thread reads it only after running() ended, and cut the group's store connection.
    client, port = silent_peer
    watchdog = StoreWatchdog(None, {("127.0.0.1", port)})
    with watchdog.running():
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)  # the watching thread reads the byte now
    thread, _ = blocked_recv(client)
    thread.join(0.2)
    assert thread.is_alive() and watchdog.signal is None and sigterm_noted == [signal.SIGTERM]
    cut_connections({("127.0.0.1", port)})
    thread.join(BOUND)


AFTER_THE_DEADLINE_CUT = """
import os, signal, time
from slurmdist.store_watchdog import StoreWatchdog
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as command-line programs set it
signal.signal(signal.SIGUSR1, lambda *_: None)
with StoreWatchdog(0.1, set()).running():
    time.sleep(0.5)  # past the deadline cut, still inside the rendezvous
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.2)
print("alive", flush=True)
"""


def test_signals_after_the_deadline_cut_still_find_a_reader():
    # The read end used to close at the deadline cut while the pipe stayed the wake-up descriptor: the next
    # signal's byte then met no reader, which killed the process (SIGPIPE) or printed a BrokenPipeError.
    result = subprocess.run([sys.executable, "-c", AFTER_THE_DEADLINE_CUT], capture_output=True, text=True,
                            timeout=BOUND)
    assert (result.returncode, result.stdout) == (0, "alive\n"), result.stderr
    assert "Exception ignored" not in result.stderr

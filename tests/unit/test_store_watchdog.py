"""The store watchdog over real loopback sockets: a peer that accepts and never answers, like a frozen store."""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterator, Tuple

import pytest

from slurmdist.store_watchdog import StoreWatchdog, cut_connections, peer_of

BOUND = 30.0  # seconds: a bound on a hang, not a timing assertion


@pytest.fixture
def silent_peer() -> Iterator[Tuple[socket.socket, int]]:
    """A connection to a listener that accepts and never sends (the frozen store), and the listener's port."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            with accepted:
                yield client, port


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


def test_peer_of_names_the_remote_end_and_ignores_other_descriptors(silent_peer, tmp_path):
    client, port = silent_peer
    assert peer_of(client.fileno()) == ("127.0.0.1", port)
    with open(tmp_path / "file", "w") as plain:
        assert peer_of(plain.fileno()) is None
    with socket.create_server(("127.0.0.1", 0)) as listener:  # listening: no peer
        assert peer_of(listener.fileno()) is None
    assert client.fileno() >= 0  # peer_of looked through a duplicate and left the socket open


def test_cutting_ends_a_read_blocked_on_the_store_port(silent_peer):
    client, port = silent_peer
    thread, box = blocked_recv(client)
    assert cut_connections({port}) == 1
    thread.join(BOUND)
    assert not thread.is_alive()
    assert box.get("data") == b"" or "error" in box  # end of stream (or reset), not a hang
    assert client.fileno() >= 0  # shut down, not closed: its owner closes it


def test_connections_to_other_ports_are_left_alone(silent_peer):
    client, port = silent_peer
    thread, box = blocked_recv(client)
    assert cut_connections({port + 1 if port < 65535 else port - 1}) == 0
    thread.join(0.2)
    assert thread.is_alive()  # still waiting: this connection was not the store's
    cut_connections({port})
    thread.join(BOUND)
    assert not thread.is_alive()


def test_watchdog_cuts_only_when_the_rendezvous_outlives_it(silent_peer):
    client, port = silent_peer
    thread, _ = blocked_recv(client)
    watchdog = StoreWatchdog(0.2, {port})
    with watchdog.running():
        thread.join(BOUND)  # the rendezvous blocked on the store, as in init()
    assert watchdog.fired and watchdog.cut == 1
    assert not thread.is_alive()


def test_a_rendezvous_that_ends_in_time_is_never_cut(silent_peer):
    client, port = silent_peer
    watchdog = StoreWatchdog(0.2, {port})
    with watchdog.running():
        pass
    time.sleep(0.4)  # past the watchdog's time: it was cancelled
    assert not watchdog.fired
    thread, _ = blocked_recv(client)
    thread.join(0.2)
    assert thread.is_alive()  # the connection still works (nothing shut it)
    cut_connections({port})
    thread.join(BOUND)


def test_ports_learnt_while_running_are_watched(silent_peer):
    client, port = silent_peer
    thread, _ = blocked_recv(client)
    watchdog = StoreWatchdog(0.2)
    with watchdog.running():
        watchdog.ports.add(port)  # an MPI launch learns the store's port from rank 0 during the rendezvous
        thread.join(BOUND)
    assert watchdog.fired and watchdog.cut == 1

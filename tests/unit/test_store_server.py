"""The store's server side: listening before the TCPStore starts, and serving on that socket, for real."""

from __future__ import annotations

import errno
import socket
import threading
import time
from datetime import timedelta

import pytest

from slurmdist import interfaces, store_server
from slurmdist.errors import RendezvousError


def _serve_and_join(dist_module):
    import torch.distributed as dist

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = store_server.serve(dist_module, listener.detach(), port, 2)
    client = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=10))
    client.set("who", "client")
    return server.get("who")


def test_the_store_is_served_on_the_inherited_socket():
    import torch.distributed as dist

    assert _serve_and_join(dist) == b"client"


def test_a_torch_whose_libuv_server_refuses_a_socket_gets_the_classic_server():
    import torch.distributed as dist

    class Torch27:
        """torch 2.4-2.7: the default (libuv) server raises on master_listen_fd; use_libuv=False works."""

        @staticmethod
        def TCPStore(*args, **kwargs):
            if kwargs.get("use_libuv", True):
                raise NotImplementedError("libuv TCPStore backend does not support initialization with an listen fd")
            return dist.TCPStore(*args, **kwargs)

    assert _serve_and_join(Torch27) == b"client"


def test_a_torch_without_master_listen_fd_gets_the_port_itself():
    import torch.distributed as dist

    class Torch20:
        """torch 2.0: TCPStore has no master_listen_fd (nor use_libuv); pybind refuses unknown arguments."""

        @staticmethod
        def TCPStore(*args, **kwargs):
            if "master_listen_fd" in kwargs or "use_libuv" in kwargs:
                raise TypeError("__init__(): incompatible constructor arguments. The following argument types are "
                                "supported: 1. TCPStore(host_name: str, port: int, world_size: Optional[int] = None, "
                                "is_master: bool = False, timeout: timedelta, wait_for_workers: bool = True, "
                                "multi_tenant: bool = False)")
            return dist.TCPStore(*args, **kwargs)

    assert _serve_and_join(Torch20) == b"client"


def test_a_port_that_cannot_be_listened_on_is_named(monkeypatch):

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(socket, "create_server", refused)
    with pytest.raises(RendezvousError, match="rank 0 cannot listen on the rendezvous port 80: Permission denied; "
                                              "ports below 1024 need root"):
        store_server.listen(80)


def test_a_rank_that_connects_before_the_store_is_served_waits_in_the_backlog():
    import torch.distributed as dist

    listener = store_server.listen(0)
    port = listener.getsockname()[1]
    joined: dict = {}

    def join() -> None:
        client = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=20))
        joined["at"] = time.monotonic()
        client.set("early", "yes")
        joined["client"] = client

    early = threading.Thread(target=join, daemon=True)
    early.start()
    time.sleep(0.5)  # the client has connected (the kernel accepted it) and waits for the handshake
    assert "at" not in joined
    serving_from = time.monotonic()
    server = store_server.serve(dist, listener.detach(), port, None)
    early.join(20)
    assert joined["at"] >= serving_from  # it waited for the server instead of failing or retrying
    assert server.get("early") == b"yes"


def test_serving_here_on_a_port_another_process_holds_names_the_port():
    with socket.create_server(("", 0)) as squatter:
        port = squatter.getsockname()[1]
        with pytest.raises(RendezvousError, match=f"rank 0 cannot listen on the rendezvous port {port}"):
            store_server.serve_here(port, 5.0)


def test_serving_here_listens_before_the_store_starts(monkeypatch):
    # The point of store_server: ranks that dial while the TCPStore starts find a listening port.
    real_serve = store_server.serve
    seen = {}

    def serve_after_a_dial(dist, fd, port, world_size, timeout=60.0):
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            seen["listening"] = True
        return real_serve(dist, fd, port, world_size, timeout)

    monkeypatch.setattr(store_server, "serve", serve_after_a_dial)
    store = store_server.serve_here(0, 5.0)
    assert seen == {"listening": True}
    store.set("k", "v")
    assert store.get("k") == b"v"


def test_a_store_that_fails_to_start_leaves_the_port_free(monkeypatch):
    def failing(dist, fd, port, world_size, timeout=60.0):
        raise RuntimeError("the store's own client timed out")

    monkeypatch.setattr(store_server, "serve", failing)
    with socket.create_server(("", 0)) as probe:
        port = probe.getsockname()[1]
    with pytest.raises(RuntimeError, match="own client timed out"):
        store_server.serve_here(port, 5.0)
    with socket.create_server(("", port)):  # our socket was closed: the port is free again
        pass


def test_a_store_that_failed_after_closing_the_socket_leaves_a_reused_descriptor_alone(monkeypatch, tmp_path):
    import os

    reused = {}

    def closes_then_fails(dist, fd, port, world_size, timeout=60.0):
        os.close(fd)  # as torch does when it fails after taking the socket
        reused["fd"] = os.open(tmp_path / "other", os.O_CREAT | os.O_RDWR)  # the lowest free number: fd's
        reused["was"] = fd
        raise RuntimeError("failed after taking the socket")

    monkeypatch.setattr(store_server, "serve", closes_then_fails)
    with pytest.raises(RuntimeError, match="after taking the socket"):
        store_server.serve_here(0, 5.0)
    assert reused["fd"] == reused["was"]
    os.fstat(reused["fd"])  # still open: not closed as if it were the listening socket
    os.close(reused["fd"])


def test_serving_here_on_port_0_takes_the_kernels_choice():
    store = store_server.serve_here(0, 5.0)
    assert store.port > 0
    store.set("k", "v")
    assert store.get("k") == b"v"


@pytest.mark.parametrize("master, over_ipv6", [
    ("10.0.0.1", False), ("127.0.0.1", False), ("::1", True), ("[fd00::2]", True), ("fe80::1%eth0", True),
])
def test_the_master_address_decides_whether_ranks_dial_over_ipv6(master, over_ipv6):
    assert store_server.ipv6_clients(master) is over_ipv6


def test_a_master_name_is_dialled_over_ipv4_where_this_host_routes_ipv4():
    assert interfaces.source_address(store_server.IPV4_ROUTE_PROBE) is not None  # this machine routes IPv4
    assert store_server.ipv6_clients("node1") is False


def test_a_master_name_on_a_host_without_ipv4_routes_is_served_over_ipv6_too(monkeypatch):
    # An IPv6-only network: the UDP probe finds no IPv4 route.
    monkeypatch.setattr(store_server, "source_address", lambda destination: None)
    assert store_server.ipv6_clients("node1") is True


def test_an_ipv4_socket_sees_its_clients_as_plain_ipv4_addresses():
    # torch's server looks up every accepted client's name: '::ffff:127.0.0.1', what a dual-stack socket sees,
    # is never found in /etc/hosts and becomes a DNS query; '127.0.0.1' is answered from the file.
    with store_server.listen(0) as listener:
        assert listener.family == socket.AF_INET
        with socket.create_connection(("127.0.0.1", listener.getsockname()[1]), timeout=5):
            accepted, peer = listener.accept()
            accepted.close()
    assert peer[0] == "127.0.0.1"
    name, _ = socket.getnameinfo(peer, socket.NI_NAMEREQD)  # /etc/hosts names loopback: no DNS query
    assert name


def test_an_ipv6_master_gets_a_socket_ipv6_and_ipv4_ranks_reach():
    assert socket.has_dualstack_ipv6(), "this machine's kernel has IPv6 (the CI machine's does)"
    with store_server.listen(0, ipv6=True) as listener:
        assert listener.family == socket.AF_INET6
        port = listener.getsockname()[1]
        for address in ("::1", "127.0.0.1"):
            with socket.create_connection((address, port), timeout=5):
                listener.accept()[0].close()


def test_a_store_still_held_stops_listening_and_its_connections_keep_working():
    # What shutdown() does when a DDP model still holds the group: the next init() must be able to serve here.
    import torch.distributed as dist

    old = store_server.serve_here(0, 30)
    client = dist.TCPStore("127.0.0.1", old.port, None, False, timedelta(seconds=10))
    client.set("k", "old")
    assert store_server.stop_listening(old.port) == 1
    new = store_server.serve_here(old.port, 30)  # the port is free again
    assert new.port == old.port
    assert client.get("k") == b"old"  # the old group's connection still works
    assert store_server.stop_listening(old.port) == 1 and store_server.stop_listening(old.port) == 0


def test_only_the_socket_slurmdist_served_is_stopped_never_another_on_that_port():
    # After the user destroyed our group and formed their own on the same port: their listener is theirs.
    served = store_server.serve_here(0, 30)
    port = served.port
    del served  # closed: the port is free
    with socket.create_server(("", port)):
        assert store_server.stop_listening(port) == 0
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # still accepting

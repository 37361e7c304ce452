"""The store's server side: listening before the TCPStore starts, and serving on that socket, for real."""

from __future__ import annotations

import errno
import socket
import threading
import time
from datetime import timedelta

import pytest

from slurmdist import store_server
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


def test_a_port_that_cannot_be_listened_on_is_named(monkeypatch):

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(socket, "create_server", refused)
    with pytest.raises(RendezvousError, match="MASTER_PORT=80: Permission denied"):
        store_server.listen(80)


def test_a_rank_that_connects_before_the_store_is_served_waits_in_the_backlog():
    import torch.distributed as dist

    listener = store_server.listen(0)
    port = listener.getsockname()[1]
    joined: dict = {}

    def join() -> None:
        started = time.monotonic()
        client = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=20))
        joined["after"] = time.monotonic() - started
        client.set("early", "yes")
        joined["client"] = client

    early = threading.Thread(target=join, daemon=True)
    early.start()
    time.sleep(0.5)  # the client has connected (the kernel accepted it) and waits for the handshake
    assert "after" not in joined
    server = store_server.serve(dist, listener.detach(), port, None)
    early.join(20)
    assert joined["after"] >= 0.4  # it waited for the server instead of failing or retrying
    assert server.get("early") == b"yes"


def test_serving_here_on_a_port_another_process_holds_names_the_port():
    with socket.create_server(("", 0)) as squatter:
        port = squatter.getsockname()[1]
        with pytest.raises(RendezvousError, match=f"rank 0 cannot listen on the rendezvous port {port}"):
            store_server.serve_here(port, 5.0)


def test_serving_here_on_port_0_takes_the_kernels_choice():
    store = store_server.serve_here(0, 5.0)
    assert store.port > 0
    store.set("k", "v")
    assert store.get("k") == b"v"

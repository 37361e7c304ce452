"""The server side of the rendezvous store: a socket that listens at once, and torch's TCPStore served on it.

Listening first, in Python (microseconds), and handing the socket to the TCPStore (milliseconds to start its
threads) lets the other ranks connect while the store starts: their connections wait in the backlog instead
of being refused and retried. Both rank 0 inside `init()` and `slurmdist run`'s store host serve this way.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from datetime import timedelta
from typing import Any, Optional

from .distenv import LOOPBACK
from .errors import RendezvousError


def port_in_use(port: int, where: str, who: str = "rank 0") -> RendezvousError:
    return RendezvousError(
        f"{who} cannot listen on the rendezvous port {port} ({where}): another process holds it (a second job "
        "step on this node, or a leftover run). Set MASTER_PORT to a free port, or stop the other process"
    )


def listen(port: int, who: str = "rank 0") -> socket.socket:
    """A socket listening on `port` (0: the kernel's choice) on every interface (IPv6 and IPv4 where the host
    has both), as torch's own store server would; a `RendezvousError` naming the port when another process
    holds it or it cannot be listened on. `who` says which process failed, in that message."""
    try:
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True,
                                        backlog=socket.SOMAXCONN)
        return socket.create_server(("", port), backlog=socket.SOMAXCONN)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise port_in_use(port, f"*:{port}", who) from None
        raise RendezvousError(f"{who} cannot listen on MASTER_PORT={port}: {exc.strerror or exc} "
                              "(ports below 1024 need root); set MASTER_PORT to a free port above 1024") from None


def serve(dist: Any, fd: int, port: int, world_size: Optional[int], timeout: float = 60.0) -> Any:
    """A TCPStore server on the listening socket `fd`, which it then owns. torch's libuv server takes a socket
    only from torch 2.8 on (earlier ones raise "does not support initialization with an listen fd"): those
    get the classic server, which always could."""
    def serve_with(**backend: bool) -> Any:
        return dist.TCPStore(LOOPBACK, port, world_size, True, timedelta(seconds=timeout), wait_for_workers=False,
                             master_listen_fd=fd, **backend)

    try:
        return serve_with()
    except (NotImplementedError, RuntimeError) as exc:
        if "listen fd" not in str(exc):
            raise
        return serve_with(use_libuv=False)


def serve_here(port: int, timeout: float, who: str = "rank 0") -> Any:
    """Listen on `port` and serve a TCPStore there, in this process (the store's `.port` says which port
    when `port` is 0)."""
    import torch.distributed as dist

    listener = listen(port, who)
    bound = listener.getsockname()[1]
    try:
        store = serve(dist, listener.fileno(), bound, None, timeout)
    except BaseException:
        with contextlib.suppress(OSError):
            listener.close()
        raise
    listener.detach()  # the store owns the descriptor now and closes it with the store
    return store

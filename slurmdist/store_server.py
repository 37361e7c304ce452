"""The server side of the rendezvous store: a socket that listens at once, and torch's TCPStore served on it.

Listening first, in Python (microseconds), and handing the socket to the TCPStore (milliseconds to start its
threads) lets the other ranks connect while the store starts: their connections wait in the backlog instead
of being refused and retried. Both rank 0 inside `init()` and `slurmdist run`'s store host serve this way.

The socket is IPv4 unless the ranks may dial over IPv6 (see `ipv6_clients`): torch's server looks up the name
of every client it accepts, and on a dual-stack socket an IPv4 client is `::ffff:a.b.c.d`, a form glibc never
finds in /etc/hosts. Every connection then cost a DNS query inside the server's one event loop (8 queries for
a 4-rank start on one node, seen with strace), each holding up every rank's join, and a query the name server
drops holds them for the resolver's 5 s timeout. An IPv4 client's address is answered from /etc/hosts.
"""

from __future__ import annotations

import errno
import os
import socket
from datetime import timedelta
from typing import Any, Dict, Optional, Tuple

from .distenv import LOOPBACK
from .errors import RendezvousError
from .interfaces import ip_of, source_address

# Where a UDP socket is "connected" to learn whether this host routes IPv4 at all (RFC 5737: nothing is sent).
IPV4_ROUTE_PROBE = "192.0.2.1"


def port_in_use(port: int, where: str, who: str = "rank 0") -> RendezvousError:
    return RendezvousError(
        f"{who} cannot listen on the rendezvous port {port} ({where}): another process holds it (a second job "
        "step on this node, or a leftover run). Set MASTER_PORT to a free port, or stop the other process"
    )


def ipv6_clients(master_addr: Optional[str]) -> bool:
    """Whether ranks may dial the store at `master_addr` over IPv6: an IPv6 address, or a name on a host with
    no IPv4 route (an IPv6-only network). A name elsewhere is dialled at its IPv4 address: each rank tries all
    the addresses it resolves to, so one with IPv6 addresses too still finds the IPv4 socket."""
    address = ip_of(master_addr.strip("[]")) if master_addr else None
    if address is not None:
        return address.version == 6
    return source_address(IPV4_ROUTE_PROBE) is None


def listen(port: int, who: str = "rank 0", ipv6: bool = False) -> socket.socket:
    """A socket listening on `port` (0: the kernel's choice) on every interface: IPv4, or with `ipv6` IPv6 and
    IPv4 where the host has both (as torch's own store server would); a `RendezvousError` naming the port when
    another process holds it or it cannot be listened on. `who` says which process failed, in that message."""
    try:
        if ipv6 and socket.has_dualstack_ipv6():
            try:
                return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True,
                                            backlog=socket.SOMAXCONN)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise
        return socket.create_server(("", port), backlog=socket.SOMAXCONN)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise port_in_use(port, f"*:{port}", who) from None
        fix = ("ports below 1024 need root: set MASTER_PORT to a free port above 1024" if exc.errno == errno.EACCES
               else "set MASTER_PORT to a free port, or check this node's network configuration")
        raise RendezvousError(f"{who} cannot listen on the rendezvous port {port}: {exc.strerror or exc}; "
                              f"{fix}") from None


def serve(dist: Any, fd: int, port: int, world_size: Optional[int], timeout: float = 60.0) -> Any:
    """A TCPStore server on the listening socket `fd`, which it then owns (it closes `fd` when it fails after
    taking it, or with the store). torch's libuv server takes a socket only from torch 2.8 on (earlier ones
    raise "does not support initialization with an listen fd" before taking it): those get the classic
    server, which always could. A torch without `master_listen_fd` at all (2.0) gets the port itself: the
    socket is closed and the store binds the same port again."""
    def serve_with(**options: Any) -> Any:
        return dist.TCPStore(LOOPBACK, port, world_size, True, timedelta(seconds=timeout), wait_for_workers=False,
                             **options)

    try:
        return serve_with(master_listen_fd=fd)
    except TypeError as exc:
        if "master_listen_fd" in str(exc):  # pybind lists the signatures it knows: this torch has the argument
            raise
        os.close(fd)
        return serve_with()
    except (NotImplementedError, RuntimeError) as exc:
        if "listen fd" not in str(exc):
            raise
        return serve_with(master_listen_fd=fd, use_libuv=False)


def serve_here(port: int, timeout: float, who: str = "rank 0", ipv6: bool = False) -> Any:
    """Listen on `port` (over IPv6 too with `ipv6`) and serve a TCPStore there, in this process (the store's
    `.port` says which port when `port` is 0)."""
    import torch.distributed as dist

    listener = listen(port, who, ipv6)
    bound = listener.getsockname()[1]
    identity = _identity(listener.fileno())
    try:
        store = serve(dist, listener.fileno(), bound, None, timeout)
    except BaseException:
        # The store may have closed the descriptor already (it fails after taking it when its own client
        # cannot connect), and another thread may have got the number since: close only our own socket.
        if _identity(listener.fileno()) == identity:
            listener.close()
        else:
            listener.detach()
        raise
    listener.detach()  # the store owns the descriptor now and closes it with the store
    if identity is not None:
        _SERVED[bound] = identity
    return store


# Port -> (device, inode) of the socket `serve_here` listens on: what `stop_listening` may stop, and nothing
# else (a store the user served on the same port afterwards is theirs).
_SERVED: Dict[int, Tuple[int, int]] = {}


def stop_listening(port: int) -> int:
    """Stop accepting connections on `port` on the socket `serve_here` listened on; how many sockets stopped.

    For a store served here that outlives its process group: a DDP model, a `new_group()` handle or a saved
    `dist.group.WORLD` keeps the group, and with it the store, alive after `slurmdist.shutdown()`. Its port
    would stay taken, and the next `init()` could not serve there. Shut down, a listening socket frees its
    port at once, while the connections it accepted (the old group's) keep working; its descriptor stays the
    store's to close. Linux only (the sockets are found through /proc/self/fd); elsewhere nothing stops."""
    from .store_watchdog import shut_down_sockets

    served = _SERVED.pop(port, None)
    if served is None:
        return 0

    def the_served_listener(sock: socket.socket) -> bool:
        return _identity(sock.fileno()) == served and bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))

    return shut_down_sockets(the_served_listener)


def _identity(fd: int) -> Optional[Tuple[int, int]]:
    """(device, inode) of what `fd` refers to; None when it is closed."""
    try:
        found = os.fstat(fd)
    except OSError:
        return None
    return found.st_dev, found.st_ino

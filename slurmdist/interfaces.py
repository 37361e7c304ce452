"""Which network interface gloo binds: the one this rank reaches the master through.

Why: left alone, gloo binds the address this host's own name resolves to, and falls back to loopback when
the name does not resolve. On many clusters that is an address other nodes cannot reach (Debian and Ubuntu
map the host name to `127.0.1.1` in /etc/hosts; container and cloud nodes often resolve to nothing), so every
rank advertises loopback and the mesh across nodes times out. The interface that carries this rank's traffic
to the master is on the network the nodes share with it. Naming it also spares every rank gloo's DNS lookup
of its own name.

`GLOO_SOCKET_IFNAME` is gloo's own switch for this; slurmdist sets it only when the user has not.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import sys
from typing import Generator, Iterable, List, Mapping, Optional, Tuple, Union

from .distenv import LOOPBACK
from .errors import BackendError

log = logging.getLogger("slurmdist")

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

GLOO_INTERFACE_VARIABLE = "GLOO_SOCKET_IFNAME"
_SIOCGIFADDR = 0x8915  # Linux ioctl: the (first) IPv4 address of an interface
_INET6_TABLE = "/proc/net/if_inet6"


def wanted(env_world_size: int, *environs: Mapping[str, str]) -> bool:
    """Choose gloo's interface only for a group with peers, and never over a choice the user made."""
    return env_world_size > 1 and user_choice(*environs) is None


def user_choice(*environs: Mapping[str, str]) -> Optional[str]:
    for environ in environs:
        if environ.get(GLOO_INTERFACE_VARIABLE):
            return environ[GLOO_INTERFACE_VARIABLE]
    return None


def check_user_choice(value: str, names: Iterable[str]) -> None:
    """A GLOO_SOCKET_IFNAME naming no interface of this host fails here, before any network wait, with the
    names it could have been (gloo itself would fail inside the process group with a C++ assertion)."""
    known = sorted(set(names))
    # As gloo reads it: empty pieces dropped (a trailing comma), an IPv4 alias label (eth0:1) on its interface.
    unknown = [name for name in value.split(",") if name and name.partition(":")[0] not in known]
    if unknown:
        raise BackendError(
            f"{GLOO_INTERFACE_VARIABLE}={value!r} names no network interface of this host "
            f"({socket.gethostname()}): {', '.join(map(repr, unknown))}; its interfaces are {', '.join(known)}. "
            f"Name one of them (the one the nodes share), or unset {GLOO_INTERFACE_VARIABLE} and slurmdist "
            "picks the interface that reaches the master"
        )


def interface_names() -> List[str]:
    return [name for _, name in socket.if_nameindex()]


def ip_of(address: str) -> Optional[IPAddress]:
    """`address` as an IP address (a zone such as `%eth0` ignored); None for a host name."""
    try:
        return ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None


def is_loopback(address: str) -> bool:
    parsed = ip_of(address)
    return parsed is not None and parsed.is_loopback


def interface_holding(address: str, pairs: Iterable[Tuple[str, bytes]]) -> Optional[str]:
    """The first interface of `pairs` ((name, packed address), in order) that carries `address`, if any.
    Stops reading `pairs` there: the live readers below query the kernel interface by interface."""
    parsed = ip_of(address)
    if parsed is None:
        return None
    return next((name for name, packed in pairs if packed == parsed.packed), None)


# Documentation addresses (RFC 5737, RFC 3849): routed like any far address, i.e. by the default route.
DEFAULT_ROUTE_PROBES = ("192.0.2.1", "2001:db8::1")


def default_route_source() -> Optional[str]:
    """This host's address on its default route (IPv4, else IPv6); None without a default route."""
    return next((found for found in map(source_address, DEFAULT_ROUTE_PROBES) if found), None)


def source_address(destination: str) -> Optional[str]:
    """The local address the kernel sends from to reach the address `destination` (connecting a UDP socket
    sends nothing). None for a host name: looking it up here would only repeat the lookup the store made."""
    parsed = ip_of(destination)
    if parsed is None:
        return None
    family = socket.AF_INET6 if parsed.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as udp:
            udp.connect((str(parsed), 9))
            return udp.getsockname()[0]
    except OSError as exc:
        log.debug("no route from this host to %s: %s", destination, exc)
        return None


def ipv4_addresses(names: Optional[Iterable[str]] = None) -> Generator[Tuple[str, bytes], None, None]:
    """(interface, its first IPv4 address, packed), asked of the kernel one interface at a time (of `names`,
    default all). The first address is the one gloo itself binds when given the interface name. Linux only
    (Slurm's platform)."""
    if not sys.platform.startswith("linux"):
        return
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in interface_names() if names is None else names:
            request = name.encode()[:15].ljust(40, b"\0")  # struct ifreq: 16-byte name, then the address
            try:
                answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on this interface, or no such interface
                continue
            yield name, answer[20:24]  # sockaddr_in: family, port, then the address


def ipv6_addresses() -> Generator[Tuple[str, bytes], None, None]:
    """(interface, IPv6 address, packed) for every IPv6 address of this host (none when IPv6 is off)."""
    try:
        with open(_INET6_TABLE, encoding="ascii") as lines:
            for line in lines:
                fields = line.split()
                if len(fields) == 6:
                    yield fields[5], bytes.fromhex(fields[0])
    except OSError:  # IPv6 disabled, or not Linux
        return


def interface_with(address: str) -> Optional[str]:
    """This host's interface that carries `address`. Reads only that address's family, and stops at the
    interface that has it: every rank asks once inside init(), on cores its peers keep busy."""
    parsed = ip_of(address)
    if parsed is None:
        return None
    with contextlib.closing(ipv4_addresses() if parsed.version == 4 else ipv6_addresses()) as pairs:
        return interface_holding(address, pairs)


def interface_towards(destination: str) -> Optional[str]:
    """The interface this host reaches `destination` through, or None when that cannot be told."""
    source = source_address(destination)
    return None if source is None else interface_with(source)


def gloo_interface(reach: Optional[str], single_node: bool) -> Optional[str]:
    """The interface gloo should bind, given the address ranks on other nodes reach the master at.

    One node: loopback, which every rank shares. Otherwise the interface towards `reach`; None (gloo keeps
    its own choice) when it is unknown or cannot be told.
    """
    if single_node:
        return loopback_interface()
    return interface_towards(reach) if reach else None


# What Linux calls its loopback interface; asked first, since every rank of a one-node group asks inside init().
LOOPBACK_INTERFACE = "lo"


def loopback_interface() -> Optional[str]:
    """The interface holding 127.0.0.1: `lo` when it does (one question to the kernel), else the one the
    route to 127.0.0.1 leaves by (a system that renamed it). Every rank of a one-node group asks, on cores its
    peers keep busy, and the route and the scan of every interface cost several times the one question."""
    with contextlib.closing(ipv4_addresses([LOOPBACK_INTERFACE])) as pairs:
        found = interface_holding(LOOPBACK, pairs)
    return found or interface_towards(LOOPBACK)


def gloo_interface_for_command(master_address: Optional[str], single_node: bool, own_name: bool) -> Optional[str]:
    """The same choice for `slurmdist run`, which cannot ask another node how it reached the master before the
    command starts, so it goes by the master address it resolved itself. `own_name`: that address is what this
    host's own name resolved to (the rank is on the master's node). When that is loopback, it is exactly where
    gloo's default goes wrong (`127.0.1.1 node1` in /etc/hosts: gloo would bind it, and no other node can
    reach it), so this takes the default route's interface, which other nodes most likely reach this one
    through. A loopback address Slurm gave as the node's NodeAddr is trusted: other nodes reach the master
    there too.
    """
    if single_node or master_address is None:
        return gloo_interface(master_address, single_node)
    if own_name and is_loopback(source_address(master_address) or ""):
        route = default_route_source()
        return interface_with(route) if route else None
    return interface_towards(master_address)

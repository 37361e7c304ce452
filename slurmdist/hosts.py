"""The master's host, as each rank names, finds and reaches it: bare and bracketed IPv6, name lookups bounded
in time, Slurm's NodeAddr when a node name is not in DNS (slurm.conf first, then `scontrol`), task 0's node
from SLURM_HOSTFILE, this host's own reachable address, and a free port."""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import subprocess
from typing import List, Mapping, NamedTuple, Optional, Tuple, Union

from . import commands, slurm_conf
from .background import call_with_timeout
from .bounds import Deadline
from .distenv import LOOPBACK
from .errors import RendezvousError
from .interfaces import default_route_source, ip_of, is_loopback
from .launchers import slurm

log = logging.getLogger("slurmdist")


def strip_brackets(host: str) -> str:
    """'[::1]' -> '::1': torch's stores and sockets want bare IPv6 literals."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def lookup_form(host: str) -> Union[str, bytes]:
    """`host` as getaddrinfo takes it: ASCII names (all real host names) as bytes, because a str makes
    Python load its idna codec first -- about 1 ms that every rank would pay inside init()."""
    bare = strip_brackets(host)
    return bare.encode("ascii") if bare.isascii() else bare


def is_ipv6(host: str) -> bool:
    return isinstance(ip_of(strip_brackets(host)), ipaddress.IPv6Address)


def hostport(host: Optional[str], port: Optional[int]) -> str:
    """'node1:29500', '[fe80::1]:29500': how an endpoint is shown and put in URLs."""
    bare = strip_brackets(host or "?")
    return f"[{bare}]:{port}" if is_ipv6(bare) else f"{bare}:{port}"


class Lookup(NamedTuple):
    """What a bounded name lookup found: the addresses (none when it found nothing), and, when the name
    server did not give an answer, why (no answer in time, or a temporary failure): the name may be fine."""

    found: List[str]
    server_failed: Optional[str] = None


def lookup(host: str, timeout: float = 10.0) -> Lookup:
    """The IP addresses a name resolves to, within `timeout`. An IP address is its own answer: no lookup
    thread for the common MASTER_ADDR=10.0.0.1."""
    if ip_of(strip_brackets(host)) is not None:
        return Lookup([strip_brackets(host)])
    try:
        infos = call_with_timeout(
            lambda: socket.getaddrinfo(lookup_form(host), None, type=socket.SOCK_STREAM), timeout, "resolve"
        )
    except TimeoutError:
        return Lookup([], f"took longer than {timeout:.1f} s")
    except socket.gaierror as exc:
        # EAI_AGAIN: the resolver gave up on its name servers (unreachable, or its own shorter timeout).
        return Lookup([], f"failed ({exc.strerror})" if exc.errno == socket.EAI_AGAIN else None)
    except (OSError, UnicodeError):
        return Lookup([])
    return Lookup(list(dict.fromkeys(info[4][0] for info in infos)))


def lookup_failure(what: str, answer: Lookup) -> str:
    """'<what> does not resolve', or, when the name server gave no answer, what happened to the lookup."""
    if answer.server_failed is None:
        return f"{what} does not resolve"
    return f"the lookup of {what} {answer.server_failed}: its name server does not answer (check /etc/resolv.conf)"


def addresses(host: str, timeout: float = 10.0) -> List[str]:
    """`lookup(host, timeout).found`: empty when the name does not resolve in time."""
    return lookup(host, timeout).found


def slurm_node_addr(node: str, environ: Mapping[str, str], timeout: float = 10.0) -> Optional[str]:
    """Slurm's NodeAddr for `node` (`scontrol show node NODE`), or None when Slurm cannot say."""
    try:
        done = commands.run(["scontrol", "-o", "show", "node", node], timeout, environ)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("scontrol show node %s failed: %s", node, exc)
        return None
    match = re.search(r"(?:^|\s)NodeAddr=(\S+)", done.stdout)
    if done.returncode != 0 or match is None:
        log.debug("scontrol show node %s: rc=%s %s", node, done.returncode, done.stderr.strip())
        return None
    return match.group(1)


def names_this_host(host: str, hostname: str) -> bool:
    """True when `host` is this machine (its name, full or short, or loopback): reachable with no lookup."""
    bare = strip_brackets(host).lower()
    if bare in ("localhost", LOOPBACK, "::1"):
        return True
    own = hostname.lower()
    own_short = own.split(".")[0]
    # node1 and node1.cluster.example are one node when one name is the other's short form.
    return bool(own) and (bare in (own, own_short) or (own == own_short and bare.split(".")[0] == own))


def _conf_node_addr(node: str, environ: Mapping[str, str], timeout: float) -> Optional[str]:
    """`slurm_conf.read_node_addr`, bounded: slurm.conf often lives on a shared file system that can stall."""
    try:
        return call_with_timeout(lambda: slurm_conf.read_node_addr(node, environ), timeout, "slurm.conf-read")
    except TimeoutError:
        log.warning("reading slurm.conf (%s) took longer than %.1f s; asking scontrol for %s's NodeAddr",
                    environ.get("SLURM_CONF") or slurm_conf.DEFAULT_PATH, timeout, node)
        return None


def resolve_host(host: str, environ: Mapping[str, str], timeout: float = 10.0) -> str:
    """A master host that resolves: the name itself, else Slurm's NodeAddr for it (from the node's slurm.conf
    when it says so plainly, else `scontrol show node`), else a `RendezvousError`. `timeout` bounds it all."""
    return resolve_addresses(host, environ, timeout)[0]


def resolve_addresses(host: str, environ: Mapping[str, str], timeout: float = 10.0) -> Tuple[str, List[str]]:
    """`resolve_host`, and the addresses the answer resolved to: whoever connects next needs no second lookup."""
    bare = strip_brackets(host)
    deadline = Deadline(timeout)
    # The name lookup gets half of the bound at most: a name server that never answers must leave time to ask
    # Slurm for the NodeAddr.
    own = lookup(bare, deadline.at_most(timeout / 2))
    if own.found:
        return bare, own.found

    def usable(node_addr: Optional[str]) -> List[str]:
        if not node_addr or node_addr == bare:
            return []
        return addresses(node_addr, deadline.remaining())

    conf_addr = _conf_node_addr(bare, environ, deadline.at_most(timeout / 4))
    found = usable(conf_addr)
    if found:
        log.debug("master %s does not resolve; using its NodeAddr %s from slurm.conf", bare, conf_addr)
        return strip_brackets(str(conf_addr)), found
    node_addr = slurm_node_addr(bare, environ, deadline.remaining())
    found = usable(node_addr)
    if found:
        log.debug("master %s does not resolve; using its Slurm NodeAddr %s", bare, node_addr)
        return strip_brackets(str(node_addr)), found
    failed = lookup_failure(f"master host {bare!r}", own)
    if own.server_failed is None:
        failed += " (DNS / /etc/hosts)"
    asked_slurm = (f" and Slurm gave no usable NodeAddr for it (scontrol show node {bare}"
                   f"{' -> ' + node_addr if node_addr else ''})") if "SLURM_JOB_ID" in environ or node_addr else ""
    if strip_brackets(environ.get("MASTER_ADDR", "").strip()) == bare:  # the user's, not the launch's
        fix = ("; it is MASTER_ADDR's value: set MASTER_ADDR to an IP address or a name every node can resolve, or, "
               "left over from elsewhere, unset it" + (" (slurmdist then meets on the step's first node)"
                                                       if "SLURM_JOB_ID" in environ else ""))
    else:
        fix = "; set MASTER_ADDR to an IP address or a name every node can resolve"
    raise RendezvousError(f"{failed}{asked_slurm}{fix}")


def hostfile_master(environ: Mapping[str, str], timeout: float = 10.0) -> str:
    """Task 0's node under `srun -m arbitrary`: the first host of SLURM_HOSTFILE (read here, at init time,
    because detect() reads variables only). The read is bounded: the file may sit on a hung network mount."""
    path = environ.get(slurm.HOSTFILE_VARIABLE)
    if not path:
        raise RendezvousError(
            f"srun -m arbitrary ({slurm.DISTRIBUTION_VARIABLE}={environ.get(slurm.DISTRIBUTION_VARIABLE)!r}) "
            f"but {slurm.HOSTFILE_VARIABLE} is not set: the layout came from an `srun -w` list, which reaches the "
            "tasks only sorted, so the node of task 0 (the rendezvous master) is unknown. Set MASTER_ADDR to "
            f"task 0's node (the first host of the -w list), or give the layout in {slurm.HOSTFILE_VARIABLE}"
        )

    def head() -> str:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read(1 << 20)  # task 0 is on the first line that names a host

    try:
        text = call_with_timeout(head, timeout, "hostfile")
    except (OSError, TimeoutError) as exc:
        raise RendezvousError(
            f"srun -m arbitrary puts task 0 (the rendezvous master) on the first host of "
            f"{slurm.HOSTFILE_VARIABLE}={path!r}, which this rank cannot read ({exc}); put the file where every "
            "node can read it, or set MASTER_ADDR to task 0's node"
        ) from None
    return slurm.hostfile_first_host(text, path)


def own_address(single_node: bool) -> str:
    """An address of this host that other hosts can reach: the hostname's non-loopback IP, else the source
    address of the default route; loopback only when every rank is on this node."""
    name = socket.gethostname()
    found = addresses(name, 5.0)
    for address in found:
        if not is_loopback(address):
            return address
    if single_node:
        return LOOPBACK
    return default_route_source() or name


def free_port() -> int:
    """A port nobody listens on right now (the kernel's choice): for the CLI, whose command will listen on
    it, and for one process, which has no store to open on port 0. Launches of several ranks take the port
    their launcher names or slurmdist.ports derives instead."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]

"""The meeting every rank holds at one store, within one deadline (`bounds`): rank 0 serves the store (or an
agent does), the others join it at the master's address (found through `hosts`, or over MPI through
`mpi_share`), and every rank checks in.

Why not torch's env:// rendezvous: a rank that starts before rank 0's store listens sits in the TCPStore
client's retry back-off (about 0.5 s per rank measured here), and a rank that never arrives shows up as a
bare timeout. Here rank 0 hosts the store, the others poll-connect with short sleeps until the port listens,
and every rank checks in under one arrival counter, so a timeout names the ranks that never came. Each
rank's own store work is a constant number of operations; only the one rank that reports a timeout looks at
every rank's arrival key once (linear in the world size).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import socket
import sys
import time
from datetime import timedelta
from typing import Any, Iterator, List, Mapping, Optional, Sequence, Tuple

from . import procfs, store_server, store_watchdog
from .background import call_with_timeout
from .bounds import Deadline, init_timeout, poll_pauses, timeout_knob
from .distenv import LOOPBACK, DistEnv, require_distenv
from .errors import RendezvousError
from .hosts import (
    free_port, hostfile_master, hostport, is_ipv6, lookup, lookup_failure, lookup_form, names_this_host, own_address,
    resolve_addresses, resolve_host, strip_brackets,
)
from .interfaces import ip_of
from .launchers import slurm
from .mpi_share import mpi_comm, mpi_share_master, require_mpi_launcher

log = logging.getLogger("slurmdist")

# torch's switch for "an agent serves the store at MASTER_ADDR:MASTER_PORT": every rank, rank 0 too, joins it.
# torchrun sets it, and so does `slurmdist run` when its store host serves the store.
AGENT_STORE_VARIABLE = "TORCHELASTIC_USE_AGENT_STORE"
RESTART_COUNT_VARIABLE = "TORCHELASTIC_RESTART_COUNT"
RUN_ID_VARIABLE = "TORCHELASTIC_RUN_ID"
# A name lookup, Slurm's NodeAddr (`scontrol`) or a hostfile read: each answers in milliseconds or hangs
# (a dead DNS server, an unreachable slurmctld, a stalled mount); past this it fails naming what hung.
LOOKUP_BOUND = 10.0
# The monotonic time this process first entered the rendezvous (a retry keeps it), and what every rank spends
# before its own wait begins (interpreter start, imports) that a rank 0 may spend too without being late.
FIRST_ENTRY: List[float] = []
START_ALLOWANCE = 10.0
VERDICT_GRACE = 5.0  # how long a rank waits for another rank's timeout report before writing its own
REPORT_SECONDS_PER_RANK = 0.002  # ... plus this per rank, which the report checks one by one on a busy store


def verdict_grace(world_size: int) -> float:
    """How long a failed rendezvous waits for the rank that reports it: that rank checks every rank's arrival
    key, one store call each, so more ranks take longer."""
    return VERDICT_GRACE + REPORT_SECONDS_PER_RANK * world_size


def resolve_master(
    env: DistEnv, *, environ: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None,
    deadline: Optional[Deadline] = None, finalize_mpi: bool = False,
) -> DistEnv:
    """Fill in `master_addr`/`master_port` where `detect()` left them None, and make the address resolvable.

    MPI launches across nodes learn rank 0's address and a free port over mpi4py, and their node numbering
    from the ranks' host names (every rank must call this). MPI stays initialised for the caller (mpi4py
    finalizes it at exit); `finalize_mpi` finalizes it again when this call initialised it, for a caller that
    execs another program next (mpirun counts a rank that never finalized as crashed). A master name that is
    not in DNS is replaced by Slurm's NodeAddr. `deadline`, when given, is one the caller's later waits share
    (instead of `timeout` seconds from now).
    """
    require_distenv(env)
    environ = os.environ if environ is None else environ
    if deadline is None:
        deadline = Deadline(init_timeout(timeout, environ), timeout_knob(timeout, "--timeout"))
    if env.world_size == 1:
        # The one process meets itself: Slurm's node name (the first of the nodelist) may not be in DNS, and a
        # torch env:// start would retry it until its own timeout. A MASTER_ADDR set by the user stays.
        master_addr = env.master_addr if environ.get("MASTER_ADDR") else LOOPBACK
        return env.replace(master_addr=master_addr, master_port=env.master_port or free_port())
    env = _slurm_master(env, environ, deadline)
    if env.master_addr is None or env.master_port is None:
        require_mpi_launcher(env)
        started_mpi = "mpi4py.MPI" not in sys.modules
        comm = mpi_comm(env, environ, deadline.remaining(), deadline.knob)
        mine = None
        if env.rank == 0:
            mine = f"{env.master_addr or own_address(single_node=env.local_world_size == env.world_size)} " \
                   f"{env.master_port or free_port()}"
        env = mpi_share_master(comm, env, mine, deadline)
        if started_mpi and finalize_mpi:
            sys.modules["mpi4py.MPI"].Finalize()
    master_addr, _ = env.master_endpoint()
    return env.replace(master_addr=resolve_host(master_addr, environ, deadline.at_most(LOOKUP_BOUND)))


# --- store ----------------------------------------------------------------------------------------------


# Why a `slurmdist run` rank can find no store although rank 0 did everything right.
COMMAND_ENDED = ("its command already ended (`slurmdist run` serves the store only while rank 0's command runs: "
                 "for a command that does not start torch.distributed, such as hostname or nvidia-smi, use "
                 "`slurmdist run --no-store`), ")


def wait_listening(
    host: str, port: int, deadline: Deadline, world_size: int, candidates: Sequence[str] = (), *,
    rank: Optional[int] = None, store_of_a_command: bool = False,
) -> str:
    """Poll until something listens on host:port, sleeping a few milliseconds between attempts; returns the
    address that answered (a name may have several). A name is looked up once (or not at all, when the
    caller passes the `candidates` it resolved), not at every attempt: the lookup has no timeout of its own,
    and thousands of ranks polling would flood the name server. `store_of_a_command`: the store is the one
    `slurmdist run` serves while rank 0's command runs, which a short command (hostname) may have ended."""
    pauses = poll_pauses()
    last = ""  # text only: a kept exception's frames would hold the caller's (and its store client) in a cycle
    # Never a name to connect to: each connect would look it up again, unbounded, at every poll.
    if not candidates:
        answer = lookup(host, deadline.at_most(LOOKUP_BOUND))
        if not answer.found:
            failed = lookup_failure(f"the rendezvous store's host {host!r}", answer)
            raise RendezvousError(
                f"{failed} (world size {world_size}): set MASTER_ADDR to an IP address or a name every node resolves"
            )
        candidates = answer.found
    while True:
        for candidate in candidates:
            try:
                # A bytes host works too (see lookup_form); typeshed says str only.
                endpoint: Tuple[Any, int] = (lookup_form(candidate), port)
                with socket.create_connection(endpoint, timeout=min(2.0, deadline.remaining())) as probe:
                    return str(probe.getpeername()[0])
            except OSError as exc:
                last = str(exc)
        if deadline.expired():
            who = "" if rank is None else f"rank {rank}: "  # several ranks share one log without srun --label
            raise RendezvousError(
                f"{who}nothing listens at the rendezvous store {hostport(host, port)} after {deadline.seconds:.0f} s "
                f"(world size {world_size}, last error: {last}): rank 0 has not started, crashed before "
                f"it listened (in slurmdist.init() or slurmdist run), already gave up on ranks that came as late "
                f"as this one (start every rank together, or raise {deadline.knob}), "
                f"{COMMAND_ENDED if store_of_a_command else ''}or "
                f"MASTER_ADDR/MASTER_PORT point elsewhere{_ipv6_only_hint(candidates)}"
            )
        time.sleep(min(next(pauses), deadline.remaining()))


def _ipv6_only_hint(candidates: Sequence[str]) -> str:
    """For a master name with IPv6 addresses only: rank 0 listens on IPv4 for a name, unless its own host routes
    no IPv4 (store_server.ipv6_clients)."""
    if not candidates or not all(is_ipv6(candidate) for candidate in candidates):
        return ""
    return (f". The master resolves to IPv6 addresses only ({', '.join(candidates)}), and rank 0 serves a master "
            "name over IPv4 where its node routes IPv4: set MASTER_ADDR to rank 0's IPv6 address")


def open_store(
    host: str,
    port: int,
    rank: int,
    world_size: int,
    deadline: Deadline,
    *,
    serve: bool = False,
    candidates: Sequence[str] = (),
    agent_serves: bool = False,
    master_addr: Optional[str] = None,
) -> Tuple[Any, Optional[str]]:
    """A TCPStore at host:port: served here when `serve` (rank 0, port 0 = kernel's choice), else joined.
    Also returns the address a joined store answered at (None when served here); `candidates` are the
    addresses `host` resolved to, when the caller has them. `agent_serves`: the port is an agent's
    (torchrun's, or slurmdist run's store host), which no other program can hold. `master_addr`: where the
    other ranks dial a store served here (`host` may be loopback), which decides its address family."""
    host = strip_brackets(host)
    where = hostport(host, port)
    if serve:
        ipv6 = store_server.ipv6_clients(master_addr or host)
        try:
            store = store_server.serve_here(port, deadline.remaining(), ipv6=ipv6)
        except RuntimeError as exc:
            raise RendezvousError(f"rank 0 cannot host the rendezvous store at {where}: {exc}") from None
        deadline.endpoints.add((LOOPBACK, store.port))  # its own client's connection (what a Ctrl-C cuts)
        return store, None
    # Polled even under an agent: slurmdist run's store host listens from rank 0's task, which srun starts
    # beside the others, not before them.
    peer = wait_listening(host, port, deadline, world_size, candidates, rank=rank)
    deadline.endpoints.add((peer, port))
    return _join_store(_dialable(peer, host), port, where, rank, world_size, deadline, agent_serves), peer


def _dialable(peer: str, host: str) -> str:
    """The address that just answered, for the store client to dial: the same machine, and no second name
    lookup in torch's resolver. A link-local IPv6 address needs its zone, which not every platform's
    getpeername() keeps: dial the name then."""
    address = ip_of(peer)
    if address is None or (isinstance(address, ipaddress.IPv6Address) and address.is_link_local):
        return host
    return peer


# Seconds a store client whose connection was cut at the deadline gets to leave torch (see _join_store).
CLIENT_GRACE = 5.0


def _join_store(
    dial: str, port: int, where: str, rank: int, world_size: int, deadline: Deadline, agent_serves: bool = False
) -> Any:
    """The store client. Rank 0's store is joined in a thread: the client's handshake ignores its timeout
    when a listener never answers, which only a program squatting on the port does. None can hold an
    agent's port, so that join runs on this thread (a thread costs every rank a start and a wake-up on busy
    cores); the watchdog still bounds an agent that stops answering."""
    import torch.distributed as dist

    def client() -> Any:
        return dist.TCPStore(dial, port, None, False, timedelta(seconds=deadline.remaining()))

    def not_a_store() -> RendezvousError:
        return RendezvousError(
            f"rank {rank}: something listens at {where} but does not answer as a rendezvous store (world size "
            f"{world_size}, waited {deadline.elapsed():.0f} s): another program holds MASTER_PORT (rank 0 then "
            "reports that it cannot listen; set MASTER_PORT to a free port), or the process serving the store is "
            "frozen (SIGSTOP, a debugger) or swapping"
        )

    try:
        if agent_serves:
            return client()
        # At the deadline torch's client can still be retrying a listener that answers in another protocol (a
        # web server on the port). Left inside torch while this rank exits, its thread aborts the process once
        # torch gives up ("terminate called without an active exception", status 134): cut its connection and
        # let it end first.
        return call_with_timeout(client, deadline.remaining(), "store-connect", grace=CLIENT_GRACE,
                                 unblock=lambda: store_watchdog.cut_connections({(dial, port)}))
    except TimeoutError:
        raise not_a_store() from None
    except RuntimeError as exc:
        if agent_serves:
            raise RendezvousError(
                f"rank {rank} could not join the rendezvous store its agent serves at {where} (world size "
                f"{world_size}): {first_line(exc)}. The agent (torchrun, or slurmdist run's store host on rank "
                "0's node) has just exited or is unreachable from here: see its log"
            ) from None
        raise RendezvousError(
            f"rank {rank} reached {where} but could not join the rendezvous store there: {exc}. "
            "Is MASTER_PORT used by something else than this job's rank 0?"
        ) from None


def rank0_keys(store: Any, base: str, deadline: Deadline) -> Optional[Keys]:
    """The keys of the store rank 0 serves, once rank 0 is there: it writes the state under `base` first thing,
    and only it creates that key on its own store. None for a store on its way out: one that closed before rank
    0 came (its previous group's, after `shutdown()`), one rank 0 said it left (`announce_closing`), or one whose
    attempt failed (rank 0 serves a fresh store for each attempt, and closes this one once the others have read
    the verdict). A timeout gives attempt 0's keys, so the rendezvous goes on to report that rank 0 never
    arrived."""
    keys = None
    try:
        state = _rank0_state(store, base, deadline)
        if state == STORE_CLOSING:  # rank 0 has left this store for a new one: see `announce_closing`
            return None
        keys = _keys_of(state, base)
        if keys.attempt > 0:  # rank 0 never checks in to a later attempt here: this waits for the close
            store.wait([keys.arrived(0)], timedelta(seconds=deadline.remaining()))
        return keys
    except RuntimeError as exc:
        if deadline.expired() or _is_timeout(exc):
            if keys is None and _unowned(store):  # answered all along, never by rank 0: see ForeignStore
                raise ForeignStore(None) from None
            return keys or Keys(base)
        if _store_closed(exc):
            return None
        raise


def _unowned(store: Any) -> bool:
    """Whether a store holds no slurmdist owner key: rank 0 writes one as it starts serving, so a store without
    it at the deadline is not a slurmdist rank 0's (a leftover torch program's, another service's)."""
    try:
        return not store.check([OWNER_KEY])
    except RuntimeError:  # it went away meanwhile: no more to learn from it
        return False


# Where rank 0 writes whose store it serves (its `run_prefix`), and how long a rank joining it waits for rank 0's
# state before it reads that: rank 0 writes its state as soon as it listens, so a store still without it by then
# is likely another run's (two job steps given one MASTER_PORT), which rank 0 of this run could not listen beside.
OWNER_KEY = "slurmdist/owner"
OWNER_CHECK_AFTER = 2.0


class ForeignStore(Exception):
    """The store at the master port is another run's: `owner` is that run's `run_prefix`, None for a store no
    slurmdist run owns."""

    def __init__(self, owner: Optional[str]) -> None:
        super().__init__(owner)
        self.owner = owner


def _rank0_state(store: Any, base: str, deadline: Deadline) -> str:
    """Rank 0's state under `base`, waited for within the deadline; raises `ForeignStore` for a store whose owner
    is another run. The owner is read only when the state is late, so the usual join costs no extra round trip."""
    if deadline.remaining() <= OWNER_CHECK_AFTER:
        return _get(store, state_key(base))
    store.set_timeout(timedelta(seconds=OWNER_CHECK_AFTER))
    try:
        return _get(store, state_key(base))
    except RuntimeError as exc:
        if not _is_timeout(exc):
            raise
    finally:
        store.set_timeout(timedelta(seconds=deadline.remaining()))
    if store.check([OWNER_KEY]):  # else not a slurmdist rank 0's store (or an older slurmdist's): wait on
        owner = _get(store, OWNER_KEY)
        if not same_run(owner, base):
            raise ForeignStore(owner)
    return _get(store, state_key(base))


def same_run(base: str, other: str) -> bool:
    """Whether two `run_prefix` values are one run's, maybe different groups of it (after `shutdown()`)."""
    return base.rpartition("/")[0] == other.rpartition("/")[0]


def describe_run(base: str) -> str:
    """A `run_prefix` in words: 'job 87353 step 1'; anything else as it is."""
    if not base.startswith("slurmdist/"):
        return repr(base)
    job, step, run_id, restart = (base.split("/") + ["-"] * 5)[1:5]
    words = ["no Slurm job" if job == "nojob" else f"job {job}"]
    words += [f"step {step}"] if step != "-" else []
    words += [f"torchrun run {run_id}"] if run_id != "-" else []
    words += [f"restart {restart}"] if restart != "-" else []
    return " ".join(words)


# What rank 0 writes, on a store it stops serving, under the state key of the group it forms next.
STORE_CLOSING = "closing"
CLOSING_BOUND = 5.0  # seconds for that write to rank 0's own store, which answers at once unless frozen


def announce_closing(store: Any, next_base: str) -> None:
    """Tell the ranks that joined this store (rank 0's, which it stops serving) to join again: a rank that came
    back from `shutdown()` first reached it while it still listened and waits there for rank 0 (`rank0_keys`).
    A store that closes tells them so itself, but one that something still holds (a DDP model, a `new_group()`
    handle keeps the old group) stays open, and they would wait there for the whole timeout. The store's own
    timeout is given back afterwards: the group still held waits on this store under it."""
    previous = getattr(store, "timeout", None)  # a property on recent torch only
    try:
        store.set_timeout(timedelta(seconds=CLOSING_BOUND))
        store.set(state_key(next_base), STORE_CLOSING)
    except RuntimeError as exc:  # the store is gone already: whoever joined it has seen it close
        log.debug("slurmdist: could not mark the old store as closing: %s", first_line(exc))
    finally:
        if previous is not None:
            store.set_timeout(previous)


def _is_timeout(exc: BaseException) -> bool:
    return "timeout" in str(exc).lower()


def _store_closed(exc: BaseException) -> bool:
    """The other side closed the store's connection (torch says so with DistNetworkError since 2.2)."""
    import torch.distributed as dist

    network_error = getattr(dist, "DistNetworkError", None)
    return isinstance(exc, network_error) if network_error is not None else not _is_timeout(exc)


def serves_store(env: DistEnv, environ: Mapping[str, str]) -> bool:
    """True in the process that hosts the rendezvous store itself: rank 0, unless an agent serves it."""
    return env.rank == 0 and not agent_serves_store(environ)


def store_stopped_answering(env: DistEnv, deadline: Deadline) -> RendezvousError:
    """The error of a rank whose store connection the watchdog had to cut (see store_watchdog)."""
    if env.master_addr and env.master_port:
        where = hostport(env.master_addr, env.master_port)
    else:  # the env from before the rendezvous (an arbitrary srun layout, MPI): where it really dialled
        where = hostport(*min(deadline.endpoints)) if deadline.endpoints else "its address"
    return RendezvousError(
        f"rank {env.rank}: the rendezvous store at {where} stopped answering (world size {env.world_size}): a "
        f"request to it was still unanswered {deadline.elapsed():.0f} s into the {deadline.seconds:.0f} s "
        "rendezvous, so this rank cut its connection. The process serving the store (rank 0, or torchrun's agent "
        "or slurmdist run's store host) is frozen (SIGSTOP, Ctrl-Z, a debugger), swapping, or cut off from this "
        "node by the network: see its state (ps, its log) and the network between the nodes. Or another program "
        "holds MASTER_PORT there and never answered as a store (slurmdist run on rank 0 then says it cannot "
        "listen on the port): set MASTER_PORT to a free port"
    )


class Keys:
    """Store keys of one rendezvous attempt. `base` separates jobs, torchrun restarts and the groups a
    process forms one after another; `attempt`, counted on the store, separates failed attempts: a retry
    never reads an earlier attempt's verdict, and a rank that missed an attempt meets the others' retry.
    `told` is the world size the first rank under `base` was told (None when the store was not asked)."""

    __slots__ = ("base", "prefix", "attempt", "told", "state", "count", "verdict", "reporter", "seen", "reach",
                 "formed")

    def __init__(self, base: str, attempt: int = 0, told: Optional[int] = None) -> None:
        self.base, self.attempt, self.told = base, attempt, told
        self.state = state_key(base)  # "ATTEMPT WORLD": failed attempts under `base`, the first rank's world size
        self.prefix = prefix = f"{base}/{attempt}"
        self.count = f"{prefix}/count"  # ranks checked in
        self.verdict = f"{prefix}/verdict"  # 'go', or what went wrong
        self.reporter = f"{prefix}/reporter"  # the first rank to notice a failure writes the verdict
        self.seen = f"{prefix}/seen"  # ranks that read a failed verdict (rank 0 waits for them)
        self.reach = f"{prefix}/reach"  # the address a rank on another node reached the master's node at
        self.formed = f"{prefix}/formed"  # ranks done with their store calls inside init_process_group

    def arrived(self, rank: int) -> str:
        return f"{self.prefix}/arrived/{rank}"

    def left(self, rank: int) -> str:
        """Set by a rank that fails after the group began to form, before it raises."""
        return f"{self.prefix}/left/{rank}"

    def moved_on(self) -> Optional[Tuple[str, str]]:
        """The state this attempt left, and the next attempt's: a failing rank swaps one for the other. None
        for keys made without reading the state (no state on the store names them)."""
        if self.told is None:
            return None
        return f"{self.attempt} {self.told}", f"{self.attempt + 1} {self.told}"


def state_key(base: str) -> str:
    return f"{base}/state"


def current_keys(store: Any, base: str, world_size: int, served_here: bool = False) -> Keys:
    """The keys of the attempt the store is at under `base`, and the world size the first rank there was
    told, which this rank's `world_size` becomes when it is the first: one store round trip for both.
    `served_here`: rank 0 on the store it has just started, where it alone writes the state, and the others
    wait for it (`rank0_keys`): a plain set, which wakes them on every torch (see `publish_once`)."""
    if served_here:
        store.set(state_key(base), f"0 {world_size}")
        store.set(OWNER_KEY, base)  # after the state, which the others wait for
        return Keys(base, 0, world_size)
    return _keys_of(store.compare_set(state_key(base), "", f"0 {world_size}").decode(), base)


def publish_once(store: Any, key: str, value: str) -> str:
    """Write `value` under `key` unless someone did first; the value the key holds. torch's classic store
    server (the one that serves on a handed-over socket before torch 2.8, and every store before 2.4) wakes
    no rank waiting on a key that compare_set wrote, so the winner writes it again with set."""
    held = store.compare_set(key, "", value).decode()
    if held == value:
        store.set(key, value)
    return held


def _keys_of(state: str, base: str) -> Keys:
    attempt, _, told = state.partition(" ")
    return Keys(base, int(attempt), int(told))


def compress_ranks(ranks: Sequence[int]) -> str:
    """[1, 2, 3, 7] -> '1-3,7': missing ranks stay readable at 10,000 processes."""
    runs: List[List[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def run_prefix(env: DistEnv, environ: Mapping[str, str], generation: int) -> str:
    """Keys unique to this job step, torchrun restart and init() call, so a reused store never mixes them.

    Every part must be the same on every rank. The Slurm step id is, only when srun started the ranks: the
    ranks of an mpirun inside a batch script carry no step id on the first node and the daemons' step id
    on the others.
    """
    parts = [
        env.job_id or "nojob",
        (slurm.step_id(environ) or "") if env.launcher == "slurm" else "",
        environ.get(RUN_ID_VARIABLE, ""),
        environ.get(RESTART_COUNT_VARIABLE, ""),
        str(generation),
    ]
    return "slurmdist/" + "/".join(part or "-" for part in parts)


# Verdicts that name nobody: with a cause (the process group's own failure), the cause is what to report.
EVERY_RANK_ARRIVED = "every rank arrived"
NO_RANK_REPORTED = "no rank reported"  # the reporter did not report in time: who arrived is unknown
# What two ranks disagreeing at check-in are told: no longer timeout could help them.
CHECKED_IN_TWICE = "checked in twice"
WORLD_SIZES_DIFFER = "every rank must be started with the same world size"


class Rendezvous:
    """One meeting of `world_size` ranks at a store: check in, wait for all, or report who is missing.

    Every rank adds itself to one counter; the rank that brings it to `world_size` writes the verdict 'go'.
    When waiting fails (deadline, or the process group's own connection step failed), the first rank to
    notice becomes the reporter: it checks each rank's arrival key once and writes the missing ranks as the
    verdict, so every present rank fails with the same message.
    """

    def __init__(
        self, store: Any, env: DistEnv, keys: Keys, deadline: Deadline, reach: Optional[str] = None,
        foreign_store_possible: bool = True,
    ) -> None:
        self.store, self.env, self.keys, self.deadline = store, env, keys, deadline
        self.reach = reach  # the address this rank reached the master's node at; None over the loopback shortcut
        # Rank 0 serves on a port it was given, which another run's store may hold: not under an agent's store
        # (torchrun's, slurmdist run's store host), nor on the port the kernel chose for it (MPI).
        self.foreign_store_possible = foreign_store_possible
        self.where = hostport(env.master_addr, env.master_port)

    def check_in(self) -> None:
        """Say this rank is here (and, first, on another node's local rank 0, at which address it reached the
        master's node: the master's own node learns its interface from that). A rank number
        someone else already holds, or a world size other than the first rank's, fails every rank at once:
        two processes with one RANK, a WORLD_SIZE that differs between ranks, or another job on this port."""
        with self._store_errors():
            conflict = self._claim() or self._world_conflict()  # first: it may move on to another attempt
            if self.reach is not None and self.env.local_rank == 0:  # one rank per node says it: any one will do
                self.store.set(self.keys.reach, self.reach)
            if conflict is not None:
                self.fail(problem=conflict)
            if self.store.add(self.keys.count, 1) == self.env.world_size:
                if self.env.local_world_size != self.env.world_size:
                    # Every rank is in, and each node's first rank says how it reached the master before it
                    # counts itself. None did: every "node" took the loopback shortcut, so all are this host
                    # (torchrun --nnodes=2 --master-addr=localhost on one machine), and loopback is the way.
                    self.store.compare_set(self.keys.reach, "", LOOPBACK)
                verdict = publish_once(self.store, self.keys.verdict, "go")
                if verdict != "go":  # the attempt failed just before this rank came: the others have left it
                    self.fail(late=True)

    def _claim(self) -> Optional[str]:
        """Take this rank's arrival key; what is wrong, or None.

        A key held by a process of this host that has ended belongs to a program that ran before this one at
        the same agent's store, under the same keys (`bash -c "python prep.py && python train.py"` under
        `slurmdist run` or torchrun): this rank moves the store on to the next attempt, where every rank of
        this program meets (each finds its own predecessor's key, and only the first move counts)."""
        me = f"{socket.gethostname()} (pid {os.getpid()})"
        token = f"{me}#{os.urandom(6).hex()}"  # unique to this check-in, threads of one process included
        while True:
            holder = self.store.compare_set(self.keys.arrived(self.env.rank), "", token).decode()
            if holder == token:
                return None
            moved = self.keys.moved_on()
            if moved is None or not _ended_here(holder) or self.deadline.expired():
                return (f"rank {self.env.rank} {CHECKED_IN_TWICE}, from {holder.split('#')[0]} and from {me}: two "
                        f"processes have RANK={self.env.rank}, or another job uses this MASTER_PORT (set a "
                        "different one)")
            log.debug("rank %d: %s, which held this rank's key, has ended: moving on to attempt %d",
                      self.env.rank, holder.split("#")[0], self.keys.attempt + 1)
            self.store.compare_set(self.keys.state, *moved)
            self.keys = current_keys(self.store, self.keys.base, self.env.world_size)

    def _world_conflict(self) -> Optional[str]:
        """A world size other than the one the first rank was told (read with the attempt number); or None."""
        told = self.keys.told
        if told is None or told == self.env.world_size:
            return None
        return (f"rank {self.env.rank} was told WORLD_SIZE={self.env.world_size} but ranks before it were "
                f"told {told}: {WORLD_SIZES_DIFFER}")

    def master_reach(self) -> str:
        """The address other nodes reach the master's node at. A rank that took the loopback shortcut learns it
        from the ranks of other nodes, which publish it when they check in (it waits for one, within the
        store's timeout)."""
        return self.reach if self.reach is not None else _get(self.store, self.keys.reach)

    def wait_all(self) -> None:
        """Block until every rank checked in, within the deadline."""
        with self._store_errors():
            try:
                self.store.wait([self.keys.verdict], timedelta(seconds=self.deadline.remaining()))
            except RuntimeError as exc:
                if not _is_timeout(exc):
                    raise
                self.fail()
                return
            if _get(self.store, self.keys.verdict) != "go":
                self.fail()

    def fail(self, cause: Optional[BaseException] = None, late: bool = False, problem: Optional[str] = None) -> None:
        """Agree on what went wrong with the other present ranks, then raise it as a `RendezvousError`.
        `late`: this rank checked in after the others had given up, so the verdict names it as missing.
        `problem`: what this rank found wrong at check-in; it becomes the verdict unless one is already set,
        and this rank raises it whatever the verdict."""
        gone = ""
        with self._store_errors(cause):
            if cause is not None:  # the group failed: which ranks of this node left without a word?
                self.store.set(self.keys.left(self.env.rank), "")  # not this one: it says why
                gone = self._gone_here()
            if self.store.add(self.keys.reporter, 1) == 1 or problem is not None:
                verdict = publish_once(self.store, self.keys.verdict, problem or self._missing_text())
            else:
                verdict = self._wait_for_report()
            if verdict == "go" and cause is None and problem is None:
                return
            if verdict != "go" or cause is not None:  # a failed attempt (not a stray process at a finished one)
                # Every failing rank moves the store to the next attempt (only the first move counts) before it
                # raises, so whichever rank retries first, every retry and every latecomer meets in the next.
                moved = self.keys.moved_on()
                if moved is not None:
                    self.store.compare_set(self.keys.state, *moved)
                if problem is None:  # one that never counted itself in (a conflict) is not lingered for
                    self.store.add(self.keys.seen, 1)
                if self.env.rank == 0:  # the store lives in this process: let the others read the verdict
                    self._linger(until_deadline=cause is not None)
        named = ""  # a rank that checked in and then failed the group, as far as this one can tell
        if problem is not None:
            verdict = problem
        elif cause is not None and (verdict == "go" or verdict.startswith(EVERY_RANK_ARRIVED)):
            named = _mesh_straggler(cause) + gone
            verdict = f"{EVERY_RANK_ARRIVED}, but: {first_line(cause)}{named}"
        elif cause is not None and verdict.startswith(NO_RANK_REPORTED):  # who arrived is unknown
            verdict = f"{verdict}; this rank: {first_line(cause)}{_mesh_straggler(cause)}"
        if late:
            verdict = (
                f"rank {self.env.rank} came after the others had given up on this attempt (their verdict: "
                f"{verdict}); calling init() again meets their retry"
            )
        conflict = CHECKED_IN_TWICE in verdict or WORLD_SIZES_DIFFER in verdict
        if conflict:
            advice = ""
        elif named:  # all came, and one of them failed since: a longer wait would not bring it back
            advice = " See that rank's log for why"
        elif verdict.startswith(EVERY_RANK_ARRIVED) and cause is not None:
            advice = (f" Every rank checked in: one may have exited or hung since (the ranks on its node name one "
                      f"that exited), or the ranks cannot reach each other's gloo address (GLOO_SOCKET_IFNAME, a "
                      f"firewall): see the other ranks' errors. Raise {self.deadline.knob} only if they are slow")
        else:
            advice = (f" Check that every rank started (job log, srun/mpirun task counts) and can reach {self.where}; "
                      f"raise {self.deadline.knob} if they are only slow")
        raise RendezvousError(
            f"rendezvous at {self.where} failed after {self.deadline.elapsed():.0f} s "
            f"(timeout {self.deadline.seconds:g} s): {verdict} (world size {self.env.world_size}; this is "
            f"rank {self.env.rank}).{advice}"
        ) from None

    def _missing_text(self) -> str:
        missing = [r for r in range(self.env.world_size) if not self.store.check([self.keys.arrived(r)])]
        if not missing:
            return EVERY_RANK_ARRIVED
        arrived = self.env.world_size - len(missing)
        text = f"{arrived} of {self.env.world_size} ranks arrived; rank(s) {compress_ranks(missing)} never arrived"
        if missing[0] == 0 and self.foreign_store_possible:  # the others met at this port anyway: whose is it?
            text += (" (if rank 0 said it cannot listen on this port, the store the others joined there is another "
                     "program's, a leftover run's: set MASTER_PORT to a free port)")
        if self.env.rank == 0 and arrived == 1:
            text += _late_rank_0(self.deadline)
        return text

    def _gone_here(self) -> str:
        """For a group that failed after every rank checked in: the ranks of this node (the block of ranks this
        one's local rank places it in, as srun, mpirun and torchrun number them) that have exited since, as a
        clause; '' when none, or the store cannot say. A constant number of reads per rank."""
        first = self.env.rank - self.env.local_rank
        gone = []
        try:
            for rank in range(max(0, first), min(self.env.world_size, first + self.env.local_world_size)):
                # Not one that never checked in (a blocking read of its key would wait out the store's timeout).
                if rank == self.env.rank or self.store.check([self.keys.left(rank)]) \
                        or not self.store.check([self.keys.arrived(rank)]):
                    continue
                if _ended_here(_get(self.store, self.keys.arrived(rank))):
                    gone.append(rank)
        except RuntimeError:  # the store went away meanwhile (rank 0 exited): nothing more to learn from it
            return ""
        if not gone:
            return ""
        return (f" (rank(s) {compress_ranks(gone)} checked in from this node and have exited since: see their log for "
                "why; gloo waits for a peer it was told about until its timeout)")

    def _wait_for_report(self) -> str:
        """The reporter's verdict; one of this rank's own when none comes in time."""
        grace = verdict_grace(self.env.world_size)
        try:
            self.store.wait([self.keys.verdict], timedelta(seconds=grace))
        except RuntimeError:
            return publish_once(self.store, self.keys.verdict, f"{NO_RANK_REPORTED} within {grace:.0f} s")
        return _get(self.store, self.keys.verdict)

    def _linger(self, until_deadline: bool = False) -> None:
        """Keep the store up until every rank that checked in has read the verdict, for a verdict grace at most;
        `until_deadline`: the group failed to form, and the others may still be inside gloo's own wait, which
        the deadline bounds (see mesh_store): that long, plus the grace."""
        arrived = int(self.store.add(self.keys.count, 0))
        seconds = verdict_grace(self.env.world_size)
        if until_deadline and not self.deadline.expired():
            seconds += self.deadline.remaining()
        wait_for_count(self.store, self.keys.seen, arrived, seconds)

    @contextlib.contextmanager
    def _store_errors(self, cause: Optional[BaseException] = None) -> Iterator[None]:
        try:
            yield
        except RendezvousError:
            raise
        except RuntimeError as exc:
            raise lost_store(self.env, exc, cause) from None


def lost_store(env: DistEnv, exc: BaseException, cause: Optional[BaseException] = None) -> RendezvousError:
    """The error of a rank whose store went away under it (`cause`: what had already failed before)."""
    return RendezvousError(
        f"rank {env.rank} lost the rendezvous store at {hostport(env.master_addr, env.master_port)} (world size "
        f"{env.world_size}): {first_line(exc)}{'; earlier: ' + first_line(cause) if cause is not None else ''}. "
        "The process hosting it (rank 0, torchrun's agent, or slurmdist run's store host) probably exited: see "
        "its log"
    )


# How torch reports a gloo peer that never published its address: "wait timeout after 9995ms, keys:
# /<prefix>/pg//cpu//0/2" (the last part is the peer's rank).
_MESH_KEY = re.compile(r"timeout.*keys: \S*/pg/\S*/(\d+)\b")


def _mesh_straggler(cause: BaseException) -> str:
    """For a gloo mesh that timed out waiting for a rank's address: which rank, and what that means."""
    found = _MESH_KEY.search(first_line(cause))
    if found is None:
        return ""
    return (f" (rank {found.group(1)} checked in but never joined the gloo mesh: it exited or hung after "
            "checking in; see its log)")


def _late_rank_0(deadline: Deadline) -> str:
    """For a rank 0 that no other rank reached: a clause when this process first entered the rendezvous later
    after its start than the others wait, with START_ALLOWANCE to spare (a dataset loaded before init()), so
    they may have come and given up before its store listened; else ''."""
    age = procfs.process_age()
    if age is None or not FIRST_ENTRY:
        return ""
    entered = age - (time.monotonic() - FIRST_ENTRY[0])
    if entered <= deadline.seconds + START_ALLOWANCE:
        return ""
    return (f" (this rank entered the rendezvous {entered:.0f} s after its process started, later than the "
            f"{deadline.seconds:.0f} s the other ranks wait for it: they may have come and given up before its store "
            f"listened. Do slow set-up after init(), or raise {deadline.knob})")


def _ended_here(holder: str) -> bool:
    """Whether the check-in `holder` ('HOST (pid N)#TOKEN') was made by a process of this host that has ended."""
    found = re.fullmatch(r"(.*) \(pid (\d+)\)#[0-9a-f]*", holder)
    if found is None or found.group(1) != socket.gethostname():
        return False
    pid = int(found.group(2))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, as another user's process
        return False
    return _is_zombie(pid)  # ended, and its parent has not read its status yet


def _is_zombie(pid: int) -> bool:
    """Linux's process state 'Z' (elsewhere: False)."""
    return procfs.process_stat(pid)[:1] == ["Z"]


def wait_for_count(store: Any, key: str, count: int, seconds: float, pause: float = 0.01) -> None:
    """Poll the counter `key` on `store` until it reaches `count`, for `seconds` at most."""
    end = time.monotonic() + seconds
    while store.add(key, 0) < count and time.monotonic() < end:
        time.sleep(pause)


def _get(store: Any, key: str) -> str:
    return store.get(key).decode()


def first_line(exc: Optional[BaseException]) -> str:
    """The first line of an error's message (torch's run on with C++ frames), else its type's name."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def agent_serves_store(environ: Mapping[str, str]) -> bool:
    """True when an agent (torchrun's, or `slurmdist run`'s store host) already serves the store."""
    return environ.get(AGENT_STORE_VARIABLE) == "True"


def connect(env: DistEnv, deadline: Deadline, environ: Mapping[str, str], generation: int = 0) -> Rendezvous:
    """Resolve the master, open the store and check in (without waiting for the others). `generation`
    counts the groups this process formed before (after `shutdown()`, `init()` meets under new keys)."""
    if not FIRST_ENTRY:  # when this process first came: how late a rank 0 no other rank reached was (_late_rank_0)
        FIRST_ENTRY.append(time.monotonic())
    agent_store = agent_serves_store(environ)
    env = _slurm_master(env, environ, deadline)
    foreign_store_possible = not agent_store
    if env.master_addr is None or env.master_port is None:
        store, env, reach = _mpi_store(env, deadline, environ)
        base = run_prefix(env, environ, generation)  # with rank 0's job id, which MPI shared
        foreign_store_possible = False
        try:
            keys = current_keys(store, base, env.world_size)
        except RuntimeError as exc:  # rank 0 went away between the broadcast and this read
            raise lost_store(env, exc) from None
    else:
        if names_this_host(env.master_addr, socket.gethostname()):
            # The store listens on every interface: ranks on the master's own node (rank 0 among them) reach
            # it over loopback, with no name lookup and no `scontrol` call when node names are not in DNS.
            host, shortcut, candidates = LOOPBACK, True, [LOOPBACK]
        else:
            host, candidates = resolve_addresses(env.master_addr, environ, deadline.at_most(LOOKUP_BOUND))
            shortcut = False
            env = env.replace(master_addr=host)
        base = run_prefix(env, environ, generation)
        store, peer, keys = open_meeting(host, env, base, deadline, not agent_store, candidates)
        reach = None if shortcut else peer
    meeting = Rendezvous(store, env, keys, deadline, reach, foreign_store_possible)
    meeting.check_in()
    return meeting


def open_meeting(
    host: str, env: DistEnv, base: str, deadline: Deadline, rank0_serves: bool, candidates: Sequence[str]
) -> Tuple[Any, Optional[str], Keys]:
    """The store (served here on rank 0 when no agent serves it), the address it answered at, and the keys
    of the attempt it is at.

    A rank joining the store rank 0 serves waits there for rank 0's arrival, and joins again when that store
    closes first: after `shutdown()` and a new `init()`, or a failed attempt and a retry, a fast rank can
    reach the store rank 0 is about to close (whose keys rank 0 will never write again).
    """
    _, port = env.master_endpoint()
    where = hostport(host, port)
    serve = rank0_serves and env.rank == 0
    pauses = poll_pauses()
    closed: Optional[str] = None  # how the store this rank last joined went away

    def lost() -> RendezvousError:
        return RendezvousError(
            f"rank {env.rank} joined the rendezvous store at {where} but lost it, again and again for "
            f"{deadline.seconds:g} s (world size {env.world_size}; last: {closed}): rank 0 "
            "keeps restarting, or another program holds MASTER_PORT"
        )

    while True:
        try:
            store, peer = open_store(
                host, port, env.rank, env.world_size, deadline, serve=serve, candidates=candidates,
                agent_serves=not rank0_serves, master_addr=env.master_addr,
            )
        except RendezvousError:
            if closed is not None and deadline.expired():  # the time ran out joining once more: say what came first
                raise lost() from None
            raise
        try:
            # One read: the attempt, the first rank's world size and, joining rank 0's store, rank 0's presence.
            if serve or not rank0_serves:
                found: Optional[Keys] = current_keys(store, base, env.world_size, served_here=serve)
            else:
                found = rank0_keys(store, base, deadline)
            if found is not None:
                return store, peer, found
            closed = "it closed before rank 0 checked in there"  # text, as `last` in wait_listening
        except ForeignStore as foreign:
            if foreign.owner is None:
                raise RendezvousError(
                    f"rank {env.rank}: the store at {where} answered for {deadline.elapsed():.0f} s (timeout "
                    f"{deadline.seconds:g} s) but rank 0 never wrote to it, as it does the moment it serves this run's "
                    f"store ({describe_run(base)}, world size {env.world_size}): another program (a leftover run, "
                    f"a service) holds port {port}, and rank 0 could not listen there (its log says so). Set "
                    "MASTER_PORT to a free port, or leave it unset: slurmdist derives one per job step"
                ) from None
            raise RendezvousError(
                f"rank {env.rank}: the rendezvous store at {where} is another run's ({describe_run(foreign.owner)}; "
                f"this is {describe_run(base)}, world size {env.world_size}): two runs use port {port} at once, and "
                "this run's rank 0 cannot listen there. Give each job step that runs beside another its own "
                "MASTER_PORT (or leave MASTER_PORT unset: slurmdist derives one per job step), else set it to a "
                "free port"
            ) from None
        except RuntimeError as exc:
            if not _store_closed(exc):
                raise RendezvousError(
                    f"rank {env.rank} joined the rendezvous store at {where} but cannot use it (world size "
                    f"{env.world_size}): {first_line(exc)}. Is MASTER_PORT used by something else than this "
                    "job's rank 0?"
                ) from None
            closed = first_line(exc)
        log.debug("rank %d: the store at %s closed (%s); joining again", env.rank, where, closed)
        time.sleep(min(next(pauses), deadline.remaining()))
        if deadline.expired():  # after the pause: joining once more with no time left would time out,
            raise lost()  # and blame whatever listens there for not answering


def _slurm_master(env: DistEnv, environ: Mapping[str, str], deadline: Deadline) -> DistEnv:
    """An srun step whose master detect() could not name (-m arbitrary) takes it from the hostfile."""
    if env.launcher != "slurm" or env.master_addr is not None:
        return env
    return env.replace(master_addr=hostfile_master(environ, deadline.at_most(LOOKUP_BOUND)))


def _mpi_store(env: DistEnv, deadline: Deadline, environ: Mapping[str, str]) -> Tuple[Any, DistEnv, Optional[str]]:
    """MPI across nodes: rank 0 opens its store on a kernel-chosen port, then broadcasts address and port.
    Also returns the address the store is reached at (rank 0's own, as it broadcast it)."""
    require_mpi_launcher(env)
    comm = mpi_comm(env, environ, deadline.remaining(), deadline.knob)
    store, mine = None, None
    if env.rank == 0:
        addr = env.master_addr or own_address(single_node=env.local_world_size == env.world_size)
        store, _ = open_store(addr, env.master_port or 0, 0, env.world_size, deadline, serve=True)
        mine = f"{addr} {store.port}"
    env = mpi_share_master(comm, env, mine, deadline)
    addr, port = env.master_endpoint()
    reach: Optional[str] = addr
    if store is None:  # rank 0's address may be a name (MASTER_ADDR): resolved once, Slurm's NodeAddr included
        host, candidates = resolve_addresses(addr, environ, deadline.at_most(LOOKUP_BOUND))
        store, reach = open_store(host, port, env.rank, env.world_size, deadline, candidates=candidates)
    return store, env, reach

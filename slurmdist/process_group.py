"""`init()` / `shutdown()`: the only place slurmdist changes process state (device, process group, atexit,
gloo's GLOO_SOCKET_IFNAME when unset, and Open MPI's OMPI_MCA_btl when it starts MPI itself).

Order matters: everything that can be decided locally (launcher, backend, device) is decided and checked
before any network wait, so a missing backend or a wrong device count fails in milliseconds, not after a
rendezvous timeout.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import traceback
import warnings
from datetime import timedelta
from typing import Any, Iterator, List, Mapping, Optional, Union

# hostlist: detect() reads a Slurm nodelist with it. Loaded with the rest of init()'s modules (when
# `slurmdist.init` is first looked up), not inside init(), where each rank's half millisecond of loading
# would hold up the whole group on busy cores.
from . import (  # noqa: F401
    backends, bounds, devices, hostlist, hosts, interfaces, procfs, rendezvous, requeue, store_server,
)
from .launchers import slurm
from .detection import detect, is_own_srun_task
from .distenv import DistEnv
from .envvars import require_mapping
from .errors import BackendError, LaunchError, SlurmdistError
from .mesh_store import GLOO_CONNECT_FACTOR, mesh_store
from .store_watchdog import StoreWatchdog

log = logging.getLogger("slurmdist")

COLLECTIVE_TIMEOUT_VARIABLE = "SLURMDIST_COLLECTIVE_TIMEOUT"
DEFAULT_COLLECTIVE_TIMEOUT = 1800.0  # torch's own default for gloo; a stuck collective still ends


def watchdog_grace(world_size: int) -> float:
    """Past the rendezvous deadline, the ranks' agreeing on who is missing takes at most two verdict graces;
    a rank still inside init() after three waits on a store that stopped answering (see store_watchdog)."""
    return 3 * rendezvous.verdict_grace(world_size)


# Re-entrant: a signal handler that calls shutdown() runs in the main thread on top of an init() holding it.
_lock = threading.RLock()
# `group`: the default process group init() formed or adopted, to tell it from one formed after the user
# destroyed it (`dist.destroy_process_group()`, the usual last line of a torch script).
# `next_base`: the keys the next group meets under, which rank 0 marks on the store it stops serving.
_state: dict = {"env": None, "store": None, "generation": 0, "atexit": False, "owned": False, "interface": None,
                "group": None, "next_base": None, "group_store": None, "formed": None, "collective_timeout": None}


def init(
    backend: str = "auto",
    *,
    timeout: Union[float, timedelta, None] = None,
    device: Any = None,
    environ: Optional[Mapping[str, str]] = None,
) -> DistEnv:
    """Detect the launch, pick backend and device, bind the device, form the default process group.

    Returns the `DistEnv` with `device`, `device_ids` (for DDP) and `backend` filled. `timeout` (seconds or a
    timedelta, default `SLURMDIST_INIT_TIMEOUT` or 300) bounds the whole rendezvous. A second call warns and
    returns the same env, without using its arguments (`shutdown()` first to form another group); after the
    group was destroyed (`shutdown()`, or your own `dist.destroy_process_group()`), `init()` forms a new one.
    """
    with _lock:
        if _live_env() is not None:
            env = _state["env"]
            warnings.warn(f"slurmdist.init() was already called; returning the existing environment (backend "
                          f"{env.backend} on {env.device}; this call's arguments are not used: shutdown() first to "
                          "form a group with others)", stacklevel=_users_frame())
            return _state["env"]
        environ = os.environ if environ is None else require_mapping(environ)
        started = time.monotonic()
        handling = sys.exc_info()[1]  # the caller's own exception, if init() runs in an except block
        if not isinstance(backend, str):
            raise BackendError(f"backend={backend!r} is not a backend name: use 'auto' (the default), "
                               "'nccl', 'hccl', 'mpi', 'gloo' or a form such as 'cpu:gloo,cuda:nccl'")
        seconds = bounds.init_timeout(timeout, environ)
        try:
            env = detect(environ)
            _refuse_start_from_a_pty_shell(env, environ)
            requeue.carry_on_past_the_warning(environ)  # the job scripts' warning signal must not kill the job
            env = _choose_device(env, backend, device, environ)
            _check_gloo_interface(env, environ)
            # The bound starts with the rendezvous, not before the local choices (which import torch).
            env = _start_group(env, bounds.Deadline(seconds, bounds.timeout_knob(timeout, "init()'s timeout")),
                               environ)
        except BaseException as exc:
            _forget_interface()
            _release_frames(exc, handling)
            raise
        # The next group (after shutdown()) meets under keys of its own. A retry after a failure keeps the
        # number: the store counts failed attempts, so a rank that missed the failed one still meets the retry.
        _state["generation"] += 1
        _state["next_base"] = rendezvous.run_prefix(env, environ, _state["generation"])
        _state["env"] = env
        _state["group"] = _default_group()
        if not _state["atexit"]:
            atexit.register(_shutdown_at_exit)
            _state["atexit"] = True
        if log.isEnabledFor(logging.INFO):  # the endpoint's spelling parses the address: only when shown
            master = (f", master {hosts.hostport(env.master_addr, env.master_port)}" if env.world_size > 1
                      else "")  # a single process meets nobody
            log.info("rank %d/%d ready in %.3f s: %s on %s%s", env.rank, env.world_size,
                     time.monotonic() - started, env.backend, env.device, master)
        return env


def _choose_device(env: DistEnv, backend: str, device: Any, environ: Mapping[str, str]) -> DistEnv:
    """Backend and device, decided and checked without touching the network."""
    # Read only where ranks outnumber devices, checked always: a typo must not wait for the GPU nodes to show.
    devices.share_requested(environ)
    device_type, index = backends.split_device(device)
    caps = backends.probe(backend, device_type, environ)
    choice = backends.choose(backend, caps, device_type, environ, asked=device)
    unused = None if device_type == "cpu" else (  # the CPU asked for: nothing to warn about
        backends.unused_gpus(backend, choice, caps, environ) or backends.unused_npus(backend, choice, caps))
    if unused and env.local_rank == 0:  # once per node: the node's ranks share the cause
        warnings.warn(unused, stacklevel=_users_frame())
    backends.check_index(device, choice)
    count = devices.device_count(choice.device_type) if choice.device_type != "cpu" else 0
    plan = devices.plan(choice.device_type, env.local_rank, env.local_world_size, count, environ, index,
                        task_is_rank=is_own_srun_task(env, environ), backend=choice.backend)
    return env.replace(device=devices.bind(plan), device_ids=plan.device_ids, backend=choice.backend)


def _check_gloo_interface(env: DistEnv, environ: Mapping[str, str]) -> None:
    """A GLOO_SOCKET_IFNAME set by the user for a gloo group must name interfaces this host has."""
    chosen = interfaces.user_choice(environ, os.environ)
    if chosen and "gloo" in str(env.backend):  # a single process's gloo binds it too
        interfaces.check_user_choice(chosen, interfaces.interface_names())


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_CONTEXTLIB = os.path.abspath(contextlib.__file__)


def _users_frame() -> int:
    """The `stacklevel` that makes a warning name the user's line (`slurmdist.init()`, `with
    slurmdist.initialized():`), however deep in slurmdist (and contextlib, for `initialized()`) it is raised."""
    frame = sys._getframe(1)  # the function that calls warnings.warn: stacklevel 1
    level = 1
    while frame.f_back is not None and _internal(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


def _internal(filename: str) -> bool:
    path = os.path.abspath(filename)
    return os.path.dirname(path) == _PACKAGE_DIR or path == _CONTEXTLIB


def _start_group(env: DistEnv, deadline: bounds.Deadline, environ: Mapping[str, str]) -> DistEnv:
    import torch.distributed as dist

    collective = timedelta(seconds=_collective_timeout(environ))
    if dist.is_initialized():
        mismatch = _shape_mismatch(env)
        if mismatch:  # the env would size samplers and shards for another group
            raise SlurmdistError(
                f"torch.distributed was initialised outside slurmdist as {mismatch}: slurmdist cannot adopt a "
                "group of another shape. Form the group with slurmdist.init() only, or destroy yours first "
                "(torch.distributed.destroy_process_group())"
            )
        warnings.warn("torch.distributed was initialised outside slurmdist; adopting that group",
                      stacklevel=_users_frame())
        _state["owned"] = False  # shutdown() leaves a group it did not create alone
        return env.replace(backend=str(dist.get_backend()))
    _state["owned"] = True
    _state["collective_timeout"] = collective.total_seconds()  # what barrier()'s error names
    if env.backend == "mpi":  # the MPI runtime did the rendezvous when the launcher started us
        dist.init_process_group("mpi", timeout=collective)
        mismatch = _shape_mismatch(env)
        if mismatch:  # each process started MPI alone: nothing would be synchronised, and nothing would say so
            dist.destroy_process_group()
            raise BackendError(
                f"backend 'mpi': MPI started this process as {mismatch}. No launcher this MPI understands "
                "started the processes together: torchrun and `slurmdist run` are none, and neither is srun "
                "without the PMI this MPI was built for (see `srun --mpi=list`). Start them with mpirun, or srun "
                "--mpi=pmix (or pmi2), or use backend='gloo' or 'nccl', which do not need MPI to start them"
            )
        return env
    if env.world_size == 1:  # no network at all: an in-memory store, and gloo told to bind loopback
        _choose_loopback(env, environ)
        _init_group(env, dist.HashStore(), "slurmdist/single", collective)
        return env
    # The store living in this process (rank 0's) cannot freeze without this rank: no deadline cut for it, only
    # the one at Ctrl-C or SIGTERM, whose handler Python runs only once torch's wait returns.
    serves_here = rendezvous.serves_store(env, environ)
    watchdog = StoreWatchdog(None if serves_here else deadline.remaining() + watchdog_grace(env.world_size),
                             deadline.endpoints)
    try:
        with watchdog.running():
            formed = _meet(env, deadline, environ, collective)
    except (rendezvous.RendezvousError, RuntimeError):
        if not watchdog.has_cut:
            raise
        raise _cut_error(env, deadline, watchdog) from None
    if watchdog.has_cut:  # cut as the group formed: its first collective and new_group() would fail on it
        dist.destroy_process_group()
        raise _cut_error(env, deadline, watchdog)
    return formed


def _cut_error(env: DistEnv, deadline: bounds.Deadline, watchdog: StoreWatchdog) -> rendezvous.RendezvousError:
    """Why the watchdog cut the store connections under this rank's rendezvous."""
    if watchdog.signal is None:
        return rendezvous.store_stopped_answering(env, deadline)
    # A handler that raises (Ctrl-C's) ended init() already: this one returned.
    return rendezvous.RendezvousError(
        f"rank {env.rank}: init() stopped waiting for the rendezvous (world size {env.world_size}) when "
        f"{watchdog.signal.name} arrived: its handler returned, but the store connection cut to let it run "
        "cannot carry the rendezvous on"
    )


def _refuse_start_from_a_pty_shell(env: DistEnv, environ: Mapping[str, str]) -> None:
    """Rank 0 of an `srun --pty` step typed at its shell: say at once why the other ranks cannot come, as the
    batch script's multi-task check does, instead of waiting out the whole timeout (see `pty_shell_hint`)."""
    if "SLURM_PTY_PORT" not in environ or env.rank != 0:  # no /proc reads for anyone else
        return
    why = slurm.pty_shell_hint(env, environ, procfs.parent_argv(), os.isatty(0))
    if why is not None:
        raise LaunchError(why, "SLURM_PTY_PORT", environ["SLURM_PTY_PORT"])


def _shape_mismatch(env: DistEnv) -> Optional[str]:
    """What the formed default group says against what the launch says, when the two disagree; else None."""
    import torch.distributed as dist

    rank, size = dist.get_rank(), dist.get_world_size()
    if (rank, size) == (env.rank, env.world_size):
        return None
    return f"rank {rank} of {size}, but the launch ({env.launcher}) says rank {env.rank} of {env.world_size}"


def _meet(env: DistEnv, deadline: bounds.Deadline, environ: Mapping[str, str], collective: timedelta) -> DistEnv:
    """Rendezvous at the store, then form the group on it."""
    meeting = rendezvous.connect(env, deadline, environ, _state["generation"])
    env = meeting.env
    # gloo connects every pair inside init_process_group, and that wait is bounded by its timeout: letting it
    # overlap the arrival wait keeps the full-mesh setup off the critical path. Lazy backends (nccl, hccl)
    # connect at the first collective, so they wait for every rank here first; so does gloo on a torch that
    # cannot give a formed group a new timeout (it then connects under the collectives' own).
    eager = "gloo" in str(env.backend) and _can_retime()
    if not eager:
        meeting.wait_all()
    meeting.store.set_timeout(timedelta(seconds=deadline.remaining()))
    try:
        _choose_gloo_interface(meeting, environ)
        group_store = _init_group(env, meeting.store, meeting.keys.prefix, collective, deadline if eager else None)
    except RuntimeError as exc:
        meeting.fail(exc)
        raise
    meeting.store.set_timeout(collective)  # later new_group() calls wait on the store as long as collectives
    # Rank 0 may be done and call shutdown() while another rank's init_process_group still reads the store it
    # serves: the others say when they are done, and shutdown() waits for that (bounded) before closing it.
    serves_here = rendezvous.serves_store(env, environ)
    if not serves_here and not rendezvous.agent_serves_store(environ):
        try:
            meeting.store.add(meeting.keys.formed, 1)
        except RuntimeError as exc:  # rank 0 is gone already: the first collective says so, with its own bound
            log.debug("slurmdist: rank %d could not say it formed the group: %s", env.rank, exc)
    _state["formed"] = (meeting.keys.formed, env.world_size - 1) if serves_here else None
    # torch holds only the C++ side of a store written in Python (mesh_store): its Python side must live as
    # long as the group, or the group's later store calls (new_group(), barriers) find none of its methods.
    _state["store"], _state["group_store"] = meeting.store, group_store
    return env


def _choose_gloo_interface(meeting: rendezvous.Rendezvous, environ: Mapping[str, str]) -> None:
    """Point gloo (this group's, and any gloo group made later, e.g. `new_group(backend="gloo")` beside nccl)
    at the interface other nodes reach the master's node through, unless the user chose one. Sets
    GLOO_SOCKET_IFNAME in this process: gloo reads its choice from there only."""
    env = meeting.env
    if not interfaces.wanted(env.world_size, environ, os.environ):
        return
    single_node = env.local_world_size == env.world_size
    reach = None if single_node else meeting.master_reach()  # a store read when another node says it
    name = interfaces.gloo_interface(reach, single_node)
    if name is None and not single_node:
        # gloo then binds what this node's name resolves to, on Debian-like hosts 127.0.1.1, which other
        # nodes cannot reach. Unknown when the route's source is not its interface's first IPv4 address
        # (the one gloo binds), or the master is reached over IPv6 link-local.
        log.warning("slurmdist: rank %d found no interface towards the master (%s); gloo picks its own. If the "
                    "group then fails across nodes, set GLOO_SOCKET_IFNAME to the interface the nodes share",
                    env.rank, reach)
    if name is None:
        return
    _set_interface(name)


def _choose_loopback(env: DistEnv, environ: Mapping[str, str]) -> None:
    """A single process: gloo would look up this host's name to pick an address (a DNS query, and a 5 s stall
    where DNS is broken) for a group that never talks to anyone."""
    if "gloo" not in str(env.backend) or interfaces.user_choice(environ, os.environ) is not None:
        return
    name = interfaces.gloo_interface(None, single_node=True)
    if name is None:  # gloo would fail inside torch with "Unable to find interface for: [127.0.0.1]"
        raise BackendError("gloo binds a network interface even for a single process, and this host has none "
                           "holding 127.0.0.1 (a network namespace whose loopback is down?): bring it up (`ip link "
                           "set lo up`), or set GLOO_SOCKET_IFNAME to an interface with an address")
    _set_interface(name)


def _set_interface(name: str) -> None:
    """Tell gloo (it reads only the process environment) which interface to bind."""
    os.environ[interfaces.GLOO_INTERFACE_VARIABLE] = name
    _state["interface"] = name  # shutdown() takes it back, so a later init() chooses afresh


def _init_group(
    env: DistEnv, store: Any, prefix: str, collective: timedelta, deadline: Optional[bounds.Deadline] = None
) -> Any:
    """`init_process_group` on our store; with a `deadline`, connecting is bounded by it, then collectives
    get their own (longer) timeout. Returns the store the group was given."""
    import torch.distributed as dist

    world = getattr(dist.distributed_c10d, "_world", None)
    group_count = getattr(world, "group_count", None)
    group_store = dist.PrefixStore(prefix + "/pg", store)
    timeout, mesh = collective, None
    if deadline is not None and _gloo_only(env.backend):  # gloo's peer-connect wait is 5 timeouts: see mesh_store
        group_store = mesh = mesh_store(group_store, deadline.remaining)
        timeout = timedelta(seconds=max(MIN_GROUP_TIMEOUT, deadline.remaining() / GLOO_CONNECT_FACTOR))
    elif deadline is not None:
        timeout = timedelta(seconds=deadline.remaining())
    try:
        dist.init_process_group(
            env.backend, store=group_store, rank=env.rank, world_size=env.world_size, timeout=timeout,
        )
    except BaseException:
        # torch numbers its groups per process, failed attempts included, and gloo meets under that number:
        # a retry must not count this attempt, or it never meets a rank on its first call.
        if world is not None and group_count is not None:
            world.group_count = group_count
        raise
    if deadline is not None:
        dist.distributed_c10d._set_pg_timeout(collective)
    if mesh is not None:
        mesh.release()
        mesh.set_timeout(collective)  # what later store calls of the group wait, as without the wrapper
    return group_store


# torch counts a group's timeout in whole milliseconds, and 0 means none.
MIN_GROUP_TIMEOUT = 0.01


def _gloo_only(backend: Any) -> bool:
    """'gloo', or a per-device form where every device gets gloo: no nccl part, whose threads would query a
    store written in Python (mesh_store) for the group's whole life."""
    return set(backends.parse_backend(str(backend)).values()) == {"gloo"}


def _can_retime() -> bool:
    """Whether this torch can change a formed group's timeout (`_set_pg_timeout`: 2.13 can, older releases
    may not). Without it, a gloo group formed under the rendezvous's remaining seconds would keep them for
    every collective."""
    import torch.distributed as dist

    return hasattr(dist.distributed_c10d, "_set_pg_timeout")


def _collective_timeout(environ: Mapping[str, str]) -> float:
    return bounds.seconds_from(environ, COLLECTIVE_TIMEOUT_VARIABLE, DEFAULT_COLLECTIVE_TIMEOUT, SlurmdistError)


def shutdown() -> None:
    """Destroy the process group formed by `init()` (safe to call twice, or without `init()`). A group the
    user formed after destroying ours is theirs: left alone."""
    with _lock:
        env, _state["env"] = _state["env"], None
        if env is None:
            return
        import torch.distributed as dist

        _wait_for_the_others_to_form()
        try:
            if _state["owned"] and dist.is_initialized() and _default_group() is _state["group"]:
                dist.destroy_process_group()
        finally:  # whatever torch raised: the port and the interface choice are given back all the same
            _stop_serving(env)
            _state["store"] = _state["group_store"] = _state["group"] = None
            _forget_interface()


def _default_group() -> Any:
    import torch.distributed as dist

    return dist.group.WORLD if dist.is_initialized() else None


def _live_env() -> Optional[DistEnv]:
    """The env of the group `init()` formed, while that group lives. When the user destroyed it
    (`dist.destroy_process_group()`), slurmdist forgets it too, so `init()` forms a new one."""
    env = _state["env"]
    # Read without the lock first: init() holds it for the whole rendezvous, and a thread that only logs (the
    # rank prefix asks here) or asks is_main() must not wait minutes for it. Forgetting needs the lock.
    if env is None or _default_group() is _state["group"]:
        return env
    with _lock:
        if _state["env"] is None or _default_group() is _state["group"]:
            return _state["env"]
        log.debug("the process group init() formed was destroyed outside slurmdist; forgetting it")
        _wait_for_the_others_to_form()
        _stop_serving(_state["env"])
        _state["env"] = _state["store"] = _state["group_store"] = _state["group"] = None
        _forget_interface()
        return None


def _forget_interface() -> None:
    """Take back the GLOO_SOCKET_IFNAME that `init()` set (unless someone changed it since), so the next
    `init()` chooses afresh instead of taking it for the user's choice."""
    chosen, _state["interface"] = _state["interface"], None
    if chosen is not None and os.environ.get(interfaces.GLOO_INTERFACE_VARIABLE) == chosen:
        del os.environ[interfaces.GLOO_INTERFACE_VARIABLE]


FORMED_GRACE = 5.0  # seconds rank 0's shutdown() waits for the others to finish forming the group


def _wait_for_the_others_to_form() -> None:
    """On rank 0, which serves the store: until every other rank's init_process_group is done with the store
    (they count themselves when it returns), for FORMED_GRACE at most. A rank that died after forming never
    counts itself: that costs this wait once."""
    formed, _state["formed"] = _state["formed"], None
    if formed is None or _state["store"] is None:
        return
    key, others = formed
    try:
        rendezvous.wait_for_count(_state["store"], key, others, FORMED_GRACE, pause=0.005)
    except RuntimeError as exc:  # the store failed: nobody is left to wait for
        log.debug("slurmdist: could not read how many ranks formed the group: %s", exc)


def _stop_serving(env: DistEnv) -> None:
    """Once the group is gone: stop listening on the store's port if this process served it (rank 0, no
    agent), so the next `init()` can serve there even while something still holds the old group (a DDP model,
    a `new_group()` handle), and with it the store. See `store_server.stop_listening`, which knows the socket
    it served and leaves any other alone. Then tell the ranks that joined the old store meanwhile to join
    again (`rendezvous.announce_closing`)."""
    if env.master_port is None or not store_server.stop_listening(env.master_port):
        return
    if _state["store"] is not None and _state["next_base"] is not None:
        rendezvous.announce_closing(_state["store"], _state["next_base"])


def _release_frames(exc: BaseException, keep: Optional[BaseException]) -> None:
    """Drop the locals of the finished frames a failed `init()` leaves in its exception and the exceptions
    it chained (slurmdist's and torch's frames below `init()`): they hold rank 0's store, whose port a retry
    needs, for as long as the caller keeps the exception. The traceback's lines stay. `keep` (the exception
    the caller was handling when it called `init()`) and what it chains are the caller's: left alone."""
    seen = set() if keep is None else {id(keep)}
    pending: List[Optional[BaseException]] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]


def _shutdown_at_exit() -> None:
    try:
        shutdown()
    except Exception as exc:  # at exit there is nobody left to raise to
        log.debug("slurmdist shutdown at exit failed: %s", exc)
    # Whoever destroyed the group: a gloo worker thread still finishing its last collective when Python ends
    # aborts the process (see gloo_workers). Nothing to wait for when no group kept its threads. Loaded here,
    # not with init()'s modules: only the exit needs it.
    from . import gloo_workers

    if not gloo_workers.wait_until_idle():
        log.debug("slurmdist: gloo's worker threads were still busy %.0f s into the exit", gloo_workers.BOUND)


@contextlib.contextmanager
def initialized(backend: str = "auto", **kwargs: Any) -> Iterator[DistEnv]:
    """`with slurmdist.initialized() as env:` -- `init()` on entry, `shutdown()` on exit. Inside a group that
    already exists (a helper's `with` in a script that called `init()`), it reuses that group and leaves it
    standing on exit."""
    outer = _live_env()
    if outer is not None:
        yield outer
        return
    env = init(backend, **kwargs)
    try:
        yield env
    finally:
        shutdown()


def is_initialized() -> bool:
    """Whether the group `init()` formed (or adopted) is still there: False before `init()`, after
    `shutdown()`, and after your own `dist.destroy_process_group()`."""
    return _live_env() is not None


def get_env() -> DistEnv:
    """The environment `init()` returned; a `SlurmdistError` before `init()`."""
    env = _live_env()
    if env is None:
        raise SlurmdistError("slurmdist.init() has not been called in this process (or its group was destroyed)")
    return env


def is_main() -> bool:
    """True on global rank 0. Before `init()`, asks the launcher's variables (no torch import)."""
    env = _live_env()
    if env is not None:
        return env.is_main
    return detect().is_main


def barrier_device_ids(env: DistEnv) -> Optional[List[int]]:
    """The bound device for torch's barrier where an accelerator backend runs it (nccl, hccl, or the per-device
    form naming one): without it torch guesses the current device and warns on every call. gloo's barrier
    runs on the CPU even for a process bound to a GPU."""
    backend = env.backend or ""
    if not env.device_ids or not any(name in backend for name in ("nccl", "hccl")):
        return None
    return list(env.device_ids)


def barrier() -> None:
    """Wait for every rank (bounded by the collective timeout); a no-op in a single process."""
    env = get_env()
    if env.world_size == 1:
        return
    import torch.distributed as dist

    try:
        dist.barrier(device_ids=barrier_device_ids(env))
    except RuntimeError as exc:  # gloo's own words name a source file, not the setting or what to do
        if _state["owned"]:
            within = f"the collective timeout ({COLLECTIVE_TIMEOUT_VARIABLE}: {_state['collective_timeout']:.0f} s)"
            raise_it = f"raise {COLLECTIVE_TIMEOUT_VARIABLE}"
        else:  # a group the program formed itself and init() adopted: its timeout is the program's
            within, raise_it = "the timeout of the group your program formed", "raise that group's timeout"
        raise SlurmdistError(
            f"barrier() on rank {env.rank} of {env.world_size} failed: {rendezvous.first_line(exc)}. Not every rank "
            f"reached it within {within}, or one left the group: a rank crashed (read its log), hangs, or is "
            f"slower than the timeout allows ({raise_it})"
        ) from exc

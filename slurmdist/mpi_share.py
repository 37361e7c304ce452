"""What an MPI launch across nodes needs to agree on a master: COMM_WORLD, with an MPI_Init that cannot hang
past its bound, and a broadcast of rank 0's address and port polled against the rendezvous deadline (with
the host names that number the nodes, which MPI does not).
mpi4py is imported only here, and only then."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import sys
import time
from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .bounds import DEFAULT_TIMEOUT, TIMEOUT_VARIABLE, Deadline, poll_pauses, readable_within
from .distenv import DistEnv
from .errors import RendezvousError

MPI_LAUNCHERS = ("openmpi", "pmi", "mvapich", "pals", "flux", "jsrun")
MPI_KILL_GRACE = 5.0  # seconds between the SIGTERM and the SIGKILL for a rank stuck in MPI_Init past its bound


def mpi_comm(env: DistEnv, environ: Mapping[str, str], timeout: float = DEFAULT_TIMEOUT,
             knob: str = TIMEOUT_VARIABLE) -> Any:
    """COMM_WORLD, importing mpi4py only now. Open MPI's ofi transport costs ~1 s of MPI_Init and we only
    exchange a few hundred bytes per rank, so it is left out unless the user chose transports (`OMPI_MCA_btl`).

    Importing mpi4py.MPI runs MPI_Init, which waits for every rank to call it, bounded by `timeout` (see
    `_import_mpi`), which `knob` sets."""
    if "mpi4py.MPI" not in sys.modules and env.launcher == "openmpi" and "OMPI_MCA_btl" not in environ:
        os.environ.setdefault("OMPI_MCA_btl", "^ofi")
    try:
        MPI = _import_mpi(timeout, (
            f"slurmdist: MPI_Init did not complete within {timeout:.0f} s on rank {env.rank} (world size "
            f"{env.world_size}): it waits for every rank of the launch, so some rank has not reached "
            "slurmdist.init(), `slurmdist run` or `slurmdist env --format shell` (crashed, stuck before it, or never "
            "started: check the launcher's "
            "task count). "
            f"Ending this process. Raise {knob} if the ranks are only slow, or set MASTER_ADDR and "
            "MASTER_PORT to skip MPI\n"
        ))
    except RuntimeError as exc:  # mpi4py >= 4: no MPI library found, or MPI_Init_thread() failed
        if "cannot load MPI library" in str(exc):
            why = (f"mpi4py cannot load an MPI library ({exc}): load the MPI the launcher belongs to in the job "
                   "(module load ...), point MPI4PY_LIBMPI at its libmpi,")
        else:
            why = (f"MPI could not start in this process ({exc}): the MPI mpi4py loaded does not speak this "
                   "launcher's process-management interface (srun needs --mpi=pmix or pmi2 for an MPI started "
                   "under it; mpirun must be the same MPI's),")
        raise RendezvousError(f"the {env.launcher} launch needs mpi4py to share rank 0's address, but {why} or set "
                              "MASTER_ADDR and MASTER_PORT to skip MPI") from None
    except ImportError as exc:
        if env.master_addr is None and "MASTER_PORT" in environ:
            lacking, share, fix = "spans several nodes and gives no master address (MASTER_PORT is set, " \
                "MASTER_ADDR is not)", "address", "MASTER_ADDR (rank 0's host)"
        elif env.master_addr is None:
            lacking, share, fix = "spans several nodes and gives no master address", "address and port", \
                "MASTER_ADDR and MASTER_PORT"
        elif "MASTER_ADDR" in environ:
            lacking, share, fix = "gives no master port (MASTER_ADDR is set, MASTER_PORT is not)", "port", \
                "MASTER_PORT (a free port on MASTER_ADDR's host)"
        else:
            lacking, share, fix = "gives no master port (of the MPI launches, only Open MPI's on one node does)", \
                "port", "MASTER_PORT"
        inside_slurm = " Inside a Slurm allocation, srun can start the ranks instead of mpirun." \
            if "SLURM_STEP_ID" in environ else ""
        raise RendezvousError(
            f"the {env.launcher} launch {lacking}, so slurmdist needs mpi4py to share rank 0's {share} "
            f"(pip install mpi4py against your MPI), or set {fix} yourself ({exc}).{inside_slurm}"
        ) from None
    if MPI.Is_finalized():  # any call now would abort the process from inside MPI, with no Python error
        raise RendezvousError(
            f"MPI was already finalized in this process (rank {env.rank}), and MPI cannot start twice, so rank 0's "
            "address cannot be shared over it: call slurmdist.init() before finalizing MPI, or set MASTER_ADDR and "
            "MASTER_PORT (export_env(resolve_master(env)) before finalizing gives them)"
        )
    if not MPI.Is_initialized():  # mpi4py.rc.initialize = False, and no MPI.Init() yet: the same abort
        raise RendezvousError(
            f"MPI is not initialized in this process (rank {env.rank}): mpi4py was imported with "
            "mpi4py.rc.initialize = False. Call MPI.Init() (or MPI.Init_thread()) before slurmdist.init(), or set "
            "MASTER_ADDR and MASTER_PORT"
        )
    comm = MPI.COMM_WORLD
    if comm.Get_size() != env.world_size or comm.Get_rank() != env.rank:
        raise RendezvousError(
            f"MPI says rank {comm.Get_rank()} of {comm.Get_size()} but the {env.launcher} variables say rank "
            f"{env.rank} of {env.world_size}: mpi4py is linked against a different MPI than the launcher "
            "(point MPI4PY_LIBMPI at the launcher's libmpi, or rebuild mpi4py with its mpicc), or those variables were "
            "changed or inherited from "
            "another launch (unset them)"
        )
    return comm


def _import_mpi(timeout: float, message: str) -> Any:
    """mpi4py.MPI, running MPI_Init on first import. MPI_Init holds the interpreter lock while it waits, so
    no thread of this process can bound it: a watcher process forked just before prints `message` and ends
    this process (SIGTERM, then SIGKILL: a Python handler cannot run inside MPI_Init) if it is still inside
    after `timeout` seconds. ImportError when mpi4py is missing, RuntimeError when it finds no MPI library."""
    if "mpi4py.MPI" in sys.modules:
        return sys.modules["mpi4py.MPI"]
    if importlib.util.find_spec("mpi4py") is None:  # before any fork
        raise ImportError("No module named 'mpi4py'")
    me = os.getpid()
    done_reading, done_writing = os.pipe()
    watcher = os.fork()
    if watcher == 0:  # only os-level calls here: the parent may have had other threads
        try:
            os.close(done_writing)
            if not readable_within(done_reading, timeout):
                os.write(2, message.encode())
                os.kill(me, signal.SIGTERM)
                if not readable_within(done_reading, MPI_KILL_GRACE):
                    os.kill(me, signal.SIGKILL)
        finally:
            os._exit(0)
    os.close(done_reading)
    try:
        from mpi4py import MPI
    finally:
        os.close(done_writing)  # the watcher reads end-of-file and exits
        os.waitpid(watcher, 0)
    return MPI


HOST_ENTRY_SIZE = 128  # bytes per rank in the allgather of node names: Linux host names stop at 64
# Collectives given up on at a timeout, with their buffers: MPI may still write into them when the late ranks
# come (a caller may retry), so they must outlive the frame that raised, whose locals the error handling clears.
_ABANDONED: List[Any] = []


def mpi_share_master(comm: Any, env: DistEnv, master: Optional[str], deadline: Deadline) -> DistEnv:
    """`env` with rank 0's "ADDRESS PORT" (`master`, given on rank 0 only) as master, rank 0's job id, and the
    node numbers the launcher left out taken from every rank's host name (`number_nodes`, `with_node_numbers`).
    All go in one round: a broadcast and an allgather started together and polled against the deadline.

    The job id names the rendezvous keys, so every rank must hold the same one: ranks that mpirun started
    over ssh inside a batch job (`--mca plm rsh`) get no SLURM_JOB_ID, which Open MPI does not forward."""
    MPI = sys.modules["mpi4py.MPI"]
    said = f"{master} {env.job_id or ''}" if master else ""
    shared = _padded(said, 512)  # a host name (at most 253 bytes), a port and a job id, between spaces
    mine = _padded(f"{socket.gethostname()} {env.local_world_size}", HOST_ENTRY_SIZE)
    hosts = bytearray(HOST_ENTRY_SIZE * comm.Get_size())
    requests = [comm.Ibcast(shared, root=0), comm.Iallgather(mine, hosts)]
    pauses = poll_pauses()
    while not MPI.Request.Testall(requests):
        if deadline.expired():
            _abort_at_exit(1)
            _ABANDONED.append((requests, shared, mine, hosts))
            raise RendezvousError(
                f"rank {comm.Get_rank()}: rank 0's address was not shared over MPI within {deadline.seconds:.0f} s "
                f"(world size {comm.Get_size()}): the other ranks have not all reached slurmdist.init(), "
                "`slurmdist run` or `slurmdist env --format shell` (crashed, stuck before it, or never calling it), "
                "or this is a second program started in the same mpirun rank after the first (`mpirun bash -c "
                "\"python a.py && python b.py\"`), whose MPI cannot reach the other ranks': MPI starts once per rank, "
                "so run such programs under `mpirun ... slurmdist run -- bash -c \"...\"`. This process ends the MPI "
                "job when it exits"
            )
        time.sleep(next(pauses))
    _abort_at_exit(0)  # a retry the caller made after a timeout went through: finalize as usual
    addr, port, *job = _unpadded(shared).split(maxsplit=2)
    entries = [_unpadded(hosts[i:i + HOST_ENTRY_SIZE]) for i in range(0, len(hosts), HOST_ENTRY_SIZE)]
    shared_env = env.replace(master_addr=addr, master_port=int(port), job_id=job[0] if job else None)
    return with_node_numbers(shared_env, *number_nodes(entries, env.rank))


def with_node_numbers(env: DistEnv, node_rank: Optional[int], num_nodes: Optional[int]) -> DistEnv:
    """`env` with the numbers the host names gave filled in where the launcher left them None (PALS numbers
    its nodes but does not count them, Flux counts them but cannot always number them). What the launcher
    said stands: numbers that disagree with it, like names that contradict themselves, change nothing."""
    if node_rank is None or num_nodes is None or env.num_nodes not in (None, num_nodes):
        return env
    if env.node_rank is not None and env.node_rank >= num_nodes:
        return env
    return env.replace(node_rank=node_rank if env.node_rank is None else env.node_rank, num_nodes=num_nodes)


def number_nodes(entries: Sequence[str], rank: int) -> Tuple[Optional[int], Optional[int]]:
    """(`rank`'s node index, node count) from every rank's "HOST LOCAL_WORLD_SIZE", by rank. Nodes are numbered
    in the order of their lowest rank, so rank 0's node is 0, as torchrun's GROUP_RANK has it (libraries such
    as Lightning take a launch for torchrun's only when GROUP_RANK is set too). (None, None) when the names
    contradict the launcher's counts of ranks per node (containers that share a host name, a launch that
    fakes its node-local variables): a guess would be worse than no number."""
    hosts: List[str] = []
    sizes: Dict[str, str] = {}
    for entry in entries:
        host, _, size = entry.rpartition(" ")
        hosts.append(host)
        if sizes.setdefault(host, size) != size:
            return None, None
    counts = Counter(hosts)
    if not all(host and str(count) == sizes[host] for host, count in counts.items()):
        return None, None
    order = list(counts)  # a Counter keeps first-seen order: the order of each node's lowest rank
    return order.index(hosts[rank]), len(order)


def _padded(text: str, size: int) -> bytearray:
    """`text` in a zeroed buffer of `size` bytes, as MPI's fixed-size collectives need; text too long is left
    out (a host name: its node goes unnumbered)."""
    buffer = bytearray(size)
    data = text.encode()
    if len(data) <= size:
        buffer[: len(data)] = data
    return buffer


def _unpadded(buffer: bytearray) -> str:
    """The text `_padded` put in `buffer`: the master, or one rank's host entry."""
    return bytes(buffer).rstrip(b"\0").decode(errors="replace")


def _abort_at_exit(status: int) -> None:
    """With a status, end this process with MPI_Abort, not MPI_Finalize, when Python exits: with a broadcast
    still pending, MPI_Finalize waits for the ranks that never came (Open MPI's is a fence), and the job would
    outlive the error until they do. MPI_Abort makes the launcher end every rank, as `python -m mpi4py` does on
    an error. 0 takes that back (mpi4py's own setting; its public `mpi4py.run.set_abort_status` only sets)."""
    MPI = sys.modules.get("mpi4py.MPI")
    set_status = getattr(MPI, "_set_abort_status", None)
    if set_status is not None:
        set_status(status)


def require_mpi_launcher(env: DistEnv) -> None:
    """Only MPI launchers can agree on a master over MPI; any other launch must say where rank 0 listens."""
    if env.launcher == "torchrun":  # torchrun itself always exports both: these variables were written by hand
        raise RendezvousError(
            f"RANK={env.rank}, WORLD_SIZE={env.world_size} and LOCAL_RANK={env.local_rank} are set but MASTER_ADDR "
            "and MASTER_PORT are not, so no rank knows where rank 0 listens: export them too (rank 0's host and a "
            "free port), or, under srun or mpirun, unset RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE and let "
            "slurmdist read the launcher's own variables"
        )
    if env.launcher not in MPI_LAUNCHERS:
        raise RendezvousError(
            f"the {env.launcher} launch gave no master address/port; set MASTER_ADDR and MASTER_PORT"
        )

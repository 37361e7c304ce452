"""What an MPI launch across nodes needs to agree on a master: COMM_WORLD, with an MPI_Init that cannot hang
past its bound, and a broadcast of rank 0's address and port polled against the rendezvous deadline.
mpi4py is imported only here, and only then."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from typing import Any, Mapping, Optional

from .bounds import DEFAULT_TIMEOUT, TIMEOUT_VARIABLE, Deadline, poll_pauses, readable_within
from .distenv import DistEnv
from .errors import RendezvousError

MPI_LAUNCHERS = ("openmpi", "pmi", "mvapich", "pals", "flux", "jsrun", "mpi4py")
MPI_KILL_GRACE = 5.0  # seconds between the SIGTERM and the SIGKILL for a rank stuck in MPI_Init past its bound


def mpi_comm(env: DistEnv, environ: Mapping[str, str], timeout: float = DEFAULT_TIMEOUT) -> Any:
    """COMM_WORLD, importing mpi4py only now. Open MPI's ofi transport costs ~1 s of MPI_Init and we only
    broadcast a few bytes, so it is left out unless the user chose transports (`OMPI_MCA_btl`).

    Importing mpi4py.MPI runs MPI_Init, which waits for every rank to call it, bounded by `timeout` (see
    `_import_mpi`)."""
    if "mpi4py.MPI" not in sys.modules and env.launcher == "openmpi" and "OMPI_MCA_btl" not in environ:
        os.environ.setdefault("OMPI_MCA_btl", "^ofi")
    try:
        MPI = _import_mpi(timeout, (
            f"slurmdist: MPI_Init did not complete within {timeout:.0f} s on rank {env.rank} (world size "
            f"{env.world_size}): it waits for every rank of the launch, so some rank has not reached "
            "slurmdist.init() or `slurmdist run` (crashed, stuck before it, or never started: check the launcher's "
            "task count). "
            f"Ending this process. Raise {TIMEOUT_VARIABLE} if the ranks are only slow, or set MASTER_ADDR and "
            "MASTER_PORT to skip MPI\n"
        ))
    except ImportError as exc:
        if env.master_addr is None:
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
    comm = MPI.COMM_WORLD
    if comm.Get_size() != env.world_size or comm.Get_rank() != env.rank:
        raise RendezvousError(
            f"MPI says rank {comm.Get_rank()} of {comm.Get_size()} but the {env.launcher} variables say rank "
            f"{env.rank} of {env.world_size}: mpi4py is linked against a different MPI than the launcher "
            "(rebuild mpi4py with the launcher's mpicc), or those variables were changed or inherited from "
            "another launch (unset them)"
        )
    return comm


def _import_mpi(timeout: float, message: str) -> Any:
    """mpi4py.MPI, running MPI_Init on first import. MPI_Init holds the interpreter lock while it waits, so
    no thread of this process can bound it: a watcher process forked just before prints `message` and ends
    this process (SIGTERM, then SIGKILL: a Python handler cannot run inside MPI_Init) if it is still inside
    after `timeout` seconds. ImportError when mpi4py is missing."""
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


def mpi_broadcast(comm: Any, text: Optional[str], deadline: Deadline, size: int = 512) -> str:
    """Rank 0's `text` on every rank, via a non-blocking broadcast polled against the deadline."""
    buffer = bytearray(size)
    if text is not None:
        data = text.encode()
        buffer[: len(data)] = data
    request = comm.Ibcast(buffer, root=0)
    pauses = poll_pauses()
    while not request.Test():
        if deadline.expired():
            _abort_at_exit(1)
            waiting_for = "rank 0 has not" if text is None else "the other ranks have not all"
            raise RendezvousError(
                f"rank {comm.Get_rank()}: rank 0's address was not shared over MPI within {deadline.seconds:.0f} s "
                f"(world size {comm.Get_size()}): {waiting_for} reached slurmdist.init() or `slurmdist run` "
                "(crashed, stuck before it, or never calling it). This process ends the MPI job when it exits"
            )
        time.sleep(next(pauses))
    _abort_at_exit(0)  # a retry the caller made after a timeout went through: finalize as usual
    return bytes(buffer).rstrip(b"\0").decode()


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
            "free port), or, under srun, unset RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE and let slurmdist "
            "read srun's own variables"
        )
    if env.launcher not in MPI_LAUNCHERS:
        raise RendezvousError(
            f"the {env.launcher} launch gave no master address/port; set MASTER_ADDR and MASTER_PORT"
        )

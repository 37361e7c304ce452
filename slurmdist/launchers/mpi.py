"""MPI launchers that export rank variables: Open MPI, MVAPICH2, Cray PALS, LSF jsrun and PMI (MPICH/Hydra).

They differ only in the variable names, so each is one row of `RankVariables`. Only PALS exports a node index,
so across several nodes `node_rank` and `num_nodes` are None here (MPI numbers ranks, not nodes), as is the
master address: `init()` learns rank 0's over MPI itself, and numbers the nodes from the ranks' host names.
"""

from __future__ import annotations

from typing import Collection, Dict, Mapping, NamedTuple, Optional, Tuple

from ..distenv import LOOPBACK, DistEnv
from ..envvars import (
    check_index, check_within, explicit_master, read_count, read_text, require_count, scheduler_job_id,
)
from ..errors import LaunchError, quoted
from ..ports import step_port


class RankVariables(NamedTuple):
    """The variable names one MPI launcher uses."""

    launcher: str
    rank: str
    size: str
    local_rank: str
    local_size: str
    node_rank: Optional[str] = None
    # A value every rank of one launch shares (and another launch does not): on one node, a port derives
    # from it, so the ranks meet without MPI itself. Launchers without one agree on a port over mpi4py.
    launch_id: Optional[str] = None


OPENMPI = RankVariables(
    "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", launch_id="PMIX_NAMESPACE",
)
MVAPICH = RankVariables(
    "mvapich", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"
)
PALS = RankVariables("pals", "PALS_RANKID", "PMI_SIZE", "PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE", node_rank="PALS_NODEID")
JSRUN = RankVariables(
    "jsrun", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_LOCAL_SIZE"
)
PMI = RankVariables("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")

# Most specific first: PALS and MVAPICH2 (under Hydra) also set PMI_RANK/PMI_SIZE.
SPECS: Tuple[RankVariables, ...] = (OPENMPI, MVAPICH, PALS, JSRUN, PMI)
SPEC_OF: Dict[str, RankVariables] = {spec.launcher: spec for spec in SPECS}


def read(spec: RankVariables, environ: Mapping[str, str]) -> Optional[DistEnv]:
    """The topology under one MPI launcher; None when its rank variable is absent."""
    if spec.rank not in environ:
        return None
    name = spec.launcher
    world_size = require_count(environ, spec.size, name, minimum=1)
    rank = require_count(environ, spec.rank, name)
    check_index(name, spec.rank, rank, spec.size, world_size)
    if spec.local_rank not in environ and spec.local_size not in environ and world_size == 1:
        local_rank, local_world_size = 0, 1
    else:
        unknown = "this process's place on its node is unknown"
        local_world_size = require_count(environ, spec.local_size, name, minimum=1, why=unknown)
        local_rank = require_count(environ, spec.local_rank, name, why=unknown)
    check_index(name, spec.local_rank, local_rank, spec.local_size, local_world_size)
    check_within(name, spec.local_size, local_world_size, spec.size, world_size)
    node_rank = read_count(environ, spec.node_rank) if spec.node_rank else None
    if node_rank is not None:  # no more nodes than ranks
        check_index(name, str(spec.node_rank), node_rank, spec.size, world_size)
    return rank_env(
        environ,
        launcher=name,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        launch_id=read_text(environ, spec.launch_id) if spec.launch_id else None,
    )


def read_any(
    environ: Mapping[str, str], *, complete_only: bool = False, skip: Collection[str] = ()
) -> Optional[DistEnv]:
    """The first MPI launcher whose variables are present, other than those named in `skip`.

    With `complete_only`, launchers whose local-rank variable is missing are passed over: inside an srun
    step, a bare PMI_RANK/PMI_SIZE is srun's own PMI (``--mpi=pmi2``), not another launcher.
    """
    for spec in SPECS:
        if spec.launcher in skip or (complete_only and spec.local_rank not in environ):
            continue
        env = read(spec, environ)
        if env is not None:
            return env
    return None


def refuse_hydra_port_mode(environ: Mapping[str, str]) -> None:
    """MPICH's and Intel MPI's Hydra started with `-pmi-port` gives each rank PMI_PORT and its rank as PMI_ID,
    but no PMI_RANK or PMI_SIZE (Hydra's proxy sets one pair or the other): the world size is in no variable.
    Read past, each rank would be a single process, or inside an allocation the proxy's srun task."""
    if "PMI_ID" not in environ or "PMI_PORT" not in environ or PMI.rank in environ:
        return
    raise LaunchError(
        f"PMI_PORT={quoted(environ['PMI_PORT'])} and PMI_ID={quoted(environ['PMI_ID'])} say MPICH's or Intel MPI's "
        "mpiexec (Hydra) started this process in its -pmi-port mode, which exports the rank but not how many ranks "
        "there are (no PMI_RANK, PMI_SIZE): start mpiexec without -pmi-port (its default sets PMI_RANK and "
        "PMI_SIZE), start the ranks with srun, or export RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and "
        "MASTER_ADDR/MASTER_PORT per rank",
        "PMI_ID",
        environ["PMI_ID"],
    )


def refuse_bare_pmix(environ: Mapping[str, str]) -> None:
    """For a process no launcher describes: PMIX_RANK above 0 says it is one of several ranks of a PMIx
    launcher whose other variables slurmdist does not read (PRRTE's prterun or prun without Open MPI's
    personality, which puts no size in the environment). Taken as a single process, every rank would train
    alone as rank 0."""
    rank = read_count(environ, "PMIX_RANK")
    if rank:
        raise LaunchError(
            f"PMIX_RANK={rank} says this process is rank {rank} of a PMIx launch (prterun, prun), but no variable "
            "slurmdist reads says how many ranks it has or where they are: start it with Open MPI's mpirun "
            "(OMPI_COMM_WORLD_*) or srun --mpi=pmix, export RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE "
            "and MASTER_ADDR/MASTER_PORT per rank, or unset PMIX_RANK if it is left over",
            "PMIX_RANK",
            environ["PMIX_RANK"],
        )


def rank_env(
    environ: Mapping[str, str],
    *,
    launcher: str,
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    node_rank: Optional[int] = None,
    num_nodes: Optional[int] = None,
    launch_id: Optional[str] = None,
) -> DistEnv:
    """A DistEnv for a launcher without a nodelist: one node is loopback, several are resolved at init."""
    single_node = local_world_size == world_size
    if single_node:
        node_rank, num_nodes = 0, 1
    master_addr, master_port = explicit_master(environ)
    if master_port is None and single_node and launch_id:
        master_port = step_port(launch_id, "0")
    return DistEnv(
        launcher=launcher,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr or (LOOPBACK if single_node else None),
        master_port=master_port,
        job_id=scheduler_job_id(environ),
    )


"""Flux: the job shell exports rank, local id, job size and node count, but no per-node task count."""

from __future__ import annotations

from typing import Mapping, Optional

from ..distenv import DistEnv
from ..envvars import check_index, check_within, require_count
from ..errors import LaunchError
from .mpi import rank_env


TASK_RANK = "FLUX_TASK_RANK"


def read(environ: Mapping[str, str]) -> Optional[DistEnv]:
    if TASK_RANK not in environ:
        return None
    world_size = require_count(environ, "FLUX_JOB_SIZE", "flux", minimum=1)
    num_nodes = require_count(environ, "FLUX_JOB_NNODES", "flux", minimum=1)
    rank = require_count(environ, "FLUX_TASK_RANK", "flux")
    local_rank = require_count(environ, "FLUX_TASK_LOCAL_ID", "flux")
    check_index("flux", "FLUX_TASK_RANK", rank, "FLUX_JOB_SIZE", world_size)
    check_within("flux", "FLUX_JOB_NNODES", num_nodes, "FLUX_JOB_SIZE", world_size)
    if world_size % num_nodes:
        # Flux does not say how an uneven job was spread, and a guess would bind the wrong device.
        raise LaunchError(
            f"flux: FLUX_JOB_SIZE={world_size} tasks on FLUX_JOB_NNODES={num_nodes} nodes is an uneven layout, "
            "and Flux does not export the number of tasks on each node. Use a task count that divides evenly "
            "(e.g. `flux run -N2 --tasks-per-node=4`).",
            "FLUX_JOB_SIZE",
            str(world_size),
        )
    per_node = world_size // num_nodes
    if local_rank >= per_node:
        # A job without -N is spread as the scheduler found cores (3 + 1 for `flux run -n4` on 3-core nodes):
        # an even division of the counts says nothing about how the tasks sit.
        raise LaunchError(
            f"flux: FLUX_TASK_LOCAL_ID={local_rank} says this node runs at least {local_rank + 1} tasks, more than "
            f"the {per_node} an even layout of FLUX_JOB_SIZE={world_size} tasks on FLUX_JOB_NNODES={num_nodes} nodes "
            "gives: Flux spread the job unevenly, and it does not export the number of tasks on each node, so "
            f"every node's share is unknown. Ask for an even layout (`flux run -N{num_nodes} --tasks-per-node="
            f"{per_node}`), or export RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and MASTER_ADDR/MASTER_PORT "
            "per task",
            "FLUX_TASK_LOCAL_ID",
            str(local_rank),
        )
    return rank_env(
        environ,
        launcher="flux",
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=per_node,
        node_rank=_node_rank(rank, num_nodes, per_node),
        num_nodes=num_nodes,
    )


def _node_rank(rank: int, num_nodes: int, per_node: int) -> Optional[int]:
    """This task's node index, where the task map does not matter: one node, or one task per node. Elsewhere
    Flux exports no node index, and no single task can tell its task map (block, the default, or cyclic or
    manual) from its own variables: None, not a guess that would land in GROUP_RANK."""
    if num_nodes == 1:
        return 0
    return rank if per_node == 1 else None

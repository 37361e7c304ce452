"""torchrun / torchelastic (and hand-exported RANK, WORLD_SIZE, LOCAL_RANK), and DeepSpeed's launcher."""

from __future__ import annotations

from typing import Mapping, Optional

from ..distenv import DistEnv, check_every_node_runs_one
from ..envvars import check_index, check_within, explicit_master, read_count, require_count, scheduler_job_id
from ..errors import LaunchError, quoted

_CORE = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
# DeepSpeed's launcher (deepspeed.launcher.launch) exports torch's core variables with its own names for the
# rest: LOCAL_SIZE for LOCAL_WORLD_SIZE, CROSS_RANK / CROSS_SIZE for GROUP_RANK / GROUP_WORLD_SIZE. torchrun's
# names win where both are set.
DEEPSPEED_LOCAL_SIZE = "LOCAL_SIZE"
# (local world size, node rank, node count) in each spelling.
TORCHRUN_NAMES = ("LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")
DEEPSPEED_NAMES = (DEEPSPEED_LOCAL_SIZE, "CROSS_RANK", "CROSS_SIZE")


def present(environ: Mapping[str, str]) -> bool:
    """torchrun sets TORCHELASTIC_RUN_ID; a hand-made env:// launch at least the three core variables."""
    return "TORCHELASTIC_RUN_ID" in environ or all(name in environ for name in _CORE)


def refuse_partial(environ: Mapping[str, str]) -> None:
    """For a process no launcher describes: RANK or WORLD_SIZE without the rest of torchrun's variables that
    says it is one of several processes (torch's own env:// contract, as Kubeflow's PyTorchJob exports it)
    is an error. Taken as a single process, each such process would train alone as rank 0."""
    rank = read_count(environ, "RANK")
    world_size = read_count(environ, "WORLD_SIZE", minimum=1)
    if not (world_size or 1) > 1 and not (rank or 0) > 0:
        return
    given = [f"{name}={quoted(environ[name])}" for name in _CORE if name in environ]
    missing = [name for name in _CORE if name not in environ]
    raise LaunchError(
        f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} set, so this process is one of several, but "
        f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not, and no launcher slurmdist reads "
        "(srun, torchrun, mpirun, ...) started it: its place in the job is unknown. Export RANK, WORLD_SIZE, "
        "LOCAL_RANK and LOCAL_WORLD_SIZE (0 and 1 for one process per node or pod), start it with a launcher, "
        f"or unset {' and '.join(name for name in _CORE if name in environ)}.",
        missing[0],
    )


def read(environ: Mapping[str, str]) -> Optional[DistEnv]:
    """torchrun's workers, hand-made env:// exports, and DeepSpeed launcher's workers (launcher "deepspeed")."""
    if not present(environ):
        return None
    world_size = require_count(environ, "WORLD_SIZE", "torchrun", minimum=1)
    rank = require_count(environ, "RANK", "torchrun")
    local_rank = require_count(environ, "LOCAL_RANK", "torchrun")
    # DeepSpeed's names as a whole set, only where torchrun's are absent and the world is several processes: a
    # helper a DeepSpeed worker starts with WORLD_SIZE=1 inherits them and is still one process alone.
    deepspeed = "LOCAL_WORLD_SIZE" not in environ and DEEPSPEED_LOCAL_SIZE in environ and world_size > 1
    launcher = "deepspeed" if deepspeed else "torchrun"
    local_size_name, node_name, nodes_name = DEEPSPEED_NAMES if deepspeed else TORCHRUN_NAMES
    local_world_size = read_count(environ, local_size_name, minimum=1)
    if local_world_size is None:
        if world_size != 1:
            raise LaunchError(
                f"RANK/WORLD_SIZE/LOCAL_RANK are set (WORLD_SIZE={world_size}) but LOCAL_WORLD_SIZE is not, so "
                "the number of processes on this node is unknown. Export LOCAL_WORLD_SIZE too (torchrun does; "
                "DeepSpeed's launcher sets LOCAL_SIZE), or unset RANK/WORLD_SIZE/LOCAL_RANK and let slurmdist "
                "read the launcher's own variables.",
                "LOCAL_WORLD_SIZE",
            )
        local_world_size = 1
    node_rank = read_count(environ, node_name)
    num_nodes = read_count(environ, nodes_name, minimum=1)
    if node_rank is None and num_nodes is None and local_world_size == world_size:
        node_rank, num_nodes = 0, 1  # every process is on this node (set by hand, or one process alone)
    # Named checks before DistEnv's own: the message then names the variables that disagree.
    check_index(launcher, "RANK", rank, "WORLD_SIZE", world_size)
    check_index(launcher, "LOCAL_RANK", local_rank, local_size_name, local_world_size)
    check_within(launcher, local_size_name, local_world_size, "WORLD_SIZE", world_size)
    if num_nodes is not None:  # every node (agent) runs at least one worker
        check_within(launcher, nodes_name, num_nodes, "WORLD_SIZE", world_size)
    if node_rank is not None and num_nodes is not None:
        check_index(launcher, node_name, node_rank, nodes_name, num_nodes)
    check_every_node_runs_one(launcher, node_rank, num_nodes, local_world_size, world_size,
                              (node_name, nodes_name, local_size_name, "WORLD_SIZE"))
    master_addr, master_port = explicit_master(environ)
    return DistEnv(
        launcher=launcher,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=master_port,
        job_id=scheduler_job_id(environ) or environ.get("TORCHELASTIC_RUN_ID") or None,
    )


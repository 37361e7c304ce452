"""submitit's LocalExecutor: several tasks on this machine, described by SUBMITIT_LOCAL_* variables.

It is checked before Slurm, because a LocalExecutor started from inside an interactive allocation inherits
that allocation's SLURM_* variables, which describe the allocation and not these tasks.
"""

from __future__ import annotations

from typing import Mapping, Optional

from ..distenv import LOOPBACK, DistEnv
from ..envvars import check_index, explicit_master, read_text, require_count
from ..ports import step_port

LAUNCHER = "submitit-local"


def read(environ: Mapping[str, str]) -> Optional[DistEnv]:
    # The LocalExecutor's controller process has the executor marker but no per-task id: it is not a task.
    if environ.get("SUBMITIT_EXECUTOR") != "local" or "SUBMITIT_LOCAL_GLOBALID" not in environ:
        return None
    world_size = require_count(environ, "SUBMITIT_LOCAL_NTASKS", LAUNCHER, minimum=1)
    rank = require_count(environ, "SUBMITIT_LOCAL_GLOBALID", LAUNCHER)
    local_rank = require_count(environ, "SUBMITIT_LOCAL_LOCALID", LAUNCHER)
    check_index(LAUNCHER, "SUBMITIT_LOCAL_GLOBALID", rank, "SUBMITIT_LOCAL_NTASKS", world_size)
    check_index(LAUNCHER, "SUBMITIT_LOCAL_LOCALID", local_rank, "SUBMITIT_LOCAL_NTASKS", world_size)
    job_id = read_text(environ, "SUBMITIT_LOCAL_JOB_ID")
    master_addr, master_port = explicit_master(environ)
    if master_port is None:
        master_port = step_port(job_id or "0", "0")
    return DistEnv(
        launcher=LAUNCHER,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=world_size,  # the LocalExecutor runs every task on this one machine
        node_rank=0,
        num_nodes=1,
        master_addr=master_addr or LOOPBACK,
        master_port=master_port,
        job_id=job_id,
    )

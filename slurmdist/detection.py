"""`detect()`: which launcher started this process, and who this process is. Pure dictionary work.

Precedence, first match wins:

1. torchrun (often run inside srun, one agent per node: its children's variables describe them)
2. submitit's LocalExecutor (its tasks may inherit an outer allocation's SLURM_* variables)
3. an srun step, unless an MPI launcher's complete variables are present (mpirun inside an allocation starts
   its daemons with srun, so its ranks carry the daemons' step variables)
4. MPI launchers: Open MPI, MVAPICH2, Cray PALS, LSF jsrun, PMI (MPICH, Intel MPI, Hydra), Flux
5. a Slurm job outside any step: the batch script with several tasks is an error, an salloc shell a warning
6. a single process, unless RANK or WORLD_SIZE say it is one of several (an incomplete env:// export: an error),
   or PMIX_RANK does (a PMIx launcher that exports no size: an error)
"""

from __future__ import annotations

import functools
import os
from typing import Callable, Dict, Mapping, Optional, Tuple

from .distenv import LOOPBACK, DistEnv
from .envvars import explicit_master, require_mapping, scheduler_job_id
from .errors import LaunchError
from .launchers import flux, mpi, slurm, submitit_local, torchrun
from .notices import warn_once

Reader = Callable[[Mapping[str, str]], Optional[DistEnv]]

# Readers by launcher name, for SLURMDIST_LAUNCHER=NAME (forces one when the variables are ambiguous).
READERS: Dict[str, Reader] = {
    "torchrun": torchrun.read,
    "deepspeed": torchrun.read,
    "submitit-local": submitit_local.read,
    "slurm": slurm.read_step,
    **{spec.launcher: functools.partial(mpi.read, spec) for spec in mpi.SPECS},
    "flux": flux.read,
}

FORCE_VARIABLE = slurm.OVERRIDE_VARIABLE


def detect(environ: Optional[Mapping[str, str]] = None) -> DistEnv:
    """The topology of this process, read from `environ` (default: ``os.environ``, never modified).

    Raises `LaunchError` naming the variable and value when the launcher's variables are malformed or
    contradict each other, and in an sbatch batch script that asked for several tasks but has no srun.
    """
    environ = os.environ if environ is None else require_mapping(environ)
    forced = environ.get(FORCE_VARIABLE)
    if forced is not None and forced.strip():  # set to nothing (`export SLURMDIST_LAUNCHER=`): unset
        return _forced(forced, environ)
    env = torchrun.read(environ)
    if env is not None:
        return _unless_stale(env, environ)
    env = submitit_local.read(environ)
    if env is not None:
        return env
    step = slurm.read_step(environ)
    launched_by_mpi = _read_mpi(environ, inside_step=step is not None)
    if step is not None and not _started_inside_step(step, launched_by_mpi, environ):
        return step
    if launched_by_mpi is not None:
        return launched_by_mpi
    job_id = slurm.check_outside_step(environ)
    torchrun.refuse_partial(environ)
    mpi.refuse_bare_pmix(environ)
    return single(environ, job_id=job_id)


def _unless_stale(env: DistEnv, environ: Mapping[str, str]) -> DistEnv:
    """torchrun's variables exported by hand (TORCHELASTIC_RUN_ID unset) that contradict the launch this process
    is a task of (an srun step, else an MPI launcher's ranks) get a warning. Exported once in the job script,
    every task has the same RANK, and init() fails far away ('checked in twice', no master address); left over
    from a notebook, an outer job or an `eval "$(slurmdist env --format shell)"`, each task trains alone as
    rank 0. They are still used: a launcher of its own inside the tasks (DeepSpeed's, accelerate's, mpirun's),
    a helper process (`WORLD_SIZE=1` for an evaluation), or one independent run per task sets them on purpose,
    and no task can tell those from a mistake. `SLURMDIST_LAUNCHER=torchrun` silences it."""
    if "TORCHELASTIC_RUN_ID" in environ:
        _warn_if_torchrun_leaves_nodes(env, environ)
        return env
    step, by_mpi = _launch_around(environ)  # the exported ones are all there is when that launch's are malformed
    outer = step or by_mpi
    if outer is None or env.world_size > outer.world_size or _same_placement(env, outer):
        return env
    if by_mpi is not None and _same_placement(env, by_mpi):  # placed by mpirun inside the allocation
        return env
    place = _place_in(outer, step is not None, environ,
                      f" (local {outer.local_rank} of {outer.local_world_size})")
    if step is not None:
        advice = ("Exported once in the job script, they are the same in every task (unset them: slurmdist, and "
                  "`srun slurmdist run -- ...` for other programs, read srun's own variables instead); left over "
                  "from elsewhere, unset them")
    else:
        advice = (f"Left over from elsewhere (an `eval \"$(slurmdist env --format shell)\"` in this shell), unset "
                  f"them: slurmdist reads {outer.launcher}'s own variables, and `mpirun slurmdist run -- ...` sets them "
                  "per rank")
    warn_once(
        f"slurmdist: RANK={env.rank} WORLD_SIZE={env.world_size} LOCAL_RANK={env.local_rank} LOCAL_WORLD_SIZE="
        f"{env.local_world_size} are set by hand (TORCHELASTIC_RUN_ID is not) but this process is {place}; using "
        f"them. {advice}. Set SLURMDIST_LAUNCHER=torchrun if they are meant",
        __file__,
    )
    return env


def _warn_if_torchrun_leaves_nodes(env: DistEnv, environ: Mapping[str, str]) -> None:
    """torchrun's group spans fewer nodes than the Slurm launch it runs in: `torchrun --standalone` (or
    `--nnodes=1`) in each task of `srun -N2`, where each node trains apart and writes the same checkpoints, or
    in the batch script of an `-N2` job, which runs on the first node alone. Nodes that run apart on purpose
    (one experiment each) are rare but possible, so a warning; `SLURMDIST_LAUNCHER=torchrun` silences it."""
    try:
        launch = slurm.launch_nodes(environ)
    except LaunchError:  # malformed Slurm variables: torchrun's own are what this process runs on
        return
    if env.num_nodes is None or launch is None or launch[1] <= env.num_nodes:
        return
    name, nodes, where = launch
    group = f"torchrun's group spans {env.num_nodes} node{'s' if env.num_nodes > 1 else ''} (GROUP_WORLD_SIZE=" \
            f"{env.num_nodes}), but this process runs in {where}, which spans {nodes} nodes ({name}={nodes})"
    if slurm.step_id(environ) is not None:  # a task step's; else the batch script's
        what = ("if each node runs torchrun --standalone (or --nnodes=1), each forms a group of its own, and the "
                "nodes train apart, writing the same checkpoints (an elastic run some nodes left is fine). For one "
                "job across the nodes, start torchrun with --nnodes=$SLURM_NNODES and one "
                "rendezvous (--rdzv-backend=c10d --rdzv-endpoint=FIRST_NODE:29500), as sbatch/train_torchrun.sh "
                "does, or start one task per GPU with srun and no torchrun")
    else:
        what = (f"the batch script runs on the first node alone, so the other {nodes - 1} stay idle. Start torchrun "
                "on every node with `srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES ...`, as "
                "sbatch/train_torchrun.sh does, or one task per GPU with srun and no torchrun")
    warn_once(f"slurmdist: {group}: {what}. Set SLURMDIST_LAUNCHER=torchrun if the nodes are meant to run apart",
              __file__)


def single(environ: Mapping[str, str], job_id: Optional[str] = None) -> DistEnv:
    """Rank 0 of 1 on this machine."""
    master_addr, master_port = explicit_master(environ)
    return DistEnv(
        launcher="single",
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr=master_addr or LOOPBACK,
        master_port=master_port,
        job_id=job_id or scheduler_job_id(environ),
    )


def _read_mpi(environ: Mapping[str, str], *, inside_step: bool) -> Optional[DistEnv]:
    """An MPI launcher's view, else Flux's. Inside an srun step or a Flux job, a bare PMI_RANK/PMI_SIZE
    (no local-rank variable) is that launcher's own PMI server, not an MPI launcher of its own; so are the
    PALS variables srun's Cray MPI plugin sets in its own tasks. Hydra's -pmi-port mode, which says no world
    size, is refused where no launcher's variables describe the process (MVAPICH2's mpirun_rsh sets PMI_PORT
    and PMI_ID too, beside its own), before a step or a single process could be taken for it."""
    inside_flux = flux.TASK_RANK in environ
    skip = ("pals",) if inside_step and _set_by_srun_for_cray_mpi(environ) else ()
    found = mpi.read_any(environ, complete_only=inside_step or inside_flux, skip=skip) or flux.read(environ)
    if found is None:
        mpi.refuse_hydra_port_mode(environ)
    return found


def _set_by_srun_for_cray_mpi(environ: Mapping[str, str]) -> bool:
    """True when the PALS variables are srun's own: its ``mpi/cray_shasta`` plugin (the default on many HPE
    Cray sites) sets PALS_RANKID, PALS_LOCAL_RANKID and PMI_* in every task of the step, but no
    PALS_LOCAL_SIZE, and names the step in PALS_APID ("JOB.STEP"). The same on every task, so the whole step
    reads as srun's, as ``--mpi=pmi2``'s does."""
    apid = environ.get("PALS_APID")  # absent in nearly every step: then no step or job id is read again
    return apid is not None and apid.strip() == f"{slurm.job_id(environ)}.{slurm.step_id(environ)}"


def _started_inside_step(step: DistEnv, launched_by_mpi: Optional[DistEnv], environ: Mapping[str, str]) -> bool:
    """True when a launcher that srun started (mpirun's daemons, a Flux instance's brokers) started this
    process: its variables then describe it, not the step's. A Flux job's tasks are always Flux's, even
    placed as the broker step's tasks are (`srun -N2 --ntasks-per-node=1 flux start`, then `flux run -N2`):
    two such jobs at once would otherwise both meet at the step's port."""
    if launched_by_mpi is not None and launched_by_mpi.launcher == "flux" and flux.TASK_RANK in environ:
        return True
    return _mpirun_inside_step(step, launched_by_mpi, environ)


def _mpirun_inside_step(step: DistEnv, launched_by_mpi: Optional[DistEnv], environ: Mapping[str, str]) -> bool:
    """True when an MPI launcher's complete variables (its local rank too) are present: mpirun's daemons, which
    srun started, started this process, so MPI's variables describe it and the daemon step's do not. srun's own
    PMI (``--mpi=pmi2``) sets no local rank, and `_read_mpi` passes it over.

    Decided the same way on every rank: comparing each rank with the daemon step instead would read a rank
    that happens to sit where the daemon does (rank 0, and rank 2 of 3 with ``--host`` in the allocation's
    order) as the step's task and its neighbours as MPI's, and the two halves would wait for each other. A
    daemon step has one task per node, so a step with several tasks here did not start these ranks: its MPI
    variables are most likely inherited (a job submitted from inside an mpirun rank), which gets a warning.
    """
    if launched_by_mpi is None:
        return False
    if step.local_world_size > 1 and not _same_placement(launched_by_mpi, step):
        spec = mpi.SPEC_OF.get(launched_by_mpi.launcher)
        named = f"{spec.rank}, {spec.size}" if spec else "its variables"
        warn_once(
            f"slurmdist: {named} say this process is rank {launched_by_mpi.rank} of {launched_by_mpi.world_size} "
            f"(local {launched_by_mpi.local_rank} of {launched_by_mpi.local_world_size}) of the "
            f"{launched_by_mpi.launcher} launch that set them, but it is task {step.rank} of {step.world_size} of srun step "
            f"{slurm.step_id(environ) or '?'} of job {step.job_id}, with {step.local_world_size} tasks on this "
            "node: mpirun's daemons run one per node, so these variables were most likely inherited (a job "
            "submitted from inside an mpirun rank), or each srun task started an mpirun of its own (`srun -n2 "
            "mpirun ...`: each launch then trains apart; start one mpirun, from the batch script or with `srun -N1 "
            f"-n1 mpirun ...`). Using the {launched_by_mpi.launcher} ones; unset them if they "
            f"are left over, or set SLURMDIST_LAUNCHER=slurm to read the step (SLURMDIST_LAUNCHER="
            f"{launched_by_mpi.launcher} if they are meant)",
            __file__,
        )
    return True


_PLACEMENT = ("rank", "world_size", "local_rank", "local_world_size")


def _same_placement(one: DistEnv, other: DistEnv) -> bool:
    return all(getattr(one, name) == getattr(other, name) for name in _PLACEMENT)


def is_own_srun_task(env: DistEnv, environ: Mapping[str, str]) -> bool:
    """True when this process is an srun task of its own, so devices Slurm narrowed per task are its alone.

    srun started it directly (launcher "slurm"), or the variables `detect()` read place it exactly as the
    step does: `srun slurmdist run -- python train.py`, or a job script that exports RANK/LOCAL_RANK from
    the step's. torchrun's workers and mpirun's ranks inside one task are placed differently.
    """
    if env.launcher == "slurm":
        return True
    try:
        step = slurm.read_step(environ)
    except LaunchError:  # malformed step variables: detect() did not rely on them either
        return False
    return step is not None and _same_placement(step, env)


def _launch_around(environ: Mapping[str, str]) -> Tuple[Optional[DistEnv], Optional[DistEnv]]:
    """The srun step and the MPI launch this process is a task of, each None when there is none; both None
    when their variables are malformed (for the warnings about an override, which then stand alone)."""
    try:
        step = slurm.read_step(environ)
        return step, _read_mpi(environ, inside_step=step is not None)
    except LaunchError:
        return None, None


def _place_in(outer: DistEnv, in_step: bool, environ: Mapping[str, str], detail: str = "") -> str:
    """'task 1 of 4 of srun step 0 of job 7' (or 'rank 1 of 4 of this openmpi launch'), `detail` after the count."""
    where = f"{outer.rank} of {outer.world_size}{detail}"
    if in_step:
        return f"task {where} of srun step {slurm.step_id(environ) or '?'} of job {outer.job_id}"
    return f"rank {where} of this {outer.launcher} launch"


def _warn_if_single_in_a_launch(environ: Mapping[str, str]) -> None:
    """`SLURMDIST_LAUNCHER=single` in a task of a launch of several (an srun step, MPI ranks): exported in the job
    script for one helper command, it makes every later step's tasks train alone, each rank 0 of 1 and each the
    main process writing the same files. Meant in a launch too (one independent run per task), so a warning."""
    step, by_mpi = _launch_around(environ)  # none when its variables are malformed: single is what was asked for
    outer = step or by_mpi
    if outer is None or outer.world_size == 1:
        return
    place = _place_in(outer, step is not None, environ)
    warn_once(
        f"slurmdist: {FORCE_VARIABLE}=single, but this process is {place}: each of its processes runs alone, as "
        f"rank 0 of 1 (each the main one, writing the same files). Meant for one helper command in the job script? "
        f"Set it on that command alone (`{FORCE_VARIABLE}=single python prep.py`), not with export",
        __file__,
    )


def _forced(name: str, environ: Mapping[str, str]) -> DistEnv:
    name = name.strip()
    if name == "single":
        _warn_if_single_in_a_launch(environ)
        return single(environ)
    reader = READERS.get(name)
    if reader is None:
        choices = ", ".join(sorted([*READERS, "single"]))
        raise LaunchError(f"{FORCE_VARIABLE}={name!r} is not a launcher slurmdist reads; use one of {choices} "
                          "(MPICH, Intel MPI and other Hydra launches are pmi)", FORCE_VARIABLE, name)
    env = reader(environ)
    if env is None:
        raise LaunchError(
            f"{FORCE_VARIABLE}={name!r} but that launcher's variables are not set in this process; "
            f"unset {FORCE_VARIABLE} or launch with {name}",
            FORCE_VARIABLE,
            name,
        )
    return env

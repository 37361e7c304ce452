"""Slurm: an srun step, and the two places that are not one (the batch script and the salloc shell).

Only a real srun step has ``SLURM_STEP_ID``: the batch script has ``SLURM_PROCID=0`` and the whole job's
task count but runs once, and the salloc shell has neither. Per-step variables (``SLURM_STEP_*``) are the
truth for the step; the job-level ones describe the allocation and may differ (``srun -n3`` in a
``--ntasks-per-node=2`` job still sees ``SLURM_NTASKS_PER_NODE=2``).
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Sequence, Tuple

from ..distenv import DistEnv
from ..envvars import (
    check_index,
    explicit_master,
    first_count,
    parse_tasks_per_node,
    read_text,
    require_count,
    whole_number,
)
from ..errors import HostlistError, LaunchError, quoted
from ..notices import warn_once
from ..ports import step_port


STEP_ID_VARIABLES = ("SLURM_STEP_ID", "SLURM_STEPID")
JOB_ID_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID")
# Step ids of things that are not srun task steps: names, and slurm.h's numeric values. Since 20.11:
# interactive 0xfffffffa, batch 0xfffffffb, extern 0xfffffffc, pending 0xfffffffd; before: batch 0xfffffffe,
# extern 0xffffffff.
BATCH_STEPS = frozenset({"batch", "4294967291", "4294967294"})
NON_TASK_STEPS = BATCH_STEPS | frozenset(
    {"extern", "interactive", "pending", "4294967290", "4294967292", "4294967293", "4294967295"}
)
WORLD_VARIABLES = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
NODES_VARIABLES = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
LAYOUT_VARIABLES = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
NODELIST_VARIABLES = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
DISTRIBUTION_VARIABLE = "SLURM_DISTRIBUTION"
# What to do about step variables that do not fit: srun sets them all together, for each step.
STEP_VARIABLES_ADVICE = ("srun sets the step variables together, for each step: one that does not fit comes from a "
                         "hand-written export or is left over from an outer job. Unset those, or start the process "
                         "with srun")
STEP_VARIABLES_DISAGREE = f"the step variables contradict each other. {STEP_VARIABLES_ADVICE}"
# Heterogeneous jobs: the component count, and the first component's nodes (HET since Slurm 20.02, PACK before
# and still beside it in 22.05).
HET_SIZE_VARIABLES = ("SLURM_HET_SIZE", "SLURM_PACK_SIZE")
FIRST_COMPONENT_NODELIST = ("SLURM_JOB_NODELIST_HET_GROUP_0", "SLURM_JOB_NODELIST_PACK_GROUP_0")
HOSTFILE_VARIABLE = "SLURM_HOSTFILE"
OVERRIDE_VARIABLE = "SLURMDIST_LAUNCHER"  # detection's override; `slurm` takes the step as it stands
LEFT_OVER_ADVICE = ("unset them where the job is submitted, or at the top of its script (bash: `unset "
                    "${!SLURM_STEP_@} SLURM_STEPID`)")


def step_id(environ: Mapping[str, str]) -> Optional[str]:
    """The srun step id, or None outside a task step (batch script, salloc shell, extern step). An empty
    variable defers to the other spelling; both empty is an error."""
    value = _step_value(environ)
    return None if value is None or value in NON_TASK_STEPS else value


def _step_value(environ: Mapping[str, str]) -> Optional[str]:
    """The first step id variable that says something (stripped), task step or not; None when none is set.
    Set but blank, with no other spelling to say more, is an error: Slurm never sets it so, and read as
    "no step" it would call an srun task the batch script."""
    values = [(name, environ[name]) for name in STEP_ID_VARIABLES if name in environ]
    said = next((value.strip() for _, value in values if value.strip()), None)
    if said is None and values:
        name, value = values[0]
        raise LaunchError(f"srun: {name}={quoted(value)} is empty: Slurm sets it to the step's id (a number, or "
                          f"'batch' in the batch script). {STEP_VARIABLES_ADVICE}", name, value)
    return said


def _require_number(environ: Mapping[str, str], names: Tuple[str, ...], what: str) -> None:
    """In a task step, the first of `names` that is set holds a number: the step's port is derived from it."""
    name = next((name for name in names if environ.get(name, "").strip()), None)
    if name is not None and whole_number(environ[name].strip(), max_digits=10) is None:  # uint32 in Slurm
        raise LaunchError(f"srun: {name}={quoted(environ[name])} is not a {what} as Slurm sets it (a number of at "
                          f"most 10 digits): {STEP_VARIABLES_ADVICE}", name, environ[name])


def job_id(environ: Mapping[str, str]) -> Optional[str]:
    for name in JOB_ID_VARIABLES:
        value = read_text(environ, name)
        if value is not None:
            return value
    return None


def read_step(environ: Mapping[str, str]) -> Optional[DistEnv]:
    """The topology of a task in an srun step; None outside one."""
    step = step_id(environ)
    if step is None:
        return None
    rank = require_count(environ, "SLURM_PROCID", "srun")
    local_rank = require_count(environ, "SLURM_LOCALID", "srun")
    node_rank = require_count(environ, "SLURM_NODEID", "srun")
    world_name, world_size = _first_required(environ, WORLD_VARIABLES)
    nodes_name, num_nodes = _first_required(environ, NODES_VARIABLES)
    layout_name, layout = _tasks_per_node(environ)

    if len(layout) != num_nodes:
        raise LaunchError(
            f"srun: {layout_name}={quoted(environ[layout_name])} lists {len(layout)} nodes but "
            f"{nodes_name}={num_nodes}: {STEP_VARIABLES_DISAGREE}",
            layout_name,
            environ[layout_name],
        )
    if sum(layout) != world_size:
        raise LaunchError(
            f"srun: {layout_name}={quoted(environ[layout_name])} adds up to {sum(layout)} tasks but "
            f"{world_name}={world_size}: {STEP_VARIABLES_DISAGREE}",
            layout_name,
            environ[layout_name],
        )
    _check_step_fits_job(environ, world_name, world_size, nodes_name, num_nodes)
    check_index("srun", "SLURM_PROCID", rank, world_name, world_size)
    check_index("srun", "SLURM_NODEID", node_rank, nodes_name, num_nodes)
    master_addr, master_port = explicit_master(environ)
    # Read even when unused: it checks the nodelist against the node count, which this node's place in it needs.
    first_host = _first_host(environ, num_nodes, master_given=master_addr is not None)
    het_nodes = _heterogeneous_step_nodes(environ)
    position = _position(environ, het_nodes, node_rank, num_nodes)
    local_world_size = layout[position]
    check_index("srun", "SLURM_LOCALID", local_rank, f"{layout_name}[node {position}]", local_world_size)

    job = job_id(environ)
    _require_number(environ, STEP_ID_VARIABLES, "step id")
    _require_number(environ, JOB_ID_VARIABLES, "job id")
    if master_addr is None and not arbitrary_layout(environ):
        # Block, cyclic and plane layouts all put task 0 on the first node; a heterogeneous step on the
        # first node of its first component, which Slurm's sorted step nodelist need not start with.
        master_addr = _first_component_host(environ, het_nodes) or first_host
    if master_port is None:
        master_port = step_port(job or "0", step)
    return DistEnv(
        launcher="slurm",
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=master_port,
        job_id=job,
    )


def _check_step_fits_job(environ: Mapping[str, str], world_name: str, world_size: int, nodes_name: str,
                         num_nodes: int) -> None:
    """Step variables left over from another job's srun task. `sbatch` and `salloc` pass the environment on, so a
    job submitted from inside an srun task (rank 0 submitting an evaluation job) starts with that task's
    SLURM_STEP_* beside its own job's variables, and its batch script would read as rank 0 of the old step and
    wait out its timeout for ranks that never come. srun sets SLURM_NNODES and SLURM_NTASKS to its step's own
    counts, except under `--preserve-env` (-E), which leaves the job's: a job has at least as many nodes as any
    of its steps, so more nodes in the step is an error; a step may run more tasks than the job's --ntasks
    (spare CPUs, --overcommit), so more tasks is a warning. `SLURMDIST_LAUNCHER=slurm` takes the step as it
    stands (a nested `srun -E` inside a smaller step)."""
    if environ.get(OVERRIDE_VARIABLE, "").strip() == "slurm":
        return
    nodes = _step_above_job(environ, nodes_name, num_nodes, ("SLURM_NNODES",))
    if nodes is not None:
        raise LaunchError(
            f"srun: {nodes}: a step never spans more nodes than its job, and srun sets SLURM_NNODES to its step's "
            "own (--preserve-env: to the job's), so the SLURM_STEP_* variables are left over from another srun "
            f"step: this job was submitted (sbatch, salloc) from inside an srun task, which passed its environment "
            f"on; {LEFT_OVER_ADVICE}. To start several tasks, use srun in the job script (SLURMDIST_LAUNCHER=slurm "
            "takes the step as it stands)",
            nodes_name,
            str(num_nodes),
        )
    tasks = _step_above_job(environ, world_name, world_size, ("SLURM_NTASKS", "SLURM_NPROCS"))
    if tasks is not None:
        warn_once(
            f"slurmdist: {tasks}: srun sets both to the step's task count, except under --preserve-env (-E). If "
            "this job was submitted from inside an srun task, the SLURM_STEP_* variables are left over from that "
            f"step and this process would wait for ranks that never come: {LEFT_OVER_ADVICE}. "
            "SLURMDIST_LAUNCHER=slurm silences this",
            __file__,
        )


def _step_above_job(environ: Mapping[str, str], step_name: str, step_count: int,
                    job_names: Tuple[str, ...]) -> Optional[str]:
    """'STEP=n but JOB=m' when the step's own variable `step_name` counts more than the first of `job_names`
    that is set; else None."""
    if not step_name.startswith("SLURM_STEP_"):
        return None
    found = first_count(environ, job_names, minimum=1)
    if found is None or step_count <= found[1]:
        return None
    return f"{step_name}={step_count} but {found[0]}={found[1]}"


def _heterogeneous_step_nodes(environ: Mapping[str, str]) -> Optional[List[str]]:
    """The step's nodes, in the order of its nodelist and layout, when the job is heterogeneous (`srun ... :
    ...`, or a step in an allocation made that way); else None, and nothing is expanded."""
    if not any(name in environ for name in HET_SIZE_VARIABLES):
        return None
    return _hosts_of(environ, NODELIST_VARIABLES)  # a bad nodelist: _first_host reports it, naming the variable


def _position(environ: Mapping[str, str], het_nodes: Optional[List[str]], node_rank: int, num_nodes: int) -> int:
    """This node's place in the step's nodelist and layout. SLURM_NODEID, except in a heterogeneous step:
    Slurm sorts its nodelist (and layout) by name while SLURM_NODEID follows the tasks' order. A nodelist of
    another length than the step's (the job's, when the step's is missing) cannot say."""
    name = environ.get("SLURMD_NODENAME", "").strip()
    if het_nodes is not None and len(het_nodes) == num_nodes and name in het_nodes:
        return het_nodes.index(name)
    return node_rank


def _first_component_host(environ: Mapping[str, str], het_nodes: Optional[List[str]]) -> Optional[str]:
    """Task 0's node in a heterogeneous step that runs the job's first component: that component's first node
    in the step (a step may use only some of the component's nodes; the variable lists the allocation's).
    None when the step leaves the first component out (`srun --het-group=1`): its own nodelist's first node
    is then task 0's, as in any step."""
    component = _hosts_of(environ, FIRST_COMPONENT_NODELIST) if het_nodes is not None else None
    in_step = set(het_nodes or ())
    return next((host for host in component or () if host in in_step), None)


def _hosts_of(environ: Mapping[str, str], names: Tuple[str, ...]) -> Optional[List[str]]:
    """The hosts of the first of `names` that is set; None when none is, or it is not a valid hostlist."""
    from .. import hostlist

    raw = next((environ[name] for name in names if name in environ), None)
    try:
        return hostlist.expand(raw) if raw is not None else None
    except HostlistError:
        return None


def arbitrary_layout(environ: Mapping[str, str]) -> bool:
    """True under `srun -m arbitrary`: task i runs on the i-th host of SLURM_HOSTFILE, so task 0 (the
    master) need not be on the nodelist's first node, and only that file says where it is."""
    value = environ.get(DISTRIBUTION_VARIABLE, "")
    return value.split(",")[0].split(":")[0].strip().lower() == "arbitrary"


def hostfile_first_host(text: str, source: str) -> str:
    """Task 0's host from the text of a Slurm hostfile, read as srun reads it: '#' starts a comment ('\\#'
    is a literal '#'), blank lines are skipped, a line holds comma-separated hosts, 'host*N' repeats one."""
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.replace("\\#", "\0").split("#", 1)[0].replace("\0", "#").strip()
        if not line:
            continue
        host = line.split(",", 1)[0].split("*", 1)[0].strip()
        if not host or not host[0].isalnum():
            raise LaunchError(
                f"{HOSTFILE_VARIABLE}={source!r}: line {number} ({line[:80]!r}) does not start with a host name; "
                "srun -m arbitrary would refuse it too",
                HOSTFILE_VARIABLE,
                source,
            )
        return host
    raise LaunchError(
        f"{HOSTFILE_VARIABLE}={source!r} names no host, so the node of task 0 (the rendezvous master) is "
        "unknown; fix the file, or set MASTER_ADDR to task 0's node",
        HOSTFILE_VARIABLE,
        source,
    )


def launch_nodes(environ: Mapping[str, str]) -> Optional[Tuple[str, int, str]]:
    """(variable, node count, what it counts) for the Slurm launch this process runs in: an srun task step's
    nodes, or in the batch script the job's (the script runs on the first of them); None elsewhere (an salloc
    shell, outside Slurm). LaunchError on malformed values."""
    job = job_id(environ)
    if job is None:
        return None
    raw_step = _step_value(environ)
    if raw_step is not None and raw_step not in NON_TASK_STEPS:
        found, where = first_count(environ, NODES_VARIABLES, minimum=1), f"srun step {raw_step} of job {job}"
    elif "SLURM_PROCID" in environ and (raw_step or "batch") in BATCH_STEPS:
        found, where = first_count(environ, NODES_VARIABLES[1:], minimum=1), f"the batch script of job {job}"
    else:
        return None
    return None if found is None else (*found, where)


SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh", "fish", "tcsh", "csh"})


def interactive_shell(argv: Sequence[str]) -> Optional[str]:
    """The shell's name when `argv` starts an interactive one (`bash`, `-bash`, `zsh -l`): no `-c` command and
    no script to run; else None."""
    if not argv:
        return None
    name = argv[0].rpartition("/")[2].lstrip("-")
    if name not in SHELLS or any(arg == "-c" or not arg.startswith("-") for arg in argv[1:]):
        return None
    return name


def pty_shell_hint(env: DistEnv, environ: Mapping[str, str], parent: Sequence[str], tty: bool) -> Optional[str]:
    """For rank 0 of a several-task `srun --pty` step (SLURM_PTY_PORT) typed at an interactive shell (`parent`,
    its command line, with a terminal): why no other rank will come. `srun -n4 --pty bash` runs the shell in
    task 0 alone; the other tasks' shells find no terminal and end, and a `python train.py` typed there is rank
    0 of 4 that would wait out its whole timeout for ranks that are gone. (`srun -n4 --pty bash -c "python
    ..."` runs the command in every task: not this.) None elsewhere."""
    shell = interactive_shell(parent)
    if not (env.launcher == "slurm" and env.rank == 0 and env.world_size > 1 and "SLURM_PTY_PORT" in environ
            and tty and shell):
        return None
    return (f"this is rank 0 of {env.world_size} of srun step {step_id(environ)} of job {env.job_id}, started "
            f"from the {shell} of an interactive `srun --pty` step: only task 0 of such a step runs the shell, and "
            f"the other {env.world_size - 1} ended when theirs found no terminal, so they would never arrive. From "
            "this shell, start the ranks with srun: `srun --overlap python train.py ...` (the step holds the "
            "allocation's CPUs), or open the shell with one task (`srun -n1 --pty bash`, or salloc)")


def check_outside_step(environ: Mapping[str, str]) -> Optional[str]:
    """In a job but not in an srun step: fail fast in a multi-task batch script, warn in an salloc shell.

    Returns the job id when this is a Slurm job at all (the caller then runs as a single process).
    """
    job = job_id(environ)
    if job is None:
        return None
    tasks, source = _allocation_tasks(environ)
    if tasks <= 1:
        return job
    # The batch script carries SLURM_PROCID=0 and no step id (or the "batch" one); an salloc shell or
    # interactive step does not. Only the batch script is known to be one of several tasks that never started.
    raw_step = _step_value(environ) or "batch"
    in_batch_script = "SLURM_PROCID" in environ and raw_step in BATCH_STEPS
    if in_batch_script:
        raise LaunchError(
            f"This process is the batch script of Slurm job {job}, which asked for {tasks} tasks ({source}), "
            "but the batch script runs only once, on the first node: the other tasks were never started and "
            "the job would hang or waste their GPUs. Start the tasks with srun in the job script, e.g. "
            "`srun python train.py ...` (or `srun slurmdist run -- python train.py ...`). "
            "To run one process on purpose, submit with --nodes=1 --ntasks=1; for a helper run once in the job script "
            "beside the srun steps (data preparation, evaluation), set SLURMDIST_LAUNCHER=single for it.",
            source.split("=")[0],
            str(tasks),
        )
    warn_once(
        f"slurmdist: inside Slurm job {job} ({source}) but not in an srun step: running as a single process. "
        f"Use `srun python ...` to start all {tasks} tasks.",
        __file__,
    )
    return job


def _allocation_tasks(environ: Mapping[str, str]) -> Tuple[int, str]:
    """How many tasks a plain `srun` in this job would start, and the variables that say so.

    With a task count asked for (-n, --ntasks-per-node), SLURM_NTASKS says it. Without one, Slurm leaves
    SLURM_NTASKS unset and fills SLURM_TASKS_PER_NODE with the node's CPUs over --cpus-per-task (8 for an
    --exclusive job on 8 cores): not tasks anyone asked for. srun then starts one task per node.
    """
    found = first_count(environ, ("SLURM_NTASKS", "SLURM_NPROCS"), minimum=1)
    if found is not None:
        return found[1], f"{found[0]}={found[1]}"
    nodes = first_count(environ, NODES_VARIABLES[1:], minimum=1)
    if nodes is None:
        return 1, "no task count"
    per_node = first_count(environ, ("SLURM_NTASKS_PER_NODE",), minimum=1)
    if per_node is not None:
        return nodes[1] * per_node[1], f"{nodes[0]}={nodes[1]} x {per_node[0]}={per_node[1]}"
    return nodes[1], f"{nodes[0]}={nodes[1]}, one task per node"


def _first_required(environ: Mapping[str, str], names: Tuple[str, ...]) -> Tuple[str, int]:
    found = first_count(environ, names, minimum=1)
    if found is None:
        raise LaunchError(
            f"srun step detected (SLURM_STEP_ID is set) but none of {', '.join(names)} is; "
            "the environment is incomplete: run under srun, or unset SLURM_STEP_ID",
            names[0],
        )
    return found


def _tasks_per_node(environ: Mapping[str, str]) -> Tuple[str, list]:
    for name in LAYOUT_VARIABLES:
        raw = environ.get(name)
        if raw is not None:
            return name, parse_tasks_per_node(name, raw)
    raise LaunchError(
        f"srun step detected but neither {' nor '.join(LAYOUT_VARIABLES)} is set, so the number of tasks on "
        "this node is unknown; run under srun, or unset SLURM_STEP_ID",
        LAYOUT_VARIABLES[0],
    )


def _first_host(environ: Mapping[str, str], num_nodes: int, *, master_given: bool) -> Optional[str]:
    """First host of the step's nodelist, after checking the whole list parses (and matches the node count).
    None when no nodelist is set but MASTER_ADDR is (a container that passes on only some SLURM_* variables)."""
    from .. import hostlist  # here, not at the top: torchrun and MPI launches never load the grammar

    for name in NODELIST_VARIABLES:
        raw = environ.get(name)
        if raw is None:
            continue
        try:
            hosts = hostlist.count(raw)
            first = hostlist.first(raw)
        except HostlistError as error:
            raise LaunchError(f"{name}: {error}. {STEP_VARIABLES_ADVICE}", name, raw) from None  # it quotes the list
        if name == "SLURM_STEP_NODELIST" and hosts != num_nodes:
            raise LaunchError(
                f"{name}={quoted(raw)} names {hosts} hosts but the step has {num_nodes} nodes: "
                f"{STEP_VARIABLES_DISAGREE}",
                name,
                raw,
            )
        return first
    if master_given:
        return None
    raise LaunchError(
        f"srun step detected but no nodelist ({', '.join(NODELIST_VARIABLES)}) is set, so the master host is "
        "unknown; set MASTER_ADDR, or run under srun",
        NODELIST_VARIABLES[0],
    )

"""Submit distributed training from Python or a notebook: a submitit executor built from what users think in.

    from slurmdist.submit import Submitter, result

    submitter = Submitter(nodes=2, gpus_per_node=4, time="2:00:00", partition="gpu", folder="logs")
    job = submitter.submit(train, lr=0.1)          # a submitit job; inside it `slurmdist.init()` just works
    print(result(job, timeout=3600))              # rank 0's return value, or the remote traceback, promptly

One task per GPU (`gpus_per_node` sets the tasks per node; CPU-only jobs give `tasks_per_node`). submitit runs
the function under srun, so each task is one rank; with ``cluster="local"`` (or no Slurm on this machine) the
same code runs every task on this machine through submitit's LocalExecutor, for laptop debugging.

Jobs get ``--signal=USR2@120 --requeue``: a `slurmdist.requeue.Resumable` function checkpoints and requeues
itself on that signal. `wait`/`results` read the job's state from Slurm with bounded calls (squeue, then sacct)
and report a failure as soon as Slurm does, with the failing task's remote traceback.

Importing this module imports neither submitit nor torch; the executor is built on first use.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import pickle
import re
import shlex
import shutil
import subprocess
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

from . import commands
from .argv import command_words
from .bounds import positive_seconds
from .envvars import is_whole, whole_number
from .errors import SlurmdistError
from .requeue import (DEFAULT_SIGNAL_DELAY, SIGNAL_VARIABLE, RequeueError, Resumable, parse_signal, requeue_limit,
                      signal_delay_problem, slurm_name)
from .sbatch_render import (
    ENDS_THE_SETUP, HAND_ON_CPUS_PER_TASK, HAND_ON_ENVIRONMENT, LOG_PATTERN, NO_LIMIT, OPTION_NAME, managed_option,
    memory_size_fault, setup_syntax_problem,
)
from .task_command import Command, CommandFailed

log = logging.getLogger("slurmdist")

__all__ = [
    "Submitter", "Resources", "Command", "Resumable", "SubmitError", "JobFailedError", "JobTimeoutError",
    "wait", "results", "result", "job_state", "parse_time", "parse_mem", "slurm_parameters", "local_parameters",
]

DEFAULT_FOLDER = "slurmdist-logs/%j"
SLURM_CALL_TIMEOUT = 15.0  # seconds for one squeue/sacct call
SUBMIT_TIMEOUT = 120.0  # seconds for a submission (sbatch answers in well under a second on a healthy cluster)
RESULT_GRACE = 5.0  # seconds to wait for result files after Slurm says the job ended (shared file systems lag)
# After COMPLETED every task returned, so its result file will appear: wait for a lagging shared file system.
COMPLETED_RESULT_GRACE = 30.0
# A result file older than the current run's start (minus this, for clocks that differ a little) was written
# by the run before a requeue.
CLOCK_SLACK = 1.0
# At most half the least time between a run's end and its requeued run's start: Slurm holds a requeued job
# until the old job credential expires (AuthInfo cred_expire, 120 s by default; `run_gap` reads the site's).
RUN_GAP = 60.0
RUN_STARTS = "slurmdist: a run of job"  # the line each run writes first to the batch log (`environment_lines`)
RUN_STARTS_IN_TASK_LOGS = "Starting with JobEnvironment("  # what submitit logs as each run of a task starts

# Variables that describe the launch the submitting process itself runs in (a notebook inside a Slurm job,
# under torchrun or mpirun). sbatch passes the whole environment on, so every task of the new job would read
# them as its own: each would train alone as rank 0 of RANK/WORLD_SIZE, or srun would take the old job's
# layout. They are hidden during submission. SLURM_CONF (which cluster), SBATCH_* (sbatch's own settings) and
# SLURMDIST_* (this library's settings) are kept.
LAUNCH_PREFIXES = (
    "SLURM_", "SLURMD_", "SRUN_", "OMPI_COMM_WORLD_", "PMIX_", "PMI_", "MV2_COMM_WORLD_", "PALS_", "JSM_NAMESPACE_",
    "FLUX_TASK_", "FLUX_JOB_", "TORCHELASTIC_", "SUBMITIT_",
)
LAUNCH_NAMES = frozenset({
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
})
KEPT_VARIABLES = frozenset({"SLURM_CONF"})

# Not Slurm's: slurmctld no longer knows the job (it ended more than MinJobAge ago, 300 s by default) and no
# accounting recorded it. Nothing more happens to it.
FORGOTTEN = "FORGOTTEN"
# Job states after which nothing more happens (a requeued job is PENDING/REQUEUED again, not PREEMPTED).
FINISHED_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
    "PREEMPTED", "REVOKED", "SPECIAL_EXIT", FORGOTTEN,
})
# States in which every task may have written its result before Slurm says the job ended (UNKNOWN: Slurm did
# not answer).
RESULTS_AHEAD_STATES = frozenset({"RUNNING", "COMPLETING", "UNKNOWN"})
# Options slurmdist sets itself: passing them through `sbatch=` would contradict the job's layout or logs.
# sbatch options slurmdist writes itself, and what sets each instead (Submitter's keywords; the command line
# shows them as its options).
MANAGED_OPTIONS = {
    "nodes": "nodes=N",
    "ntasks": "nodes=N with gpus_per_node=G (one task per GPU) or tasks_per_node=T: the task count is their product",
    "ntasks-per-node": "gpus_per_node=G (one task per GPU) or, without GPUs, tasks_per_node=T",
    "gpus-per-node": "gpus_per_node=G",
    "gpus": "gpus_per_node=G (sbatch's --gpus is the job's total across its nodes, and clashes with it)",
    "cpus-per-task": "cpus_per_task=C",
    "time": "time=MINUTES (or 'HH:MM:SS', 'D-HH:MM:SS')",
    "partition": "partition=NAME",
    "account": "account=NAME",
    "mem": "mem=SIZE (with its unit, e.g. 32G)",
    "job-name": "name=NAME",
    "output": "folder=DIR: each task's log is written there",
    "error": "folder=DIR: each task's log is written there",
    "signal": "signal=NAME and signal_delay=SECONDS",
    "array": "Submitter.map_array() in Python, for a job array",
    "open-mode": "no option: the logs are appended to, so a requeued job keeps its earlier output",
    "wrap": "the command to run, which slurmdist writes into the job script",
}


class SubmitError(SlurmdistError):
    """A job could not be described or submitted (bad option, no Slurm, sbatch refused it)."""


class JobFailedError(SubmitError):
    """The job ended without a result: its remote traceback, or Slurm's state and the log's last lines."""

    def __init__(self, message: str, state: str = "", job_id: str = "") -> None:
        super().__init__(message)
        self.state = state
        self.job_id = job_id


class JobTimeoutError(SubmitError):
    """Waiting for a job took longer than the caller allowed (the job itself keeps running)."""


# --- pure: options -> submitit parameters ---------------------------------------------------------------------


def parse_time(value: Union[int, float, str]) -> int:
    """A time limit in whole minutes, from minutes (int/float) or Slurm's forms: MM, MM:SS, HH:MM:SS, D-HH,
    D-HH:MM, D-HH:MM:SS. submitit needs minutes: it also uses them to tell a time-out from a preemption."""
    if isinstance(value, bool):
        raise SubmitError(f"time={value!r} is not a duration")
    if isinstance(value, (int, float)):
        minutes = float(value)
    elif NO_LIMIT.fullmatch(str(value).strip()):
        minutes = 0.0
    else:
        minutes = _slurm_time_minutes(str(value).strip())
    if minutes == 0 or (isinstance(value, float) and value == math.inf):  # sbatch's "no limit" ("0", UNLIMITED)
        raise SubmitError(f"time={value!r} means no time limit to Slurm, but a job slurmdist submits needs one: the "
                          "requeue warning comes signal_delay before it, and submitit tells a time-out from a "
                          "preemption by it. Give the partition's longest (sinfo -o '%P %l'), e.g. time='7-00:00:00'")
    if not math.isfinite(minutes) or minutes <= 0:
        raise SubmitError(f"time={value!r} must be a positive duration")
    return max(1, math.ceil(minutes))


def _slurm_time_minutes(text: str) -> float:
    days, dash, rest = text.rpartition("-")
    parts = [whole_number(p) for p in rest.split(":")]
    day_count = whole_number(days) if dash else 0
    numbers = [n for n in parts if n is not None]
    if len(numbers) < len(parts) or day_count is None or not 1 <= len(numbers) <= 3:
        raise SubmitError(f"time={text!r} is not a Slurm time: use minutes or HH:MM:SS or D-HH:MM:SS")
    if dash:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = (numbers + [0, 0])[:3]
        return day_count * 1440 + hours * 60 + minutes + seconds / 60
    if len(numbers) == 3:
        return numbers[0] * 60 + numbers[1] + numbers[2] / 60
    if len(numbers) == 2:  # MM:SS
        return numbers[0] + numbers[1] / 60
    return float(numbers[0])


def parse_mem(value: Union[int, float, str]) -> str:
    """Memory per node for ``--mem``: a number is GiB (``32`` -> ``'32G'``); strings such as '500M' pass, and
    a string without a unit is refused (a config file's "32" would be 32 MB to sbatch, 32 GiB as a number)."""
    if isinstance(value, bool):
        raise SubmitError(f"mem={value!r} is not an amount of memory")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value <= 0:  # nan and inf: no amount at all
            raise SubmitError(f"mem={value!r} must be a positive, finite amount (GiB)")
        return f"{int(value)}G" if float(value).is_integer() else f"{math.ceil(value * 1024)}M"
    text = str(value).strip()
    fault = memory_size_fault(text)
    if fault == "not a size":
        raise SubmitError(f"mem={value!r} is not a Slurm memory size such as 32G or 500M (whole numbers; a "
                          "Python number such as 1.5 is taken as GiB)")
    if fault == "no unit":
        raise SubmitError(f"mem={value!r} has no unit: sbatch reads a bare number as megabytes, while mem={text} "
                          f"(a number) means {text} GiB. Write the unit, e.g. '{text}G' or '{text}M'")
    return text.upper()


@dataclass(frozen=True)
class Resources:
    """What a distributed job asks for, in the terms users think in. Validated on creation."""

    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: Optional[int] = None  # CPU-only jobs; with GPUs it follows gpus_per_node
    cpus_per_task: Optional[int] = None
    time: Union[int, float, str] = 60
    partition: Optional[str] = None
    account: Optional[str] = None
    mem: Union[int, float, str, None] = None
    sbatch: Mapping[str, Any] = field(default_factory=dict)  # extra #SBATCH options: {"constraint": "a100"}
    setup: Sequence[str] = ()  # shell lines run in the batch script before srun (module load, source venv)
    name: str = "slurmdist"
    signal: Union[str, int, None] = None  # the requeue warning signal (default SLURMDIST_REQUEUE_SIGNAL/USR2)
    signal_delay: int = DEFAULT_SIGNAL_DELAY

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node", "tasks_per_node", "cpus_per_task", "signal_delay"):
            value = getattr(self, name)
            minimum = 0 if name in ("gpus_per_node", "signal_delay") else 1
            if (value is not None or name == "signal_delay") and not is_whole(value, minimum):
                raise SubmitError(f"{name}={value!r} must be a whole number >= {minimum}")
        if self.gpus_per_node and self.tasks_per_node not in (None, self.gpus_per_node):
            raise SubmitError(
                f"gpus_per_node={self.gpus_per_node} runs one task per GPU, but tasks_per_node="
                f"{self.tasks_per_node}; drop tasks_per_node (it follows gpus_per_node)"
            )
        for name in ("name", "partition", "account"):  # each becomes an #SBATCH line of its own
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value or any(c in value for c in "\n\r\0")):
                raise SubmitError(f"{name}={value!r} must be one non-empty line of text (it becomes an #SBATCH line)")
            if value is not None and "\\" in value:  # sbatch unquotes #SBATCH lines: 'a\b' became 'ab'
                raise SubmitError(f"{name}={value!r}: sbatch reads a backslash in an #SBATCH line as an escape and "
                                  "drops it; leave it out")
            refuse_undecodable(f"{name}=", value)
        if isinstance(self.setup, str):
            raise SubmitError("setup must be a list of shell lines, not one string")
        for index, line in enumerate(self.setup):
            if not isinstance(line, str):
                raise SubmitError(f"setup[{index}]={line!r} is not a shell line: give each line as text, e.g. "
                                  "setup=['module load cuda', 'export OMP_NUM_THREADS=4']")
            refuse_undecodable("the setup line ", line)
        problem = setup_syntax_problem(list(self.setup), option="setup")
        if problem is not None:  # found when the job starts, after its wait in the queue, otherwise
            raise SubmitError(problem)
        self._check_signal_delay(parse_time(self.time))
        if self.mem is not None:
            parse_mem(self.mem)
        try:  # the job reads these too, from the environment it inherits: checked here, not after the queue
            parse_signal(self.signal)
            requeue_limit(None, os.environ)
        except RequeueError as error:
            raise SubmitError(str(error)) from None
        _check_sbatch_options(self.sbatch)

    def _check_signal_delay(self, minutes: int) -> None:
        problem = signal_delay_problem(self.signal_delay, minutes, what=f"signal_delay={self.signal_delay} s",
                                       within=f"time={self.time!r}", time_name="time", delay_name="signal_delay")
        if problem is not None:
            raise SubmitError(problem)

    @property
    def ntasks_per_node(self) -> int:
        """One task per GPU, else `tasks_per_node` (default 1)."""
        return self.gpus_per_node or self.tasks_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.ntasks_per_node


def _check_sbatch_options(options: Mapping[str, Any]) -> None:
    if not isinstance(options, Mapping):
        raise SubmitError(f"sbatch={options!r} must be a mapping of option names to values, such as "
                          "{'constraint': 'a100', 'qos': 'high'}")
    for key, value in options.items():
        if not isinstance(key, str) or not OPTION_NAME.fullmatch(key):
            raise SubmitError(f"sbatch option {key!r} is not an option name (letters, digits, '-' and '_')")
        name = key.replace("_", "-")
        if len(name) == 1:  # written as `#SBATCH --C=...`, which sbatch refuses
            raise SubmitError(f"sbatch option {key!r} is a short option; give its long name (constraint for -C, "
                              "qos for -q): each option becomes an `#SBATCH --NAME=VALUE` line")
        managed = managed_option(name, MANAGED_OPTIONS)
        if managed is not None:
            read_as = "" if managed == name else f" (sbatch reads it as --{managed})"
            raise SubmitError(f"sbatch option {key!r} is set by slurmdist{read_as}; instead use "
                              f"{MANAGED_OPTIONS[managed]}")
        if name in ("requeue", "no-requeue"):
            raise SubmitError(f"sbatch option {key!r}: slurmdist always submits with --requeue (resuming after "
                              "preemption and the requeue signal rely on it), which would override it; submit "
                              "with submitit or sbatch directly for a job that must never be requeued")
        if value is False:  # rendered as --key=False, which sbatch refuses
            raise SubmitError(f"sbatch option {key}=False: leave the option out instead (True sets a flag)")
        if not isinstance(value, (str, int, float, bool)) or (isinstance(value, str) and "\n" in value):
            raise SubmitError(f"sbatch option {key}={value!r}: the value must be one line of text, a number or True")
        refuse_undecodable("the sbatch option ", f"{key}={value}")


def signal_variables(resources: Resources) -> Dict[str, str]:
    """The variables that make the job's submitit and slurmdist agree on the requeue signal, by name without
    SIG (submitit looks `"SIG" + name` up in Python's signal module; sbatch gets `slurm_name`)."""
    name = parse_signal(resources.signal).name.removeprefix("SIG")
    return {"SLURMDIST_REQUEUE_SIGNAL": name, "SUBMITIT_PREEMPT_SIGNAL": name}


def environment_lines(resources: Resources) -> List[str]:
    """Shell lines run in the batch script before srun: the environment handed on to srun under
    `--export=NONE` (submitit's tasks find their job through a variable its script exports), the signal
    variables and, for Slurm 22.05 and later, `SRUN_CPUS_PER_TASK` (srun there no longer takes --cpus-per-task
    from the job: each task would get one CPU)."""
    lines = [HAND_ON_ENVIRONMENT]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in signal_variables(resources).items()]
    if resources.cpus_per_task:
        lines.append(HAND_ON_CPUS_PER_TASK)
    # Where this run's part of the batch log begins: submitit appends each run to it (see `_srun_said`).
    lines.append(f'echo "{RUN_STARTS} ${{SLURM_JOB_ID:-}} starts (restarts so far: ${{SLURM_RESTART_COUNT:-0}})" >&2')
    return lines


def launch_variables(environ: Mapping[str, str]) -> List[str]:
    """The names in `environ` that describe the submitting process's own launch (see LAUNCH_PREFIXES)."""
    return sorted(name for name in environ if name not in KEPT_VARIABLES
                  and (name in LAUNCH_NAMES or name.startswith(LAUNCH_PREFIXES)))


def slurm_parameters(resources: Resources) -> Dict[str, Any]:
    """`submitit.SlurmExecutor.update_parameters` arguments for `resources`."""
    extra: Dict[str, Any] = {"signal": f"{slurm_name(parse_signal(resources.signal))}@{resources.signal_delay}",
                             "requeue": True}
    extra.update({key.replace("_", "-"): value for key, value in resources.sbatch.items()})
    params: Dict[str, Any] = {
        "job_name": resources.name,
        "nodes": resources.nodes,
        "ntasks_per_node": resources.ntasks_per_node,
        "time": parse_time(resources.time),
        "signal_delay_s": resources.signal_delay,
        "setup": [*environment_lines(resources), *resources.setup, *([ENDS_THE_SETUP] if resources.setup else [])],
        "additional_parameters": extra,
        # One failed rank ends the step: the others would otherwise wait in a collective until its timeout.
        "srun_args": ["--kill-on-bad-exit=1"],
    }
    optional = {
        "gpus_per_node": resources.gpus_per_node or None,
        "cpus_per_task": resources.cpus_per_task,
        "partition": resources.partition,
        "account": resources.account,
        "mem": None if resources.mem is None else parse_mem(resources.mem),
    }
    params.update({key: value for key, value in optional.items() if value is not None})
    return params


def local_parameters(resources: Resources) -> Dict[str, Any]:
    """`submitit.LocalExecutor.update_parameters` arguments: every task of every node on this machine."""
    params: Dict[str, Any] = {
        "tasks_per_node": resources.world_size,
        "timeout_min": parse_time(resources.time),
        "signal_delay_s": resources.signal_delay,
        # Run in bash before the controller starts (see local_jobs); the signal variables go through the
        # environment (see `Submitter`).
        "setup": list(resources.setup),
    }
    if resources.gpus_per_node:
        params["gpus_per_node"] = resources.nodes * resources.gpus_per_node
    return params


def unused_locally(resources: Resources) -> List[str]:
    """The options that only a Slurm cluster can honour (a partition, an account, extra #SBATCH lines)."""
    named = [f"{name}={getattr(resources, name)!r}" for name in ("partition", "account") if getattr(resources, name)]
    return named + ([f"sbatch={dict(resources.sbatch)!r}"] if resources.sbatch else [])


def choose_cluster(cluster: str, which: Callable[[str], Optional[str]] = shutil.which) -> str:
    """'slurm' or 'local': 'auto' is Slurm where sbatch and srun exist, else this machine."""
    if cluster not in ("auto", "slurm", "local"):
        raise SubmitError(f"cluster={cluster!r}: use 'auto', 'slurm' or 'local'")
    if cluster == "auto":
        return "slurm" if which("sbatch") and which("srun") else "local"
    if cluster == "slurm" and not (which("sbatch") and which("srun")):
        raise SubmitError("cluster='slurm' but sbatch/srun are not on PATH; run on a login node, or use "
                          "cluster='local'")
    return cluster


# --- side effects: building executors and submitting ---------------------------------------------------------


class Submitter:
    """Builds the submitit executor for a distributed job and submits to it; returns submitit jobs.

    Arguments are `Resources` fields (nodes, gpus_per_node, tasks_per_node, cpus_per_task, time, partition,
    account, mem, sbatch, setup, name, signal, signal_delay) plus `folder` (logs and pickles; ``%j`` is the job
    id), `cluster` ('auto', 'slurm', 'local') and `python` (the interpreter command in the job).
    """

    def __init__(self, *, folder: Union[str, os.PathLike] = DEFAULT_FOLDER, cluster: str = "auto",
                 python: Optional[str] = None, **resources: Any) -> None:
        try:
            self.resources = Resources(**resources)
        except TypeError as error:
            raise SubmitError(f"Submitter: {error}") from None
        self.cluster = choose_cluster(cluster)
        slurm_only = unused_locally(self.resources) if cluster == "auto" and self.cluster == "local" else []
        if slurm_only:
            log.warning("slurmdist: sbatch and srun are not on PATH, so this job runs on this machine (submitit's "
                        "LocalExecutor), where %s %s nothing; load your site's Slurm module, or pass "
                        "cluster='local' to mean it", ", ".join(slurm_only),
                        "means" if len(slurm_only) == 1 else "mean")
        if python is not None and (not isinstance(python, str) or not python.strip()):
            raise SubmitError(f"python={python!r} must be the interpreter command the job runs, such as "
                              "'/path/to/venv/bin/python' (None: this process's interpreter)")
        refuse_undecodable("python=", python)  # submitit writes it into the job script
        if python is not None and self.cluster == "local":
            # On this machine, so checked here (a Slurm job's nodes may keep it elsewhere: not checked then). The
            # local controller splits it as a shell would.
            try:
                program = shlex.split(python)[0]
            except ValueError as error:  # an unclosed quote
                raise SubmitError(f"python={python!r} is not a command line: {error}") from None
            if shutil.which(program) is None:
                raise SubmitError(f"python={python!r}: no such command on this machine, where a local job runs it; "
                                  "give the path of an interpreter with torch and slurmdist (None: this process's "
                                  "own)")
        self.folder = job_folder(folder)
        self.python = python
        self._executor: Any = None

    @property
    def executor(self) -> Any:
        """The submitit executor (built on first use; submitit is imported only then)."""
        if self._executor is None:
            try:
                self._executor = build_executor(self.resources, self.cluster, self.folder, self.python)
            except OSError as error:  # the local executor makes its folder here
                raise folder_failure(error, self.folder) from None
        return self._executor

    def with_options(self, **changes: Any) -> "Submitter":
        """A copy with some resources (or its folder, cluster, python) changed: ``submitter.with_options(nodes=1)``."""
        fields = {f: getattr(self.resources, f) for f in self.resources.__dataclass_fields__}
        options = {"folder": self.folder, "cluster": self.cluster, "python": self.python, **fields}
        return Submitter(**{**options, **changes})

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` in every task of one job; returns the submitit job."""
        _require_callable(fn, "submit")
        _require_the_jobs_signal(fn, self.resources)
        executor = self.executor  # first: without submitit, its error says what to install
        with _folders_kept_only_if_submitted(self.folder):
            return _submitting(lambda: executor.submit(fn, *args, **kwargs), signal_variables(self.resources),
                               self.folder)

    def submit_command(self, argv: Sequence[str], cwd: Union[str, os.PathLike, None] = None) -> Any:
        """Run a command (``["python", "train.py", "--steps", "100"]``) in every task; no shell is involved."""
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
            raise SubmitError("submit_command needs a non-empty list of strings, e.g. ['python', 'train.py']")
        command_words(argv, "submit_command", "submit_command(['python', 'train.py'])", SubmitError)
        workdir = str(Path(cwd).absolute()) if cwd is not None else os.getcwd()
        return self.submit(Command(tuple(argv), workdir))

    def map_array(self, fn: Callable[..., Any], *iterables: Iterable[Any]) -> List[Any]:
        """A job array, one job per ``fn(*args)`` for args in ``zip(*iterables)``: a sweep. Each element is a
        whole distributed job with these resources. The iterables must be of one length: `zip` would drop the
        longer ones' tail without a word."""
        _require_callable(fn, "map_array")
        _require_the_jobs_signal(fn, self.resources)
        columns = [list(column) for column in iterables]
        lengths = sorted({len(column) for column in columns})
        if len(lengths) > 1:
            raise SubmitError(f"map_array: the argument lists have different lengths ({', '.join(map(str, lengths))}); "
                              "zip would submit only as many jobs as the shortest has: make them one length")
        executor = self.executor
        with _folders_kept_only_if_submitted(self.folder):
            return _submitting(lambda: executor.map_array(fn, *columns), signal_variables(self.resources),
                               self.folder, gated=False)


def _require_callable(fn: Any, method: str) -> None:
    """Before anything is queued: a job whose function is not one fails only once it runs."""
    if not callable(fn):
        raise SubmitError(f"{method}: {fn!r} is not callable; pass the function to run in every task (its arguments "
                          "follow it), or use submit_command(['python', 'train.py']) for a command")


def _require_the_jobs_signal(fn: Any, resources: "Resources") -> None:
    """A `Resumable` told another signal than the job's waits for one that never comes, while submitit's handler
    takes the job's: it requeues the job without a checkpoint, and every run starts again from step 0."""
    told = getattr(fn, "signal", None)  # a subclass that skipped Resumable.__init__ has none: its run says so
    if not isinstance(fn, Resumable) or told is None:
        return
    wanted, sent = parse_signal(told), parse_signal(resources.signal)
    if wanted != sent:
        theirs = sent.name.removeprefix("SIG")
        raise SubmitError(
            f"{type(fn).__name__}(signal={told!r}) waits for {wanted.name}, but this job is warned with "
            f"{sent.name} ({_signal_source(resources)}): it would requeue without saving. Give "
            f"the Submitter signal={wanted.name.removeprefix('SIG')!r}, or the Resumable signal={theirs!r} or "
            "none (it then takes the job's)"
        )


def _signal_source(resources: "Resources") -> str:
    """Where the job's requeue signal came from, as a message names it."""
    if resources.signal is not None:
        return f"the Submitter's signal={resources.signal!r}"
    if os.environ.get(SIGNAL_VARIABLE, "").strip():
        return f"{SIGNAL_VARIABLE}={os.environ[SIGNAL_VARIABLE]!r} in this process"
    return "the Submitter's default"


def build_executor(resources: Resources, cluster: str, folder: Path, python: Optional[str] = None) -> Any:
    """A configured submitit executor (imports submitit)."""
    try:
        import submitit  # noqa: F401  # here, where its absence is told; the executors' modules import it too
    except ImportError:
        raise SubmitError("slurmdist.submit needs submitit: pip install submitit (or \".[submit]\" in slurmdist's "
                          "checkout)") from None
    if cluster == "local":
        from .local_jobs import LocalBatchExecutor

        local = LocalBatchExecutor(folder=folder, python=python)
        local.update_parameters(**local_parameters(resources))
        return local
    from .submission_gate import gated_slurm_executor

    slurm = gated_slurm_executor()(folder=folder, python=python)
    slurm.update_parameters(**slurm_parameters(resources))
    return slurm


_ENVIRON_LOCK = threading.Lock()  # one submission at a time changes os.environ


def enter_job_environment(extra: Mapping[str, str]) -> Callable[[], None]:
    """Make os.environ what a new job should inherit: without the submitting process's own launch variables
    (`launch_variables`), with `extra`; returns what puts it back. submitit runs sbatch (and its local
    controller) with this process's environment and offers no other way, so it is changed in place, as
    submitit's own `clean_env()` does; one submission at a time."""
    _ENVIRON_LOCK.acquire()  # held at most one submission's bound (see `_submitting`)
    hidden = launch_variables(os.environ)
    saved = {name: os.environ[name] for name in [*hidden, *extra] if name in os.environ}
    if hidden:
        log.info("not passed to the job (they describe this process's own launch): %s", ", ".join(hidden))
    for name in hidden:
        del os.environ[name]
    os.environ.update(extra)

    def restore() -> None:
        for name in extra:
            os.environ.pop(name, None)
        os.environ.update(saved)
        _ENVIRON_LOCK.release()

    return restore


def _submitting(submit: Callable[[], Any], environment: Mapping[str, str], folder: Path, gated: bool = True) -> Any:
    """Run a submission with a bound, in the job's environment (`enter_job_environment`), and turn submitit's
    failures (sbatch's message) into a SubmitError.

    submitit calls sbatch without a timeout, so a slurmctld that does not answer would hang the caller; the
    submission runs in a thread that is given up on after SUBMIT_TIMEOUT (sbatch itself may still finish). The
    caller gets its environment back then; a submission still pickling is stopped before it starts sbatch
    (`submission_gate`). `gated`: the executor starts the job through the gate (submitit's Slurm arrays start
    theirs through an executor of their own, which does not).
    """
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    from .submission_gate import Gate, open_in_this_thread

    outcome: Dict[str, Any] = {}
    over = threading.Event()
    gate = Gate() if gated else None

    def run() -> None:
        open_in_this_thread(gate)
        try:
            outcome["job"] = submit()
        except BaseException as error:  # handed to the caller's thread below
            outcome["error"] = error
        finally:
            over.set()

    restore = enter_job_environment(environment)
    started = time.monotonic()
    try:
        threading.Thread(target=run, name="slurmdist-submit", daemon=True).start()
        try:
            finished = over.wait(SUBMIT_TIMEOUT)
        except KeyboardInterrupt:
            raise KeyboardInterrupt(_interrupted(over, outcome, gate, SUBMIT_TIMEOUT - (time.monotonic() - started)))
        if not finished:
            raise SubmitError(_given_up(gate, folder))
    finally:
        restore()  # after the gate closed: a submission still pickling starts nothing in the caller's environment
    error = outcome.get("error")
    if isinstance(error, (FailedJobError, FailedSubmissionError, subprocess.CalledProcessError)):
        said = str(error).strip()
        raise _nothing_queued(f"sbatch refused the job: {said}{_unreachable_cluster_hint(said)}") from None
    if isinstance(error, OSError):
        raise folder_failure(error, folder) from None
    if error is not None and _raised_while_pickling(error):
        raise _nothing_queued(f"the function or its arguments cannot be sent to the job: {error}. They are pickled "
                          "into a file the job loads: pass what the job needs to rebuild them (a path, a config) "
                          "instead") from error
    if error is not None:
        raise error
    return outcome["job"]


def _given_up(gate: Any, folder: Path) -> str:
    """Why a submission did not finish in time, once its gate is closed: still pickling (nothing submitted), or
    waiting for sbatch (something may be)."""
    bound = f"{SUBMIT_TIMEOUT:.0f} s"
    if gate is not None and gate.close():
        return (f"the submission did not reach sbatch within {bound}: pickling the function and its arguments into "
                f"{folder} took that long (a slow or full file system?). Nothing was submitted")
    if gate is not None:
        return (f"sbatch did not answer within {bound}: slurmctld may be down or overloaded (`scontrol ping`). The "
                "job may still be submitted: check `squeue --me` before submitting again")
    return (f"the submission did not finish within {bound}: it pickles the function and its arguments into "
            f"{folder}, then runs sbatch; a slow file system, or a slurmctld that is down or overloaded (`scontrol "
            "ping`), holds it up. The job may still be submitted: check `squeue --me` before submitting again")


def _interrupted(over: threading.Event, outcome: Mapping[str, Any], gate: Any, remaining: float) -> str:
    """Ctrl-C while submitting: the submission cannot be stopped halfway (sbatch may have queued a job whose
    files submitit had not moved in place yet, which then fails), so let it end, within its bound, and cancel
    what it queued. What happened, for the KeyboardInterrupt."""
    try:
        finished = over.wait(max(0.0, remaining))
    except KeyboardInterrupt:  # a second Ctrl-C: leave now
        finished = False
    if not finished:
        if gate is not None and gate.close():
            return "interrupted while submitting, before anything was queued (it was still pickling)"
        return ("interrupted while submitting; sbatch had not answered, so a job may still be queued: check "
                "`squeue --me` and scancel it")
    error, queued = outcome.get("error"), outcome.get("job")
    if queued is None:
        maybe = "" if gate is not None and not gate.passed else \
            " (a job may have been queued before it failed: check `squeue --me`)"
        from .rendezvous import first_line

        return f"interrupted while submitting, which then failed: {first_line(error)}{maybe}"
    jobs = queued if isinstance(queued, list) else [queued]
    cancel(jobs)
    ids = ", ".join(str(job.job_id) for job in jobs)
    return f"interrupted while submitting; job {ids} was queued meanwhile and is cancelled now"


def cancel(jobs: Sequence[Any], timeout: float = SLURM_CALL_TIMEOUT) -> None:
    """Stop `jobs`, within `timeout` (submitit's own cancel() waits on scancel without a bound): one scancel
    for the Slurm ones."""
    on_slurm = [str(job.job_id) for job in jobs if not is_local(job)]
    for job in jobs:
        if is_local(job):
            job.cancel()
    if not on_slurm:
        return
    try:
        subprocess.run(["scancel", *on_slurm], timeout=timeout, check=False, capture_output=True)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("slurmdist: could not cancel job(s) %s (%s): scancel them yourself", " ".join(on_slurm), error)


def _unreachable_cluster_hint(said: str) -> str:
    """What to do when sbatch found no cluster to submit to, from what it said; else ''."""
    if "configuration source" in said or "cannot stat file" in said:
        problem = "sbatch finds no slurm.conf here"
    elif "Unable to contact slurm controller" in said:
        problem = "slurmctld does not answer (`scontrol ping` says why)"
    else:
        return ""
    return (f"\n{problem}: submit from a login node of your cluster (where `sinfo` works, or with SLURM_CONF "
            "naming its slurm.conf), or run the job on this machine with cluster='local' (--cluster local)")


def _raised_while_pickling(error: BaseException) -> bool:
    """Whether `error` came from pickling (submitit cloudpickles the function and its arguments), not from
    submitit or sbatch."""
    frames = traceback.extract_tb(error.__traceback__)
    return isinstance(error, (TypeError, AttributeError, pickle.PicklingError)) and any(
        "pickle" in os.path.basename(frame.filename) for frame in frames)


def refuse_undecodable(shown: str, value: Any) -> None:
    """Text that goes into the job script, which is written as UTF-8: bytes that are not UTF-8, as a shell passes
    them on (`--name $'\\xff'`), reach Python as lone surrogates, and submitit failed on them with a traceback."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise SubmitError(f"{shown}{value!r} holds bytes that are not UTF-8 text (shown as \\udcXX), and the "
                              "job script is written as UTF-8: spell it in UTF-8") from None


# The patterns submitit fills in a folder as Slurm does (%a aside: see `job_folder`).
FOLDER_PATTERNS = ("%j", "%A")


def job_folder(folder: Union[str, os.PathLike]) -> Path:
    """`folder` as a Path, refused when submitit cannot use it: it places a job's submission file under the
    job id sbatch printed, which for a job array names no element, so a `%a` in the folder failed after the job
    was queued (and the job, missing its files, failed too)."""
    refuse_undecodable("folder=", os.fspath(folder))
    if "%a" in os.fspath(folder):
        raise SubmitError(f"folder={os.fspath(folder)!r}: %a (the array index) cannot be in the folder, since "
                          "submitit files an array's submission before any element has an index. Use %j (an "
                          "element's id is ARRAYID_INDEX, so each gets its own folder) or %A (one folder per array)")
    unknown = [found[0] for found in LOG_PATTERN.finditer(os.fspath(folder)) if found[0] not in FOLDER_PATTERNS]
    if unknown:
        raise SubmitError(f"folder={os.fspath(folder)!r}: {unknown[0]} is one of Slurm's filename patterns, which "
                          "submitit does not fill in: on Slurm the job's log path and submitit's own would name "
                          "different folders, and the job would fail without a log (a local job would get a folder "
                          f"named {unknown[0]}). Use only {', '.join(FOLDER_PATTERNS)} in the folder (%j: the job id), "
                          "and write the rest out (the job's name instead of %x)")
    return Path(folder)


@contextlib.contextmanager
def _folders_kept_only_if_submitted(folder: Path) -> Iterator[None]:
    """Remove the folder a submission that queued nothing made for its files: submitit makes the job's folder (up
    to its first %) and writes the pickle and script there before sbatch answers, and `slurmdist submit -- ...`
    where sbatch refused left a `slurmdist-logs/` in the caller's directory. Only a folder that was not there
    before is removed, and only when nothing was queued: a submission given up on may still reach sbatch, and
    its job needs its files. In a folder that was there (the default one, after a first job), the files it
    wrote for the job go instead."""
    fixed = submitit_folder(folder)
    made = next((path for path in reversed([fixed, *fixed.parents]) if not path.exists()), None)  # outermost
    began = time.time()
    try:
        yield
    except SubmitError as error:
        if getattr(error, NOTHING_QUEUED, False):
            if made is not None:
                shutil.rmtree(made, ignore_errors=True)
            else:
                _remove_submission_files(fixed, began)
        raise


# What submitit writes into the job's folder before sbatch answers, named by a fresh uuid: the pickled call and
# the batch script (renamed after the job id once sbatch answered).
_SUBMISSION_FILE = re.compile(r"[0-9a-f]{32}\.pkl|\.submission_file_[0-9a-f]{32}\.sh")


def _remove_submission_files(folder: Path, since: float) -> None:
    """Remove the files a submission that queued nothing wrote into `folder` from `since` (epoch seconds) on;
    other submissions' files, made before, stay. submitit does not say which names were this submission's: a
    second process submitting into the same folder at that moment could lose its files (its job then fails at
    start, missing its pickle); give concurrent submitters folders of their own (the part before any `%j`)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        with contextlib.suppress(OSError):
            if _SUBMISSION_FILE.fullmatch(entry.name) and entry.stat().st_mtime >= since - CLOCK_SLACK:
                os.unlink(entry.path)


NOTHING_QUEUED = "nothing_queued"  # set on a SubmitError after which certainly no job exists


def _nothing_queued(message: str) -> SubmitError:
    """A SubmitError for a submission that certainly queued no job (sbatch refused it, or it never reached
    sbatch): the files submitit made for it are of no use to anyone."""
    error = SubmitError(message)
    setattr(error, NOTHING_QUEUED, True)
    return error


def submitit_folder(folder: Union[str, os.PathLike]) -> Path:
    """The folder submitit makes for a job's files before sbatch answers: `folder` up to its first part that
    holds a pattern (%j, %A), absolute."""
    return Path(*itertools.takewhile(lambda part: "%" not in part, Path(folder).parts)).absolute()


def folder_failure(error: OSError, folder: Path) -> Exception:
    """A SubmitError naming the job's folder when `error` is about it or a folder above it (submitit makes it
    and writes the job's pickles there before the job starts); else `error` itself."""
    if error.filename is None:
        return error
    failed = Path(os.fsdecode(error.filename)).absolute()
    fixed = submitit_folder(folder)
    if not (failed == fixed or fixed in failed.parents or failed in fixed.parents):
        return error
    return SubmitError(
        f"cannot write the job's folder {str(folder)!r} (folder=, or --folder): {error.strerror or error} "
        f"({str(failed)!r}). Give a folder this process can create and write, on a file system every node of the "
        "job sees"
    )


# --- following jobs: state, wait, results ---------------------------------------------------------------------


def is_local(job: Any) -> bool:
    """A job of submitit's LocalExecutor (a `local_jobs.LocalBatchJob` is one), told without importing submitit."""
    return any(cls.__name__ == "LocalJob" for cls in type(job).__mro__)


def stop_command(job: Any) -> str:
    """The shell command that stops `job`: a local job's id is its controller's pid, which forwards SIGTERM to
    the tasks, where submitit ignores it; SIGINT (what submitit's own cancel() sends) ends them. A job
    slurmdist started locally leads a process group, signalled whole (see `local_jobs.LocalBatchJob`)."""
    if not is_local(job):
        return f"scancel {job.job_id}"
    return f"kill -INT -{job.job_id}" if _leads_its_group(job) else f"kill -INT {job.job_id}"


def _leads_its_group(job: Any) -> bool:
    """A local job slurmdist started (`local_jobs.LocalBatchJob`): its id is also its process group's."""
    return type(job).__name__ == "LocalBatchJob"


def job_state(job: Any, environ: Optional[Mapping[str, str]] = None, timeout: float = SLURM_CALL_TIMEOUT) -> str:
    """The job's state now: squeue while slurmctld remembers the job, else sacct, both within `timeout`.

    FORGOTTEN when slurmctld no longer knows the job and accounting has no record of it (it ended more than
    MinJobAge ago on a cluster without accounting); UNKNOWN when neither answered.
    """
    if is_local(job):
        return _local_state(job)
    return slurm_state(job.job_id, environ, timeout)


def _local_state(job: Any) -> str:
    """The LocalExecutor knows only its controller process: running, finished or gone. A controller finishes
    whatever its tasks did (a task killed, a setup line that failed), so only results say COMPLETED."""
    state = job.state
    if state == "RUNNING" or (state == NO_PROCESS and _controller_runs(job)):
        return "RUNNING"
    succeeded = state == "FINISHED" and _all_results_written(job) and all(
        outcome == "success" for outcome, _ in _read_outcomes(job, grace=0.0))
    return "COMPLETED" if succeeded else "FAILED"


NO_PROCESS = "NO PROCESS AND NO RESULT"  # submitit's state of a local job this process did not start


def _controller_runs(job: Any) -> bool:
    """Whether the controller of a local job this process did not start (one unpickled, in a notebook started
    again) still runs: its pid, no zombie, and for a job slurmdist started, still leading its process group (a
    pid used again by another process does not)."""
    from . import procfs

    fields = procfs.process_stat(job.job_id)
    if not fields or fields[0] == "Z":
        return False
    return not _leads_its_group(job) or fields[2] == str(job.job_id)


def slurm_state(job_id: str, environ: Optional[Mapping[str, str]] = None, timeout: float = SLURM_CALL_TIMEOUT) -> str:
    """squeue's view of `job_id`, else sacct's, else FORGOTTEN or UNKNOWN (see `job_state`); both calls share
    `timeout`, so a slurmctld that does not answer holds a caller's wait no longer than it asked."""
    deadline = time.monotonic() + timeout
    squeue = _slurm_call(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], environ, deadline)
    if squeue is not None and squeue.returncode == 0 and squeue.stdout.strip():
        return parse_state(squeue.stdout)
    sacct = _slurm_call(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id], environ, deadline)
    if sacct is not None and sacct.returncode == 0 and sacct.stdout.strip():
        return parse_state(sacct.stdout)
    if squeue is not None and "invalid job id" in squeue.stderr.lower():  # slurmctld answered: not a job it has
        return FORGOTTEN
    return "UNKNOWN"


def parse_state(output: str) -> str:
    """The first state in squeue/sacct output: 'CANCELLED by 0' -> 'CANCELLED'."""
    lines = output.strip().splitlines()
    return lines[0].split()[0].rstrip("+").upper() if lines else "UNKNOWN"


def _slurm_call(command: List[str], environ: Optional[Mapping[str, str]],
                deadline: float) -> "Optional[subprocess.CompletedProcess[str]]":
    """The finished call, or None when it could not run or outlived its share of `deadline`."""
    try:
        return commands.run(command, min(SLURM_CALL_TIMEOUT, max(0.1, deadline - time.monotonic())), environ)
    except (OSError, subprocess.TimeoutExpired):
        return None


def wait(job: Any, timeout: float, *, poll: float = 1.0,
         on_state: Optional[Callable[[str], None]] = None, on_poll: Optional[Callable[[], None]] = None) -> str:
    """Wait until the job ends (every task wrote its result, or Slurm says it ended); return its state.

    Raises `JobTimeoutError` after `timeout` seconds; the job keeps running. `on_state` hears every change,
    `on_poll` is called at every poll (to stream a log, say).
    """
    return _wait(job, timeout, poll, on_state, on_poll)[0]


def _wait(job: Any, timeout: float, poll: float = 1.0, on_state: Optional[Callable[[str], None]] = None,
          on_poll: Optional[Callable[[], None]] = None) -> Tuple[str, Optional[List[Tuple[Optional[str], Any]]]]:
    """`wait`, which also hands back the tasks' outcomes when it read them to end early (None otherwise): they
    may be large, and `results` need not load them twice."""
    timeout = positive_seconds("timeout", timeout, SubmitError)
    poll = positive_seconds("poll", poll, SubmitError)
    deadline = time.monotonic() + timeout
    last = ""
    written_at: Optional[float] = None
    a_task_raised = False
    reported: Set[int] = set()  # local tasks whose result says they returned
    while True:
        state = job_state(job, timeout=max(1.0, deadline - time.monotonic()))
        outcomes = None
        # Every task reported but Slurm has not caught up (the step is completing): trust the results soon. Only
        # while the job runs, and only files written since this run started: a job requeued (and running again)
        # may hold result files of the run before. Only when every task returned: after a task raised, the job
        # ends as Slurm says (FAILED, or CANCELLED or PREEMPTED when that is why it raised), and soon.
        if state not in RESULTS_AHEAD_STATES:
            written_at, a_task_raised = None, False
        elif written_at is None and not a_task_raised and _all_results_written(job) and \
                _written_by_this_run(job, deadline):
            written_at = time.monotonic()
        if state == "RUNNING" and is_local(job) and _a_local_task_failed(job, reported):
            cancel([job])  # what srun --kill-on-bad-exit does on Slurm: the others would wait in vain
            state = "FAILED"
        if written_at is not None and time.monotonic() - written_at > RESULT_GRACE:
            outcomes = _read_outcomes(job, grace=0.0)
            if all(outcome == "success" for outcome, _ in outcomes):
                state = "COMPLETED"
            else:
                written_at, a_task_raised, outcomes = None, True, None
        if state != last and on_state is not None:
            on_state(state)
        last = state
        if on_poll is not None:
            on_poll()
        if state in FINISHED_STATES:
            return state, outcomes
        if time.monotonic() >= deadline:
            raise JobTimeoutError(f"job {job.job_id} still {state} after {timeout:.0f}s (it keeps running; "
                                  f"`{stop_command(job)}` to stop it)")
        time.sleep(min(poll if written_at is None else 0.2, max(0.0, deadline - time.monotonic())))


def _a_local_task_failed(job: Any, returned: Set[int]) -> bool:
    """Whether a task of a local job has written that it failed while another has written nothing yet:
    submitit's local controller waits for every task whatever one of them did. `returned`: the tasks known to
    have returned, whose (possibly large) results are read once; updated here."""
    from submitit.core.utils import pickle_load

    failed, running = False, False
    for index, task in enumerate(_tasks(job)):
        path = task.paths.result_pickle
        if index in returned:
            continue
        if not path.exists():
            running = True
            continue
        try:
            outcome = pickle_load(path)[0]
        except Exception:  # noqa: BLE001  # being written: read at the next poll
            running = True
            continue
        if outcome == "error":
            failed = True
        else:
            returned.add(index)
    return failed and running


def results(job: Any, timeout: float, *, poll: float = 1.0) -> List[Any]:
    """Every task's return value, once the job ended. Raises `JobFailedError` with the first failing
    task's remote traceback (for a command: what failed and its log's last lines), or with Slurm's state and the
    log's last lines when no task could report."""
    state, outcomes = _wait(job, timeout, poll)
    if outcomes is None:
        # A requeued job's folder still holds the results of its run before: after a failure they say nothing
        # of this run. A requeued run starts RUN_GAP and more after the run before ended, so a file server's
        # clock a little behind slurmctld's does not make this run's files look older. After COMPLETED every
        # task wrote its result in this run: no filter, whatever the clocks say.
        started = None if is_local(job) or state == "COMPLETED" else run_start(job.job_id)
        since = None if started is None else started - run_gap()
        outcomes = _read_outcomes(job, grace=result_grace(job, state), since=since)
    failed = [task for task, (outcome, _) in enumerate(outcomes) if outcome == "error"]
    missing = [task for task, (outcome, _) in enumerate(outcomes) if outcome is None]
    if failed:
        # The first task to fail is the cause; the others usually failed because it left their collectives. A
        # task that left no result was ended after that failure (srun --kill-on-bad-exit), or died before it
        # without a traceback (killed, out of memory, os._exit), the others then losing it as a peer: named
        # with srun's own lines, which tell the two apart.
        first = min(failed, key=lambda task: job.task(task).paths.result_pickle.stat().st_mtime)
        others = f" (then task(s) {sorted(set(failed) - {first})} failed too)" if len(failed) > 1 else ""
        srun_said = ""
        if missing:
            srun_said = _srun_said(job)
            which = ": srun's lines at the end say which" if srun_said else ""
            others += (f"; task(s) {missing} left no result: ended after that failure, or died before it without "
                       f"a Python error (killed, out of memory, os._exit){which}")
        ended = "" if state == "COMPLETED" else f"ended {state}: "  # CANCELLED, PREEMPTED, TIMEOUT say why
        log = _task_paths(job, first)[1]
        besides = _other_errors(job, sorted((set(failed) - {first}) | set(missing)), outcomes)
        failure = command_failure(outcomes[first][1])
        if failure is not None:
            # A command's own error is in the log it wrote to; the task's traceback is slurmdist's and submitit's
            # plumbing, which only knows the status (and which submitit writes to the end of that log too).
            tail = _tail(log, skip="submitit ", until=CommandFailed.__name__)
            said = f"last lines of {log}:\n{tail}" if tail.strip() else f"(the command wrote nothing to its log {log})"
            # The others after the failure: between the task and its cause, it read as theirs.
            raise JobFailedError(f"job {job.job_id} {ended}task {first}: {failure}{others}\n{said}{besides}{srun_said}",
                                 state, job.job_id)
        raise JobFailedError(f"job {job.job_id} {ended}task {first} raised{others}:\n{outcomes[first][1]}\n(log: "
                             f"{log}){besides}{srun_said}", state, job.job_id)
    if missing:
        stdout, stderr = _task_paths(job, missing[0])
        ended = (f"Slurm no longer knows job {job.job_id} (it ended more than MinJobAge ago, 300 s by default, and "
                 "this cluster keeps no job accounting)" if state == FORGOTTEN else f"job {job.job_id} ended {state}")
        raise JobFailedError(
            f"{ended} and task(s) {missing} left no result; last lines of {stderr}:\n{_tail(stderr)}", state,
            job.job_id,
        )
    return [value for _, value in outcomes]


def result(job: Any, timeout: float, *, poll: float = 1.0) -> Any:
    """Rank 0's return value (see `results`)."""
    return results(job, timeout, poll=poll)[0]


def _tasks(job: Any) -> List[Any]:
    return [job.task(i) for i in range(job.num_tasks)]


def _task_paths(job: Any, task: int) -> Tuple[Path, Path]:
    paths = job.task(task).paths
    return paths.stdout, paths.stderr


def result_grace(job: Any, state: str) -> float:
    """Seconds to wait for missing result files once the job ended: none on this machine; after COMPLETED
    (every task returned, so they will appear) long enough for a lagging shared file system; after a failure,
    a little (the tasks that failed may never write one)."""
    if is_local(job):
        return 0.0
    return COMPLETED_RESULT_GRACE if state == "COMPLETED" else RESULT_GRACE


def _all_results_written(job: Any, since: Optional[float] = None) -> bool:
    return all(_written_since(task.paths.result_pickle, since) for task in _tasks(job))


def _written_since(path: Path, since: Optional[float]) -> bool:
    """Whether `path` exists and, when `since` (a run's start, epoch seconds) is given, was written in that run."""
    try:
        written = path.stat().st_mtime
    except OSError:
        return False
    return since is None or written >= since - CLOCK_SLACK


def _srun_said(job: Any) -> str:
    """srun's own lines about its tasks ('srun: error: node1: task 1: Exited with exit code 3'), from the job's
    batch log (task 0's error file, where the batch script's srun writes) since the last run started (a
    requeued job's log holds its earlier runs' too), for a message; '' when none."""
    log = _tail(_task_paths(job, 0)[1], lines=400).splitlines()
    starts = [index for index, line in enumerate(log) if line.startswith(RUN_STARTS)]
    lines = [line for line in log[starts[-1] if starts else 0:] if line.startswith("srun: error:")]
    return "\nsrun said:" + "".join(f"\n{line}" for line in lines[-8:]) if lines else ""


def _written_by_this_run(job: Any, deadline: float) -> bool:
    """Whether every result file is at least as new as the job's current run (True when that is unknown, or
    squeue does not say by `deadline`)."""
    started = None if is_local(job) else run_start(job.job_id, timeout=max(1.0, deadline - time.monotonic()))
    return started is None or _all_results_written(job, started)  # a file removed meanwhile: False, look again


def run_start(job_id: str, environ: Optional[Mapping[str, str]] = None,
              timeout: float = SLURM_CALL_TIMEOUT) -> Optional[float]:
    """When the job's current (or, once it ended, last) run started, in seconds since the epoch: from squeue
    while slurmctld remembers the job, else from sacct, both within `timeout`; None when unknown."""
    deadline = time.monotonic() + timeout
    for command in (["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%S"],
                    ["sacct", "-n", "-X", "-P", "-o", "Start", "-j", job_id]):
        proc = _slurm_call(command, environ, deadline)
        started = parse_start(proc.stdout) if proc is not None and proc.returncode == 0 else None
        if started is not None:
            return started
    return None


def run_gap(environ: Optional[Mapping[str, str]] = None, timeout: float = SLURM_CALL_TIMEOUT) -> float:
    """How long before a run's start a file may have been written and still be this run's: half the least gap
    between runs (cred_expire + 1 s, from `scontrol show config`), at most RUN_GAP. A site that lowered
    cred_expire below 2 x RUN_GAP (this project's local cluster: 10 s) requeues sooner, and the run before's
    results would otherwise pass for this run's."""
    proc = _slurm_call(["scontrol", "show", "config"], environ, time.monotonic() + timeout)
    found = re.search(r"\bcred_expire=(\d+)", proc.stdout) if proc is not None and proc.returncode == 0 else None
    return RUN_GAP if found is None else min(RUN_GAP, (int(found[1]) + 1) / 2)


def parse_start(output: str) -> Optional[float]:
    """squeue's StartTime ('2026-11-22T03:50:01', in this machine's time zone) as epoch seconds; None for
    'N/A', 'Unknown' or nothing."""
    lines = output.strip().splitlines()
    try:
        return datetime.fromisoformat(lines[0].strip()).timestamp() if lines else None
    except ValueError:
        return None


def _read_outcomes(job: Any, grace: float, since: Optional[float] = None) -> List[Tuple[Optional[str], Any]]:
    """(outcome, value) per task: ('success', result), ('error', traceback text) or (None, None), the last also
    for a result written before `since` (the start of the job's last run: a requeued job's earlier run)."""
    from submitit.core.utils import pickle_load

    deadline = time.monotonic() + grace
    while not _all_results_written(job, since) and time.monotonic() < deadline:
        time.sleep(0.2)
    outcomes: List[Tuple[Optional[str], Any]] = []
    for task in _tasks(job):
        path = task.paths.result_pickle
        fresh = _written_since(path, since)
        outcomes.append(tuple(pickle_load(path)) if fresh else (None, None))  # type: ignore[arg-type]
    return outcomes


# A line that names a Python exception ("RuntimeError: ...", "[rank1]: ValueError: ...", "torch.distributed.
# DistBackendError: ..."), as a traceback ends.
_EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]: )?[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failed)\b.*")
OTHER_ERRORS_SHOWN = 8


def _other_errors(job: Any, tasks: List[int], outcomes: List[Tuple[Any, Any]]) -> str:
    """The error each of `tasks` ended with, one line each: which task failed first is a guess when they failed
    within milliseconds of each other (a command's result is written only after it exited, and the others lose
    it as a peer as it exits), so the blamed task's own error may be a peer's consequence and the cause here."""
    lines = []
    for task in tasks[:OTHER_ERRORS_SHOWN]:
        outcome, value = outcomes[task]
        found: Optional[str]
        if outcome == "error" and command_failure(value) is None:  # a function's traceback: its last line
            found = (str(value).strip().splitlines() or [""])[-1]
        else:
            found = last_exception_line(_task_paths(job, task)[1])
        if found:
            lines.append(f"  task {task}: {found}")
    more = f"\n  ... and {len(tasks) - OTHER_ERRORS_SHOWN} more" if len(tasks) > OTHER_ERRORS_SHOWN else ""
    return "\nwhat the other tasks ended with:\n" + "\n".join(lines) + more if lines else ""


def last_exception_line(log: Path) -> Optional[str]:
    """The last line of a task's log that names an exception, without slurmdist's and submitit's own traceback
    of the failed command (None without one)."""
    text = _tail(log, lines=400, skip="submitit ", until=CommandFailed.__name__, after=RUN_STARTS_IN_TASK_LOGS)
    return next((line.strip() for line in reversed(text.splitlines()) if _EXCEPTION_LINE.match(line.strip())), None)


def command_failure(traceback: str) -> Optional[str]:
    """What a task's remote traceback says when its command failed ('command exited with status 3: ...'), or
    None for any other error."""
    last = traceback.strip().splitlines()[-1:] or [""]
    _, found, said = last[0].partition(f"{CommandFailed.__name__}: ")
    return said if found else None


def _tail(path: Path, lines: int = 20, skip: Optional[str] = None, until: Optional[str] = None,
          after: Optional[str] = None) -> str:
    """The last `lines` lines of a log (read from its last 64 KiB: logs grow large), from the last line that
    holds `after` on (a requeued job's log holds its runs before too), without those that start with `skip`,
    and without the last traceback when it names `until` (the task's own, after the command's output, which
    would crowd it out)."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 65536))
            text = log.read().decode(errors="replace").splitlines()
    except OSError:
        return "(no log file)"
    if after is not None:
        text = text[next((i for i in reversed(range(len(text))) if after in text[i]), 0):]
    starts = [i for i, line in enumerate(text) if line.startswith("Traceback (most recent call last):")]
    if until is not None and starts and any(until in line for line in text[starts[-1]:]):
        text = text[:starts[-1]]
    kept = [line for line in text if skip is None or not line.startswith(skip)]
    return "\n".join(kept[-lines:])


def log_paths(job: Any) -> Tuple[Path, Path]:
    """Task 0's stdout and stderr files (rank 0 prints there)."""
    return _task_paths(job, 0)


"""`slurmdist sbatch`: render a job script from options, for users who want their own.

    slurmdist sbatch --nodes 2 --gpus-per-node 4 --time 2:00:00 -- python train.py --lr 0.1 > job.sh
    slurmdist sbatch --nodes 2 --gpus-per-node 4 -- python train.py | sbatch     # sbatch reads stdin

Why it is careful: a job script is a shell program, and what a user types (a job name, a command argument
with quotes or `$(...)`) must arrive as data, never run as code. Every command word is shell-quoted, and
`#SBATCH` values, which sbatch parses itself and which a newline would turn into a shell line, must match a
strict pattern or the command exits 2 naming the option.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Any, Collection, List, Optional, Sequence, Tuple

from .argv import command_words, refuse_job_wide_counts
from .envvars import whole_number
from .errors import SlurmdistError

LAUNCHERS = ("srun", "torchrun", "mpirun")
DEFAULT_SIGNAL = "USR2@120"
SLURM_DEFAULT_SIGNAL_DELAY = 60  # seconds, when --signal gives no @DELAY
DEVICES = ("gpu", "npu", "cpu")
REQUEUE_SIGNAL_VARIABLE = "SLURMDIST_REQUEUE_SIGNAL"  # requeue.SIGNAL_VARIABLE, without importing requeue here

# What each #SBATCH value may contain. Narrow on purpose: these are the characters real partition,
# account and job names and Slurm's filename patterns (%j, %x, %A, %a) use, and none of them is special to
# sbatch's own #SBATCH parser (quotes, '#', whitespace) or to the shell.
_NAME = re.compile(r"[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*")
# re.ASCII: \d alone also matches other scripts' digits ('٣'), which sbatch refuses.
_TIME = re.compile(r"\d+(-\d+)?(:\d+){0,2}|\d+-\d+(:\d+)?|(?i:infinite|unlimited)", re.ASCII)
NO_LIMIT = re.compile(r"[0:-]+|(?i:infinite|unlimited)")  # Slurm's ways to say "no time limit"
_PATH = re.compile(r"[A-Za-z0-9_./%+-]+")
_SIGNAL = re.compile(r"(R:)?[A-Z0-9]+(@\d+)?", re.ASCII)  # not B:, which signals only the batch shell (it would die)
# An sbatch option's long name (shared with submit.py), and a --mem size (sbatch takes no fractions; a unit may end
# in B, as 500MB, but a bare B is no unit sbatch knows). re.ASCII: \d also matches other scripts' digits.
OPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")  # fullmatch: '$' would also pass a trailing newline
_MEMORY_SIZE = re.compile(r"\d+([KMGT]B?)?", re.IGNORECASE | re.ASCII)
# A value given with --sbatch KEY=VALUE: what constraints (a100&nvlink), gres (gpu:a100:4), node lists
# (node[1-3]), mail addresses and reservations hold; nothing that ends an #SBATCH line or starts a comment.
_EXTRA_VALUE = re.compile(r"[A-Za-z0-9_.,:;@%+=/\[\]()&|!*~^-]+")
# #SBATCH options the renderer writes itself, and the option of its own that sets each instead.
_RENDERED_OPTIONS = {
    "nodes": "--nodes", "ntasks": "--nodes and --tasks-per-node", "ntasks-per-node": "--tasks-per-node",
    "gpus-per-node": "--gpus-per-node", "cpus-per-task": "--cpus-per-task", "time": "--time",
    "partition": "--partition", "account": "--account", "job-name": "--job-name", "output": "--output",
    "error": "--output (one log per job)", "signal": "--signal", "requeue": "--no-requeue to leave it out",
    "no-requeue": "--no-requeue", "open-mode": "nothing (a requeued job appends to its log)", "mem": "--mem",
    "wrap": "the command after --",
}


class SbatchError(SlurmdistError):
    """An option `slurmdist sbatch` cannot put into a job script safely or meaningfully."""


@dataclass(frozen=True)
class JobSpec:
    """What the rendered script asks Slurm for and runs. `command` is argv: it is quoted, never parsed."""

    command: Tuple[str, ...]
    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: Optional[int] = None  # default: one per GPU (one per node under torchrun), else 1
    workers_per_node: Optional[int] = None  # torchrun's --nproc-per-node; default: one per GPU, else 1
    cpus_per_task: Optional[int] = None
    time: str = "01:00:00"
    partition: Optional[str] = None
    account: Optional[str] = None
    job_name: str = "train"
    output: str = "%x-%j.out"
    launcher: str = "srun"
    device: str = "gpu"
    signal: Optional[str] = None  # the warning before the time limit: None = USR2@120 under srun, "" = none
    requeue: bool = True
    share_devices: bool = False  # let more ranks than devices share a node's GPUs/NPUs (SLURMDIST_SHARE_DEVICES)
    setup: Tuple[str, ...] = ()  # shell lines before the launch (module load, source a venv): shell on purpose
    mem: Optional[str] = None  # memory per node, with its unit (32G)
    # Other #SBATCH options: (name, value), None for a flag; `validate` spells the names with dashes, as sbatch.
    extra: Tuple[Tuple[str, Optional[str]], ...] = ()


# --- validation ------------------------------------------------------------------------------------------


def _check(option: str, value: Optional[str], pattern: "re.Pattern[str]", example: str,
           typed: Optional[str] = None) -> None:
    """`typed`: how the error names the value, when the user wrote it otherwise (--signal is upper-cased)."""
    if value is not None and not pattern.fullmatch(value):
        raise SbatchError(f"{typed or f'--{option} {value!r}'} is not allowed in an #SBATCH line: use letters, "
                          f"digits and {example}")


def validate(spec: JobSpec) -> JobSpec:
    """The spec with defaults filled in, or a `SbatchError` naming the first bad option."""
    command_words(spec.command, "slurmdist sbatch", "slurmdist sbatch [options] -- python train.py ARGS", SbatchError,
                  program_first=False)  # torchrun takes -m there: checked by launcher below
    if spec.launcher not in LAUNCHERS:
        raise SbatchError(f"--launcher {spec.launcher!r}: use one of {', '.join(LAUNCHERS)}")
    for line in spec.setup:
        if not line.strip() or any(c in line for c in "\n\r\0"):
            raise SbatchError(f"--setup {line!r}: give one non-empty shell line per --setup (repeat it for more)")
    if spec.device not in DEVICES:
        raise SbatchError(f"--device {spec.device!r}: use one of {', '.join(DEVICES)}")
    for option in ("nodes", "gpus_per_node", "tasks_per_node", "workers_per_node", "cpus_per_task"):
        value = getattr(spec, option)
        minimum = 0 if option == "gpus_per_node" else 1
        if value is not None and value < minimum:
            raise SbatchError(f"--{option.replace('_', '-')} must be at least {minimum}, got {value}")
    if any("\0" in word for word in spec.command):
        raise SbatchError("the command contains a NUL byte, which no shell can pass on")
    _check("job-name", spec.job_name, _NAME, "_ . + -")
    _check("partition", spec.partition, _NAME, "_ . + - (a comma-separated list is fine)")
    _check("account", spec.account, _NAME, "_ . + -")
    if not _TIME.fullmatch(spec.time):
        raise _not_a_time(spec.time)
    _check("output", spec.output, _PATH, "_ . / % + - (%x job name, %j job id)")
    _check_mem(spec.mem)
    for name, value in spec.extra:
        _check_extra(name, value)  # its errors quote the names as given
    spec = replace(spec, extra=tuple((name.replace("_", "-"), value) for name, value in spec.extra))
    job_wide = [value for name, value in spec.extra if name == "gpus"]
    if job_wide and spec.gpus_per_node and spec.device == "gpu":
        raise SbatchError(f"--sbatch gpus={job_wide[0]} beside -G {spec.gpus_per_node}: sbatch's --gpus is the job's "
                          "total and clashes with the --gpus-per-node the script writes ('Failed to ensure --gpus >= "
                          "--gres=gpu/--gpus-per-node'): give the GPUs once, with -G (per node)")
    gres = _extra_gres(spec)
    if spec.gpus_per_node and spec.device == "gpu" and asks_for_devices([("gres", ",".join(gres))]):
        raise SbatchError(f"--sbatch gres={','.join(gres)} asks for GPUs again beside -G {spec.gpus_per_node}, which "
                          f"the script writes as --gpus-per-node={spec.gpus_per_node}: Slurm takes one of the two "
                          "(the tasks saw -G's count). Give the count once, with -G, and a GPU type with --sbatch "
                          "constraint=TYPE; or leave -G out and give --tasks-per-node to go with the gres")
    if _npu_gres(spec) and any(re.match(r"npu(:|$)", item) for item in gres):
        raise SbatchError(f"--sbatch gres={','.join(gres)} asks for NPUs again beside -G "
                          f"{spec.gpus_per_node} --device npu, which the script writes as --gres=npu:"
                          f"{spec.gpus_per_node}: give the NPU count once, with -G")
    # Errors quote the value as the user wrote it.
    typed = f"--signal {spec.signal!r}" if spec.signal is not None else f"the default --signal {DEFAULT_SIGNAL}"
    warning = spec.signal
    if warning is None:  # srun passes it to every task; torchrun's agent and mpirun would die of it
        warning = DEFAULT_SIGNAL if spec.launcher == "srun" else ""
    spec = replace(spec, signal=warning.strip().upper())  # usr2@60 as Slurm's own spelling
    if spec.signal and spec.signal.startswith("B:"):
        raise SbatchError(f"{typed}: B: sends it to the batch shell only, which this script does "
                          "not trap: the job would die without a checkpoint. Drop the B: (every task gets it)")
    _check("signal", spec.signal or None, _SIGNAL, "Slurm's format: SIGNAL[@SECONDS], e.g. USR2@120", typed)
    if spec.signal:
        spec = replace(spec, signal=_in_slurms_spelling(spec.signal, typed))
    if spec.signal and spec.launcher != "srun":
        raise SbatchError(f"{typed} with --launcher {spec.launcher}: {spec.launcher} does not "
                          "pass it on to the ranks and would die of it; use --launcher srun for a warning before "
                          "the time limit")
    _check_signal_delay(spec, typed)
    if spec.gpus_per_node and spec.device == "cpu":
        raise SbatchError(f"--gpus-per-node {spec.gpus_per_node} with --device cpu: drop one of them "
                          "(CPU-only jobs give --tasks-per-node)")
    if spec.workers_per_node is not None and spec.launcher != "torchrun":
        raise SbatchError(f"--workers-per-node is for --launcher torchrun; with {spec.launcher} each task is one "
                          "rank: use --tasks-per-node")
    if spec.launcher != "torchrun" and spec.command[0].startswith("-"):
        raise SbatchError(f"the command starts with {spec.command[0]!r}, which {spec.launcher} would read as an "
                          f"option of its own (srun: 'Invalid --distribution specification' for -m): name the "
                          f"program first, e.g. `-- python {quote_command(spec.command)}`")
    if spec.launcher == "torchrun":
        if spec.tasks_per_node not in (None, 1):
            raise SbatchError("--launcher torchrun runs one srun task per node (torchrun starts the workers): "
                              "drop --tasks-per-node and use --gpus-per-node or --workers-per-node")
        if re.fullmatch(r"python[0-9.]*", spec.command[0].rsplit("/", 1)[-1]):
            raise SbatchError("--launcher torchrun starts Python itself: pass the script and its arguments, "
                              "e.g. `-- train.py --lr 0.1`")
    spec = _with_rank_counts(spec)
    _check_devices_per_rank(spec)
    return spec


def memory_size_fault(text: str) -> Optional[str]:
    """Why sbatch's --mem would not take `text` as meant: 'not a size', or 'no unit' (a bare number other than 0,
    all of the node's memory, which sbatch reads as megabytes); None when it would. Shared with submit.py."""
    size = _MEMORY_SIZE.fullmatch(text)
    if size is None:
        return "not a size"
    return "no unit" if size.group(1) is None and text.strip("0") else None


def _check_mem(mem: Optional[str]) -> None:
    if mem is not None and memory_size_fault(mem) is not None:
        raise SbatchError(f"--mem {mem!r} is not a memory size with its unit, such as 32G or 500M (sbatch reads a "
                          "bare number as megabytes; 0 is all of the node's memory)")


# sbatch options of their own that are also the start of another's name: not abbreviations of it.
_OPTIONS_NOT_ABBREVIATIONS = frozenset({"gpus"})


# Other names sbatch takes for an option (its getopt table): `tasks-per-node=3` is --ntasks-per-node=3.
_SBATCH_ALIASES = {"tasks-per-node": "ntasks-per-node"}


def managed_option(option: str, managed: Collection[str]) -> Optional[str]:
    """Which of the `managed` options `option` (a long name, '-' spelled) stands for: itself, one of its other
    names, or the one it abbreviates (sbatch takes any unambiguous start of a long option: `part=x` is
    --partition, `tasks=3` is --tasks-per-node); None for none."""
    names = {**{name: name for name in managed},
             **{alias: name for alias, name in _SBATCH_ALIASES.items() if name in managed}}
    if option in names:
        return names[option]
    if option in _OPTIONS_NOT_ABBREVIATIONS:
        return None
    return next((names[name] for name in sorted(names) if name.startswith(option)), None)


def asks_for_devices(extra: Sequence[Tuple[str, Optional[str]]], device: str = "gpu") -> bool:
    """Whether --sbatch options (a validated spec's) ask Slurm for at least one `device` ("gpu", "npu")
    themselves: gpus=8, gpus-per-task=1, gres=gpu:a100:4, tres-per-task=gres/gpu:1. A gres of another kind
    (nvme:1), or a count of 0, asks for none."""
    for name, value in extra:
        if name.startswith("gpus"):  # --gpus, --gpus-per-task, --gpus-per-socket: "8", "a100:8"
            if device == "gpu" and whole_number((value or "").rpartition(":")[2]) != 0:
                return True
        elif name.startswith(("gres", "tres-per")):
            for item in (value or "").split(","):
                kind, _, rest = item.removeprefix("gres/").removeprefix("gres:").partition(":")
                if kind == device and whole_number(rest.rpartition(":")[2] or "1") != 0:
                    return True
    return False


def _check_extra(name: str, value: Optional[str]) -> None:
    """An --sbatch KEY[=VALUE] option: a long option name the script does not write itself, and a value that
    stays one #SBATCH word."""
    typed = name if value is None else f"{name}={value}"
    if not OPTION_NAME.fullmatch(name) or len(name) == 1:
        raise SbatchError(f"--sbatch {typed!r}: give an sbatch option's long name (constraint for -C, qos for -q), "
                          "as KEY=VALUE or a flag alone, e.g. --sbatch constraint=a100 or --sbatch exclusive")
    spelled = name.replace("_", "-")
    option = managed_option(spelled, _RENDERED_OPTIONS)
    if option is not None:
        read_as = "" if option == spelled else f" (sbatch reads {name} as --{option})"
        raise SbatchError(f"--sbatch {typed!r}: the script writes --{option} itself{read_as}; use "
                          f"{_RENDERED_OPTIONS[option]}")
    if spelled == "ntasks-per-gpu":
        raise SbatchError(f"--sbatch {typed!r}: sbatch refuses --ntasks-per-gpu beside the --ntasks-per-node the "
                          "script writes ('mutually exclusive'): give -G N (GPUs per node) and --tasks-per-node M, "
                          "with --share-devices when M is more than N")
    if value is not None and not _EXTRA_VALUE.fullmatch(value):
        raise SbatchError(f"--sbatch {typed!r}: the value must be one word without spaces, quotes or '#' (an "
                          "#SBATCH line ends there)")


def _not_a_time(time: str) -> SbatchError:
    """The error for a --time sbatch would not take: its forms, not how submit's time= parser words it."""
    return SbatchError(f"--time {time!r} is not a time limit Slurm takes: use MINUTES, HH:MM:SS, D-HH:MM:SS (or 0 or "
                       "infinite for none)")


def _check_signal_delay(spec: JobSpec, typed: str) -> None:
    """The warning must come after the job started, and Slurm's --signal takes at most 65535 s. A job warned as
    it starts saves, requeues, is warned again: requeued until its limit of requeues."""
    if not spec.signal:
        return
    from .requeue import signal_delay_problem
    from .submit import SubmitError, parse_time

    _, delay = _warning_of(spec.signal)
    try:
        # In whole minutes, rounded up, as Slurm keeps the limit (00:03:01: 4); 0, 00:00:00, 0-0: no limit.
        minutes = None if NO_LIMIT.fullmatch(spec.time) else parse_time(spec.time)
    except SubmitError:  # its message names Python's time=, not this option
        raise _not_a_time(spec.time) from None
    problem = signal_delay_problem(delay, minutes, what=typed,
                                   within=f"--time {spec.time}", time_name="--time", delay_name="the delay after @")
    if problem is not None:
        raise SbatchError(problem)


def _in_slurms_spelling(value: str, typed: str) -> str:
    """A --signal value in Slurm's format, checked to name a signal the tasks can catch (the script tells the
    command to save and requeue when it comes), spelled as sbatch takes it: `SIGUSR2@90` is `USR2@90`, and a
    signal sbatch knows by number only (`PWR`) is its number."""
    from .requeue import RequeueError, parse_signal, slurm_name

    scope, name, delay = _signal_parts(value)
    try:
        sig = parse_signal(name, named=typed)
    except RequeueError as exc:
        raise SbatchError(str(exc)) from None
    return f"{scope}{slurm_name(sig)}{delay}"


def _warning_of(signal: str) -> Tuple[str, int]:
    """A validated --signal value as (signal name, seconds before the limit): 'R:USR2@120' -> ('USR2', 120);
    Slurm's default delay when it gives none."""
    _, name, delay = _signal_parts(signal)
    return name, int(delay[1:]) if delay else SLURM_DEFAULT_SIGNAL_DELAY


def _signal_parts(value: str) -> Tuple[str, str, str]:
    """A --signal value in Slurm's format split as written: 'R:USR2@120' -> ('R:', 'USR2', '@120')."""
    name, at, seconds = value.partition("@")
    scope = "R:" if name.startswith("R:") else ""
    return scope, name[len(scope):], at + seconds


def _signal_called(name: str) -> str:
    """A validated signal as Python names it: 'USR2', 'SIGUSR2' and '12' are all 'SIGUSR2'."""
    from .requeue import parse_signal

    return parse_signal(name).name


def _with_rank_counts(spec: JobSpec) -> JobSpec:
    """Tasks per node, and torchrun's workers per node: one per GPU unless given (torchrun: one task)."""
    per_gpu = max(spec.gpus_per_node, 1)
    if spec.launcher == "torchrun":
        return replace(spec, tasks_per_node=1, workers_per_node=spec.workers_per_node or per_gpu)
    return replace(spec, tasks_per_node=spec.tasks_per_node or per_gpu)


def _check_devices_per_rank(spec: JobSpec) -> None:
    """More ranks on a node than GPUs/NPUs: slurmdist.init() would refuse it in every rank once the job runs."""
    torchrun = spec.launcher == "torchrun"
    ranks = (spec.workers_per_node if torchrun else spec.tasks_per_node) or 1
    option = "--workers-per-node" if torchrun else "--tasks-per-node"
    if spec.device == "cpu" or not spec.gpus_per_node or ranks <= spec.gpus_per_node or spec.share_devices:
        return
    kind = "NPUs" if spec.device == "npu" else "GPUs"
    raise SbatchError(
        f"{option} {ranks} with --gpus-per-node {spec.gpus_per_node}: {ranks} ranks per node on "
        f"{spec.gpus_per_node} {kind}, which slurmdist.init() refuses when the job starts (ranks stacked on one "
        f"device are slow and run out of its memory). Ask for {ranks} {kind} per node, run fewer ranks, or "
        f"pass --share-devices if sharing is what you want (it sets SLURMDIST_SHARE_DEVICES=1)"
    )


# --- rendering (pure) ------------------------------------------------------------------------------------

# Slurm >= 22.05: srun no longer inherits --cpus-per-task from the allocation; a job script hands it on.
HAND_ON_CPUS_PER_TASK = "if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK; fi"
# sbatch --export=NONE (or NIL) leaves SLURM_EXPORT_ENV so in the batch script, and every srun in it (mpirun's
# too) would start its tasks without the script's environment: no PATH, nothing the --setup lines set up.
HAND_ON_ENVIRONMENT = "case ${SLURM_EXPORT_ENV:-} in [Nn][Oo][Nn][Ee] | [Nn][Ii][Ll]) export SLURM_EXPORT_ENV=ALL ;; esac"


# Run with bash, the script would stop at its first job variable ("SLURM_JOB_ID: unbound variable").
NOT_IN_A_JOB = [
    "# Run by sbatch (or inside salloc), not on its own: what follows reads the job's variables.",
    '[[ -n ${SLURM_JOB_ID:-} ]] || { echo "${0##*/}: submit it with sbatch (sbatch $0); run as a plain script it '
    'is in no job" >&2; exit 2; }',
]


# mpirun -np takes the allocation's task count, which salloc leaves unset when asked for none.
MPIRUN_NEEDS_A_TASK_COUNT = [
    '[[ -n ${SLURM_NTASKS:-} ]] || { echo "${0##*/}: this allocation has no task count (SLURM_NTASKS is unset: '
    'salloc without -n or --ntasks-per-node); ask for one rank per device, e.g. salloc -N2 --ntasks-per-node=4" '
    '>&2; exit 2; }',
]


def render(spec: JobSpec) -> str:
    """The job script for `spec`, validated here."""
    return render_valid(validate(spec))


def render_valid(spec: JobSpec) -> str:
    """The job script for a spec `validate` returned (its defaults filled in)."""
    lines = ["#!/bin/bash", "# Rendered by `slurmdist sbatch`. Submit with: sbatch THIS_FILE", "#"]
    if spec.setup:  # before the first command, where a directive covers the whole file
        lines += ["# shellcheck disable=SC1090,SC1091  # the site's files --setup lines may source", "#"]
    if spec.signal:
        name, delay = _warning_of(spec.signal)
        lines += [f"# --signal: every task gets {_signal_called(name)} {delay} s before the time limit. The command",
                  "# should handle it (slurmdist.requeue.install(), or a handler of its own: save, then requeue or go",
                  "# on). slurmdist.init() logs it in a program without one, which runs on; it kills any other",
                  "# command. Render with --signal '' for no warning.", "#"]
    lines += [f"#SBATCH {option}" for option in sbatch_options(spec)]
    lines += ["", "set -euo pipefail", *NOT_IN_A_JOB]
    if spec.launcher == "mpirun":
        lines += MPIRUN_NEEDS_A_TASK_COUNT
    elif spec.launcher == "torchrun":  # `sbatch --ntasks-per-node=2 THIS_FILE` would override the script's 1
        lines += ["# One srun task per node: each is a torchrun agent, and two on a node would both host its port.",
                  "[[ ${SLURM_TASKS_PER_NODE:-1} =~ ^1(\\(x[0-9]+\\))?$ ]] || { echo \"${0##*/}: one task per node "
                  "(--ntasks-per-node=1), got SLURM_TASKS_PER_NODE=$SLURM_TASKS_PER_NODE: torchrun starts the "
                  f"workers, {spec.workers_per_node} of them\" >&2; exit 2; }}"]
    if spec.signal:
        lines += ["# The signal slurmdist.requeue.install() listens for: the one --signal above sends.",
                  f"export {REQUEUE_SIGNAL_VARIABLE}={_signal_called(_warning_of(spec.signal)[0])[3:]}"]
    if spec.launcher != "mpirun":  # mpirun's own srun (its daemons, one per node) must keep the node's CPUs
        lines += [
            "# Slurm >= 22.05: srun no longer inherits --cpus-per-task from the allocation; hand it on when set.",
            HAND_ON_CPUS_PER_TASK,
        ]
    lines += ["# Submitted with --export=NONE: srun would start the tasks with no environment; hand this one on.",
              HAND_ON_ENVIRONMENT]
    if spec.share_devices:
        lines += ["# Asked for with --share-devices: more ranks per node than devices, on purpose.",
                  "export SLURMDIST_SHARE_DEVICES=1"]
    if spec.setup:
        # Site scripts (module, conda's and venv's activate) often read unset variables: not under set -u. The
        # lines stand as typed, one command each: indented, a heredoc's end marker would not end it, and grouped,
        # bash would parse them all before a `shopt -s extglob` among them ran (shellcheck: see the header).
        # Back to where sbatch started the script (the submit directory, or --chdir's) after them: a setup line
        # may cd elsewhere.
        lines += ["# --setup, here in the batch script; the tasks srun starts inherit what it sets up.",
                  "slurmdist_submit_dir=$PWD", "set +u", *spec.setup, ENDS_THE_SETUP, "set -u",
                  'cd "$slurmdist_submit_dir"']
    lines += [
        # salloc without a task count sets no SLURM_NTASKS: srun then starts one task per node.
        'echo "job $SLURM_JOB_ID: $SLURM_NNODES node(s) ($SLURM_JOB_NODELIST), ${SLURM_NTASKS:-$SLURM_NNODES} '
        'task(s)"',
        "",
    ]
    launch = launch_lines(spec)
    if any(mark in word for word in spec.command for mark in ("$", "`")):
        # The command's `$`/backticks are quoted on purpose: they reach the program as typed. The directive
        # covers the one command that follows it: the launcher line.
        last = max(i for i, line in enumerate(launch) if line.startswith(("srun ", "mpirun ")))
        launch.insert(last, "# shellcheck disable=SC2016")
    return "\n".join(lines + launch) + "\n"


def _npu_gres(spec: JobSpec) -> bool:
    """Whether the script asks for the job's NPUs itself, with --gres (Slurm has no --npus-per-node)."""
    return bool(spec.gpus_per_node) and spec.device == "npu"


def _extra_gres(spec: JobSpec) -> List[str]:
    """The resources --sbatch gres=... asks for besides ('gpu:1', 'tmpdisk:10')."""
    return [item for name, value in spec.extra if name == "gres" and value for item in value.split(",") if item]


def sbatch_options(spec: JobSpec) -> List[str]:
    """The #SBATCH options, in the order a reader looks for them."""
    options = [f"--job-name={spec.job_name}", f"--nodes={spec.nodes}", f"--ntasks-per-node={spec.tasks_per_node}"]
    if spec.gpus_per_node and spec.device == "gpu":
        options.append(f"--gpus-per-node={spec.gpus_per_node}")
    elif _npu_gres(spec):  # one --gres line with the user's own: sbatch keeps only the last one given
        options.append("--gres=" + ",".join([f"npu:{spec.gpus_per_node}", *_extra_gres(spec)]))
    if spec.cpus_per_task:
        options.append(f"--cpus-per-task={spec.cpus_per_task}")
    options.append(f"--time={spec.time}")
    options += [f"--{name}={value}" for name, value in (("partition", spec.partition), ("account", spec.account),
                                                        ("mem", spec.mem)) if value]
    options += [f"--{name}" + ("" if value is None else f"={value}") for name, value in spec.extra
                if not (_npu_gres(spec) and name == "gres")]
    if spec.signal:  # srun only (validated): torchrun's agent and mpirun do not pass SIGUSR2 on
        options.append(f"--signal={spec.signal}")
    options.append(f"--output={spec.output}")
    if spec.requeue:  # a requeued run adds to the log: Slurm would truncate it, and the earlier run's lines with it
        options += ["--requeue", "--open-mode=append"]
    else:  # said outright: a site's JobRequeue=1 (Slurm's default) requeues any job that does not say so
        options.append("--no-requeue")
    return options


def quote_command(words: Sequence[str]) -> str:
    """argv as one shell-safe string: `$(...)`, backticks, quotes, `;` and newlines stay literal text."""
    return " ".join(shlex.quote(word) for word in words)


_TASK_UNIT = {"gpu": "GPU", "npu": "NPU", "cpu": "rank"}  # what each srun task drives, by --device


def launch_lines(spec: JobSpec) -> List[str]:
    command = quote_command(spec.command)
    if spec.launcher == "srun":
        unit = _TASK_UNIT[spec.device] if spec.gpus_per_node else "rank"
        return [f"# One task per {unit}: slurmdist.init() reads SLURM_PROCID / SLURM_LOCALID in each.",
                f"srun --kill-on-bad-exit=1 {command}"]
    if spec.launcher == "mpirun":
        # Ranks per node from the allocation, so `sbatch --ntasks-per-node=N` on the command line still fits;
        # without a per-node count (`salloc -N2 -n6`), the allocation's own slots on each node, node by node.
        return ["# mpirun reads the allocation and starts its daemons with srun; slurmdist reads the MPI ranks.",
                'map_by=${SLURM_NTASKS_PER_NODE:+ppr:$SLURM_NTASKS_PER_NODE:node}',
                f'mpirun -np "$SLURM_NTASKS" --map-by "${{map_by:-slot}}" --bind-to none {command}']
    return [
        "# torchrun, one per node; the c10d rendezvous is hosted on the first node, at its Slurm NodeAddr.",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        "head_addr=$(scontrol -o show node \"$head_node\" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2) || true",
        "head_addr=${head_addr:-$head_node}",
        "rdzv_port=$((20000 + SLURM_JOB_ID % 10000))",
        "# Escaped \\$ expands inside each task (its own node); the rest expands here, once.",
        'srun --kill-on-bad-exit=1 bash -c "',
        "    addr=\\$(scontrol -o show node \\\"\\$SLURMD_NODENAME\\\" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)",
        f'    exec torchrun --nnodes=$SLURM_NNODES --nproc-per-node={spec.workers_per_node} \\',
        "        --rdzv-backend=c10d --rdzv-endpoint=$head_addr:$rdzv_port --rdzv-id=$SLURM_JOB_ID \\",
        '        --rdzv-conf=is_host=\\$((SLURM_NODEID == 0)) --local-addr=\\"\\${addr:-\\$SLURMD_NODENAME}\\" \\',
        f'        \\"\\$@\\"" torchrun {command}',
    ]


# --- command line ----------------------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    """Add the `sbatch` subcommand to the `slurmdist` parser."""
    parser = subparsers.add_parser(
        "sbatch",
        help="print a job script for a multi-node training run (pipe it to sbatch)",
        description="Render an sbatch script that starts COMMAND on every GPU of every node. Every word of "
        "COMMAND is shell-quoted: it runs as typed, nothing in it is expanded by the shell.",
    )
    parser.add_argument("--nodes", "-N", type=int, default=1)
    parser.add_argument("--gpus-per-node", "-G", type=int, default=0, help="GPUs (or NPUs) per node")
    parser.add_argument("--tasks-per-node", "--ntasks-per-node", type=int,
                        help="default: one per GPU (1 under torchrun)")
    refuse_job_wide_counts(parser)
    parser.add_argument("--workers-per-node", type=int, help="torchrun workers per node (default: GPUs per node)")
    parser.add_argument("--cpus-per-task", "-c", type=int)
    parser.add_argument("--time", "-t", default="01:00:00", help="MINUTES, HH:MM:SS or D-HH:MM:SS; 0 or infinite for no limit")
    parser.add_argument("--partition", "-p")
    parser.add_argument("--account", "-A")
    parser.add_argument("--job-name", "-J", default="train")
    parser.add_argument("--mem", help="memory per node with its unit, e.g. 32G or 500M")
    parser.add_argument("--sbatch", action="append", default=[], metavar="KEY=VALUE",
                        help="any other #SBATCH option, e.g. --sbatch constraint=a100 or --sbatch qos=high, or a flag "
                        "alone: --sbatch exclusive (repeatable)")
    parser.add_argument("--output", default="%x-%j.out", help="log file pattern (%%x job name, %%j job id)")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="srun")
    parser.add_argument("--device", choices=DEVICES, default="gpu", help="npu: ask for --gres=npu:N")
    parser.add_argument("--signal", default=None,
                        help="warning signal before the time limit (default USR2@120 with srun; '' for none)")
    parser.add_argument("--no-requeue", dest="requeue", action="store_false")
    parser.add_argument("--share-devices", action="store_true",
                        help="allow more ranks per node than GPUs/NPUs (exports SLURMDIST_SHARE_DEVICES=1; on GPUs the program "
                        "must then use gloo: NCCL takes one rank per GPU)")
    parser.add_argument("--setup", action="append", default=[], metavar="LINE",
                        help="shell line run before the launch, e.g. 'module load cuda' or 'source ~/venv/bin/activate' "
                        "(repeatable; needed where jobs are submitted with --export=NONE)")
    parser.add_argument("--write", metavar="FILE", help="write the script to FILE instead of stdout (- is stdout)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")
    parser.set_defaults(handler=_sbatch)


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    from .submit_cli import parse_sbatch_options

    command = command_words(args.command, "slurmdist sbatch", "slurmdist sbatch [options] -- python train.py ARGS",
                            SbatchError, program_first=False)
    return JobSpec(
        command=tuple(command),
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        tasks_per_node=args.tasks_per_node,
        workers_per_node=args.workers_per_node,
        cpus_per_task=args.cpus_per_task,
        time=args.time,
        partition=args.partition,
        account=args.account,
        job_name=args.job_name,
        output=args.output,
        launcher=args.launcher,
        device=args.device,
        signal=args.signal,
        requeue=args.requeue,
        share_devices=args.share_devices,
        setup=tuple(args.setup),
        mem=args.mem,
        extra=tuple((key, None if value is True else value) for key, value in parse_sbatch_options(args.sbatch).items()),
    )


def _sbatch(args: argparse.Namespace) -> int:
    spec = validate(spec_from_args(args))  # once: the script and the warnings read the same defaults
    script = render_valid(spec)
    problem = setup_syntax_problem(spec.setup)
    if problem is not None:
        raise SbatchError(problem)
    for warning in (devices_not_asked_for(spec), workers_without_cores(spec)):
        if warning is not None:
            print(f"slurmdist sbatch: warning: {warning}", file=sys.stderr)
    problem = log_problem(spec.output, spec.job_name, dict(spec.extra).get("chdir"))
    if problem is not None:
        print(f"slurmdist sbatch: warning: {problem}", file=sys.stderr)
    if args.write == "":
        raise SbatchError("--write '' names no file: give a file name, or leave --write out (or give -) for stdout")
    if args.write not in (None, "-"):
        try:
            with open(args.write, "w") as stream:
                stream.write(script)
        except OSError as error:
            raise SbatchError(f"cannot write {args.write}: {error.strerror}") from None
        print(f"wrote {args.write}; submit with: sbatch {shlex.quote(args.write)}", file=sys.stderr)
    else:
        sys.stdout.write(script)
    return 0


_ASK_ON_SBATCH_LINE = {"gpu": "--gpus-per-node=N", "npu": "--gres=npu:N"}  # as sbatch_options() writes them


_ASK_FOR_CORES = ("cpus-per-gpu", "exclusive", "mincpus", "cores-per-socket")


def workers_without_cores(spec: JobSpec) -> Optional[str]:
    """What is off when a torchrun job's one task per node, which holds all the node's workers, asks for no
    CPUs: Slurm gives a task one CPU unless told (or the partition's default), which the workers then share.
    `spec` is validated (its workers per node filled in: by default one per GPU)."""
    workers = spec.workers_per_node or 1
    if spec.launcher != "torchrun" or spec.cpus_per_task or workers < 2:
        return None
    if any(name in _ASK_FOR_CORES for name, _ in spec.extra):  # asked for CPUs another way
        return None
    return (f"--launcher torchrun without --cpus-per-task: each node's one task holds all {workers} torchrun "
            f"workers, and Slurm gives a task 1 CPU unless told (or the partition's default), which they would "
            f"share. Give the cores for all of them, e.g. --cpus-per-task {4 * workers} for 4 each")


def devices_not_asked_for(spec: JobSpec) -> Optional[str]:
    """What is off when a GPU or NPU job asks Slurm for none of them (the default --device is gpu, and -G is 0
    unless given), or None: its ranks then train on the CPU wherever the partition gives no device anyway."""
    if spec.device == "cpu" or spec.gpus_per_node or asks_for_devices(spec.extra, spec.device):
        return None
    unit = _TASK_UNIT[spec.device]
    return (f"--device {spec.device} without --gpus-per-node asks Slurm for no {unit}s: the ranks get none, unless "
            f"the partition gives them anyway, and slurmdist.init() then trains on the CPU (gloo). Give -G N ({unit}s "
            f"per node; or {_ASK_ON_SBATCH_LINE[spec.device]} on the sbatch command line), or --device cpu for a CPU "
            "job")


SETUP_CHECK_TIMEOUT = 10.0  # seconds for `bash -n` over the --setup lines
# Written after the setup lines wherever they run (the rendered script, submitit's, the local wrapper): a last
# line that ends in a backslash would join the next line of the script to its command; it joins this one.
ENDS_THE_SETUP = ""


def setup_syntax_problem(setup: Sequence[str], option: str = "--setup") -> Optional[str]:
    """What `bash -n` says of the setup lines as the job runs them (one block), or None when they parse, or
    when bash is not here to ask. A line with an open quote or an `if` without `fi` would otherwise be found
    only when the job starts (after its wait in the queue), reported at a line of the script it broke."""
    from . import commands

    if not setup:
        return None
    # As the job runs them: one line after another (the rendered script, submitit's, the local wrapper). -n
    # parses without running, so a `shopt -s extglob` among them is taken as given.
    try:
        checked = commands.run(["bash", "-O", "extglob", "-n", "-c", "\n".join(setup) + "\n"],
                               timeout=SETUP_CHECK_TIMEOUT, env={**os.environ, "LC_ALL": "C"})  # bash's own words
    except (OSError, subprocess.TimeoutExpired):
        return None
    open_heredoc = re.search(r"here-document at line (\d+) delimited by end-of-file \(wanted [`'](.*)'\)",
                             checked.stderr)
    if open_heredoc is not None:  # only a warning to bash, which then feeds it the rest of the job script
        number, marker = int(open_heredoc[1]), open_heredoc[2]
        near = f" at {option} {setup[number - 1]!r}" if 1 <= number <= len(setup) else ""
        return (f"the {option} lines open a heredoc{near} that they never close, so it would swallow the rest "
                f"of the job script, launch included: end it with a {option} line that is {marker!r} alone, "
                "not indented")
    if checked.returncode == 0:
        return None
    said = checked.stderr.strip().splitlines()[0] if checked.stderr.strip() else f"status {checked.returncode}"
    found = re.match(r"bash: -c: line (\d+): (.*)", said)
    if found is None:
        return f"the {option} lines are not valid shell (bash -n: {said})"
    number, what = int(found[1]), found[2]
    near = f" at {option} {setup[number - 1]!r}" if 1 <= number <= len(setup) else ""
    return (f"the {option} lines are not valid shell{near}: {what}. Check the quotes, and that every if, for, "
            "while, { and heredoc they open is closed in them too")


# Slurm's filename patterns: %x, %j, ... with an optional zero-padding width (%3t); "%%" is a literal %.
LOG_PATTERN = re.compile(r"%(\d*)([A-Za-z%])")


def log_problem(output: str, job_name: str, chdir: Optional[str] = None) -> Optional[str]:
    """Why Slurm would write no log for `--output` (it opens the log before the script runs, creates no folder,
    and then writes none and says nothing), for a warning; None when nothing shows. Relative patterns count from
    `chdir` (the job's --chdir), else from here, where sbatch is usually run."""
    unknown: List[str] = []  # patterns known before the job starts that this process cannot fill in

    def known_now(found: "re.Match[str]") -> str:  # what a pattern becomes that is known before the job starts
        letter = found[2]
        if letter == "%":
            return "%"
        if letter == "x":
            return job_name
        if letter == "u":
            with contextlib.suppress(KeyError, OSError):  # a uid without a passwd entry, and no USER
                return getpass.getuser()
            unknown.append(found[0])
        return found[0]

    job_time = [found[0] for found in LOG_PATTERN.finditer(os.path.dirname(output)) if found[2] not in "%xu"]
    path = LOG_PATTERN.sub(known_now, output)
    here = "here" if chdir is None else f"in --sbatch chdir={chdir}"
    base = chdir or "."
    folder = os.path.dirname(path)
    if job_time:  # `logs/%j/out.txt`: a folder per job, which nobody creates
        return (f"the folder part of --output {output!r} holds {job_time[0]}, which only the job fills in, and "
                f"Slurm creates no folder: the job would have no log. Keep such patterns in the file name: "
                f"--output {folder[:folder.index(job_time[0])]}%x-%j.out")
    if output.endswith("/") or os.path.isdir(os.path.join(base, path)):
        return (f"--output {output!r} is a folder {here}: Slurm opens the log as a file, cannot, and the job fails "
                f"without one. Give a file pattern in it: --output {output.rstrip('/')}/%x-%j.out")
    if folder and not unknown and not os.path.isdir(os.path.join(base, folder)):
        return (f"the log folder {folder!r} of --output {output!r} does not exist {here}; Slurm writes no log at all "
                f"when it is missing as the job starts. Create it first: mkdir -p "
                f"{shlex.quote(os.path.join(chdir, folder) if chdir else folder)}")
    return None

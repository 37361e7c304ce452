"""`slurmdist submit [options] -- CMD ARGS...`: submit a command as a distributed job, optionally follow it.

    slurmdist submit --nodes 2 --gpus-per-node 4 --time 2:00:00 -- python train.py --steps 1000
    slurmdist submit --nodes 2 --tasks-per-node 2 --wait --timeout 600 -- python train.py

Prints the job id and rank 0's log files; with --wait prints state changes (stderr) and rank 0's output as it
is written (stdout), then exits 0 when every task succeeded, 1 when the job failed (with the remote error),
124 when --timeout ran out first, 130 on Ctrl-C (the job keeps running). The command runs without a shell,
one copy per task: nothing in it can inject shell code. Only --setup lines are shell, on purpose (module load,
source a venv).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from .argv import command_words, refuse_job_wide_counts
from .bounds import positive_seconds
from .errors import SlurmdistError
from .sbatch_render import memory_size_fault

WAIT_TIMEOUT_DEFAULT = 86400.0  # seconds --wait follows a job when --timeout is not given
EXIT_FAILED = 1
EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130  # what a shell reports for a command Ctrl-C ended


# sbatch's short options whose long names submit sets itself (-n is refused as a job-wide count before this).
_SHORT_SBATCH = {"-o": "output", "-e": "error", "-a": "array"}


def _instead_of(word: str) -> Optional[str]:
    """What to use for `word` when it is an sbatch option this command sets itself (`--output x`, `-ologs/x`:
    --folder), by its full long name or short letter (sbatch's own abbreviations are too loose to guess at)."""
    from .submit import MANAGED_OPTIONS

    option = word.partition("=")[0]
    name = _SHORT_SBATCH.get(option[:2]) if not option.startswith("--") else option[2:]
    if name in ("requeue", "no-requeue"):
        return "slurmdist submit always submits with --requeue: preemption and the requeue signal rely on it"
    if name not in MANAGED_OPTIONS:
        return None
    return f"sbatch's --{name} is slurmdist submit's to set; instead: {in_option_terms(MANAGED_OPTIONS[name])}"


def register(subparsers: Any) -> None:
    """Add the `submit` command to the `slurmdist` parser's subcommands."""
    parser = subparsers.add_parser(
        "submit", help="submit a command as a multi-node job through submitit (and --wait for it)",
        description=__doc__.split("\n\n")[0] + " Each task is one rank: slurmdist.init() inside just works; a "
        "torchrun-style script (a plain init_process_group() that reads RANK, WORLD_SIZE, MASTER_ADDR) runs under "
        "`slurmdist submit [options] -- slurmdist run -- python train.py`.",
    )
    parser.instead_of = _instead_of
    shape = parser.add_argument_group("job shape")
    shape.add_argument("--nodes", "-N", type=int, default=1)
    shape.add_argument("--gpus-per-node", "-G", type=int, default=0, help="one task per GPU")
    shape.add_argument("--tasks-per-node", "--ntasks-per-node", type=int,
                       help="tasks per node for CPU-only jobs (default 1)")
    refuse_job_wide_counts(shape)
    shape.add_argument("--cpus-per-task", "-c", type=int)
    shape.add_argument("--time", "-t", default="60", help="time limit: minutes, HH:MM:SS or D-HH:MM:SS (default 60)")
    shape.add_argument("--partition", "-p")
    shape.add_argument("--account", "-A")
    shape.add_argument("--mem", help="memory per node with its unit, e.g. 32G or 500M")
    shape.add_argument("--sbatch", action="append", default=[], metavar="KEY=VALUE",
                       help="any other #SBATCH option, e.g. --sbatch constraint=a100, or a flag alone: --sbatch exclusive "
                            "(repeatable)")
    shape.add_argument("--setup", action="append", default=[], metavar="LINE",
                       help="shell line run before srun, e.g. 'module load cuda' (repeatable)")
    shape.add_argument("--name", "--job-name", "-J", default="slurmdist", help="job name")
    shape.add_argument("--signal", help="requeue warning signal sent before the time limit (default USR2)")
    shape.add_argument("--signal-delay", type=int, default=None, metavar="SECONDS",
                       help="send it this long before the time limit (default 120)")
    where = parser.add_argument_group("where")
    where.add_argument("--folder", default="slurmdist-logs/%j", help="logs and pickles (%%j: the job id)")
    where.add_argument("--cluster", choices=("auto", "slurm", "local"), default="auto",
                       help="local: run every task on this machine (debugging without Slurm)")
    follow = parser.add_argument_group("following")
    follow.add_argument("--parsable", action="store_true",
                        help="print only the job id on stdout (the rest, and with --wait rank 0's output, on "
                             "stderr), as sbatch --parsable does: JOB=$(slurmdist submit --parsable ...)")
    follow.add_argument("--wait", action="store_true", help="follow the job and exit with its status")
    follow.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="with --wait: give up after this long (the job keeps running); default 1 day")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    parser.set_defaults(handler=run)


def parse_sbatch_options(items: List[str]) -> Dict[str, str]:
    """``['constraint=a100', 'qos=high']`` -> ``{'constraint': 'a100', 'qos': 'high'}``; a bare key is a flag."""
    options: Dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not key:
            raise SlurmdistError(f"--sbatch {item!r}: expected KEY=VALUE, e.g. --sbatch constraint=a100")
        options[key] = value if sep else True
    return options


# Submitter's keyword arguments that are options here: its errors name the keywords (nodes=-3), the user typed
# the options (--nodes -3).
_OPTION_OF = {name: "--" + name.replace("_", "-") for name in (
    "nodes", "gpus_per_node", "tasks_per_node", "cpus_per_task", "time", "partition", "account", "mem", "name",
    "signal", "signal_delay", "cluster", "folder")}
_KEYWORD = re.compile(r"\b(%s)=" % "|".join(sorted(_OPTION_OF, key=len, reverse=True)))
# Not in quotes: a quoted word is what the user typed (`--sbatch cpus_per_task=4`), kept as typed.
_BARE_KEYWORD = re.compile(r"(?<!')\b(%s)\b(?!')|(?<=Set )time\b" % "|".join(
    name for name in _OPTION_OF if "_" in name))


def in_option_terms(message: str) -> str:
    """A Submitter error as this command's user typed it: `nodes=-3` -> `--nodes -3`, `signal_delay` ->
    `--signal-delay`, the requeue signal -> `--signal`."""
    message = _KEYWORD.sub(lambda match: _OPTION_OF[match[1]] + " ", message)
    message = _BARE_KEYWORD.sub(lambda match: _OPTION_OF[match[0]], message)
    return message.replace("requeue signal '", "--signal '")


def cli_mem(text: Optional[str]) -> Optional[str]:
    """--mem as typed. A bare number is refused: in Python `mem=32` means 32 GiB, but sbatch's own --mem=32
    means 32 MB, and a user of either would get the other's meaning from it. 0 is all of the node's memory to
    sbatch, whatever the unit, and passes."""
    if text is None:
        return None
    fault = memory_size_fault(text.strip())
    if fault == "no unit":
        raise SlurmdistError(f"--mem {text.strip()} has no unit: sbatch reads a bare number as megabytes, slurmdist's "
                             "Python API as gibibytes. Write the unit, e.g. --mem 32G or --mem 500M (0: all of "
                             "the node's memory)")
    if fault is not None:  # in the command's terms: the Python API's own message speaks of Python numbers
        raise SlurmdistError(f"--mem {text!r} is not a Slurm memory size: give a whole number and its unit, such as "
                             "32G or 500M (0: all of the node's memory)")
    return text


def submitter_options(args: argparse.Namespace) -> Dict[str, Any]:
    """`Submitter` keyword arguments from the parsed command line (pure)."""
    options: Dict[str, Any] = {
        "nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "tasks_per_node": args.tasks_per_node,
        "cpus_per_task": args.cpus_per_task, "time": args.time, "partition": args.partition,
        "account": args.account, "mem": cli_mem(args.mem), "sbatch": parse_sbatch_options(args.sbatch),
        "setup": list(args.setup), "name": args.name, "signal": args.signal, "folder": args.folder,
        "cluster": args.cluster,
    }
    if args.signal_delay is not None:
        options["signal_delay"] = args.signal_delay
    return options


def command_of(args: argparse.Namespace) -> List[str]:
    return command_words(args.command, "slurmdist submit", "slurmdist submit [options] -- python train.py ARGS")


def run(args: argparse.Namespace) -> int:
    from .sbatch_render import setup_syntax_problem
    from .submit import Submitter, log_paths, stop_command

    command = command_of(args)
    # Checked before the job exists, not after.
    if args.timeout is not None and not args.wait:
        raise SlurmdistError(f"--timeout {args.timeout:g} applies only with --wait (without it slurmdist submit "
                             "returns once the job is queued): add --wait, or drop --timeout")
    timeout = WAIT_TIMEOUT_DEFAULT if args.timeout is None else args.timeout
    if args.wait:
        positive_seconds("--timeout", timeout, SlurmdistError)
    problem = setup_syntax_problem(args.setup)
    if problem is not None:
        raise SlurmdistError(problem)
    try:
        submitter = Submitter(**submitter_options(args))
    except SlurmdistError as error:
        raise type(error)(in_option_terms(str(error))) from None
    job = submitted_quietly(lambda: submitter.submit_command(command))
    stdout, stderr = log_paths(job)
    resources = submitter.resources
    about = sys.stderr if args.parsable else sys.stdout
    if args.parsable:
        print(job.job_id, flush=True)
    print(f"submitted job {job.job_id} ({resources.nodes} node(s) x {resources.ntasks_per_node} task(s), "
          f"{submitter.cluster})", file=about)
    print(f"  stdout: {stdout}", file=about)
    print(f"  stderr: {stderr}", file=about)
    print(f"  stop:   {stop_command(job)}", file=about, flush=True)
    if not args.wait:
        return 0
    return follow(job, timeout, about)


def submitted_quietly(submit: Callable[[], Any]) -> Any:
    """`submit()`, without submitit's own copy of sbatch's error on stderr: the error the CLI prints carries
    the same text, which would show twice. Whatever else went to stderr meanwhile is passed on."""
    captured, reported = io.StringIO(), ""
    try:
        with contextlib.redirect_stderr(captured):
            return submit()
    except SlurmdistError as error:
        reported = str(error)
        raise
    finally:
        text = captured.getvalue()
        if text.strip() and text.strip() not in reported:
            sys.stderr.write(text)
            sys.stderr.flush()


def follow(job: Any, timeout: float, out: Optional[Any] = None) -> int:
    """Print state changes and rank 0's new output (on `out`, default stdout) until the job ends; its exit
    status for the shell."""
    from .submit import JobFailedError, JobTimeoutError, log_paths, results, stop_command, wait

    tail = LogTail(log_paths(job)[0], out)
    seen: List[str] = []

    def on_state(state: str) -> None:
        tail.flush()
        if not seen or seen[-1] != state:
            seen.append(state)
            print(f"slurmdist: job {job.job_id} {state}", file=sys.stderr, flush=True)

    deadline = time.monotonic() + timeout
    try:
        wait(job, timeout=timeout, poll=0.5, on_state=on_state, on_poll=tail.flush)  # rank 0's output streams
        tail.flush()
        results(job, timeout=max(1.0, deadline - time.monotonic()))
    except JobTimeoutError as error:
        print(f"slurmdist: {error}", file=sys.stderr)
        return EXIT_TIMEOUT
    except JobFailedError as error:
        tail.flush()
        print(f"slurmdist: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:  # Ctrl-C stops following, not the job: say so, as the timeout does
        print(f"\nslurmdist: stopped following job {job.job_id}; it keeps running (`{stop_command(job)}` to stop "
              "it)", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"slurmdist: job {job.job_id} succeeded", file=sys.stderr)
    return 0


# A line of submitit's logger, to the end of the line: "submitit INFO (2026-11-30 06:40:00,123) - Job completed
# successfully".
_SUBMITIT_LINE = re.compile(r"submitit (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \(\d{4}-\d\d-\d\d [^)]*\) - .*$")


class LogTail:
    """New complete lines of a growing log file, without submitit's own bookkeeping lines."""

    def __init__(self, path: Path, out: Optional[Any] = None) -> None:
        self.path = path
        self.offset = 0
        self.out = out

    def flush(self) -> None:
        try:
            with open(self.path, "rb") as stream:
                stream.seek(self.offset)
                data = stream.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = self.out or sys.stdout
        for line in data[:end].decode(errors="replace").splitlines():
            if line.startswith("submitit "):
                continue
            # Output that ended without a newline has submitit's next line glued to it.
            glued = _SUBMITIT_LINE.search(line)
            print(line[:glued.start()] if glued else line, file=out)
        out.flush()

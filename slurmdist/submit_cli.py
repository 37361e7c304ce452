"""`slurmdist submit [options] -- CMD ARGS...`: submit a command as a distributed job, optionally follow it.

    slurmdist submit --nodes 2 --gpus-per-node 4 --time 2:00:00 -- python train.py --steps 1000
    slurmdist submit --nodes 2 --tasks-per-node 2 --wait --timeout 600 -- python train.py

Prints the job id and rank 0's log files; with --wait prints state changes (stderr) and rank 0's output as it
is written (stdout), then exits 0 when every task succeeded, 1 when the job failed (with the remote error),
124 when --timeout ran out first. The command runs without a shell, one copy per task: nothing in it can
inject shell code. Only --setup lines are shell, on purpose (module load, source a venv).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from .errors import SlurmdistError
from .bounds import positive_seconds

WAIT_TIMEOUT_DEFAULT = 86400.0  # seconds --wait follows a job when --timeout is not given
EXIT_FAILED = 1
EXIT_TIMEOUT = 124


def register(subparsers: Any) -> None:
    """Add the `submit` command to the `slurmdist` parser's subcommands."""
    parser = subparsers.add_parser(
        "submit", help="submit a command as a multi-node job through submitit (and --wait for it)",
        description=__doc__.split("\n\n")[0] + " Each task is one rank: slurmdist.init() inside just works.",
    )
    shape = parser.add_argument_group("job shape")
    shape.add_argument("--nodes", "-N", type=int, default=1)
    shape.add_argument("--gpus-per-node", type=int, default=0, help="one task per GPU")
    shape.add_argument("--tasks-per-node", type=int, help="tasks per node for CPU-only jobs (default 1)")
    shape.add_argument("--cpus-per-task", type=int)
    shape.add_argument("--time", "-t", default="60", help="time limit: minutes, HH:MM:SS or D-HH:MM:SS (default 60)")
    shape.add_argument("--partition", "-p")
    shape.add_argument("--account", "-A")
    shape.add_argument("--mem", help="memory per node, e.g. 32G")
    shape.add_argument("--sbatch", action="append", default=[], metavar="KEY=VALUE",
                       help="any other #SBATCH option, e.g. --sbatch constraint=a100 (repeatable)")
    shape.add_argument("--setup", action="append", default=[], metavar="LINE",
                       help="shell line run before srun, e.g. 'module load cuda' (repeatable)")
    shape.add_argument("--name", "-J", default="slurmdist", help="job name")
    shape.add_argument("--signal", help="requeue warning signal sent before the time limit (default USR2)")
    shape.add_argument("--signal-delay", type=int, default=None, metavar="SECONDS",
                       help="send it this long before the time limit (default 120)")
    where = parser.add_argument_group("where")
    where.add_argument("--folder", default="slurmdist-logs/%j", help="logs and pickles (%%j: the job id)")
    where.add_argument("--cluster", choices=("auto", "slurm", "local"), default="auto",
                       help="local: run every task on this machine (debugging without Slurm)")
    follow = parser.add_argument_group("following")
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


def submitter_options(args: argparse.Namespace) -> Dict[str, Any]:
    """`Submitter` keyword arguments from the parsed command line (pure)."""
    options: Dict[str, Any] = {
        "nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "tasks_per_node": args.tasks_per_node,
        "cpus_per_task": args.cpus_per_task, "time": args.time, "partition": args.partition,
        "account": args.account, "mem": args.mem, "sbatch": parse_sbatch_options(args.sbatch),
        "setup": list(args.setup), "name": args.name, "signal": args.signal, "folder": args.folder,
        "cluster": args.cluster,
    }
    if args.signal_delay is not None:
        options["signal_delay"] = args.signal_delay
    return options


def command_of(args: argparse.Namespace) -> List[str]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise SlurmdistError("slurmdist submit needs a command: `slurmdist submit [options] -- python train.py ARGS`")
    return command


def run(args: argparse.Namespace) -> int:
    from .submit import Submitter, log_paths

    command = command_of(args)
    # Checked before the job exists, not after.
    if args.timeout is not None and not args.wait:
        raise SlurmdistError(f"--timeout {args.timeout:g} applies only with --wait (without it slurmdist submit "
                             "returns once the job is queued): add --wait, or drop --timeout")
    timeout = WAIT_TIMEOUT_DEFAULT if args.timeout is None else args.timeout
    if args.wait:
        positive_seconds("--timeout", timeout, SlurmdistError)
    submitter = Submitter(**submitter_options(args))
    job = submitter.submit_command(command)
    stdout, stderr = log_paths(job)
    resources = submitter.resources
    print(f"submitted job {job.job_id} ({resources.nodes} node(s) x {resources.ntasks_per_node} task(s), "
          f"{submitter.cluster})")
    print(f"  stdout: {stdout}")
    print(f"  stderr: {stderr}")
    sys.stdout.flush()
    if not args.wait:
        return 0
    return follow(job, timeout)


def follow(job: Any, timeout: float) -> int:
    """Print state changes and rank 0's new output until the job ends; its exit status for the shell."""
    from .submit import JobFailedError, JobTimeoutError, log_paths, results, wait

    tail = LogTail(log_paths(job)[0])
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
    print(f"slurmdist: job {job.job_id} succeeded", file=sys.stderr)
    return 0


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
            if not line.startswith("submitit "):
                print(line, file=out)
        out.flush()

"""Jobs on this machine (cluster='local'): submitit's LocalExecutor, its controller started as a batch job is.

Why: submitit starts its local controller in the caller's terminal session, with the caller's stdout and
stderr, and runs setup lines through `sh -c`. So a terminal's Ctrl-C also ended the job it said kept running,
a `$(slurmdist submit ...)` capture waited for the job to end, `source venv/bin/activate` failed where sh is
dash, and with setup lines the job's pid was that shell's, which SIGINT (cancel) does not get past. Here the
controller starts in a session of its own, after the setup lines in bash, which then execs it: the job's pid is
the controller's. What the setup lines print goes to task 0's log, as a batch script's output does on Slurm.
Imports submitit: only `submit.build_executor` imports this module.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

from submitit.core.utils import JobPaths
from submitit.local.local import LocalExecutor, LocalJob

from .submission_gate import through_gate

JOB_ID_MARK = "%j"  # in the log paths handed to the wrapper, which knows its own pid only once started

# bash: the setup lines, their output appended to task 0's logs, then the controller in bash's place (same pid),
# given its job's own folder (it makes the folder it is given: a literal `%j` one, under submitit's own start).
# The controller's words are kept aside and the arguments cleared: a sourced script sees (and may change) "$@".
# Until the logs are open, bash's errors go to the submitter's stderr; after, nothing holds it open.
WRAPPER = """\
mark=%j
out=${SLURMDIST_LOCAL_OUT//"$mark"/$$}
err=${SLURMDIST_LOCAL_ERR//"$mark"/$$}
mkdir -p -- "${out%/*}" "${err%/*}" && exec >>"$out" 2>>"$err" </dev/null || {
    echo "slurmdist: local job $$ cannot write its logs ($out, $err): it does not start" >&2; exit 1; }
unset SLURMDIST_LOCAL_OUT SLURMDIST_LOCAL_ERR
slurmdist_controller=("${@//"$mark"/$$}")
set --
"""


def controller_environment(parameters: Mapping[str, Any], command: str, environ: Mapping[str, str]) -> Dict[str, str]:
    """What submitit's local controller reads from its environment (see submitit.local.local.Controller)."""
    ntasks = int(parameters.get("tasks_per_node", 1))
    count = int(parameters.get("gpus_per_node", 0))
    visible = tuple(parameters.get("visible_gpus", ()))
    gpus = visible[:count] if visible else range(count)
    return {
        **environ,
        "SUBMITIT_LOCAL_NTASKS": str(ntasks),
        "SUBMITIT_LOCAL_COMMAND": command,
        "SUBMITIT_LOCAL_TIMEOUT_S": str(int(60 * float(parameters.get("timeout_min", 2.0)))),
        "SUBMITIT_LOCAL_SIGNAL_DELAY_S": str(int(parameters.get("signal_delay_s", 30))),
        "SUBMITIT_LOCAL_NODEID": "0",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
        "SUBMITIT_STDERR_TO_STDOUT": "1" if parameters.get("stderr_to_stdout") else "",
        "SUBMITIT_EXECUTOR": "local",
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
        # bash execs the controller, so its own pid is the job's (not its parent's, as under submitit's shell)
        "SUBMITIT_LOCAL_WITH_SHELL": "",
    }


def wrapper_script(setup: Sequence[str]) -> str:
    """The bash script: output to the logs, the setup lines one after another (as in a batch script, a failed
    line does not stop the next), then `exec` of the controller given as the script's arguments."""
    # An empty line after them, as in the job scripts (sbatch_render.ENDS_THE_SETUP): a last line that ends in a
    # backslash would otherwise join the exec to its command.
    return WRAPPER + "".join(f"{line}\n" for line in setup) + '\nexec "${slurmdist_controller[@]}"\n'


def task_0_logs(folder: Path, stderr_to_stdout: bool) -> "tuple[str, str]":
    """Task 0's log paths, the job id left as %j for the wrapper to fill in."""
    paths = JobPaths(folder, job_id=JOB_ID_MARK, task_id=0)
    return str(paths.stdout), str(paths.stdout if stderr_to_stdout else paths.stderr)


def start_controller(folder: Path, command: str, parameters: Mapping[str, Any], bash: str) -> "subprocess.Popen[bytes]":
    out, err = task_0_logs(folder, bool(parameters.get("stderr_to_stdout")))
    environ = {**controller_environment(parameters, command, os.environ),
               "SLURMDIST_LOCAL_OUT": out, "SLURMDIST_LOCAL_ERR": err}
    controller: List[str] = [sys.executable, "-m", "submitit.local._local", str(folder)]
    return subprocess.Popen(
        [bash, "-c", wrapper_script(parameters.get("setup", ())), "slurmdist-local-job", *controller],
        env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        start_new_session=True,  # a terminal's Ctrl-C (or the end of its session) is the caller's, not the job's
    )


# Without bash, submitit's own start runs `sh -c "SETUP && CONTROLLER"`, and the controller takes its parent
# (the shell) for the job. A shell that execs the last command of that list itself would leave the submitting
# process as the parent: a trap keeps it from exec'ing; it does nothing at exit.
KEEP_SHELL_AS_PARENT = "trap : EXIT"


class LocalBatchExecutor(LocalExecutor):  # type: ignore[misc]  # submitit is not type-checked here
    """submitit's LocalExecutor with the controller started by `start_controller`. Without bash on PATH it
    falls back to submitit's own start."""

    def _submit_command(self, command: str) -> Any:
        return through_gate(lambda: self._start(command))

    def _start(self, command: str) -> Any:
        bash = shutil.which("bash")
        if bash is None:
            setup = list(self.parameters.get("setup", ()))
            self.parameters["setup"] = [KEEP_SHELL_AS_PARENT, *setup] if setup else []
            try:
                return super()._submit_command(command)
            finally:
                self.parameters["setup"] = setup
        process = start_controller(Path(self.folder), command, self.parameters, bash)
        tasks = list(range(int(self.parameters.get("tasks_per_node", 1))))
        return LocalBatchJob(folder=self.folder, job_id=str(process.pid), process=process, tasks=tasks)


class LocalBatchJob(LocalJob):  # type: ignore[misc]
    """A job `LocalBatchExecutor` started: it leads a process group of its own, which cancel() signals whole.
    SIGINT to the pid alone would wait behind a setup line still running (bash finishes a command before it
    acts on SIGINT), and the job would start anyway; the controller and its tasks share the group after."""

    def cancel(self, check: bool = True) -> None:  # noqa: ARG002  # submitit's signature
        try:
            os.killpg(int(self.job_id), signal.SIGINT)
        except ProcessLookupError:  # ended already
            pass

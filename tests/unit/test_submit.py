"""slurmdist.submit's pure parts: option validation, the mapping to submitit's parameters, the rendered
sbatch script (through submitit's own renderer), states, and the cheap import."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import re
import sys
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.integration.cluster import require
from slurmdist import cli
from slurmdist.submit import (
    FINISHED_STATES, Resources, SubmitError, Submitter, choose_cluster, local_parameters, parse_mem, parse_state,
    parse_time, signal_variables, slurm_parameters,
)


@pytest.mark.parametrize("value, minutes", [
    (30, 30), (0.5, 1), (90.2, 91), ("45", 45), ("10:30", 11), ("1:30:00", 90), ("2-00:00:00", 2880),
    ("1-12", 2160), ("1-00:30", 1470),
])
def test_parse_time_gives_whole_minutes(value, minutes):
    assert parse_time(value) == minutes


@pytest.mark.parametrize("value", [0, -5, "-5", "", "1:2:3:4", "abc", "1-x", True, float("inf"), "\u00b2", "9" * 5000,
                                   "1-" + "9" * 5000])
def test_parse_time_rejects_what_is_not_a_duration(value):
    with pytest.raises(SubmitError, match="time="):
        parse_time(value)


@pytest.mark.parametrize("value, text", [(32, "32G"), (1.5, "1536M"), ("500m", "500M"), ("64GB", "64GB"),
                                         ("500kb", "500KB"), ("0", "0")])  # "0": all of the node's memory
def test_parse_mem(value, text):
    assert parse_mem(value) == text


@pytest.mark.parametrize("value", ["4096", " 32 ", "7" * 5000])  # past int()'s 4300 digits too
def test_a_memory_string_without_a_unit_is_refused_as_ambiguous(value):
    # sbatch reads "32" as 32 MB, and mem=32 (a number) means 32 GiB: a value read from a config file or an
    # environment variable would get the wrong one.
    with pytest.raises(SubmitError, match=f"mem={value!r} has no unit.*e.g. '{value.strip()}G'"):
        parse_mem(value)
    with pytest.raises(SubmitError, match="has no unit"):
        Submitter(mem=value)


@pytest.mark.parametrize("value", [0, "lots", "32G; rm -rf /", False, "1.5G", "500B", "500b", float("nan"),
                                   float("inf"), -float("inf")])  # sbatch: "Invalid --mem"
def test_parse_mem_rejects_garbage(value):
    with pytest.raises(SubmitError, match="mem="):
        parse_mem(value)


def test_gpus_set_one_task_per_gpu():
    resources = Resources(nodes=2, gpus_per_node=4)
    assert (resources.ntasks_per_node, resources.world_size) == (4, 8)
    params = slurm_parameters(resources)
    assert (params["nodes"], params["ntasks_per_node"], params["gpus_per_node"]) == (2, 4, 4)


def test_cpu_jobs_give_tasks_per_node():
    params = slurm_parameters(Resources(nodes=2, tasks_per_node=3, cpus_per_task=2, time="0:30:00",
                                        partition="cpu", account="proj", mem=16))
    assert {k: params[k] for k in ("ntasks_per_node", "cpus_per_task", "time", "partition", "account", "mem")} == \
        {"ntasks_per_node": 3, "cpus_per_task": 2, "time": 30, "partition": "cpu", "account": "proj", "mem": "16G"}
    assert "gpus_per_node" not in params


def test_jobs_are_requeueable_and_warned_with_usr2_by_default():
    params = slurm_parameters(Resources())
    assert params["additional_parameters"]["signal"] == "USR2@120"
    assert params["additional_parameters"]["requeue"] is True
    assert "export SLURMDIST_REQUEUE_SIGNAL=USR2" in params["setup"]
    assert "export SUBMITIT_PREEMPT_SIGNAL=USR2" in params["setup"]
    assert "--kill-on-bad-exit=1" in params["srun_args"]


def test_signal_is_configurable():
    params = slurm_parameters(Resources(signal="SIGURG", signal_delay=300))
    assert params["additional_parameters"]["signal"] == "URG@300"
    assert params["signal_delay_s"] == 300


def test_a_signal_sbatch_knows_by_number_only_is_given_as_its_number():
    # sbatch 22.05 refuses --signal=PWR@120 (an invalid --signal specification) but takes 30@120; submitit
    # in the job looks the name up in Python's signal module, so the variables keep the name.
    resources = Resources(signal="PWR", signal_delay=120)
    assert slurm_parameters(resources)["additional_parameters"]["signal"] == f"{int(signal.SIGPWR)}@120"
    assert "export SUBMITIT_PREEMPT_SIGNAL=PWR" in slurm_parameters(resources)["setup"]
    assert signal_variables(resources)["SLURMDIST_REQUEUE_SIGNAL"] == "PWR"


@pytest.mark.parametrize("changes, message", [
    ({"nodes": 0}, "nodes=0"),
    ({"nodes": 1.5}, "nodes=1.5"),
    ({"gpus_per_node": 4, "tasks_per_node": 2}, "one task per GPU"),
    ({"setup": "module load cuda"}, "list of shell lines"),
    ({"signal": "NOPE"}, "not a signal"),
    ({"sbatch": {"output": "x"}}, "set by slurmdist; instead use folder=DIR"),
    ({"sbatch": {"ntasks_per_node": 3}}, r"set by slurmdist; instead use gpus_per_node=G \(one task per GPU\) or"),
    ({"sbatch": {"job-name": "x"}}, "'job-name' is set by slurmdist; instead use name=NAME"),
    ({"name": "a\\b"}, r"name='a\\\\b': sbatch reads a backslash in an #SBATCH line as an escape and drops it"),
    ({"sbatch": {"gpus": 2}}, r"'gpus' is set by slurmdist; instead use gpus_per_node=G \(sbatch's --gpus is the "
                              r"job's total"),  # sbatch: "Failed to ensure --gpus >= --gres=gpu/--gpus-per-node"
    ({"sbatch": {"part": "x"}}, r"'part' is set by slurmdist \(sbatch reads it as --partition\); instead use partition="),
    ({"sbatch": {"tasks_per_node": 3}}, r"'tasks_per_node' is set by slurmdist \(sbatch reads it as "
                                         r"--ntasks-per-node\); instead use gpus_per_node=G"),
    ({"sbatch": {"C": "a100"}}, "'C' is a short option; give its long name"),
    ({"sbatch": {"bad key\n#SBATCH --x": "1"}}, "not an option name"),
    ({"sbatch": {"qos\n": "x"}}, "not an option name"),  # '$' in a pattern also matches before a last newline
    ({"mem": "\u0663\u0662G"}, "not a Slurm memory size"),
    ({"sbatch": {"comment": "two\nlines"}}, "one line"),
    ({"sbatch": {"exclusive": False}}, "exclusive=False: leave the option out"),  # sbatch refuses --exclusive=False
    ({"signal": "KILL"}, "cannot be caught"),
    ({"time": 3}, r"signal_delay=120 s leaves no time .* time to at least 4 min, or signal_delay to at most 119 s"),
    ({"time": 1, "signal_delay": 1}, r"warned \(and requeued\) as it starts. Set time to at least 2 min$"),
    ({"signal_delay": 0}, r"signal_delay=0 s would mean no warning at all: Slurm sends none"),  # warn_time 0: none
    ({"signal_delay": 65536}, "more than Slurm's --signal accepts"),
])
def test_resources_are_validated(changes, message):
    with pytest.raises(SubmitError, match=message):
        Resources(**changes)


@pytest.mark.parametrize("name, value, message", [
    ("SLURMDIST_MAX_REQUEUES", "ten", "SLURMDIST_MAX_REQUEUES='ten' is not a whole number of requeues"),
    ("SLURMDIST_REQUEUE_SIGNAL", "TERM", "SLURMDIST_REQUEUE_SIGNAL='TERM' is also what scancel"),
])
def test_requeue_variables_the_job_inherits_are_checked_before_it_queues(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(SubmitError, match=message):
        Resources()


def test_the_rendered_batch_script_quotes_every_value():
    """What sbatch reads, rendered by submitit itself from our parameters: nothing can break out."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = slurm_parameters(Resources(nodes=2, tasks_per_node=2, partition="gpu",
                                        sbatch={"comment": "x; touch /tmp/pwned", "exclusive": True}))
    script = _make_sbatch_string(command="python -m submitit.core._submit logs", folder="logs/%j", **params)
    lines = script.splitlines()
    assert "#SBATCH --comment='x; touch /tmp/pwned'" in lines
    assert "#SBATCH --exclusive" in lines and "#SBATCH --requeue" in lines
    assert "#SBATCH --signal=USR2@120" in lines and "#SBATCH --ntasks-per-node=2" in lines
    assert lines.index("export SLURMDIST_REQUEUE_SIGNAL=USR2") < next(
        i for i, line in enumerate(lines) if line.startswith("srun "))


def test_local_runs_every_task_on_this_machine():
    params = local_parameters(Resources(nodes=2, gpus_per_node=2, time=10))
    assert (params["tasks_per_node"], params["gpus_per_node"], params["timeout_min"]) == (4, 4, 10)


def test_a_job_meant_for_slurm_that_falls_back_to_this_machine_is_warned_about(tmp_path, monkeypatch, caplog):
    # A notebook on a login node whose Slurm module is not loaded: 'auto' finds no sbatch.
    from slurmdist.submit import Submitter

    monkeypatch.setenv("PATH", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="slurmdist"):
        assert Submitter(nodes=2, partition="gpu", account="proj", folder=tmp_path).cluster == "local"
        assert Submitter(nodes=1, folder=tmp_path).cluster == "local"  # nothing Slurm-only asked: no warning
        assert Submitter(nodes=1, partition="gpu", cluster="local", folder=tmp_path).cluster == "local"  # meant
    warnings = [r.getMessage() for r in caplog.records if "not on PATH" in r.getMessage()]
    assert len(warnings) == 1 and "partition='gpu', account='proj'" in warnings[0]


def test_choose_cluster():
    assert choose_cluster("auto", which=lambda tool: f"/usr/bin/{tool}") == "slurm"
    assert choose_cluster("auto", which=lambda tool: None) == "local"
    assert choose_cluster("local", which=lambda tool: f"/usr/bin/{tool}") == "local"
    with pytest.raises(SubmitError, match="sbatch/srun are not on PATH"):
        choose_cluster("slurm", which=lambda tool: None)
    with pytest.raises(SubmitError, match="cluster="):
        choose_cluster("pbs")


@pytest.mark.parametrize("output, state", [
    ("RUNNING\n", "RUNNING"), ("CANCELLED by 0\n", "CANCELLED"), ("COMPLETED\nCOMPLETED\n", "COMPLETED"),
    ("FAILED+\n", "FAILED"), ("\n", "UNKNOWN"),
])
def test_parse_state(output, state):
    assert parse_state(output) == state


def test_requeued_and_pending_jobs_are_not_finished():
    assert {"PENDING", "RUNNING", "REQUEUED", "COMPLETING", "UNKNOWN"}.isdisjoint(FINISHED_STATES)
    assert {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"} <= FINISHED_STATES


def test_importing_submit_imports_neither_submitit_nor_torch():
    code = ("import sys, slurmdist, slurmdist.submit, slurmdist.requeue, slurmdist.submit_cli; "
            "print(sorted(m for m in ('submitit', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("field", ["name", "partition", "account"])
@pytest.mark.parametrize("value", ["two\nlines", "carriage\rreturn", "", "nul\0byte"])
def test_names_that_would_break_an_sbatch_line_are_refused(field, value):
    from slurmdist.submit import Resources, SubmitError

    with pytest.raises(SubmitError, match=field):
        Resources(**{field: value})


class FinishedTasks:
    """A job whose every task has written its result file, as after a run that ended (or was requeued)."""

    def __init__(self, folder, tasks=2, outcome="success"):
        import pickle

        self.job_id, self.num_tasks, self.folder = "42", tasks, folder
        for task in range(tasks):
            self.task(task).paths.result_pickle.write_bytes(pickle.dumps((outcome, task)))

    def task(self, index):
        return SimpleNamespace(paths=SimpleNamespace(result_pickle=self.folder / f"42_{index}_result.pkl"))


@pytest.mark.parametrize("state, ends", [("RUNNING", True), ("COMPLETING", True), ("PENDING", False),
                                         ("REQUEUED", False)])
def test_result_files_end_the_wait_only_while_the_job_runs(tmp_path, monkeypatch, state, ends):
    # Slurm may lag behind tasks that reported; but a job queued again after a requeue still holds the result
    # files of the run before, and those must not pass for its end.
    import slurmdist.submit as submit

    monkeypatch.setattr(submit, "RESULT_GRACE", 0.2)
    monkeypatch.setattr(submit, "job_state", lambda job, **_: state)
    job, polls = FinishedTasks(tmp_path), []
    if ends:
        assert submit.wait(job, timeout=30, poll=0.05, on_poll=lambda: polls.append(1)) == "COMPLETED"
    else:
        with pytest.raises(submit.JobTimeoutError, match=f"job 42 still {state}"):
            submit.wait(job, timeout=1, poll=0.05, on_poll=lambda: polls.append(1))
    assert len(polls) > 1  # the caller's log tail ran at every poll


def test_tasks_that_raised_do_not_end_the_wait_before_slurm_says_how_the_job_ended(tmp_path, monkeypatch):
    # Every task wrote a result, but one that raised: the job ends FAILED (or CANCELLED, PREEMPTED: why it raised),
    # not COMPLETED, and the caller is told what Slurm says.
    import slurmdist.submit as submit

    monkeypatch.setattr(submit, "RESULT_GRACE", 0.1)
    states = iter(["RUNNING"] * 6 + ["FAILED"])
    monkeypatch.setattr(submit, "job_state", lambda job, **_: next(states))
    assert submit.wait(FinishedTasks(tmp_path, outcome="error"), timeout=30, poll=0.05) == "FAILED"
    with pytest.raises(StopIteration):  # it asked Slurm until Slurm said the job had ended
        next(states)


COMMAND_UNDER_SUBMITIT = """
import signal, sys
from slurmdist.submit import Command
signal.signal(signal.SIGTERM, lambda signum, frame: None)  # as submitit's task process has it
Command(tuple(sys.argv[1:]))()
"""


def run_command_task(script: str, environ=None) -> subprocess.CompletedProcess:
    """A submitted command's task process (as submitit starts it) running `sh -c script`."""
    return subprocess.run([sys.executable, "-c", COMMAND_UNDER_SUBMITIT, "sh", "-c", script], capture_output=True,
                          text=True, timeout=60, env=None if environ is None else {**os.environ, **environ})


@pytest.mark.parametrize("warned", [True, False])
def test_a_command_task_waits_out_slurms_sigterm_and_leaves_no_result(tmp_path, warned):
    # Slurm's SIGTERM (a requeue taking effect, preemption, the time limit) reaches the command too, which may
    # be saving: the task waits for it, then ends with no result (143), or it would report the ended run as a
    # failure (or a success) of a job that is in fact queued again.
    saved = tmp_path / "saved"
    warning = "kill -USR2 $PPID; sleep 0.2; " if warned else ""
    proc = run_command_task(f"{warning}kill -TERM $PPID; sleep 0.5; echo saved > '{saved}'; exit 3")
    assert proc.returncode == 143, proc.stderr
    assert saved.exists(), "the task ended before its command had saved"
    assert "command exited" not in proc.stderr


def test_a_local_command_task_passes_the_warning_on(tmp_path):
    # submitit's LocalExecutor signals its own children, the tasks, and not the commands they run.
    heard = tmp_path / "heard"
    proc = run_command_task(f"trap 'echo warned > \"{heard}\"; exit 0' USR2; kill -USR2 $PPID; sleep 20 & wait",
                            {"SUBMITIT_EXECUTOR": "local"})
    assert proc.returncode == 0, proc.stderr
    assert heard.read_text() == "warned\n"


def start_command_task(script: str, environ=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", COMMAND_UNDER_SUBMITIT, "sh", "-c", script],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=None if environ is None else {**os.environ, **environ})


def command_pid(pid_file) -> int:
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().endswith("\n")):
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    return int(pid_file.read_text())


def gone(pid: int, within: float = 10) -> bool:
    """True once `pid` no longer runs (an unreaped zombie counts as gone), within `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop(task: subprocess.Popen, pid_file) -> None:
    """Whatever the test found, leave neither the task nor its command running."""
    task.kill()
    task.wait(timeout=30)
    if pid_file.exists() and pid_file.read_text().strip() and not gone(int(pid_file.read_text()), 0):
        os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_sigint_while_the_command_starts_is_held_then_delivered_once_it_has_started():
    # Raised during the fork, the KeyboardInterrupt would land in an at-fork hook of the interpreter (logging's
    # lock release), which drops it: the task then waited for a command that ignores SIGINT (seen in CI).
    from slurmdist.task_command import _SignalRelay

    relay = _SignalRelay(local=False)
    child = subprocess.Popen(["true"])
    child.wait()
    with relay.installed(signal.SIGUSR2):
        os.kill(os.getpid(), signal.SIGINT)  # handled before os.kill returns: held, nothing raised
        with pytest.raises(KeyboardInterrupt):
            relay.started(child)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("local", [True, False])
def test_a_command_goes_with_its_task_when_the_task_is_interrupted(tmp_path, local):
    # The local controller stops a task (cancel, time limit) with SIGINT, then SIGKILL; a Ctrl-C does the first.
    # A command that ignores SIGINT must not run on without its task.
    pid_file = tmp_path / "pid"
    task = start_command_task(f"trap '' INT; echo $$ > '{pid_file}'; exec sleep 60",
                              {"SUBMITIT_EXECUTOR": "local"} if local else None)
    try:
        command = command_pid(pid_file)
        task.send_signal(signal.SIGINT)
        assert task.wait(timeout=30) != 0
        assert gone(command), "the command outlived its interrupted task"
    finally:
        stop(task, pid_file)


def test_a_local_commands_own_processes_go_with_its_interrupted_task(tmp_path):
    # torchrun, mpirun or a shell script: what the command starts holds GPUs too.
    pid_file, worker_file = tmp_path / "pid", tmp_path / "worker"
    task = start_command_task(f"trap '' INT; sleep 60 & echo $! > '{worker_file}'; echo $$ > '{pid_file}'; wait",
                              {"SUBMITIT_EXECUTOR": "local"})
    try:
        command, worker = command_pid(pid_file), command_pid(worker_file)
        task.send_signal(signal.SIGINT)
        task.wait(timeout=30)
        assert gone(command) and gone(worker), "the command's worker outlived the interrupted task"
    finally:
        stop(task, pid_file)
        if worker_file.exists() and not gone(int(worker_file.read_text()), 0):
            os.kill(int(worker_file.read_text()), signal.SIGKILL)


def test_a_local_commands_workers_hear_the_warning_too(tmp_path):
    # The command (a launcher) ignores the warning and waits; its worker, a process of its own, saves on it.
    heard, worker = tmp_path / "heard", tmp_path / "worker.sh"
    worker.write_text(f"trap 'echo warned > \"{heard}\"; exit 0' USR2\nsleep 20 & wait\n")
    # (A handler, not '': an ignored signal stays ignored in the shell's children. Its trap interrupts a wait.)
    proc = run_command_task(f"trap : USR2; sh '{worker}' & sleep 0.5; kill -USR2 $PPID; wait; wait",
                            {"SUBMITIT_EXECUTOR": "local"})
    assert proc.returncode == 0, proc.stderr
    assert heard.read_text() == "warned\n"


def test_a_local_command_dies_with_its_task_killed_outright(tmp_path):
    pid_file = tmp_path / "pid"
    task = start_command_task(f"trap '' INT TERM; echo $$ > '{pid_file}'; exec sleep 60", {"SUBMITIT_EXECUTOR": "local"})
    try:
        command = command_pid(pid_file)
        task.kill()  # the controller's SIGKILL, a second after its SIGINT
        task.wait(timeout=30)
        assert gone(command), "the command outlived its SIGKILLed task"
    finally:
        stop(task, pid_file)


def test_a_local_command_reaches_the_controller_and_its_restart_status_passes_through(tmp_path):
    told = tmp_path / "controller"
    proc = run_command_task(f'echo "$SLURMDIST_LOCAL_CONTROLLER_PID" > "{told}"; exit 144',
                            {"SUBMITIT_EXECUTOR": "local"})
    assert proc.returncode == 144, proc.stderr  # what makes submitit's local controller restart the job
    assert told.read_text().strip() == str(os.getpid())  # the task's parent: here the test, there the controller
    # Under Slurm 144 is only a failure of the command.
    proc = run_command_task("exit 144")
    assert proc.returncode == 1 and "command exited with status 144" in proc.stderr


def test_a_command_killed_by_the_warning_is_told_to_handle_it():
    proc = subprocess.run([sys.executable, "-c", COMMAND_UNDER_SUBMITIT, "sh", "-c", "kill -USR2 $$"],
                          capture_output=True, text=True, timeout=60)
    assert "command was killed by SIGUSR2 (the requeue warning: handle it in the command" in proc.stderr


@pytest.mark.parametrize("submit", [
    lambda submitter: submitter.submit(print),
    lambda submitter: submitter.submit_command(["true"]),
    lambda submitter: submitter.map_array(print, [1]),
])
def test_submitting_without_submitit_says_what_to_install(monkeypatch, submit):
    from slurmdist.submit import Submitter

    monkeypatch.setitem(sys.modules, "submitit", None)  # import fails as when it is not installed
    with pytest.raises(SubmitError, match=r"needs submitit: pip install submitit"):
        submit(Submitter(cluster="local"))


def test_a_submission_that_sbatch_never_answers_fails_within_its_bound(tmp_path, monkeypatch):
    # submitit calls sbatch without a timeout: a slurmctld that never answers must not hang the caller.
    import time

    import slurmdist.submit as submit

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in (("sbatch", "sleep 3"), ("srun", "exit 0")):
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setattr(submit, "SUBMIT_TIMEOUT", 1.0)
    submitter = submit.Submitter(cluster="slurm", folder=tmp_path / "%j")
    started = time.monotonic()
    with pytest.raises(SubmitError, match=r"sbatch did not answer within 1 s.*squeue --me"):
        submitter.submit(print)
    assert time.monotonic() - started < 10


def fake_submitting_tools(tmp_path, monkeypatch, sbatch: str) -> Path:
    """sbatch (its body given) and scancel (which notes its arguments) on PATH; returns the folder they write to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in (("sbatch", sbatch), ("srun", "exit 0"), ("scancel", f'echo "$@" >> {bin_dir}/scancelled')):
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir


@pytest.mark.parametrize("folder", ["slurmdist-logs/%j", "runs/today/%j/logs", "runs/today/job_%j"])
def test_a_refused_submission_leaves_no_empty_log_folders_behind(tmp_path, monkeypatch, folder):
    # `slurmdist submit -- ...` where sbatch refused left an empty slurmdist-logs/ in the caller's directory.
    import slurmdist.submit as submit

    fake_submitting_tools(tmp_path, monkeypatch, 'echo "sbatch: error: Invalid account" >&2; exit 1')
    work = tmp_path / "work"
    (work / "runs").mkdir(parents=True)  # there before: kept
    monkeypatch.chdir(work)
    with pytest.raises(SubmitError, match="sbatch refused the job: .*Invalid account"):
        submit.Submitter(cluster="slurm", folder=folder).submit(print)
    assert sorted(path.name for path in work.iterdir()) == ["runs"] and not any((work / "runs").iterdir())


def test_a_refused_submission_into_a_folder_that_was_there_removes_the_files_it_wrote(tmp_path, monkeypatch):
    # The default slurmdist-logs/ after a first job: every refused submission left a <uuid>.pkl and a hidden
    # .submission_file_<uuid>.sh in it. Files that were there before stay.
    import slurmdist.submit as submit

    fake_submitting_tools(tmp_path, monkeypatch, 'echo "sbatch: error: invalid partition specified: nope" >&2; exit 1')
    logs = tmp_path / "slurmdist-logs"
    logs.mkdir()
    kept = [logs / "17_0_log.out", logs / f"{'a' * 32}.pkl"]  # a job's log; another submission's pickle, older
    for path in kept:
        path.write_text("before")
        os.utime(path, (time.time() - 600, time.time() - 600))
    for _ in range(2):
        with pytest.raises(SubmitError, match="invalid partition"):
            submit.Submitter(cluster="slurm", folder=logs, partition="nope").submit(print)
    assert sorted(logs.iterdir()) == sorted(kept)


class SlowToPickle:
    """An argument that takes its time to pickle (large, onto a slow file system)."""

    def __getstate__(self):
        time.sleep(2)
        return {}


def wait_for_file(path: Path, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    time.sleep(0.1)  # written whole
    return path.read_text()


def test_a_submission_given_up_on_while_it_pickles_never_starts_sbatch(tmp_path, monkeypatch):
    # Given up on, the submission gives the caller its environment back at once: an sbatch it started later would
    # run in it (with the caller's RANK) and queue a job nobody follows.
    import slurmdist.submit as submit

    bin_dir = fake_submitting_tools(tmp_path, monkeypatch, 'touch "$(dirname "$0")/ran"; echo "Submitted batch job 42"')
    monkeypatch.setattr(submit, "SUBMIT_TIMEOUT", 1.0)
    monkeypatch.setenv("RANK", "5")  # this process's own launch: not the job's
    with pytest.raises(SubmitError, match=r"did not reach sbatch within 1 s: pickling the function .* Nothing was "
                                          "submitted"):
        submit.Submitter(cluster="slurm", folder=tmp_path / "%j").submit(print, SlowToPickle())
    assert os.environ["RANK"] == "5" and "SLURMDIST_REQUEUE_SIGNAL" not in os.environ  # the caller's, at once
    time.sleep(2.5)  # the pickling is over: the submission has reached its start, and stopped there
    assert not (bin_dir / "ran").exists()


def test_ctrl_c_while_submitting_cancels_the_job_the_submission_queued(tmp_path, monkeypatch):
    # sbatch answers after the Ctrl-C: the job it queued would otherwise run (or fail) unattended.
    import _thread
    import threading

    import slurmdist.submit as submit

    bin_dir = fake_submitting_tools(tmp_path, monkeypatch, 'sleep 1; echo "Submitted batch job 42"')
    threading.Timer(0.3, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt, match="job 42 was queued meanwhile and is cancelled now"):
        submit.Submitter(cluster="slurm", folder=tmp_path / "%j").submit(print)
    assert wait_for_file(bin_dir / "scancelled").split() == ["42"]


SUBMIT_THEN_SAY = """
import sys
from slurmdist.submit import Submitter
try:
    Submitter(cluster="slurm", folder=sys.argv[1]).submit(print)
except KeyboardInterrupt as interrupted:
    print(interrupted)
"""


def test_a_terminals_ctrl_c_while_submitting_does_not_reach_sbatch(tmp_path, monkeypatch):
    # A terminal's Ctrl-C signals its whole foreground process group: sbatch too, which died halfway through
    # its request; the job it had queued then failed (its folder was never made), and nothing cancelled it.
    bin_dir = fake_submitting_tools(tmp_path, monkeypatch, 'touch "$(dirname "$0")/started"; sleep 1; '
                                                           'echo "Submitted batch job 42"')
    submitting = subprocess.Popen([sys.executable, "-c", SUBMIT_THEN_SAY, str(tmp_path / "%j")],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_file(bin_dir / "started")  # sbatch is running
        os.killpg(submitting.pid, signal.SIGINT)  # the group a terminal's Ctrl-C reaches
        out, err = submitting.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(submitting.pid, signal.SIGKILL)
    assert "job 42 was queued meanwhile and is cancelled now" in out, out + err
    assert wait_for_file(bin_dir / "scancelled").split() == ["42"]


def test_the_submitting_process_launch_is_not_passed_to_the_job():
    from slurmdist.submit import launch_variables

    environ = {
        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "TORCHELASTIC_RUN_ID": "x",
        "SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "4", "SRUN_CPUS_PER_TASK": "4", "OMPI_COMM_WORLD_RANK": "0",
        "PMI_RANK": "0", "SUBMITIT_EXECUTOR": "slurm",
        # kept: which cluster, sbatch's and slurmdist's own settings, everything else
        "SLURM_CONF": "/etc/slurm/slurm.conf", "SBATCH_ACCOUNT": "proj", "SLURMDIST_INIT_TIMEOUT": "60",
        "OMPI_MCA_btl": "^ofi", "PATH": "/usr/bin", "RANKING": "x",
    }
    assert launch_variables(environ) == sorted([
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
        "SLURM_CPUS_PER_TASK", "SRUN_CPUS_PER_TASK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SUBMITIT_EXECUTOR",
    ])


def test_the_job_environment_hides_the_launch_and_restores_it(monkeypatch):
    import os

    from slurmdist.submit import enter_job_environment

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("SLURM_CONF", "/x/slurm.conf")
    monkeypatch.setenv("SLURMDIST_REQUEUE_SIGNAL", "URG")
    restore = enter_job_environment({"SLURMDIST_REQUEUE_SIGNAL": "USR2"})
    try:
        assert "RANK" not in os.environ
        assert os.environ["SLURM_CONF"] == "/x/slurm.conf"
        assert os.environ["SLURMDIST_REQUEUE_SIGNAL"] == "USR2"
    finally:
        restore()
    assert (os.environ["RANK"], os.environ["SLURMDIST_REQUEUE_SIGNAL"]) == ("3", "URG")


def test_cpus_per_task_reaches_srun_through_the_batch_script():
    # srun in Slurm 22.05-23.02 no longer reads --cpus-per-task from the job; the script must hand it on.
    from slurmdist.submit import environment_lines

    lines = environment_lines(Resources(cpus_per_task=3))
    script = "\n".join(["set -u", *lines, 'echo "$SRUN_CPUS_PER_TASK"'])
    out = subprocess.run(["bash", "-c", script], env={"SLURM_CPUS_PER_TASK": "3", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.strip() == "3"
    # Each run marks where its part of the batch log begins (results() reads srun's lines from there).
    assert out.stderr.startswith("slurmdist: a run of job  starts (restarts so far: 0)")
    assert not any("SRUN_CPUS_PER_TASK" in line for line in environment_lines(Resources()))


def test_local_jobs_hand_their_setup_lines_to_the_controllers_wrapper():
    assert local_parameters(Resources())["setup"] == []
    assert local_parameters(Resources(setup=["module load cuda"]))["setup"] == ["module load cuda"]
    # On Slurm an empty line follows them in submitit's batch script: a last line ending in a backslash joins
    # it, not the srun line.
    assert slurm_parameters(Resources(setup=["module load cuda \\"]))["setup"][-2:] == ["module load cuda \\", ""]
    assert slurm_parameters(Resources())["setup"][-1] != ""


def test_a_setup_line_that_is_not_text_is_named():
    with pytest.raises(SubmitError, match=r"setup\[1\]=1 is not a shell line"):  # was a TypeError inside submitit
        Resources(setup=["module load cuda", 1])


def test_python_setup_lines_that_are_not_shell_are_refused_before_anything_is_queued():
    with pytest.raises(SubmitError, match=r"the setup lines open a heredoc at setup 'cat > cfg.txt <<EOF' that they "
                                          r"never close"):
        Resources(setup=["cat > cfg.txt <<EOF", "lr: 0.1", " EOF"])


def test_a_local_jobs_wrapper_runs_setup_as_a_batch_script_then_becomes_the_controller(tmp_path):
    # `source` (not in dash), a failed line that does not stop the next (as in a batch script), the lines'
    # output appended to task 0's logs under the job id, and the controller in the wrapper's place: its pid,
    # which is the job's id, and the environment the lines made.
    from slurmdist.local_jobs import task_0_logs, wrapper_script

    # It sees no arguments of the wrapper's, and clearing them (as some setvars scripts do) harms nothing.
    (tmp_path / "act.sh").write_text('export FOO=bar\necho "activated with $# argument(s)"\nset --\n')
    out, err = task_0_logs(tmp_path / "logs" / "%j", stderr_to_stdout=False)
    controller = [sys.executable, "-c", "import os, sys; print('controller', os.getpid(), os.environ['FOO'], "
                  "sys.argv[1])", str(tmp_path / "logs" / "%j")]
    wrapper = subprocess.Popen(
        # The last line ends in a backslash: it must not take the exec in (the job would never start).
        [require("bash"), "-c", wrapper_script(["source act.sh", "no-such-module-command cuda/12.1 \\"]), "job",
         *controller],
        cwd=tmp_path, env={"PATH": os.environ["PATH"], "SLURMDIST_LOCAL_OUT": out, "SLURMDIST_LOCAL_ERR": err},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said, complained = wrapper.communicate(timeout=30)
    assert wrapper.returncode == 0 and not said and not complained
    job = str(wrapper.pid)
    logs = tmp_path / "logs" / job
    assert (logs / f"{job}_0_log.out").read_text().splitlines() == ["activated with 0 argument(s)",
                                                                     f"controller {job} bar {logs}"]
    assert "no-such-module-command" in (logs / f"{job}_0_log.err").read_text()


@pytest.mark.parametrize("shell", ["bash", "dash"])
def test_without_bash_a_local_controllers_parent_is_still_the_shell_that_is_the_job(shell):
    # The fallback to submitit's own start, `sh -c "SETUP && CONTROLLER"`: the controller takes its parent
    # (getppid) for the job, and a shell that execs the last command itself would leave the submitter as it.
    from slurmdist.local_jobs import KEEP_SHELL_AS_PARENT

    controller = shlex.join([sys.executable, "-c", "import os; print(os.getppid(), os.environ['FOO'])"])
    shell_process = subprocess.Popen([require(shell), "-c", " && ".join([KEEP_SHELL_AS_PARENT, "export FOO=bar",
                                                                         controller])],
                                     stdout=subprocess.PIPE, text=True)
    out, _ = shell_process.communicate(timeout=30)
    assert out.split() == [str(shell_process.pid), "bar"]


@pytest.mark.parametrize("output, parsed", [
    ("2026-11-22T03:50:01\n", __import__("datetime").datetime(2026, 11, 22, 3, 50, 1).timestamp()),
    ("N/A\n", None), ("Unknown\n", None), ("", None),
])
def test_parse_start(output, parsed):
    from slurmdist.submit import parse_start

    assert parse_start(output) == parsed


@pytest.mark.parametrize("started_after_the_files, ends", [(True, False), (False, True)])
def test_result_files_from_before_the_current_run_do_not_end_the_wait(tmp_path, monkeypatch,
                                                                       started_after_the_files, ends):
    # A requeued job RUNNING again may hold the files its run before wrote (a task that returned or raised).
    import time

    import slurmdist.submit as submit

    monkeypatch.setattr(submit, "RESULT_GRACE", 0.2)
    monkeypatch.setattr(submit, "job_state", lambda job, **_: "RUNNING")
    job = FinishedTasks(tmp_path)
    written = job.task(0).paths.result_pickle.stat().st_mtime
    start = written + 60 if started_after_the_files else written - 60
    monkeypatch.setattr(submit, "run_start", lambda job_id, **_: start)
    if ends:
        assert submit.wait(job, timeout=30, poll=0.05) == "COMPLETED"
    else:
        began = time.monotonic()
        with pytest.raises(submit.JobTimeoutError, match="job 42 still RUNNING"):
            submit.wait(job, timeout=1, poll=0.05)
        assert time.monotonic() - began >= 1  # it waited for the new run, not for the old files


def test_a_command_ended_by_slurms_sigterm_leaves_no_result():
    # SIGTERM (preemption, scancel, the time limit) kills the command: the task exits 143 without raising,
    # so submitit writes no result that a requeued run could be mistaken for.
    proc = subprocess.run([sys.executable, "-c", COMMAND_UNDER_SUBMITIT, "sh", "-c", "kill -TERM $$"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 143, proc.stderr
    assert "command" not in proc.stderr  # nothing raised
    proc = subprocess.run([sys.executable, "-c", COMMAND_UNDER_SUBMITIT, "sh", "-c", "exit 143"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 143, proc.stderr  # what slurmdist.requeue exits with after saving on SIGTERM


def test_results_wait_longer_for_the_files_of_a_completed_job():
    from slurmdist.submit import COMPLETED_RESULT_GRACE, RESULT_GRACE, result_grace

    slurm_job = SimpleNamespace()
    assert result_grace(slurm_job, "COMPLETED") == COMPLETED_RESULT_GRACE > RESULT_GRACE
    assert result_grace(slurm_job, "FAILED") == RESULT_GRACE


@pytest.mark.parametrize("option", ["requeue", "no-requeue", "no_requeue"])
def test_requeue_options_are_refused_rather_than_silently_overridden(option):
    with pytest.raises(SubmitError, match="always submits with --requeue"):
        Resources(sbatch={option: True})


@pytest.mark.parametrize("folder", ["logs/%A_%a", "logs/%a"])
def test_an_array_index_in_the_folder_is_refused_before_anything_is_queued(tmp_path, monkeypatch, folder):
    # submitit filed the array's submission under the id sbatch printed (no index), and raised after sbatch
    # had queued the array, whose elements then failed without their files.
    bin_dir = fake_submitting_tools(tmp_path, monkeypatch, 'touch "$(dirname "$0")/queued"; echo "Submitted batch job 42"')
    with pytest.raises(SubmitError, match=r"%a \(the array index\) cannot be in the folder.*Use %j"):
        Submitter(cluster="slurm", folder=tmp_path / folder).map_array(print, [1, 2])
    assert not (bin_dir / "queued").exists()


@pytest.mark.parametrize("folder, pattern", [("y/%x/%j", "%x"), ("logs/%u/%j", "%u"), ("logs/%j_%t", "%t"),
                                             ("logs/%N", "%N"), ("logs/100%%/%j", "%%"), ("logs/%5j", "%5j")])
def test_a_folder_pattern_submitit_does_not_fill_in_is_refused_before_anything_is_queued(tmp_path, monkeypatch,
                                                                                          folder, pattern):
    # Slurm filled %x in the job's log path, submitit did not in its own: the job failed, its log nowhere.
    bin_dir = fake_submitting_tools(tmp_path, monkeypatch, 'touch "$(dirname "$0")/queued"; echo "Submitted batch job 42"')
    with pytest.raises(SubmitError, match=rf"{re.escape(pattern)} is one of Slurm's filename patterns, which "
                                          r"submitit does not fill in.*Use only %j, %A"):
        Submitter(cluster="slurm", folder=tmp_path / folder).submit_command(["true"])
    assert not (bin_dir / "queued").exists()
    assert cli.main(["submit", "--cluster", "slurm", "--folder", str(tmp_path / folder), "--", "true"]) == 2
    assert not (bin_dir / "queued").exists()


@pytest.mark.parametrize("args, said", [
    (["--name", "\udcff"], "--name '\\udcff' holds bytes that are not UTF-8 text"),
    (["--partition", "gpu\udcff"], "--partition 'gpu\\udcff' holds bytes"),
    (["--setup", "echo \udcff"], "the setup line 'echo \\udcff' holds bytes"),
    (["--sbatch", "comment=\udcff"], "the sbatch option 'comment=\\udcff' holds bytes"),
    (["--folder", "\udcff/%j"], "--folder '\\udcff/%j' holds bytes"),
])
def test_bytes_that_are_not_utf8_in_the_job_script_are_refused_naming_the_option(tmp_path, monkeypatch, capsys,
                                                                                  args, said):
    # What a shell passes for $'\xff': submitit wrote the job script as UTF-8 and failed with a traceback,
    # leaving its pickle behind.
    monkeypatch.chdir(tmp_path)
    bin_dir = fake_submitting_tools(tmp_path, monkeypatch, 'touch "$(dirname "$0")/queued"; echo "Submitted batch job 42"')
    assert cli.main(["submit", "--cluster", "slurm", *args, "--", "true"]) == 2
    err = capsys.readouterr().err
    assert said in err and "spell it in UTF-8" in err and "Traceback" not in err, err
    assert not (bin_dir / "queued").exists() and not (tmp_path / "slurmdist-logs").exists()
    with pytest.raises(SubmitError, match=r"python='python\\udcff' holds bytes that are not UTF-8 text"):
        Submitter(cluster="slurm", python="python\udcff")


def test_a_job_folder_that_cannot_be_made_is_a_submit_error_naming_it(tmp_path):
    # submitit writes the job's pickles there before it starts the job (sbatch, or the local controller).
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    submitter = Submitter(cluster="local", folder=blocker / "logs" / "%j", time=5)
    with pytest.raises(SubmitError, match=r"cannot write the job's folder '.*a-file/logs/%j' \(folder=, or --folder\)"):
        submitter.submit_command(["true"])


def fake_slurm(tmp_path, monkeypatch, squeue: str, sacct: str) -> None:
    """squeue and sacct on PATH as shell bodies (what a cluster in that state answers)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("squeue", squeue), ("sacct", sacct)):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_a_slurmctld_that_does_not_answer_holds_a_wait_no_longer_than_asked(tmp_path, monkeypatch):
    # Each call alone may take SLURM_CALL_TIMEOUT (15 s): squeue then sacct would hold a 2 s wait for 30 s.
    import slurmdist.submit as submit

    fake_slurm(tmp_path, monkeypatch, squeue="exec sleep 60", sacct="exec sleep 60")
    began = time.monotonic()
    with pytest.raises(submit.JobTimeoutError, match="job 42 still UNKNOWN after 2s"):
        submit.wait(FinishedTasks(tmp_path), timeout=2, poll=0.1)  # results written: squeue asked when it ran
    assert time.monotonic() - began < 2 + 1 + 2 * submit.commands.REAP_GRACE


def test_a_job_slurm_has_forgotten_ends_the_wait_and_says_so(tmp_path, monkeypatch):
    # Past MinJobAge without accounting: squeue no longer knows the id, sacct keeps nothing.
    import slurmdist.submit as submit

    fake_slurm(tmp_path, monkeypatch, squeue="echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1",
               sacct="echo 'Slurm accounting storage is disabled' >&2; exit 1")
    assert submit.slurm_state("42") == submit.FORGOTTEN
    job = FinishedTasks(tmp_path)
    job.task(1).paths.result_pickle.unlink()  # task 1 never reported
    job.task = lambda index, task=job.task: SimpleNamespace(  # noqa: E731 - the paths results() reads
        paths=SimpleNamespace(result_pickle=task(index).paths.result_pickle, stdout=tmp_path / "out",
                              stderr=tmp_path / "err"))
    monkeypatch.setattr(submit, "RESULT_GRACE", 0.1)
    monkeypatch.setattr(submit, "_read_outcomes", lambda job, grace, **_: [("success", 1), (None, None)])
    began = time.monotonic()
    with pytest.raises(submit.JobFailedError, match=r"Slurm no longer knows job 42 \(it ended more than MinJobAge "
                                                    r"ago.*task\(s\) \[1\] left no result") as failed:
        submit.results(job, timeout=600, poll=0.05)
    assert failed.value.state == submit.FORGOTTEN and time.monotonic() - began < 30  # not the whole timeout


class EndedTasks(FinishedTasks):
    """FinishedTasks with the log files results() reads: task 0's error file is the batch log srun writes to."""

    def task(self, index):
        return SimpleNamespace(paths=SimpleNamespace(result_pickle=self.folder / f"42_{index}_result.pkl",
                                                     stdout=self.folder / f"42_{index}_log.out",
                                                     stderr=self.folder / f"42_{index}_log.err"))


def ended_failed(tmp_path, monkeypatch, srun_said: str, tasks: int = 4) -> EndedTasks:
    import slurmdist.submit as submit

    monkeypatch.setattr(submit, "job_state", lambda job, **_: "FAILED")
    monkeypatch.setattr(submit, "RESULT_GRACE", 0.1)
    import pickle

    job = EndedTasks(tmp_path, tasks=tasks)
    for task in range(tasks):
        job.task(task).paths.result_pickle.write_bytes(pickle.dumps(("error", f"RuntimeError: task {task} lost a peer")))
    job.task(0).paths.stderr.write_text(f"some output\n{srun_said}")
    return job


def test_a_task_that_died_without_a_result_is_named_with_what_srun_said(tmp_path, monkeypatch):
    # Rank 1 killed (out of memory, os._exit): it writes nothing, and the ranks in a collective with it raise
    # "Connection reset by peer". The message blamed one of those and never named task 1; srun's lines say
    # which task died first and which it ended after (Terminated).
    import slurmdist.submit as submit

    job = ended_failed(tmp_path, monkeypatch, "srun: error: node1: task 1: Exited with exit code 3\n"
                                              "srun: error: node1: task 0: Terminated\n")
    job.task(1).paths.result_pickle.unlink()
    # Its own error is in its log (a command's, or one ended before it could write a result): shown beside the
    # blamed task's, since which of the tasks failed first is a guess when they fail milliseconds apart.
    job.task(1).paths.stderr.write_text("Traceback (most recent call last):\n  File \"t.py\", line 5\n"
                                        "ValueError: rank 1 exploded\nsubmitit WARNING bypassing SIGTERM\n")
    monkeypatch.setattr(submit, "run_start", lambda job_id, **_: None)  # unknown: every file counts
    with pytest.raises(submit.JobFailedError) as failed:
        submit.results(job, timeout=30, poll=0.05)
    said = str(failed.value)
    assert said.startswith("job 42 ended FAILED: task 0 raised (then task(s) [2, 3] failed too); task(s) [1] left no "
                           "result: ended after that failure, or died before it without a Python error (killed, out "
                           "of memory, os._exit): srun's lines at the end say which:\nRuntimeError: task 0 lost a "
                           "peer\n"), said
    assert said.endswith("_log.err)\nwhat the other tasks ended with:\n  task 1: ValueError: rank 1 exploded\n"
                         "  task 2: RuntimeError: task 2 lost a peer\n  task 3: RuntimeError: task 3 lost a peer\n"
                         "srun said:\nsrun: error: node1: task 1: Exited with exit code 3\nsrun: error: "
                         "node1: task 0: Terminated"), said


def test_a_failed_commands_status_comes_right_after_its_task(tmp_path, monkeypatch):
    # "task 1; task(s) [0] left no result: ... say which: command exited with status 3": the status read as
    # task 0's.
    import pickle

    import slurmdist.submit as submit

    job = ended_failed(tmp_path, monkeypatch, "srun: error: node1: task 1: Exited with exit code 3\n", tasks=2)
    job.task(0).paths.result_pickle.unlink()
    job.task(1).paths.result_pickle.write_bytes(pickle.dumps(
        ("error", "Traceback ...\nslurmdist.task_command.CommandFailed: command exited with status 3: python t.py")))
    monkeypatch.setattr(submit, "run_start", lambda job_id, **_: None)
    with pytest.raises(submit.JobFailedError) as failed:
        submit.results(job, timeout=30, poll=0.05)
    assert str(failed.value).startswith("job 42 ended FAILED: task 1: command exited with status 3: python t.py; "
                                        "task(s) [0] left no result: "), failed.value


def test_results_of_a_requeued_job_leave_out_the_files_its_run_before_wrote(tmp_path, monkeypatch):
    # Preempted, its ranks 1..3 raised ("they fail in their next collective") and wrote error files; requeued,
    # rank 2 was killed in the new run and rank 1 raised. The old files blamed the preemption's traceback.
    import pickle

    import slurmdist.submit as submit

    # The batch log is appended to by every run: srun's lines of the run before are not this run's.
    job = ended_failed(tmp_path, monkeypatch, "srun: error: node1: task 0: Terminated\n"
                                              f"{submit.RUN_STARTS} 42 starts (restarts so far: 1)\n"
                                              "srun: error: node2: task 2: Killed\n")
    old = job.task(0).paths.result_pickle.stat().st_mtime - 600
    for task in (0, 2, 3):
        os.utime(job.task(task).paths.result_pickle, (old, old))
    job.task(1).paths.result_pickle.write_bytes(pickle.dumps(("error", "RendezvousError: rank 2 never arrived")))
    monkeypatch.setattr(submit, "run_start", lambda job_id, **_: old + 300)  # files before start - RUN_GAP: stale
    monkeypatch.setattr(submit, "run_gap", lambda: submit.RUN_GAP)  # not this machine's scontrol
    # Each task's log holds every run (appended): only this run's part says what the task ended with.
    started = "submitit INFO (2026-11-29 23:00:00,000) - Starting with JobEnvironment(job_id=42, ...)\n"
    job.task(2).paths.stderr.write_text(f"{started}RuntimeError: from the run before\n{started}")  # killed: none
    job.task(3).paths.stderr.write_text(f"{started}RuntimeError: from the run before\n{started}ValueError: this run's\n")
    with pytest.raises(submit.JobFailedError) as failed:
        submit.results(job, timeout=30, poll=0.05)
    said = str(failed.value)
    assert "\n  task 3: ValueError: this run's\n" in said and "from the run before" not in said, said
    assert said.startswith("job 42 ended FAILED: task 1 raised; task(s) [0, 2, 3] left no result"), said
    assert ":\nRendezvousError: rank 2 never arrived\n" in said and said.endswith("\nsrun said:\nsrun: error: node2: task 2: Killed")


@pytest.mark.parametrize("config, gap", [
    ("AuthInfo                = cred_expire=10,socket=/run/munge.socket", 5.5),  # requeued 11 s after: half
    ("AuthInfo                = cred_expire=600", 60.0),  # capped: clocks a minute apart still agree
    ("AuthInfo                = (null)", 60.0),  # Slurm's default 120 s
])
def test_the_gap_between_runs_follows_the_sites_credential_lifetime(tmp_path, monkeypatch, config, gap):
    # A requeued run starts cred_expire + 1 s after the run before ended: with cred_expire=10 the fixed 60 s
    # let the run before's result files pass for this run's, and blame the wrong task (a user trial).
    import slurmdist.submit as submit

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho 'ClusterName = local'\necho '{config}'\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert submit.run_gap() == gap
    (bin_dir / "scontrol").write_text("#!/bin/sh\nexit 1\n")  # slurmctld unreachable: the default
    assert submit.run_gap() == submit.RUN_GAP


def test_run_start_asks_for_a_job_that_ended_too_then_accounting(tmp_path, monkeypatch):
    # Plain `squeue -j` lists no job that ended; `-t all` does while slurmctld remembers it, sacct after that.
    import slurmdist.submit as submit

    fake_slurm(tmp_path, monkeypatch, squeue='case "$*" in *"-t all"*) echo 2026-11-29T17:55:33;; esac',
               sacct="exit 1")
    assert submit.run_start("42") == datetime.fromisoformat("2026-11-29T17:55:33").timestamp()
    (tmp_path / "bin").rename(tmp_path / "old-bin")
    fake_slurm(tmp_path, monkeypatch, squeue="exit 0", sacct="echo 2026-11-29T17:40:00")
    assert submit.run_start("42") == datetime.fromisoformat("2026-11-29T17:40:00").timestamp()


def test_a_local_jobs_timeout_says_how_to_stop_it_there():
    import slurmdist.submit as submit

    class LocalJob:  # submitit's class name: its id is the controller's pid
        job_id, state, num_tasks = "8197", "RUNNING", 1

        def task(self, index):
            return SimpleNamespace(paths=SimpleNamespace(result_pickle=Path("/nonexistent/8197_0_result.pkl")))

    with pytest.raises(submit.JobTimeoutError, match="`kill -INT 8197` to stop it"):
        submit.wait(LocalJob(), timeout=0.1, poll=0.05)


def test_an_argument_that_cannot_be_pickled_is_a_submit_error_saying_so(tmp_path):
    import threading

    submitter = Submitter(tasks_per_node=1, folder=tmp_path / "%j", cluster="local")
    with pytest.raises(SubmitError, match=r"cannot be sent to the job: cannot pickle '_thread.lock' object\. .*a path"):
        submitter.submit(print, threading.Lock())


@pytest.mark.parametrize("call, message", [
    (lambda s: s.submit(3), "submit: 3 is not callable"),
    (lambda s: s.map_array(3, [1]), "map_array: 3 is not callable"),
    (lambda s: s.map_array(print, [1, 2, 3], [1]), r"different lengths \(1, 3\); zip would submit only"),
    (lambda s: s.submit_command(["-m", "pkg"]), r"submit_command -- -m pkg: the command starts with an option, not a "
                                                r"program: name the program first, e.g. `-- python -m pkg`"),
])
def test_a_submission_that_could_only_fail_in_the_job_is_refused_before_anything_is_queued(tmp_path, call, message):
    submitter = Submitter(cluster="local", folder=tmp_path / "logs")
    with pytest.raises(SubmitError, match=message):
        call(submitter)
    assert not (tmp_path / "logs").exists()  # nothing was submitted, not even the executor's folder made


@pytest.mark.parametrize("arguments, message", [
    ({"python": 3}, "python=3 must be the interpreter command"),
    ({"python": " "}, "python=' ' must be the interpreter command"),
    ({"python": "'/usr/bin/python3"}, r"python=\"'/usr/bin/python3\" is not a command line: No closing quotation"),
    ({"python": "/nonexistent/python"}, r"python='/nonexistent/python': no such command on this machine, where a "
                                        r"local job runs it"),  # the job failed at execve
    ({"sbatch": "constraint=a100"}, "sbatch='constraint=a100' must be a mapping"),
])
def test_submitter_arguments_of_the_wrong_kind_are_named(arguments, message):
    with pytest.raises(SubmitError, match=message):
        Submitter(cluster="local", **arguments)
    assert Submitter(cluster="local", python=f"{sys.executable} -X faulthandler").python  # a command with options
    assert Submitter(cluster="local", python=f"'{sys.executable}' -X faulthandler").python  # quoted, as shlex.quote


def test_a_slurm_jobs_interpreter_is_left_to_its_nodes(tmp_path, monkeypatch):
    fake_submitting_tools(tmp_path, monkeypatch, "exit 0")
    assert Submitter(cluster="slurm", python="/opt/site/bin/python").python == "/opt/site/bin/python"


@pytest.mark.parametrize("arguments, message", [
    ({"timeout": "x"}, "timeout='x' is not a number of seconds"),
    ({"timeout": -1}, "timeout=-1 must be a positive number of seconds"),
    ({"timeout": 10, "poll": 0}, "poll=0 must be a positive number of seconds"),
])
def test_wait_bounds_are_checked_before_the_job_is_asked(arguments, message):
    from slurmdist.submit import results

    job = SimpleNamespace(job_id="1")  # never reached: the bounds are checked first
    with pytest.raises(SubmitError, match=message):
        results(job, **arguments)


def test_with_options_copies_a_submitter_with_some_arguments_changed(tmp_path):
    base = Submitter(nodes=2, gpus_per_node=4, time=30, folder=tmp_path / "a", cluster="local", python="python3")
    copy = base.with_options(nodes=1, folder=tmp_path / "b")
    assert (copy.resources.nodes, copy.resources.gpus_per_node, copy.resources.time) == (1, 4, 30)
    assert (copy.folder, copy.cluster, copy.python) == (tmp_path / "b", "local", "python3")
    assert base.resources.nodes == 2 and base.folder == tmp_path / "a"  # the original is unchanged
    with pytest.raises(SubmitError, match="nodes=0 must be a whole number >= 1"):
        base.with_options(nodes=0)


@pytest.mark.parametrize("options, said", [
    ({"partition": "gpu"}, "where partition='gpu' means nothing"),
    ({"partition": "gpu", "account": "proj"}, "where partition='gpu', account='proj' mean nothing"),
])
def test_a_job_that_falls_back_to_this_machine_names_the_options_it_drops(tmp_path, monkeypatch, caplog, options,
                                                                          said):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, no srun
    with caplog.at_level(logging.WARNING, logger="slurmdist"):
        assert Submitter(folder=tmp_path / "%j", **options).cluster == "local"
    assert said in caplog.text, caplog.text

"""slurmdist.submit against a real 2-node Slurm cluster with accounting (slurmdbd + MariaDB): training
round trip, sweep, CLI --wait, preemption -> checkpoint -> requeue -> resume, prompt failures, LocalExecutor."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator

import pytest

from tests.integration.cluster import PYTHON, REPO, TRAIN_PY, LocalCluster, train_reference

pytestmark = pytest.mark.integration

TIMEOUT = 150  # seconds any one job may take here, requeue included
# Training that is still under way when a signal sent after its first log line lands. Slurm's preemption
# (scheduling the urgent job) took about 3 s here: 200 steps, 0.6 s on a fast core, finished before it came.
# Steps of at least 0.12 s make that margin time (18 s), whatever the cores' speed; plain steps did it with
# 3000 of them, which the requeued run and the uninterrupted reference then had to train too (2 minutes).
# Few slow steps rather than many fast ones: the reference trains them all at full speed.
LONG_STEPS = 150
SLOW_STEPS = ["--steps", str(LONG_STEPS), "--step-seconds", "0.12"]


def slow_until_requeued(example, checkpoint: Path):
    """example.Train with SLOW_STEPS in its first run only: the slow steps are there for the signal to land,
    and the requeued run, with nothing left to wait for, trains the rest at full speed (about 15 s less per test).
    Sleeping changes no number, so the result is still an uninterrupted run's."""

    class SlowUntilRequeued(example.Train):
        def run(self, preemption):
            from slurmdist.requeue import restart_count

            if restart_count(os.environ):
                self.train_args = ["--steps", str(LONG_STEPS)]
            return super().run(preemption)

    return SlowUntilRequeued(SLOW_STEPS, str(checkpoint))


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_example(name: str):
    """examples/NAME.py as a module whose code travels with the job (the job cannot import it)."""
    import cloudpickle

    module = _load(name, REPO / "examples" / f"{name}.py")
    cloudpickle.register_pickle_by_value(module)
    return module


@pytest.fixture(scope="module")
def cluster(slurm_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The session's cluster (accounting on, so sacct reports failed and cancelled jobs), with its
    variables in os.environ for in-process submission."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # jobs run this module's functions
    with pytest.MonkeyPatch.context() as patch:
        for key in [k for k in os.environ if k.startswith("SLURM_")]:
            patch.delenv(key)
        for key, value in slurm_cluster.env.items():
            patch.setenv(key, value)
        yield slurm_cluster


@pytest.fixture(scope="module")
def example(cluster):
    return load_example("submit_train")


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory) -> Callable[[int, int, int], Dict]:
    """train.py's results under plain srun, by (nodes, tasks per node, steps): once per test run."""
    return lambda nodes, tasks, steps: train_reference(cluster, tmp_path_factory, nodes, tasks, steps, TIMEOUT)


# --- tests ---------------------------------------------------------------------------------------------------


def test_python_submission_trains_like_srun(cluster, example, reference, tmp_path, monkeypatch):
    from slurmdist.submit import Submitter, results

    expected = reference(2, 2, 40)["checksum"]  # before the variables below, which would reach its srun
    # Submitted from a process that runs under torchrun itself (a notebook in a job): none of that may reach
    # the tasks, or each would train alone as rank 0 of world 1.
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    submitter = Submitter(nodes=2, tasks_per_node=2, time=5, folder=tmp_path / "%j")
    job = submitter.submit(example.Train(["--steps", "40"], str(tmp_path / "ckpt.pt")))
    outcome = results(job, timeout=TIMEOUT)
    assert len(outcome) == 4 and all(r["launcher"] == "slurm" and r["world_size"] == 4 for r in outcome)
    assert {r["checksum"] for r in outcome} == {expected}
    assert outcome[0]["restarts"] == 0 and outcome[0]["resumed_from_step"] == 0


def test_map_array_runs_a_sweep(cluster, example, tmp_path):
    from slurmdist.submit import Submitter, result

    submitter = Submitter(nodes=2, tasks_per_node=1, time=5, folder=tmp_path / "%j")
    jobs = submitter.map_array(example.train_seed, [1, 2, 3], [20] * 3, [str(tmp_path / "ckpt.pt")] * 3)
    assert len(jobs) == 3 and len({job.job_id.split("_")[0] for job in jobs}) == 1  # one job array
    outcomes = [result(job, timeout=TIMEOUT) for job in jobs]
    assert all(r["world_size"] == 2 and r["steps"] == 20 for r in outcomes)
    assert len({r["checksum"] for r in outcomes}) == 3  # three seeds, three models
    assert sorted(p.name for p in tmp_path.glob("ckpt.pt.seed*")) == [f"ckpt.pt.seed{s}" for s in (1, 2, 3)]


def test_cli_submit_wait_trains_like_srun(cluster, reference, tmp_path):
    out = tmp_path / "result.json"
    proc = cluster.run(
        [PYTHON, "-m", "slurmdist", "submit", "--nodes", "2", "--tasks-per-node", "2", "--time", "5",
         "--folder", tmp_path / "%j", "--wait", "--timeout", TIMEOUT, "--",
         PYTHON, TRAIN_PY, "--steps", "40", "--out", out], timeout=TIMEOUT + 30)
    job_id = re.search(r"submitted job (\d+)", proc.stdout).group(1)
    assert f"{tmp_path}/{job_id}/{job_id}_0_log.out" in proc.stdout
    assert "step 40/40" in proc.stdout  # rank 0's progress, followed live
    assert f"job {job_id} COMPLETED" in proc.stderr
    assert json.loads(out.read_text())["checksum"] == reference(2, 2, 40)["checksum"]


def test_cli_wait_exits_with_the_job_status(cluster, tmp_path):
    proc = cluster.run(
        [PYTHON, "-m", "slurmdist", "submit", "--nodes", "2", "--tasks-per-node", "1", "--time", "5",
         "--folder", tmp_path / "%j", "--wait", "--timeout", TIMEOUT, "--",
         PYTHON, "-c", "import os, sys; sys.exit('bad input on rank 1' if os.environ['SLURM_PROCID'] == '1' else 0)"],
        timeout=TIMEOUT + 30, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "FAILED" in proc.stderr and "command exited with status 1" in proc.stderr
    # What the command itself said, from the task's log: the task's traceback only knows the status.
    assert re.search(r"task 1: command exited with status 1: .*\nlast lines of \S+_1_log\.err:\nbad input on rank 1$",
                     proc.stderr, re.MULTILINE), proc.stderr
    assert "Traceback" not in proc.stderr  # the task's own plumbing says nothing the first line does not


def test_cli_submit_works_where_jobs_are_submitted_with_export_none(cluster, tmp_path):
    # Sites that set SBATCH_EXPORT=NONE: sbatch leaves SLURM_EXPORT_ENV=NONE in the batch script, and srun
    # started submitit's tasks without the variable that tells them they run under Slurm.
    proc = cluster.run(
        [PYTHON, "-m", "slurmdist", "submit", "--nodes", "2", "--tasks-per-node", "1", "--time", "5",
         "--folder", tmp_path / "%j", "--wait", "--timeout", TIMEOUT, "--",
         PYTHON, "-c", "import os; print('task', os.environ['SLURM_PROCID'], 'ran')"],
        timeout=TIMEOUT + 30, check=False, env={"SBATCH_EXPORT": "NONE"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "task 0 ran" in proc.stdout and "COMPLETED" in proc.stderr


def test_cli_reports_sbatchs_refusal_once(cluster, tmp_path):
    proc = cluster.run([PYTHON, "-m", "slurmdist", "submit", "--partition", "nosuchpart", "--folder",
                        tmp_path / "%j", "--", "true"], timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    # submitit prints sbatch's error itself too; the CLI's own error carries it.
    assert proc.stderr.count("invalid partition") == 1, proc.stderr
    assert proc.stderr.startswith("slurmdist: error: sbatch refused the job"), proc.stderr


def test_cli_without_a_cluster_to_submit_to_says_where_to_submit_from(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}  # no SLURM_CONF: no cluster here
    proc = subprocess.run([PYTHON, "-m", "slurmdist", "submit", "--cluster", "slurm", "--folder", str(tmp_path / "%j"),
                           "--", "true"], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr
    assert "Could not establish a configuration source" in proc.stderr  # sbatch's own words
    assert "sbatch finds no slurm.conf here: submit from a login node" in proc.stderr
    assert "--cluster local" in proc.stderr


def test_preempted_job_checkpoints_requeues_and_resumes(cluster, example, reference, tmp_path):
    from slurmdist.submit import Submitter, results

    steps = LONG_STEPS
    submitter = Submitter(nodes=2, tasks_per_node=1, time=5, folder=tmp_path / "%j")
    job = submitter.submit(slow_until_requeued(example, tmp_path / "ckpt.pt"))
    wait_for_line(job.paths.stdout, rf"step \d+/{steps}")  # training is under way
    cluster.run(["scancel", "--signal=USR2", job.job_id])
    outcome = results(job, timeout=TIMEOUT)
    saved_step = outcome[0]["resumed_from_step"]
    assert outcome[0]["restarts"] == 1
    assert 0 < saved_step < steps
    # The same model as an uninterrupted run: the requeue lost and changed nothing.
    assert {r["checksum"] for r in outcome} == {reference(2, 1, steps)["checksum"]}
    history = run_history(cluster, job.job_id)
    assert history == ["REQUEUED", "COMPLETED"]


def test_sigterm_without_a_warning_saves_a_checkpoint_and_ends_the_job(cluster, example, tmp_path):
    # What a preemption sends where the cluster does not send the warning first (and scancel): submitit
    # ignores SIGTERM, so before `Resumable` caught it the job lost everything since its last save.
    from slurmdist.submit import JobFailedError, Submitter, results

    steps, checkpoint = LONG_STEPS, tmp_path / "ckpt.pt"
    submitter = Submitter(nodes=2, tasks_per_node=1, time=5, folder=tmp_path / "%j")
    job = submitter.submit(example.Train(SLOW_STEPS, str(checkpoint)))
    wait_for_line(job.paths.stdout, rf"step \d+/{steps}")
    signalled = time.time()
    cluster.run(["scancel", "--signal=TERM", job.job_id])
    with pytest.raises(JobFailedError) as ended:  # not requeued: Slurm requeues a preempted job itself
        results(job, timeout=TIMEOUT)
    assert checkpoint.exists() and checkpoint.stat().st_mtime >= signalled - 1
    assert any("got SIGTERM" in log for log in task_stderrs(job, 2))
    assert run_history(cluster, job.job_id) == [ended.value.state]  # one run: nothing requeued it


def test_a_preempted_job_saves_on_sigterm_is_requeued_by_slurm_and_resumes(cluster, example, reference, tmp_path):
    # A real preemption: a job in the local cluster's higher-tier "urgent" partition takes both nodes. Slurm
    # sends SIGTERM (no warning first, as on most clusters), requeues the job itself, and runs it again.
    from slurmdist.submit import Submitter, results

    steps = LONG_STEPS
    submitter = Submitter(nodes=2, tasks_per_node=1, time=5, folder=tmp_path / "%j")
    job = submitter.submit(slow_until_requeued(example, tmp_path / "ckpt.pt"))
    wait_for_line(job.paths.stdout, rf"step \d+/{steps}")
    cluster.run(["sbatch", "--partition=urgent", "--nodes=2", "--exclusive", f"--output={tmp_path / 'urgent.out'}",
                 "--wrap=sleep 1"])
    outcome = results(job, timeout=TIMEOUT)
    assert any("got SIGTERM" in log for log in task_stderrs(job, 2))
    assert outcome[0]["restarts"] == 1
    assert 0 < outcome[0]["resumed_from_step"] < steps  # saved on SIGTERM, not started over
    assert {r["checksum"] for r in outcome} == {reference(2, 1, steps)["checksum"]}
    history = run_history(cluster, job.job_id)
    assert history == ["PREEMPTED", "COMPLETED"], history


def test_a_job_preempted_within_a_grace_time_requeues_itself_and_resumes(cluster, example, reference, tmp_path):
    # With a partition GraceTime, Slurm sends SIGTERM and requeues the job only if it still runs when the grace
    # time is over: the ranks saved and exited at once, and the job ended FAILED, never requeued (a trial).
    from slurmdist.submit import Submitter, results

    steps = LONG_STEPS
    cluster.run(["scontrol", "update", "PartitionName=debug", "GraceTime=30"])
    try:
        submitter = Submitter(nodes=2, tasks_per_node=1, time=5, folder=tmp_path / "%j")
        job = submitter.submit(slow_until_requeued(example, tmp_path / "ckpt.pt"))
        wait_for_line(job.paths.stdout, rf"step \d+/{steps}")
        cluster.run(["sbatch", "--partition=urgent", "--nodes=2", "--exclusive",
                     f"--output={tmp_path / 'urgent.out'}", "--wrap=sleep 1"])
        outcome = results(job, timeout=TIMEOUT)
    finally:
        cluster.run(["scontrol", "update", "PartitionName=debug", "GraceTime=0"])
    stderr = "".join(task_stderrs(job, 2))
    assert "Slurm is preempting the job (its PreemptTime is set): requeueing it" in stderr, stderr
    assert outcome[0]["restarts"] == 1
    assert 0 < outcome[0]["resumed_from_step"] < steps  # saved on SIGTERM, not started over
    assert {r["checksum"] for r in outcome} == {reference(2, 1, steps)["checksum"]}
    assert run_history(cluster, job.job_id)[-1] == "COMPLETED"


REQUEUEING_COMMAND = """
import os, sys, time
import slurmdist.requeue
preemption = slurmdist.requeue.install()
restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
print("run", restarts, flush=True)
if restarts == "0":
    deadline = time.monotonic() + 100
    while not preemption.requested and time.monotonic() < deadline:
        time.sleep(0.1)
    preemption.requeue()  # rank 0 requeues and waits to be ended; the others go on until Slurm ends them
    time.sleep(100)
else:
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)  # the requeued run's training
print("finished after", restarts, "requeue(s)", flush=True)
"""


def test_a_submitted_command_that_requeues_itself_ends_with_its_requeued_run(cluster, tmp_path):
    # Slurm's SIGTERM after the requeue kills the command; the task around it (submitit ignores SIGTERM)
    # must die with it rather than report a failure of a job that is queued again.
    from slurmdist.submit import Submitter, results

    script = tmp_path / "requeueing.py"
    script.write_text(REQUEUEING_COMMAND)
    job = Submitter(nodes=2, tasks_per_node=1, time=5, folder=tmp_path / "%j").submit_command([PYTHON, str(script)])
    for task in range(2):  # every command has installed its handler: the warning would kill one still starting
        wait_for_line(job.task(task).paths.stdout, "run 0")
    cluster.run(["scancel", "--signal=USR2", job.job_id])
    assert results(job, timeout=TIMEOUT) == [0, 0]
    assert "finished after 1 requeue(s)" in job.paths.stdout.read_text()
    history = run_history(cluster, job.job_id)
    assert history == ["REQUEUED", "COMPLETED"]


ARRAY_ELEMENT = """
import os, sys, time
import slurmdist.requeue
element, restarts = os.environ["SLURM_ARRAY_TASK_ID"], os.environ.get("SLURM_RESTART_COUNT", "0")
with open(os.path.join(sys.argv[1], "runs-" + element), "a") as runs:
    runs.write(restarts + "\\n")
if element == "1" and restarts == "0":
    preemption = slurmdist.requeue.install()
    print("waiting", flush=True)
    deadline = time.monotonic() + 100
    while not preemption.requested and time.monotonic() < deadline:
        time.sleep(0.1)
    preemption.requeue()
    time.sleep(100)
"""


def test_an_array_element_that_requeues_itself_leaves_the_other_elements_alone(cluster, tmp_path):
    # Element 1's SLURM_JOB_ID is the array's own id, which `scontrol requeue` reads as every element: the
    # finished element 0 ran again, and running elements were cancelled.
    script = tmp_path / "element.py"
    script.write_text(ARRAY_ELEMENT)
    submitted = cluster.run(["sbatch", "--parsable", "--array=0-1", "-n1", "--time=5",
                             f"--output={tmp_path}/%A_%a.out", f"--wrap=exec {PYTHON} {script} {tmp_path}"])
    array_id = submitted.stdout.strip()
    wait_for_line(tmp_path / f"{array_id}_1.out", "waiting")
    assert run_history(cluster, f"{array_id}_0") == ["COMPLETED"]  # element 0 is done before 1 requeues
    cluster.run(["scancel", "--full", "--signal=USR2", f"{array_id}_1"])
    wait_for_line(tmp_path / "runs-1", "0\n1\n")
    assert run_history(cluster, f"{array_id}_1") == ["REQUEUED", "COMPLETED"]
    assert (tmp_path / "runs-0").read_text() == "0\n"  # one run only
    assert run_history(cluster, f"{array_id}_0") == ["COMPLETED"]


def test_a_preempted_command_leaves_no_result_that_passes_for_the_requeued_runs(cluster, tmp_path):
    # Preempted (SIGTERM, no warning), the command saves and exits 143. The task around it used to raise
    # "command exited with status 143", which submitit wrote as the job's result: once the requeued run was
    # RUNNING, results() read that file and reported the job failed while it was still training.
    from slurmdist.submit import Submitter, results

    script = tmp_path / "requeueing.py"
    script.write_text(REQUEUEING_COMMAND)  # after a SIGTERM with no warning, requeue() saves and exits 143
    # The requeued run trains longer than the wait trusts result files it sees while the job runs (RESULT_GRACE).
    job = Submitter(nodes=1, tasks_per_node=1, time=5, folder=tmp_path / "%j").submit_command(
        [PYTHON, str(script), "10"])
    wait_for_line(job.paths.stdout, "run 0")
    cluster.run(["sbatch", "--partition=urgent", "--nodes=2", "--exclusive", f"--output={tmp_path / 'urgent.out'}",
                 "--wrap=sleep 1"])
    assert results(job, timeout=TIMEOUT) == [0]
    assert "finished after 1 requeue(s)" in job.paths.stdout.read_text()
    assert run_history(cluster, job.job_id) == ["PREEMPTED", "COMPLETED"]


def test_remote_traceback_reaches_the_caller(cluster, tmp_path):
    from slurmdist.submit import JobFailedError, Submitter, results

    job = Submitter(nodes=2, tasks_per_node=1, time=5, folder=tmp_path / "%j").submit(fail_on_rank_one)
    with pytest.raises(JobFailedError) as failure:
        results(job, timeout=TIMEOUT)
    assert "ValueError: rank 1 gives up" in str(failure.value)
    assert failure.value.state == "FAILED"


def test_a_killed_job_is_reported_from_accounting(cluster, tmp_path):
    from slurmdist.submit import JobFailedError, Submitter, results

    job = Submitter(nodes=1, tasks_per_node=1, time=5, folder=tmp_path / "%j").submit(time.sleep, 120)
    wait_for_line(job.paths.stdout, "Loading pickle")
    cluster.run(["scancel", job.job_id])
    with pytest.raises(JobFailedError) as failure:
        results(job, timeout=TIMEOUT)
    assert failure.value.state == "CANCELLED"
    # submitit itself reads sacct: with accounting it too sees the end, instead of waiting forever.
    deadline = time.monotonic() + 30
    while not job.done(force_check=True):
        assert time.monotonic() < deadline, "submitit never saw the cancelled job end"
        time.sleep(0.5)
    assert job.state.startswith("CANCELLED")


def test_local_executor_runs_the_same_code(cluster, example, reference, tmp_path):
    from slurmdist.submit import Submitter, results

    submitter = Submitter(nodes=1, tasks_per_node=2, time=5, folder=tmp_path / "%j", cluster="local")
    # LONG_STEPS: the preemption tests' reference (world 2) serves here too.
    job = submitter.submit(example.Train(["--steps", str(LONG_STEPS)], str(tmp_path / "ckpt.pt")))
    outcome = results(job, timeout=TIMEOUT)
    assert [r["launcher"] for r in outcome] == ["submitit-local"] * 2
    assert {r["checksum"] for r in outcome} == {reference(2, 1, LONG_STEPS)["checksum"]}


LOCAL_REQUEUEING_COMMAND = """
import os, sys, time
import slurmdist.requeue
preemption = slurmdist.requeue.install()
marker = sys.argv[1] + "." + os.environ["SUBMITIT_LOCAL_GLOBALID"]
restarted = os.path.exists(marker)  # no SLURM_RESTART_COUNT on this machine: the first run leaves a mark
print("run", int(restarted), flush=True)
if not restarted:
    open(marker, "w").close()
    deadline = time.monotonic() + 100
    while not preemption.requested and time.monotonic() < deadline:
        time.sleep(0.1)
    preemption.requeue()  # rank 0 asks the local controller for a restart; the others go on until it ends them
    time.sleep(100)
print("finished", flush=True)
"""


def test_a_local_submitted_command_hears_the_warning_and_restarts(tmp_path):
    # submitit's LocalExecutor signals its tasks, not the commands they run: the tasks pass the warning on, the
    # command reaches the controller (not its own parent, the task) to restart, and the restart status (144)
    # passes through the task. The warning is sent to the tasks as the controller's timer does (the time limit
    # is minutes away); every task and process here is real.
    from slurmdist.submit import Submitter, results

    script = tmp_path / "requeueing.py"
    script.write_text(LOCAL_REQUEUEING_COMMAND)
    job = Submitter(nodes=1, tasks_per_node=2, time=5, folder=tmp_path / "%j", cluster="local").submit_command(
        [PYTHON, str(script), str(tmp_path / "ran")])
    for task in range(2):  # every command has installed its handler: the warning would kill one still starting
        wait_for_line(job.task(task).paths.stdout, "run 0")
    for pid in children_of(job._process.pid):
        os.kill(pid, signal.SIGUSR2)
    assert results(job, timeout=TIMEOUT) == [0, 0]
    for task in range(2):
        assert re.search(r"run 0.*run 1\nfinished", job.task(task).paths.stdout.read_text(), re.S)


def warned_then_requeue(max_requeues: int) -> str:
    """A job that is warned as soon as it starts, every run, and asks for a requeue each time."""
    import os
    import signal as signals
    import time as clock

    import slurmdist.requeue

    preemption = slurmdist.requeue.install(max_requeues=max_requeues)
    os.kill(os.getpid(), signals.SIGUSR2)
    deadline = clock.monotonic() + 60
    while not preemption.requested and clock.monotonic() < deadline:
        clock.sleep(0.05)
    preemption.requeue()  # a restart, or a RequeueError once out of them
    return "not reached"


def test_a_local_job_stops_restarting_at_max_requeues(tmp_path):
    # submitit's LocalExecutor keeps no count: slurmdist counts the restarts beside the job's logs and gives up
    # at max_requeues, as SLURM_RESTART_COUNT makes it give up under Slurm.
    from slurmdist.submit import JobFailedError, Submitter, results

    job = Submitter(nodes=1, tasks_per_node=1, time=5, folder=tmp_path / "%j", cluster="local").submit(
        warned_then_requeue, 1)
    with pytest.raises(JobFailedError, match=r"already restarted 1 times \(limit 1"):
        results(job, timeout=TIMEOUT)
    count, controller_started = (tmp_path / job.job_id / f"{job.job_id}_slurmdist_restarts").read_text().split()
    assert count == "1" and controller_started.isdigit()


def killed_by_sigkill() -> None:
    """What the OOM killer does to a task."""
    import os
    import signal as signals

    os.kill(os.getpid(), signals.SIGKILL)


def test_a_local_job_whose_task_died_is_failed_not_completed(tmp_path):
    # The controller finishes whatever its tasks did: only their results make the job COMPLETED.
    from slurmdist.submit import Submitter, job_state, wait

    killed = Submitter(tasks_per_node=1, time=5, folder=tmp_path / "killed" / "%j", cluster="local").submit(
        killed_by_sigkill)
    assert wait(killed, timeout=TIMEOUT) == "FAILED" and job_state(killed) == "FAILED"
    fine = Submitter(tasks_per_node=1, time=5, folder=tmp_path / "fine" / "%j", cluster="local").submit(len, "ab")
    assert wait(fine, timeout=TIMEOUT) == "COMPLETED"


def rank_1_fails_rank_0_sleeps() -> None:
    """Rank 1 fails at once; rank 0 is in no collective (I/O, an eval loop) and would go on for two minutes."""
    import submitit

    if submitit.JobEnvironment().global_rank == 1:
        raise ValueError("rank 1 gives up")
    time.sleep(120)


def test_a_local_job_whose_task_failed_is_ended_as_srun_kill_on_bad_exit_would(tmp_path):
    from slurmdist.submit import JobFailedError, Submitter, results

    job = Submitter(tasks_per_node=2, time=5, folder=tmp_path / "%j", cluster="local").submit(
        rank_1_fails_rank_0_sleeps)
    started = time.monotonic()
    with pytest.raises(JobFailedError, match=r"(?s)ended FAILED: task 1 raised.*rank 1 gives up") as failed:
        results(job, timeout=TIMEOUT, poll=0.2)
    assert time.monotonic() - started < 60, failed.value
    wait_until_gone(int(job.job_id), timeout=20)


def test_local_setup_lines_run_as_in_a_batch_script_and_cancel_still_stops_the_job(tmp_path):
    # `source` (Debian's sh, dash, has none); a line that fails (no `module` on a laptop) is told in task 0's
    # log and the next still runs, as in a batch script. With setup lines the job's pid is still the
    # controller's, so cancel (SIGINT to it) stops the job.
    from slurmdist.submit import Submitter, wait

    (tmp_path / "act.sh").write_text("export FOO=bar\n")
    job = Submitter(tasks_per_node=2, time=5, folder=tmp_path / "%j", cluster="local",
                    setup=["module load cuda/12.1", f"source {tmp_path / 'act.sh'}"]).submit_command(
        ["sh", "-c", "echo FOO=$FOO; exec sleep 60"])
    logs = tmp_path / job.job_id
    for task in range(2):  # both commands run (a task's own start takes a while on a busy machine)
        wait_for_line(logs / f"{job.job_id}_{task}_log.out", "FOO=bar")
    assert "module: command not found" in (logs / f"{job.job_id}_0_log.err").read_text()
    sleeps = [pid for child in children_of(int(job.job_id)) for pid in children_of(child)]
    assert len(sleeps) == 2, sleeps
    job.cancel()
    assert wait(job, timeout=30) == "FAILED"
    for pid in sleeps:
        wait_until_gone(pid, timeout=20)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(["act.sh", job.job_id])  # no literal "%j"


def test_a_local_job_cancelled_while_its_setup_lines_run_never_starts(tmp_path):
    # bash finishes the command it runs before it acts on a SIGINT to itself alone: the job's whole process group
    # is signalled, the printed command does the same.
    from slurmdist.submit import Submitter, stop_command, wait

    job = Submitter(tasks_per_node=1, time=5, folder=tmp_path / "%j", cluster="local",
                    setup=["echo setting up", "sleep 5"]).submit_command(["sh", "-c", "echo started; sleep 60"])
    out = tmp_path / job.job_id / f"{job.job_id}_0_log.out"
    wait_for_line(out, "setting up")
    job.cancel()
    assert wait(job, timeout=30) == "FAILED"
    time.sleep(6)  # past the end of the setup line, where the job would have started
    assert "started" not in out.read_text()
    assert stop_command(job) == f"kill -INT -{job.job_id}"


def test_a_local_job_loaded_in_another_process_is_running_until_it_ends(tmp_path):
    # A notebook started again, or the job pickled for another script: submitit forgets the controller there.
    import pickle

    from slurmdist.submit import Submitter, result

    job = Submitter(tasks_per_node=1, time=5, folder=tmp_path / "%j", cluster="local").submit(time.sleep, 6)
    saved = tmp_path / "job.pkl"
    saved.write_bytes(pickle.dumps(job))
    follow = ("import pickle, sys; from slurmdist.submit import job_state, wait; "
              "job = pickle.load(open(sys.argv[1], 'rb')); print(job_state(job), wait(job, timeout=60, poll=0.2))")
    seen = subprocess.run([PYTHON, "-c", follow, str(saved)], capture_output=True, text=True, timeout=TIMEOUT)
    assert seen.stdout.split() == ["RUNNING", "COMPLETED"], seen.stderr
    assert result(job, timeout=30) is None


def test_parsable_prints_the_job_id_alone_for_a_script_to_capture(tmp_path):
    # `JOB=$(slurmdist submit --parsable ...)`, as with sbatch: the rest of what it says goes to stderr.
    proc = subprocess.run([PYTHON, "-m", "slurmdist", "submit", "--parsable", "--cluster", "local", "--folder",
                           str(tmp_path / "%j"), "--", "sleep", "60"], capture_output=True, text=True, timeout=TIMEOUT)
    job_id = proc.stdout.strip()
    try:
        assert proc.returncode == 0 and re.fullmatch(r"\d+\n", proc.stdout), (proc.stdout, proc.stderr)
        assert f"submitted job {job_id} " in proc.stderr and f"  stop:   kill -INT -{job_id}\n" in proc.stderr
    finally:
        if job_id.isdigit():
            subprocess.run(["kill", "-INT", job_id], timeout=10)
    if job_id.isdigit():
        wait_until_gone(int(job_id), timeout=20)
    # With --wait, rank 0's output streams on stderr too: stdout stays the job id.
    waited = subprocess.run([PYTHON, "-m", "slurmdist", "submit", "--parsable", "--wait", "--cluster", "local",
                             "--folder", str(tmp_path / "w%j"), "--", "echo", "out-of-rank-0"],
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert waited.returncode == 0 and re.fullmatch(r"\d+\n", waited.stdout), (waited.stdout, waited.stderr)
    assert "out-of-rank-0" in waited.stderr


def test_a_local_submission_without_wait_returns_while_the_job_runs(tmp_path):
    # Captured output (`JOB=$(slurmdist submit ...)`): the job must not hold the capture's pipe until it ends.
    started = time.monotonic()
    proc = subprocess.run([PYTHON, "-m", "slurmdist", "submit", "--cluster", "local", "--folder", str(tmp_path / "%j"),
                           "--", "sleep", "60"], capture_output=True, text=True, timeout=TIMEOUT)
    took = time.monotonic() - started
    job_id = re.search(r"submitted job (\d+)", proc.stdout).group(1)
    try:
        assert proc.returncode == 0 and took < 50, (took, proc.stderr)
        assert f"  stop:   kill -INT -{job_id}\n" in proc.stdout  # what stops it, printed without --wait too
        assert running(int(job_id))
    finally:
        subprocess.run(["kill", "-INT", job_id], timeout=10)
    wait_until_gone(int(job_id), timeout=20)


@pytest.mark.parametrize("command, first_line, last_lines", [
    (["no-such-command-here"], "command not found: 'no-such-command-here': not on the task's PATH", None),
    # The command's last 20 lines of stderr, not crowded out by the task's own traceback after them.
    ([PYTHON, "-c", "import sys; [print(f'line {i}', file=sys.stderr) for i in range(30)]; sys.exit(3)"],
     "command exited with status 3", [f"line {i}" for i in range(10, 30)]),
])
def test_a_failed_command_is_told_in_its_own_words_not_the_tasks_traceback(tmp_path, command, first_line, last_lines):
    proc = subprocess.run([PYTHON, "-m", "slurmdist", "submit", "--cluster", "local", "--folder", str(tmp_path / "%j"),
                           "--wait", "--timeout", str(TIMEOUT), "--", *command],
                          capture_output=True, text=True, timeout=TIMEOUT + 30)
    assert proc.returncode == 1, proc.stderr
    said = re.search(r"ended FAILED: task 0: (.*)\n(?:last lines of \S+:\n((?:.*\n?)*)|\(the command wrote nothing to its log \S+\))",
                     proc.stderr)
    assert said and said.group(1).startswith(first_line), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    if last_lines is not None:
        assert said.group(2).splitlines() == last_lines, proc.stderr


def test_ctrl_c_stops_following_not_the_job_and_says_so(tmp_path):
    out, err = tmp_path / "out", tmp_path / "err"  # files: the job inherits them and outlives the follower
    with open(out, "w") as stdout, open(err, "w") as stderr:
        follower = subprocess.Popen(
            [PYTHON, "-m", "slurmdist", "submit", "--cluster", "local", "--folder", str(tmp_path / "%j"), "--wait",
             "--", PYTHON, "-c", "import time; print('started', flush=True); time.sleep(60)"],
            stdout=stdout, stderr=stderr, start_new_session=True,  # a terminal's process group, of its own
            # As from a terminal: a test run started in the background inherits SIGINT ignored, and Python then
            # installs no KeyboardInterrupt handler.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    job_id = None
    try:
        wait_for_line(out, r"submitted job \d+")
        job_id = re.search(r"submitted job (\d+)", out.read_text()).group(1)
        wait_for_line(tmp_path / job_id / f"{job_id}_0_log.out", "started")
        os.killpg(follower.pid, signal.SIGINT)  # Ctrl-C: the terminal signals its whole foreground group
        assert follower.wait(timeout=30) == 130, err.read_text()
        time.sleep(2)  # what the signal would have done to a job in that group, it has done by now
        said = re.search(rf"stopped following job {job_id}; it keeps running \(`([^`]+)` to stop it\)", err.read_text())
        assert said, err.read_text()
        assert running(int(job_id))  # the job is still there
        subprocess.run(said.group(1), shell=True, check=True, timeout=10)  # ... until told as it says
        wait_until_gone(int(job_id), timeout=20)
    finally:
        follower.kill()
        if job_id is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(job_id), signal.SIGTERM)


def test_a_local_function_job_stops_when_told_as_the_timeout_says(tmp_path):
    # submitit's task ignores SIGTERM, and its controller only forwards it: a plain `kill PID` left it running.
    from slurmdist.submit import JobTimeoutError, Submitter, wait

    job = Submitter(tasks_per_node=1, time=5, folder=tmp_path / "%j", cluster="local").submit(time.sleep, 60)
    with pytest.raises(JobTimeoutError) as timed_out:
        wait(job, timeout=1, poll=0.1)
    stop = re.search(r"`([^`]+)` to stop it", str(timed_out.value))
    assert stop, timed_out.value
    subprocess.run(stop.group(1), shell=True, check=True, timeout=10)
    wait_until_gone(int(job.job_id), timeout=20)


def running(pid: int) -> bool:
    """The process runs: it exists and is no zombie (an orphan's zombie stays where PID 1 does not reap)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text(errors="replace")
    except FileNotFoundError:
        return False


def wait_until_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while running(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs {timeout:.0f} s after it was told to stop"
        time.sleep(0.1)


def children_of(pid: int) -> list:
    """The pids of the processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            found.append(int(entry))
    assert found, f"process {pid} has no children"
    return found


def fail_on_rank_one() -> None:
    import slurmdist

    env = slurmdist.init()
    if env.rank == 1:
        raise ValueError("rank 1 gives up")
    slurmdist.barrier()


def task_stderrs(job, tasks: int) -> list:
    """Each task's stderr. Slurm signals the tasks one after another; the first to get SIGTERM says so, and
    the others may stop on its word (train.py agrees on it across ranks) before their own signal lands."""
    return [job.task(task).paths.stderr.read_text() for task in range(tasks)]


def run_history(cluster, job_id: str, timeout: float = 60) -> list:
    """The job's runs as accounting records them (`sacct -D`: one state per run), once the last run ended:
    every task may have written its result while Slurm still says RUNNING or COMPLETING."""
    deadline = time.monotonic() + timeout
    while True:
        history = cluster.run(["sacct", "-n", "-P", "-D", "-X", "-o", "State", "-j", job_id]).stdout.split()
        if history and history[-1] not in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED", "CONFIGURING"):
            return history
        assert time.monotonic() < deadline, f"job {job_id} still {history} after {timeout} s"
        time.sleep(0.5)


def wait_for_line(path: Path, pattern: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and re.search(pattern, path.read_text(errors="replace"))):
        assert time.monotonic() < deadline, f"{pattern!r} never appeared in {path}"
        time.sleep(0.1)


RANK_1_RAISES = ("import time, slurmdist, torch, torch.distributed as dist\n"
                 "env = slurmdist.init()\n"
                 "if env.rank == 1:\n"
                 "    time.sleep(1)\n"
                 "    raise ValueError('rank 1 exploded')\n"
                 "dist.all_reduce(torch.ones(1))\n")


@pytest.mark.parametrize("where", ["local", "slurm"])
def test_a_failed_commands_own_error_is_in_the_message_whichever_task_is_blamed(cluster, tmp_path, where):
    # Rank 1 raises; rank 0 loses it as a peer in its all_reduce within milliseconds. Which command's result
    # was written first is a race: the blamed task was rank 0 in most runs of a trial, and "rank 1 exploded"
    # was nowhere in the message (rank 1's task, ended by srun, left no result).
    from slurmdist.submit import JobFailedError, Submitter, results

    script = tmp_path / "raise1.py"
    script.write_text(RANK_1_RAISES)
    job = Submitter(nodes=2 if where == "slurm" else 1, tasks_per_node=1 if where == "slurm" else 2, time=5,
                    folder=tmp_path / "%j", cluster=where).submit_command([PYTHON, str(script)])
    with pytest.raises(JobFailedError) as failed:
        results(job, timeout=TIMEOUT)
    said = str(failed.value)
    blamed = re.match(r"job \S+ ended FAILED: task (\d)", said)
    assert blamed and "ValueError: rank 1 exploded" in said, said
    if blamed.group(1) == "0":  # rank 1's error, named beside the blamed one (torch prefixes it with [rank1])
        assert re.search(r"what the other tasks ended with:\n  task 1: (\[rank1\]: )?ValueError: rank 1 exploded",
                         said), said


def test_the_gap_between_runs_is_read_from_the_real_slurmctld(cluster):
    # The local cluster sets cred_expire=10 (requeued runs start 11 s after the run before ended).
    from slurmdist.submit import run_gap

    assert run_gap() == 5.5

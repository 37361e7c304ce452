"""Jobs started the way users start them on the real cluster: `slurmdist sbatch` scripts as sites submit them,
Slurm's warning signal to a program without a handler, and ranks typed at an interactive `srun --pty` shell."""

from __future__ import annotations

import time

import pytest

from tests.integration.cluster import PYTHON, REPO, require

pytestmark = pytest.mark.integration

TIMEOUT = 120
PRINT_PROBE = "import os; print('task', os.environ['SLURM_PROCID'], 'sees', os.environ.get('PROBE'))"


def test_setup_lines_reach_the_tasks_of_a_job_submitted_with_export_none(slurm_cluster, tmp_path):
    # Sites that submit with --export=NONE are why --setup exists: the job starts without the caller's
    # environment, and sbatch leaves SLURM_EXPORT_ENV=NONE in the batch script, which srun inherits, so the
    # tasks started with nothing ("execve(): python: No such file or directory").
    script = slurm_cluster.run(
        [PYTHON, "-m", "slurmdist", "sbatch", "-N2", "--tasks-per-node", "1", "--device", "cpu", "--time", "5",
         "--output", f"{tmp_path}/%j.out", "--setup", "export PROBE=set-up", "--", PYTHON, "-c", PRINT_PROBE],
        timeout=TIMEOUT).stdout
    submitted = slurm_cluster.run(["sbatch", "--parsable", "--wait", "--export=NONE"], input=script,
                                  timeout=TIMEOUT, check=False, cwd=tmp_path)
    (log,) = tmp_path.glob("*.out")
    output = log.read_text()
    assert submitted.returncode == 0, submitted.stderr + output
    assert sorted(line for line in output.splitlines() if line.startswith("task ")) == \
        ["task 0 sees set-up", "task 1 sees set-up"], output


# Ready once the group formed, then a long step; says when it got to the end.
TRAIN_ON = ("import time, slurmdist; env = slurmdist.init(); print('ready', env.rank, flush=True); "
            "time.sleep(6); print('done', env.rank, flush=True)")


def test_a_program_without_a_requeue_handler_runs_on_past_the_warning_signal(slurm_cluster, tmp_path):
    # The scripts ask for SIGUSR2 before the limit (--signal). A training script that never installs
    # slurmdist.requeue died of it, FAILED two minutes early: init() now logs it and carries on.
    script = slurm_cluster.run(
        [PYTHON, "-m", "slurmdist", "sbatch", "-N1", "--tasks-per-node", "2", "--device", "cpu", "--time", "5",
         "--output", f"{tmp_path}/job.out", "--", PYTHON, "-c", TRAIN_ON], timeout=TIMEOUT).stdout
    assert "--signal=USR2@120" in script
    job = slurm_cluster.run(["sbatch", "--parsable"], input=script, timeout=TIMEOUT, cwd=tmp_path).stdout.strip()
    log = tmp_path / "job.out"
    deadline = time.monotonic() + TIMEOUT
    while not (log.exists() and log.read_text().count("ready") == 2):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.2)
    slurm_cluster.run(["scancel", "--signal=USR2", job], timeout=30)  # what --signal sends, to every task
    while slurm_cluster.run(["squeue", "-h", "-j", job], check=False, timeout=30).stdout.strip():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.3)
    output = log.read_text()
    assert output.count("got SIGUSR2, Slurm's warning") == 2 and sorted(
        line for line in output.splitlines() if line.startswith("done")) == ["done 0", "done 1"], output


def test_rank_0_typed_at_an_srun_pty_shell_stops_saying_the_other_tasks_are_gone(slurm_cluster, tmp_path):
    # `srun -n2 --pty bash`, then `python train.py` at its prompt: task 1's shell found no terminal and ended.
    # It waited out its whole timeout (300 s by default) with only "rank(s) 1 never arrived" to show for it; now
    # it stops at once, before any rendezvous.
    typed = f"{PYTHON} -c 'import slurmdist; slurmdist.init()'\nexit\n"
    done = slurm_cluster.run([require("script"), "-qec", "srun -N1 -n2 --pty bash --norc --noprofile -i", "/dev/null"],
                             input=typed, timeout=TIMEOUT, check=False, cwd=tmp_path,
                             env={"SLURMDIST_INIT_TIMEOUT": "600"})
    said = done.stdout + done.stderr
    assert "LaunchError: this is rank 0 of 2 of srun step" in said and "srun --overlap" in said, said
    assert "never arrived" not in said, said


def test_the_job_scripts_run_inside_an_salloc_that_asked_for_no_task_count(slurm_cluster, tmp_path):
    # `salloc -N2` alone sets no SLURM_NTASKS: the scripts' info line died of it under set -u (unbound
    # variable) before srun started; train_mpirun.sh needs a task count for -np and says how to ask for one.
    environ = {"PYTHON": PYTHON, "TRAIN_STEPS": "4", "TRAIN_DIR": str(tmp_path / "run")}
    done = slurm_cluster.run(["salloc", "-N2", "-t", "5", "bash", "sbatch/train_2n4g.sh"], cwd=REPO, env=environ,
                             timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ": 2 nodes (" in done.stdout and "2 tasks, dir" in done.stdout, done.stdout
    assert "slurm: 2 rank(s)" in done.stdout and "done: loss" in done.stdout, done.stdout + done.stderr
    refused = slurm_cluster.run(["salloc", "-N2", "-t", "5", "bash", "sbatch/train_mpirun.sh"], cwd=REPO,
                                env=environ, timeout=TIMEOUT, check=False)
    assert refused.returncode == 2 and "train_mpirun.sh: this allocation has no task count (SLURM_NTASKS is " \
        "unset: salloc without -n or --ntasks-per-node)" in refused.stderr, refused.stdout + refused.stderr


def test_rendered_scripts_and_the_torchrun_script_read_an_sallocs_own_layout(slurm_cluster, tmp_path):
    def rendered(*options: str, command=(PYTHON, "-c", PRINT_PROBE)) -> str:
        path = tmp_path / f"job{len(list(tmp_path.glob('job*.sh')))}.sh"
        path.write_text(slurm_cluster.run([PYTHON, "-m", "slurmdist", "sbatch", *options, "--", *command],
                                          timeout=TIMEOUT).stdout)
        return str(path)

    def in_salloc(*args: str, **environ: str):
        return slurm_cluster.run(["salloc", "-t", "5", *args], cwd=REPO, env=environ, timeout=TIMEOUT, check=False)

    ran = in_salloc("-N2", "bash", rendered("-N2", "--tasks-per-node", "1", "--device", "cpu"))
    assert ran.returncode == 0 and "2 node(s) (" in ran.stdout and "), 2 task(s)" in ran.stdout, ran.stdout + ran.stderr
    assert sorted(line for line in ran.stdout.splitlines() if line.startswith("task ")) == \
        ["task 0 sees None", "task 1 sees None"], ran.stdout
    mpirun = in_salloc("-N2", "bash", rendered("-N2", "--launcher", "mpirun", "--device", "cpu"))
    assert mpirun.returncode == 2 and "this allocation has no task count" in mpirun.stderr, mpirun.stderr
    # Two torchrun agents on a node would both host the rendezvous port: refused before either starts.
    agents = rendered("-N1", "--launcher", "torchrun", "-G", "2", command=("train.py",))
    torchrun = in_salloc("-N1", "--ntasks-per-node=2", "bash", agents)
    assert torchrun.returncode == 2 and "one task per node (--ntasks-per-node=1), got SLURM_TASKS_PER_NODE=2" \
        in torchrun.stderr, torchrun.stderr
    # salloc's shell has SLURM_GPUS_PER_NODE, not the batch step's SLURM_GPUS_ON_NODE: 3 workers on 2 GPUs.
    stacked = in_salloc("-N1", "--gpus-per-node=2", "bash", "sbatch/train_torchrun.sh", NPROC_PER_NODE="3",
                        TRAIN_DIR=str(tmp_path / "run"))
    assert stacked.returncode == 2 and "NPROC_PER_NODE=3 workers per node, but the job has 2 GPU(s) per node" \
        in stacked.stderr, stacked.stderr


def test_an_mpirun_job_whose_daemon_a_signal_killed_does_not_end_as_a_success(slurm_cluster, tmp_path):
    # `scancel --signal=USR2` kills the remote prted (mpirun does not pass it on): mpirun then exited 0, and the
    # job ended COMPLETED with no result, still printing "result: .../result.json".
    log = tmp_path / "job.out"
    env = {"TRAIN_DIR": str(tmp_path / "run"), "TRAIN_STEPS": "100000", "PYTHON": PYTHON, "OMP_NUM_THREADS": "1",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    job = slurm_cluster.run(["sbatch", "--parsable", "-N2", "--ntasks-per-node=1", "--cpus-per-task=1",
                             f"--output={log}", "sbatch/train_mpirun.sh"], env=env, cwd=REPO,
                            timeout=TIMEOUT).stdout.strip()
    deadline = time.monotonic() + TIMEOUT
    while not (log.exists() and "step 20/" in log.read_text()):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.3)
    slurm_cluster.run(["scancel", "--signal=USR2", job], timeout=30)
    while slurm_cluster.run(["squeue", "-h", "-j", job], check=False, timeout=30).stdout.strip():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.3)
    output = log.read_text()
    assert "wrote no new" in output and "result: " not in output, output
    state = slurm_cluster.run(["scontrol", "-o", "show", "job", job], timeout=30).stdout
    assert "JobState=FAILED" in state, state


INHERITED_COUNT_RUN = """
import os, sys, time
import slurmdist.requeue
preemption = slurmdist.requeue.install()
first = not os.path.exists(sys.argv[1])
open(sys.argv[1], "a").close()
print("run", "first" if first else "again", "SLURM_RESTART_COUNT", os.environ.get("SLURM_RESTART_COUNT"), flush=True)
if first:
    deadline = time.monotonic() + 100
    while not preemption.requested and time.monotonic() < deadline:
        time.sleep(0.1)
    preemption.requeue()
print("finished", flush=True)
"""


def test_a_restart_count_inherited_from_the_submitting_shell_does_not_use_up_the_requeues(slurm_cluster, tmp_path):
    # Slurm sets SLURM_RESTART_COUNT only from a job's first requeue on, and sbatch passes the submitter's on: a
    # job submitted from a requeued job (a chain) read its parent's count and refused to requeue ("already
    # requeued 1 time", limit 1) although Slurm had never requeued it.
    log, marker = tmp_path / "job.out", tmp_path / "ran-once"
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH -N1 -n1 --requeue --open-mode=append --output={log}\n"
                      f"srun {PYTHON} -c '{INHERITED_COUNT_RUN}' {marker}\n")
    job = slurm_cluster.run(["sbatch", "--parsable", str(script)], timeout=TIMEOUT, cwd=tmp_path,
                            env={"SLURM_RESTART_COUNT": "1", "SLURMDIST_MAX_REQUEUES": "1"}).stdout.strip()
    deadline = time.monotonic() + TIMEOUT
    while not (log.exists() and "run first SLURM_RESTART_COUNT 1" in log.read_text()):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.2)
    slurm_cluster.run(["scancel", "--signal=USR2", job], timeout=30)
    while "finished" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.3)
    assert "already requeued" not in log.read_text(), log.read_text()
    assert "run again SLURM_RESTART_COUNT 1" in log.read_text()  # Slurm's own count now

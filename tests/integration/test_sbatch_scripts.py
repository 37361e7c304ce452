"""Every shell script we ship passes shellcheck and `bash -n`, and the job scripts keep their promises.

shellcheck missing: a skip locally, a failure under CI=true (conftest's `require`).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import List

import pytest

from tests.integration.cluster import REPO, require
from slurmdist.sbatch_render import JobSpec, render

JOB_SCRIPTS = sorted((REPO / "sbatch").glob("*.sh"))
TIMEOUT = 60


def shell_scripts() -> List[Path]:
    """sbatch/*.sh and every script in scripts/ that starts with a bash or sh shebang."""
    found = list(JOB_SCRIPTS)
    for path in sorted((REPO / "scripts").iterdir()):
        if path.is_file() and re.match(r"#!.*\b(ba)?sh\b", path.read_text(errors="replace").split("\n", 1)[0]):
            found.append(path)
    return found


def shellcheck(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([require("shellcheck"), "--external-sources", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=TIMEOUT)


def test_there_are_scripts_to_check():
    names = {path.name for path in shell_scripts()}
    assert {"train_2n4g.sh", "train_torchrun.sh", "train_mpirun.sh", "train_npu.sh", "sweep_array.sh",
            "demo", "local-cluster"} <= names


@pytest.mark.parametrize("path", shell_scripts(), ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck_passes(path):
    done = shellcheck(path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", shell_scripts(), ids=lambda p: str(p.relative_to(REPO)))
def test_bash_parses(path):
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("path", JOB_SCRIPTS, ids=lambda p: p.name)
def test_job_scripts_are_explained_and_strict(path):
    text = path.read_text()
    lines = text.splitlines()
    sbatch_lines = [line for line in lines if line.startswith("#SBATCH")]
    assert sbatch_lines, "a job script without #SBATCH lines"
    uncommented = [line for line in sbatch_lines if "#" not in line[len("#SBATCH"):]]
    assert not uncommented, f"#SBATCH lines need a comment saying why: {uncommented}"
    assert "set -euo pipefail" in text
    assert "--time=" in text, "every job states its time limit"
    if re.search(r"^\s*srun ", text, re.M) and "--cpus-per-task" in text:
        # Slurm >= 22.05: srun does not inherit --cpus-per-task from the allocation.
        assert "export SRUN_CPUS_PER_TASK=" in text


@pytest.mark.parametrize("launcher", ["srun", "torchrun", "mpirun"])
@pytest.mark.parametrize("device", ["gpu", "npu"])
def test_rendered_scripts_pass_shellcheck(tmp_path, launcher, device):
    words = ["train.py", "--name", "it's $(id) `id`; x"] if launcher == "torchrun" else \
        ["python", "train.py", "--name", "it's $(id) `id`; x"]
    path = tmp_path / "job.sh"
    setup = ("module load cuda", "source ~/venv/bin/activate")  # the site's files: shellcheck cannot follow them
    path.write_text(render(JobSpec(command=tuple(words), nodes=2, gpus_per_node=4, partition="gpu", account="p",
                                   launcher=launcher, device=device, setup=setup)))
    done = shellcheck(path)
    assert done.returncode == 0, done.stdout + path.read_text()


@pytest.mark.parametrize("path", JOB_SCRIPTS, ids=lambda p: p.name)
def test_a_job_script_run_with_bash_says_to_submit_it(path, tmp_path):
    # `bash sbatch/train_2n4g.sh` from the repository root: no job around it, so no SLURM_JOB_ID.
    done = subprocess.run(["bash", str(path.relative_to(REPO))], cwd=REPO, capture_output=True, text=True,
                          timeout=TIMEOUT, env={"PATH": "/usr/bin:/bin", "TRAIN_DIR": str(tmp_path / "runs")})
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"{path.name}: submit it with sbatch (sbatch sbatch/{path.name}); run as a plain script "
                           "it is in no job\n")
    assert list(tmp_path.iterdir()) == []  # before it makes its run folder


def test_a_rendered_script_run_with_bash_says_to_submit_it(tmp_path):
    from slurmdist.sbatch_render import JobSpec, render

    script = tmp_path / "job.sh"
    script.write_text(render(JobSpec(command=("python", "t.py"), device="cpu")))
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT,
                          env={"PATH": "/usr/bin:/bin"})
    assert (done.returncode, done.stderr) == (2, f"job.sh: submit it with sbatch (sbatch {script}); run as a plain "
                                                 "script it is in no job\n")


@pytest.mark.parametrize("path", JOB_SCRIPTS, ids=lambda p: p.name)
def test_a_job_submitted_from_elsewhere_is_told_where_to_submit_from(path, tmp_path):
    # Slurm starts the script in the submit directory (SLURM_SUBMIT_DIR): here one without the repository.
    done = subprocess.run(["bash", str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT,
                          env={"PATH": "/usr/bin:/bin", "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_ID": "7"})
    assert done.returncode == 2, done.stderr
    where = f"there is no examples/train.py in {tmp_path}"
    assert done.stderr == f"{path.name}: run sbatch from the repository root, or give it --chdir=ROOT ({where})\n"
    assert list(tmp_path.iterdir()) == []  # before it makes runs/ there


def run_with_stub_launchers(path: Path, tmp_path: Path, **environ: str) -> subprocess.CompletedProcess:
    """`path` run from the repository as a one-node job, with srun, mpirun and scontrol that only say where they
    started and with which SLURM_EXPORT_ENV."""
    tools = tmp_path / "bin"
    tools.mkdir(parents=True)
    for name in ("srun", "mpirun", "scontrol"):
        (tools / name).write_text(f'#!/bin/sh\necho "{name} started in $PWD, SLURM_EXPORT_ENV=$SLURM_EXPORT_ENV"\n')
        (tools / name).chmod(0o755)
    env = {"PATH": f"{tools}:/usr/bin:/bin", "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_ID": "7",
           "SLURM_JOB_NAME": "job", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_NODELIST": "node1",
           "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_NTASKS": "1",
           "TRAIN_DIR": str(tmp_path / "runs"), **environ}
    return subprocess.run(["bash", str(path)], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT, env=env)


@pytest.mark.parametrize("path", JOB_SCRIPTS, ids=lambda p: p.name)
def test_a_job_that_sbatch_chdir_started_in_the_repository_runs_there(path, tmp_path):
    # `sbatch --chdir=ROOT sbatch/...` from elsewhere: sbatch starts the script in ROOT. The scripts cd'd to
    # SLURM_SUBMIT_DIR and then said to submit from the repository root.
    done = run_with_stub_launchers(path, tmp_path)
    assert "repository root" not in done.stderr, done.stderr
    assert f"started in {REPO}" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("path", JOB_SCRIPTS, ids=lambda p: p.name)
def test_a_job_submitted_with_export_none_hands_its_environment_to_srun(path, tmp_path):
    # sbatch --export=NONE leaves SLURM_EXPORT_ENV=NONE in the script; srun (mpirun's too) would start the tasks
    # with no environment, without what lines added to a copy of the script set up.
    done = run_with_stub_launchers(path, tmp_path, SLURM_EXPORT_ENV="None")  # Slurm compares it ignoring case
    assert "SLURM_EXPORT_ENV=ALL" in done.stdout and "SLURM_EXPORT_ENV=NONE" not in done.stdout, \
        done.stdout + done.stderr
    kept = run_with_stub_launchers(path, tmp_path / "kept", SLURM_EXPORT_ENV="PATH,HOME")  # a list is left as given
    assert "SLURM_EXPORT_ENV=PATH,HOME" in kept.stdout, kept.stdout + kept.stderr


@pytest.mark.parametrize("layout, says", [
    ({"SLURM_TASKS_PER_NODE": "2(x2)"}, "one task per node (--ntasks-per-node=1), got SLURM_TASKS_PER_NODE=2(x2)"),
    ({"NPROC_PER_NODE": "5", "SLURM_GPUS_ON_NODE": "4"},
     "NPROC_PER_NODE=5 workers per node, but the job has 4 GPU(s) per node"),
])
def test_the_torchrun_script_refuses_a_layout_torchrun_would_fail_on_later(layout, says, tmp_path):
    # Two agents on a node both host the rendezvous port (EADDRINUSE); more workers than GPUs stack them.
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "job", "TRAIN_DIR": str(tmp_path / "runs"),
           **layout}
    done = subprocess.run(["bash", "sbatch/train_torchrun.sh"], cwd=REPO, capture_output=True, text=True,
                          timeout=TIMEOUT, env=env)
    assert done.returncode == 2 and done.stderr.startswith(f"train_torchrun.sh: {says}"), done.stderr
    assert not (tmp_path / "runs").exists()  # before it makes its run folder


def test_the_torchrun_script_lets_workers_share_gpus_when_told_to(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "job", "TRAIN_DIR": str(tmp_path / "runs"),
           "NPROC_PER_NODE": "5", "SLURM_GPUS_ON_NODE": "4", "SLURMDIST_SHARE_DEVICES": "Yes"}
    done = subprocess.run(["bash", "sbatch/train_torchrun.sh"], cwd=REPO, capture_output=True, text=True,
                          timeout=TIMEOUT, env=env)
    assert "workers per node" not in done.stderr and (tmp_path / "runs").is_dir(), done.stderr  # went on

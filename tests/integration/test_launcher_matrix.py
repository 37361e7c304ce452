"""The launcher matrix, for real: examples/train.py under every launcher, on the local Slurm cluster and the
PyPI MPI wheels, comparing what the runs computed.

- the same world size gives the same parameter checksum under every launcher (bit-identical training);
- one process reaches the loss of four (a fixed global batch split across ranks) within 1e-4;
- a batch script that runs python on 4 tasks without srun fails fast, naming srun, even with a long timeout.

Each launch runs once per test run, and both xdist workers' comparisons share it. Small model, few steps.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import pytest

from tests.integration.cluster import PYTHON, REPO, LocalCluster, client_environ, once_per_run, require, run_checked

pytestmark = pytest.mark.integration

STEPS = "12"
TRAIN = REPO / "examples" / "train.py"
LAUNCH_TIMEOUT = 150  # seconds for one launch, cluster queueing included; init has its own 120 s bound
COMMON_ENV = {
    "OMP_NUM_THREADS": "1",
    "SLURMDIST_INIT_TIMEOUT": "120",
    "PYTHON": PYTHON,  # for the sbatch scripts: the interpreter running these tests has torch and slurmdist
    "TRAIN_STEPS": STEPS,
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl": "^ofi",  # Open MPI's libfabric transport costs ~1 s per MPI_Init here and is not used
    "PATH": f"{Path(PYTHON).parent}{os.pathsep}{os.environ.get('PATH', '')}",
}


def train_args(out: Path) -> List[str]:
    return [PYTHON, str(TRAIN), "--steps", STEPS, "--log-every", "6", "--out", str(out)]


def torchrun(*options: str) -> List[str]:
    return [PYTHON, "-m", "torch.distributed.run", *options]


class Runs:
    """Runs each launch once per test run (the reference launches are compared against by tests on both
    workers) and keeps its result JSON; a failed launch fails every test that needs it."""

    def __init__(self, cluster: Callable[[], LocalCluster], tmp_path_factory: pytest.TempPathFactory) -> None:
        self.cluster, self.tmp_path_factory = cluster, tmp_path_factory
        self.directory = tmp_path_factory.mktemp("matrix")

    def get(self, name: str) -> dict:
        key = "launch-" + re.sub(r"[^\w.-]+", "-", name)
        return once_per_run(self.tmp_path_factory, key, lambda: LAUNCHES[name](self, self.directory / name))

    # --- launch helpers -----------------------------------------------------------------------------------

    def local(self, args: Sequence[str], out: Path) -> dict:
        """A launcher without Slurm (plain python, mpirun, torchrun --standalone)."""
        env = client_environ(COMMON_ENV)
        run_checked(args, env=env, timeout=LAUNCH_TIMEOUT, cwd=REPO)
        return json.loads(out.read_text())

    def slurm(self, args: Sequence[str], out: Path, **env: str) -> dict:
        """A client command against the local cluster (srun, salloc, sbatch --wait)."""
        self.cluster().run(args, timeout=LAUNCH_TIMEOUT, env={**COMMON_ENV, **env}, cwd=REPO)
        return json.loads(out.read_text())

    def sbatch(self, script: str, directory: Path, *options: str, **env: str) -> dict:
        directory.mkdir(parents=True)
        log = directory / "job.out"
        state = sbatch_wait(self.cluster(), [f"--output={log}", *options, str(REPO / "sbatch" / script)],
                            env={**COMMON_ENV, "TRAIN_DIR": str(directory), **env})
        result = directory / "result.json"
        assert state == "COMPLETED" and result.exists(), \
            f"{script}: {state}\n--- {log}:\n{log.read_text() if log.exists() else '(no log)'}"
        return json.loads(result.read_text())


def sbatch_wait(cluster: LocalCluster, args: Sequence[str], env: Dict[str, str]) -> str:
    """`sbatch --wait` without its back-off (it sleeps 2, 8, then 32 s between polls): submit, then ask
    scontrol four times a second until the job ends. Returns the final JobState; bounded by LAUNCH_TIMEOUT."""
    job = cluster.run(["sbatch", "--parsable", *args], env=env, cwd=REPO).stdout.strip().split(";")[0]
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while time.monotonic() < deadline:
        shown = cluster.run(["scontrol", "-o", "show", "job", job], check=False).stdout
        state = re.search(r"\bJobState=(\S+)", shown)
        if state and state.group(1) not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED"):
            return state.group(1)
        time.sleep(0.25)
    cluster.run(["scancel", job], check=False)
    raise AssertionError(f"job {job} ({shlex.join(args)}) did not end within {LAUNCH_TIMEOUT} s")


def _plain(runs: Runs, d: Path) -> dict:
    return runs.local(train_args(d / "r.json"), d / "r.json")


def _srun(*layout: str) -> Callable[[Runs, Path], dict]:
    return lambda runs, d: runs.slurm(["srun", *layout, *train_args(d / "r.json")], d / "r.json")


def _salloc_srun(runs: Runs, d: Path) -> dict:
    inner = shlex.join(["srun", *train_args(d / "r.json")])
    return runs.slurm(["salloc", "-N2", "--ntasks-per-node=2", "bash", "-c", inner], d / "r.json")


def _sbatch_2n4g(runs: Runs, d: Path) -> dict:
    # Command-line options beat the script's #SBATCH lines: 2 x 2 tasks on this 2-core machine.
    return runs.sbatch("train_2n4g.sh", d, "--ntasks-per-node=2", "--gpus-per-node=2", "--cpus-per-task=1")


def _sbatch_torchrun(runs: Runs, d: Path) -> dict:
    return runs.sbatch("train_torchrun.sh", d, "--gpus-per-node=2", "--cpus-per-task=2", NPROC_PER_NODE="2")


def _sbatch_mpirun(runs: Runs, d: Path) -> dict:
    require("mpirun")
    # A short init bound: a launch that cannot meet fails in seconds, not after the default timeout.
    # The jobs here run as root, which Open MPI refuses unless told it is meant: the script says so itself.
    return runs.sbatch("train_mpirun.sh", d, "--ntasks-per-node=2", "--cpus-per-task=1",
                       SLURMDIST_INIT_TIMEOUT="10", OMPI_ALLOW_RUN_AS_ROOT="0", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="0")


def _mpirun(runs: Runs, d: Path) -> dict:
    mpirun = require("mpirun")
    return runs.local([mpirun, "-np", "4", "--oversubscribe", *train_args(d / "r.json")], d / "r.json")


def _torchrun_standalone(runs: Runs, d: Path) -> dict:
    return runs.local(torchrun("--standalone", "--nproc-per-node=4", *train_args(d / "r.json")[1:]), d / "r.json")


def _torchrun_resumed(runs: Runs, d: Path) -> dict:
    """Stopped after 5 steps and started again from its checkpoint: must end as the uninterrupted runs do."""
    d.mkdir(parents=True)
    resumable = [*train_args(d / "r.json")[1:], "--checkpoint", str(d / "checkpoint.pt")]
    runs.local(torchrun("--standalone", "--nproc-per-node=4", *resumable, "--steps", "5"), d / "r.json")
    return runs.local(torchrun("--standalone", "--nproc-per-node=4", *resumable), d / "r.json")


LAUNCHES: Dict[str, Callable[[Runs, Path], dict]] = {
    "python": _plain,
    "srun -N2 --ntasks-per-node=2": _srun("-N2", "--ntasks-per-node=2"),
    "sbatch train_2n4g.sh": _sbatch_2n4g,
    "salloc + srun": _salloc_srun,
    "srun -N2 -n3": _srun("-N2", "-n3"),
    "srun --gpus-per-task=1": _srun("-N2", "--ntasks-per-node=2", "--gpus-per-task=1"),
    "torchrun in srun (train_torchrun.sh)": _sbatch_torchrun,
    "mpirun -np 4": _mpirun,
    "mpirun in sbatch (train_mpirun.sh)": _sbatch_mpirun,
    "torchrun --standalone": _torchrun_standalone,
    "torchrun --standalone, stopped and resumed": _torchrun_resumed,
}
REFERENCE_4 = "srun -N2 --ntasks-per-node=2"
WORLD_SIZE = {"python": 1, "srun -N2 -n3": 3}


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> Runs:
    # The cluster is started on first use only, so the non-Slurm launches run without it.
    return Runs(lambda: request.getfixturevalue("slurm_cluster"), tmp_path_factory)


@pytest.mark.parametrize("launcher", LAUNCHES)
def test_launcher_trains_the_example(runs, launcher):
    result = runs.get(launcher)
    world_size = WORLD_SIZE.get(launcher, 4)
    assert result["world_size"] == world_size
    assert result["steps"] == int(STEPS)
    print(f"{launcher:40s} world {world_size}  checksum {result['checksum']}  loss {result['loss']:.8f}")
    if world_size == 4:
        assert result["checksum"] == runs.get(REFERENCE_4)["checksum"], f"{launcher} vs {REFERENCE_4}"
    # A fixed global batch split across ranks: every world size follows the one-process run.
    assert result["loss"] == pytest.approx(runs.get("python")["loss"], abs=1e-4)


def test_python_without_srun_in_a_four_task_batch_script_fails_fast_naming_srun(runs, tmp_path):
    """The classic mistake: `python train.py` in an sbatch script with --ntasks=4. Without the fail-fast
    rule the one process would wait out the whole init timeout (600 s here) for three that never come.
    The wait for the job is bounded far below that timeout, so a hang fails this test."""
    log = tmp_path / "job.out"
    command = shlex.join([PYTHON, str(TRAIN), "--steps", "5", "--out", str(tmp_path / "never.json")])
    state = sbatch_wait(runs.cluster(), ["-N2", "--ntasks-per-node=2", f"--output={log}", f"--wrap={command}"],
                        env={**COMMON_ENV, "SLURMDIST_INIT_TIMEOUT": "600"})
    text = log.read_text()
    assert state == "FAILED", text
    assert "srun" in text, text
    assert "Traceback" not in text, text
    assert not (tmp_path / "never.json").exists()

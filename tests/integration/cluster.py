"""Driving a real multi-node Slurm cluster on this machine (``scripts/local-cluster``) from tests.

``require(tool)`` skips a test when a prerequisite is missing, except under ``CI=true`` where it fails: CI
must never skip silently. The pytest fixtures built on these helpers live in conftest.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import pytest
from filelock import FileLock

from tests.conftest import missing_prerequisite

REPO = Path(__file__).resolve().parents[2]
TRAIN_PY = REPO / "examples" / "train.py"
PYTHON = sys.executable
LOCAL_CLUSTER = REPO / "scripts" / "local-cluster"
# Daemons live in sbin, which is often not on a normal user's PATH.
SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")
# What starting a cluster needs; the script installs missing packages only when run as root.
CLUSTER_TOOLS = ("munged", "slurmctld", "slurmd", "slurmstepd", "srun", "sinfo", "unshare")
# Bounds on a hang, above the script's own bounded waits (another start's port lock, 720 s, then accounting's
# start, a few minutes at worst, and the daemons'), and below pytest's per-test timeout (pyproject): a normal start takes a
# second or two, a stop a few.
START_TIMEOUT = 1500
STOP_TIMEOUT = 300
CLEANUP_TIMEOUT = 120  # for the script to stop what it started, once told to give up (SIGTERM)
# The longest one worker waits for a result the other is computing (a reference training run, a launch), which
# may include starting that worker's cluster.
SHARED_RESULT_WAIT = START_TIMEOUT + 600


def require(tool: str) -> str:
    """Path of ``tool`` (searched on PATH and in the sbin dirs), else skip (fail under CI=true)."""
    path = shutil.which(tool, path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN_DIRS]))
    if path is None:
        missing_prerequisite(
            f"{tool} not found on PATH: run the suite through `make test`, which installs the Python tools "
            "(mpirun, torchrun) into .venv and, as root, Debian's Slurm, accounting and shellcheck packages "
            "(scripts/install-system-deps)"
        )
    return path


def client_environ(extra: Dict[str, str]) -> Dict[str, str]:
    """os.environ without any outer job's SLURM_* variables (they would point srun at a foreign job)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(extra)
    return env


def run_checked(args: Sequence[str], env: Dict[str, str], timeout: float, check: bool = True, **kw):
    """subprocess.run with a timeout; a failure shows the command and everything it printed."""
    proc = subprocess.run(
        [str(a) for a in args], env=env, timeout=timeout, capture_output=True, text=True, **kw
    )
    if check and proc.returncode != 0:
        raise failed(args, f"exited {proc.returncode}", proc.stdout, proc.stderr)
    return proc


def failed(args: Sequence[str], what: str, out: str, err: str) -> AssertionError:
    """A command that failed, with everything it printed."""
    return AssertionError(f"`{shlex.join(str(a) for a in args)}` {what}\n--- stdout:\n{out}--- stderr:\n{err}")


def parse_exports(text: str) -> Dict[str, str]:
    """The ``export KEY='value'`` lines printed by ``local-cluster env``."""
    env = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, _, value = words[1].partition("=")
            env[key] = value
    return env


@dataclass
class LocalCluster:
    """A running local cluster: ``env`` to merge into client environments, ``run`` a client command."""

    dir: Path
    env: Dict[str, str] = field(default_factory=dict)

    def script(self, command: str, *args: str, timeout: float = STOP_TIMEOUT, check: bool = True):
        """Run ``scripts/local-cluster COMMAND --dir DIR ARGS...``. Past `timeout` it gets SIGTERM first, not
        SIGKILL: its EXIT trap then stops the daemons a start had launched, which nothing else could find."""
        args = [str(a) for a in (LOCAL_CLUSTER, command, "--dir", self.dir, *args)]
        # A session of its own: the signals reach its children too (`timeout ... local-accounting start`, a
        # flock), which would otherwise go on, and hold its output pipes, after it is gone.
        proc = subprocess.Popen(args, env=client_environ({}), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out, err = _end_session(proc)
            raise failed(args, f"took over {timeout} s", out, err) from None
        except BaseException:  # Ctrl-C, CI's SIGINT, pytest-timeout: its session no longer hears them
            _end_session(proc)
            raise
        if check and proc.returncode != 0:
            raise failed(args, f"exited {proc.returncode}", out, err)
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    def run(self, args: Sequence[str], timeout: float = 60, check: bool = True, **kw):
        """Run a client command (srun, sbatch, salloc, scontrol, ...) against this cluster."""
        env = client_environ({**self.env, **kw.pop("env", {})})
        return run_checked(args, env=env, timeout=timeout, check=check, **kw)

    def stop(self) -> None:
        self.script("stop")


def _end_session(proc: subprocess.Popen) -> Tuple[str, str]:
    """SIGTERM to the script's whole session (its traps stop the daemons it launched, which have sessions of
    their own), SIGKILL if it lingers; what it printed, as far as it can still be read."""
    for sig, wait in ((signal.SIGTERM, CLEANUP_TIMEOUT), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    for pipe in (proc.stdout, proc.stderr):
        pipe.close()
    return "", "(its output is lost: a process still holds its pipes)"


def start_cluster(directory: Path, *args: str, owner: Optional[int] = None) -> LocalCluster:
    """Start a cluster in ``directory`` (extra ``args`` such as ``--nodes 3``), skipping if impossible.

    The cluster stops by itself once process ``owner`` (default: this test session) has exited, so a
    session killed from outside (a CI timeout, Ctrl-C twice) leaves no daemons behind.
    """
    for tool in CLUSTER_TOOLS:
        require(tool)
    if os.geteuid() != 0:
        missing_prerequisite("the local Slurm cluster needs root (mknod, unshare --uts)")
    cluster = LocalCluster(dir=directory)
    owner = os.getpid() if owner is None else owner
    proc = cluster.script("start", *args, "--stop-with", str(owner), timeout=START_TIMEOUT)
    cluster.env = parse_exports(proc.stdout)
    assert "SLURM_CONF" in cluster.env, proc.stdout + proc.stderr
    return cluster


def once_per_run(tmp_path_factory: pytest.TempPathFactory, key: str, compute: Callable[[], dict]) -> dict:
    """`compute()` (a JSON result: a reference training run, a launch several tests compare against) done
    once per test run, not once per pytest-xdist worker: every run of train.py costs seconds of CPU, on cores
    the suite already keeps busy. Workers share the result through a file in the run's common temporary
    directory; one computes it under a lock while the other waits. A failure writes nothing, so whoever
    asks next tries again and reports its own failure. `key` names everything the result depends on."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's basetemp sits in the run's
        root = root.parent
    path = root / "once-per-run" / f"{key}.json"
    path.parent.mkdir(exist_ok=True)
    with FileLock(f"{path}.lock", timeout=SHARED_RESULT_WAIT):
        if path.exists():
            return json.loads(path.read_text())
        result = compute()
        path.write_text(json.dumps(result))
        return result


def train_reference(cluster: "LocalCluster", tmp_path_factory: pytest.TempPathFactory, nodes: int, tasks: int,
                    steps: int, timeout: float) -> dict:
    """examples/train.py's result under plain srun (`nodes` x `tasks` per node, `steps` steps): the run a
    requeued, resumed or submitted one must match bit for bit."""
    def run() -> dict:
        out = tmp_path_factory.mktemp("reference") / "result.json"
        cluster.run(["srun", f"-N{nodes}", f"--ntasks-per-node={tasks}", PYTHON, TRAIN_PY, "--steps", steps,
                     "--out", out], timeout=timeout)
        return json.loads(out.read_text())

    return once_per_run(tmp_path_factory, f"train-{nodes}x{tasks}-{steps}-steps", run)

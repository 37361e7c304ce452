"""`python -m benchmarks --quick --only hostlist,startup` runs and writes a page with the expected tables.

Never asserts a timing: benchmarks report, tests check that the report is complete.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import require_module

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "hostlist,startup", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "measured on" in done.stdout  # each benchmark says what, how many runs, which machine
    return out


@pytest.fixture(scope="module")
def page(out: Path) -> str:
    return (out / "benchmarks.md").read_text(encoding="utf-8")


def test_sections_ran_without_failing(page: str) -> None:
    for name in ("hostlist", "startup"):
        assert f"<!-- section:{name} -->" in page
    assert "This benchmark failed" not in page
    assert "<!-- section:bootstrap -->" not in page  # not asked for


def test_hostlist_tables(page: str) -> None:
    assert "| case | tool | median | min | max | runs | time / slurmdist's |" in page
    for case in ("100k hosts", "10k range", "4096 nodes in", "64 groups of 128"):
        assert f"| {case}" in page
    for tool in ("python-hostlist", "submitit", "scontrol (process)", "slurmdist, memo warm (same list again)"):
        assert f"| {tool} |" in page
    # scontrol is a whole process: its ratio is against slurmdist's own command, not the library call.
    assert "| case | tool | median | min | max | runs | time / the command's |" in page
    assert "| **slurmdist hostlist expand (process)** |" in page
    commands = page.split("time / the command's |")[1].split("\n\n")[0]
    assert "| scontrol (process) |" in commands
    library = page.split("time / slurmdist's |")[1].split("\n\n")[0]
    assert "scontrol (process)" not in library
    assert "log-log slope" in page
    assert "first()" in page
    # Each case also as a job meets it: once, in a fresh process, with a goal row of its own.
    assert "the first call in a fresh interpreter" in page
    assert "| no slower than the fastest Python peer on any case, on the first call in a fresh process |" in page


def test_startup_tables(page: str) -> None:
    assert "| import | median |" in page
    # Like for like: what asking "who am I" needs, not the lazy package's bare import.
    assert "| **slurmdist (from slurmdist import detect)** |" in page
    assert "| `from slurmdist import init` importing no torch/mpi4py/submitit |" in page
    assert "slurmdist detect()" in page
    assert "TorchDistributedEnvironment" in page
    assert "first call in a fresh process |" in page


def test_goals_and_machine(page: str) -> None:
    assert "| goal | measured | met |" in page
    assert "logical cores" in page and "Python" in page and "torch" in page
    assert str(REPO) not in page  # no machine-specific paths in a committed page


def test_plots_linked_and_written(page: str, out: Path) -> None:
    require_module("matplotlib", "pip install -e '.[bench]' (make venv installs it)")
    for name in ("hostlist-cases", "hostlist-linearity"):
        assert f"](img/{name}.png)" in page
        assert (out / "img" / f"{name}.png").stat().st_size > 1000


def test_a_run_stopped_with_sigterm_stops_the_cluster_it_started() -> None:
    # `timeout` and `kill` send SIGTERM, which skips Python's exit hooks: the local cluster the bootstrap
    # benchmark started kept its slurmctld and slurmds running on the shared machine.
    from tests.integration.cluster import require

    require("slurmctld")
    scratch = Path(tempfile.mkdtemp(prefix="sdb-", dir="/tmp"))  # short: munge's socket path has a limit
    try:
        bench = subprocess.Popen(
            [sys.executable, "-m", "benchmarks", "--quick", "--only", "bootstrap", "--ranks", "2",
             "--out", str(scratch / "out")],
            cwd=REPO, env={**os.environ, "TMPDIR": str(scratch)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        deadline = time.monotonic() + 120
        while not daemons_of(scratch):  # the cluster's slurmctld and slurmds, once they run
            assert bench.poll() is None and time.monotonic() < deadline, bench.communicate(timeout=30)[0][-2000:]
            time.sleep(0.5)
        cluster_dir = next(scratch.glob("sd-bench-*/etc/slurm.conf")).parent.parent
        bench.send_signal(signal.SIGTERM)
        said = bench.communicate(timeout=90)[0]
        assert bench.returncode == 128 + signal.SIGTERM, said[-2000:]
        assert not cluster_dir.exists(), said[-2000:]
        assert not daemons_of(scratch)  # no slurmctld/slurmd of that cluster left
    finally:
        if "bench" in locals() and bench.poll() is None:
            bench.kill()
        shutil.rmtree(scratch, ignore_errors=True)


def daemons_of(scratch: Path) -> str:
    """The pids of Slurm daemons whose command line names a directory under `scratch`."""
    found = subprocess.run(["pgrep", "-f", f"slurm(ctld|d) .*{scratch}/"], capture_output=True, text=True, timeout=30)
    return found.stdout.strip()

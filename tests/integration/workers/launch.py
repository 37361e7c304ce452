"""Start worker processes the way each launcher would, and read what they report (used by test_init_*)."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from tests.conftest import missing_prerequisite
from tests.integration.cluster import PYTHON

WORKERS = Path(__file__).resolve().parent
ALLREDUCE = WORKERS / "allreduce.py"
RUN_TIMEOUT = 120  # seconds: a bound on a hang, not a timing assertion
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_", "SLURMDIST_", "MASTER_")
LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")


def tool(name: str) -> str:
    """`name` next to this Python (a venv's bin) or on PATH; skip, or fail under CI=true, when missing."""
    beside = Path(PYTHON).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        missing_prerequisite(f"{name} not found next to {PYTHON} or on PATH (pip install -e '.[dev]')")
    return found


def clean_environ(**extra: str) -> Dict[str, str]:
    """This process's environment without any launcher's variables, plus `extra`."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES) and k not in LAUNCHER_NAMES
    }
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_environ(rank: int, world: int, port: int, addr: str = "127.0.0.1", **extra: str) -> Dict[str, str]:
    """The explicit-environment launch: RANK, WORLD_SIZE, LOCAL_*, MASTER_ADDR/PORT."""
    return clean_environ(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR=addr, MASTER_PORT=str(port), **extra,
    )


def start_ranks(
    ranks: Sequence[int], world: int, port: int, args: Sequence[str] = (), addr: str = "127.0.0.1", **extra: str
) -> List[subprocess.Popen]:
    """One worker per rank, in the order given (rank 0 last is the slow case for torch's env://)."""
    return [
        subprocess.Popen(
            [PYTHON, str(ALLREDUCE), *args], env=rank_environ(rank, world, port, addr, **extra),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for rank in ranks
    ]


def finish(procs: Sequence[subprocess.Popen]) -> List[subprocess.CompletedProcess]:
    """Wait for every process (bounded), killing stragglers so a hang fails the test instead of the run."""
    done = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def stderr_until(proc: subprocess.Popen, marker: str, timeout: float = RUN_TIMEOUT) -> str:
    """What `proc` wrote to stderr up to and including `marker`, read as it runs (raw from the pipe, so
    `finish()` still collects the rest); an AssertionError with what was read when `marker` never came."""
    fd = proc.stderr.fileno()
    text, end = b"", time.monotonic() + timeout
    while marker.encode() not in text:
        left = end - time.monotonic()
        chunk = os.read(fd, 4096) if left > 0 and select.select([fd], [], [], left)[0] else b""
        if not chunk:
            raise AssertionError(f"{marker!r} never appeared on stderr: {text.decode(errors='replace')[-2000:]}")
        text += chunk
    return text.decode(errors="replace")


def run(args: Sequence[str], env: Dict[str, str], timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], env=env, capture_output=True, text=True, timeout=timeout)


def records(text: str) -> List[dict]:
    """The workers' JSON lines (launchers may interleave several processes' output on one stream)."""
    return [json.loads(m) for m in re.findall(r"\{[^{}]*\}", text)]


def check_allreduce(text: str, world: int, launcher: Optional[str] = None) -> List[dict]:
    """Every rank reported once, with the right all_reduce sum (and launcher, when given)."""
    found = records(text)
    assert sorted(r["rank"] for r in found) == list(range(world)), text
    for record in found:
        assert record["world_size"] == world
        assert record["sum"] == world * (world + 1) / 2
        if launcher is not None:
            assert record["launcher"] == launcher
    return found

"""The local 2-node Slurm cluster (scripts/local-cluster) for the srun runs, started once per benchmark run.

Started lazily by the first benchmark that needs it and stopped at exit, so bootstrap and scaling share it.
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import subprocess
import tempfile
from typing import Dict, Optional

from .machine import REPO

SCRIPT = REPO / "scripts" / "local-cluster"
NODES = 2
CPUS = 32  # advertised per node (Slurm's config_overrides): room for 32 ranks over two nodes
START_TIMEOUT = 180
STOP_TIMEOUT = 90

_state: Dict[str, object] = {}


def clean_environ() -> Dict[str, str]:
    """os.environ without an outer job's SLURM_* or torchrun variables, which would mislead the launchers."""
    dropped = ("SLURM_", "TORCHELASTIC_")
    names = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURMDIST_LAUNCHER"}
    return {k: v for k, v in os.environ.items() if not k.startswith(dropped) and k not in names}


def environ() -> Dict[str, str]:
    """Client environment of the running cluster (SLURM_CONF, ...), starting it on first use."""
    if "env" in _state:
        return dict(_state["env"])  # type: ignore[arg-type]
    if "error" in _state:
        raise RuntimeError(str(_state["error"]))
    try:
        _state["env"] = _start()
    except Exception as exc:
        _state["error"] = exc
        raise
    return dict(_state["env"])  # type: ignore[arg-type]


def _start() -> Dict[str, str]:
    if not SCRIPT.exists():
        raise RuntimeError(f"{SCRIPT.relative_to(REPO)} is missing: no local cluster for the srun runs")
    if shutil.which("srun") is None:
        raise RuntimeError("srun is not installed (Debian: slurm-client; `scripts/local-cluster install`)")
    directory = tempfile.mkdtemp(prefix="sd-bench-")  # short: munge's socket path must stay under 108 bytes
    args = [str(SCRIPT), "start", "--dir", directory, "--nodes", str(NODES), "--cpus", str(CPUS), "--gpus", "0"]
    _state["dir"] = directory  # before it starts: a run stopped while it starts stops what it got to
    atexit.register(stop)
    done = subprocess.run(args, capture_output=True, text=True, timeout=START_TIMEOUT, env=clean_environ())
    if done.returncode != 0:
        raise RuntimeError(f"local-cluster start failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    exports = _exports(done.stdout)
    if "SLURM_CONF" not in exports:
        raise RuntimeError(f"local-cluster start printed no SLURM_CONF: {done.stdout[-300:]!r}")
    return {**clean_environ(), **exports}


def _exports(text: str) -> Dict[str, str]:
    """KEY -> value of the `export KEY='value'` lines the script prints."""
    words = shlex.split(text)
    return dict(word.partition("=")[::2] for before, word in zip(words, words[1:]) if before == "export")


def stop() -> None:
    directory: Optional[str] = _state.pop("dir", None)  # type: ignore[assignment]
    _state.pop("env", None)
    if directory is None:
        return
    try:
        subprocess.run([str(SCRIPT), "stop", "--dir", directory], capture_output=True, timeout=STOP_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        pass
    shutil.rmtree(directory, ignore_errors=True)

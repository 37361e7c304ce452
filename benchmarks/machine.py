"""Which machine and software a run measured, without host names or paths (the page is committed)."""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _field(text: str, key: str, sep: str) -> Optional[str]:
    for line in text.splitlines():
        name, _, value = line.partition(sep)
        if name.strip() == key:
            return value.strip().strip('"')
    return None


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _command_version(argv: List[str]) -> str:
    if shutil.which(argv[0]) is None:
        return "not installed"
    try:
        with tempfile.TemporaryDirectory() as tmp:  # Slurm's clients read a slurm.conf even for --version
            conf = Path(tmp, "slurm.conf")
            conf.write_text("ClusterName=x\nSlurmctldHost=localhost\n")
            done = subprocess.run(argv, capture_output=True, text=True, timeout=20,
                                  env={**os.environ, "SLURM_CONF": str(conf)})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({type(exc).__name__})"
    lines = (done.stdout.strip() or done.stderr).strip().splitlines()
    return lines[0].strip() if lines else "unknown"


def _git_commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return f"{head}{' + uncommitted changes' if dirty else ''}" if head else "unknown"


def describe() -> Dict[str, str]:
    """Hardware and software of this run, as label -> value."""
    meminfo = _field(_read("/proc/meminfo"), "MemTotal", ":")
    memory = f"{int(meminfo.split()[0]) / 2**20:.1f} GiB" if meminfo else "unknown"
    cpu = _field(_read("/proc/cpuinfo"), "model name", ":") or platform.processor() or "unknown"
    os_name = _field(_read("/etc/os-release"), "PRETTY_NAME", "=") or platform.system()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"
    return {
        "date (UTC)": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "CPU": f"{os.cpu_count()} logical cores, {cpu}",
        "memory": memory,
        "OS": f"{os_name}, Linux {platform.release()}" if platform.system() == "Linux" else os_name,
        "load average at start (1, 5, 15 min)": load,
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "torch": _version("torch"),
        "slurmdist": f"{_version('slurmdist')} (git {_git_commit()})",
        "python-hostlist": _version("python-hostlist"),
        "submitit": _version("submitit"),
        "lightning": _version("lightning"),
        "Slurm (scontrol)": _command_version(["scontrol", "--version"]),
        "Open MPI (mpirun)": _command_version(["mpirun", "--version"]),
    }


def summary(info: Dict[str, str]) -> str:
    """One line for the console and each section: when, which code, which processor. A page keeps the
    sections an `--only` run did not redo, so each must say where its numbers come from."""
    return (f"{info['date (UTC)']} UTC, slurmdist {info['slurmdist']}, {info['CPU']}, {info['memory']}, "
            f"{info['OS'].split(',')[0]}, Python {info['Python'].split()[-1]}, torch {info['torch']}, "
            f"load {info['load average at start (1, 5, 15 min)']}")

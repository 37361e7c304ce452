"""Bootstrap launches inside an existing Slurm allocation (`--use-allocation`), e.g. on a GPU cluster.

srun with slurmdist against the usual multi-node torchrun under Slurm: one torchrun agent per node started
by srun, meeting at a c10d rendezvous on the first node. Tasks per node come from the allocation.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Dict, Tuple

from .timing import run_process

RDZV_PORT = 29431


def per_node() -> int:
    """Tasks per node of the allocation (SLURM_NTASKS_PER_NODE, else tasks / nodes)."""
    text = os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0].split(",")[0]
    if text.isdigit():
        return int(text)
    return max(1, int(os.environ.get("SLURM_NTASKS", "1")) // max(1, int(os.environ.get("SLURM_NNODES", "1"))))


def _nodes(ranks: int) -> int:
    return max(1, math.ceil(ranks / per_node()))


def srun_launch(ranks: int, extra: Dict[str, str], worker: str, timeout: float) -> Tuple[float, str]:
    argv = ["srun", f"-N{_nodes(ranks)}", f"-n{ranks}", "--kill-on-bad-exit=1", sys.executable, worker, "slurmdist"]
    wall, done = run_process(argv, env={**os.environ, **extra}, timeout=timeout)
    return wall, done.stdout


def torchrun_launch(ranks: int, extra: Dict[str, str], worker: str, timeout: float) -> Tuple[float, str]:
    from slurmdist.hostlist import first
    from slurmdist.hosts import resolve_host

    nodes = _nodes(ranks)
    # What a careful user writes: the first node, by address if its name does not resolve (it does not on
    # the local test cluster; slurmdist falls back to Slurm's NodeAddr the same way).
    host = resolve_host(first(os.environ["SLURM_JOB_NODELIST"]), os.environ)
    argv = ["srun", f"-N{nodes}", f"-n{nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", sys.executable, "-m",
            "torch.distributed.run", f"--nnodes={nodes}", f"--nproc-per-node={ranks // nodes}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={host}:{RDZV_PORT}", f"--rdzv-id=bench-{os.getpid()}-{ranks}",
            worker, "torch"]
    wall, done = run_process(argv, env={**os.environ, **extra}, timeout=timeout)
    return wall, done.stdout


def srun_true(ranks: int) -> float:
    wall, _ = run_process(["srun", f"-N{_nodes(ranks)}", f"-n{ranks}", "true"], env=dict(os.environ), timeout=120)
    return wall

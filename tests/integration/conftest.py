"""Integration fixtures: a real multi-node Slurm cluster on this machine (``scripts/local-cluster``).

``slurm_cluster`` (session scope) starts one cluster, with job accounting so ``sacct`` (and submitit) see
failed and cancelled jobs, in a pytest tmp dir and stops it at the end of the session; ``local_cluster``
starts extra ones (stopped after the test). Helpers (``require``, ``start_cluster``, ...) are in cluster.py.
"""

from __future__ import annotations

from typing import Callable, Iterator, List, Optional

import pytest

from tests.integration.cluster import LocalCluster, require, start_cluster


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One 2-node cluster (node1, node2; 8 CPUs and 4 fake GPUs each, accounting on) for the whole session."""
    for tool in ("mariadbd", "slurmdbd", "sacct"):
        require(tool)
    cluster = start_cluster(tmp_path_factory.mktemp("cluster"), "--accounting")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LocalCluster]]:
    """Factory for extra clusters, ``local_cluster("--nodes", "3")``; all stopped after the test."""
    started: List[LocalCluster] = []

    def start(*args: str, owner: Optional[int] = None) -> LocalCluster:
        started.append(start_cluster(tmp_path_factory.mktemp("cluster"), *args, owner=owner))
        return started[-1]

    try:
        yield start
    finally:
        for cluster in started:
            cluster.script("stop", check=False)

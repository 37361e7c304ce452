"""slurmdist.init() forms real gloo groups through every launch path this machine can run."""

from __future__ import annotations

import pytest

from tests.integration.workers.launch import (
    ALLREDUCE, PYTHON, check_allreduce, clean_environ, finish, free_port, run, start_ranks, tool,
)

pytestmark = pytest.mark.integration


WORLDS = [4, pytest.param(8, marks=pytest.mark.slow)]  # 8 torch processes on 2 cores take a while


@pytest.mark.parametrize("world", WORLDS)
def test_explicit_environment(world):
    procs = start_ranks(reversed(range(world)), world, free_port())  # rank 0 last: the others wait for it
    results = finish(procs)
    for result in results:
        assert result.returncode == 0, result.stderr
    check_allreduce("".join(r.stdout for r in results), world)


def test_single_process_needs_no_launcher():
    result = run([PYTHON, ALLREDUCE], clean_environ())
    assert result.returncode == 0, result.stderr
    [record] = check_allreduce(result.stdout, 1, launcher="single")


def test_torchrun_standalone():
    result = run([tool("torchrun"), "--standalone", "--nproc_per_node=4", ALLREDUCE], clean_environ())
    assert result.returncode == 0, result.stderr
    check_allreduce(result.stdout, 4, launcher="torchrun")


@pytest.mark.parametrize("world", WORLDS)
def test_mpirun_shares_the_port_over_mpi4py(world):
    env = clean_environ(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    result = run([tool("mpirun"), "-np", str(world), "--oversubscribe", PYTHON, ALLREDUCE], env)
    assert result.returncode == 0, result.stdout + result.stderr
    check_allreduce(result.stdout, world, launcher="openmpi")


@pytest.mark.parametrize("tasks_per_node", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_srun_across_two_nodes_whose_names_do_not_resolve(slurm_cluster, tasks_per_node):
    # node1/node2 are not in DNS: the master address comes from Slurm's NodeAddr.
    result = slurm_cluster.run(
        ["srun", "-N2", f"--ntasks-per-node={tasks_per_node}", PYTHON, ALLREDUCE],
        timeout=120, check=False, env={"SLURMDIST_INIT_TIMEOUT": "60"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = check_allreduce(result.stdout, 2 * tasks_per_node, launcher="slurm")
    assert {r["host"] for r in found} == {"node1", "node2"}


def test_srun_arbitrary_layout_meets_where_task_0_runs(slurm_cluster, tmp_path):
    # -m arbitrary puts task 0 on node2 although the step's nodelist starts with node1: the master must come
    # from SLURM_HOSTFILE, or every rank would wait at node1 until the timeout.
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node2\nnode1\nnode1\nnode2\n")
    result = slurm_cluster.run(
        ["srun", "-m", "arbitrary", "-n4", PYTHON, ALLREDUCE],
        timeout=120, check=False, env={"SLURM_HOSTFILE": str(hostfile), "SLURMDIST_INIT_TIMEOUT": "60"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = check_allreduce(result.stdout, 4, launcher="slurm")
    assert [r["host"] for r in sorted(found, key=lambda r: r["rank"])] == ["node2", "node1", "node1", "node2"]


@pytest.mark.parametrize("mode", ["plain", "slurmdist"])
def test_slurmdist_run_under_srun_exports_a_master_every_node_reaches(slurm_cluster, mode):
    # node1 is not in DNS: torch's own env:// start cannot fall back to Slurm's NodeAddr, so `slurmdist run`
    # must export an address that resolves; rank 0's `slurmdist run` serves the store both modes join.
    command = [PYTHON, "-m", "slurmdist", "run", "--", PYTHON, ALLREDUCE, mode]
    result = slurm_cluster.run(["srun", "-N2", "-n4", *command], timeout=120, check=False,
                               env={"SLURMDIST_INIT_TIMEOUT": "60"})
    assert result.returncode == 0, result.stdout + result.stderr
    found = check_allreduce(result.stdout, 4, launcher="plain" if mode == "plain" else "torchrun")
    assert {r["host"] for r in found} == {"node1", "node2"}


def test_slurmdist_run_under_mpirun_exports_a_shared_master():
    # resolve_master() over mpi4py, then torch's own env:// start in the exec'd command.
    env = clean_environ(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    command = [PYTHON, "-m", "slurmdist", "run", "--", PYTHON, ALLREDUCE, "plain"]
    result = run([tool("mpirun"), "-np", "4", "--oversubscribe", *command], env)
    assert result.returncode == 0, result.stdout + result.stderr
    check_allreduce(result.stdout, 4, launcher="plain")

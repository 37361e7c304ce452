"""slurmdist.init() forms real gloo groups through every launch path this machine can run."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.conftest import missing_prerequisite
from tests.integration.cluster import client_environ, require
from tests.integration.workers.launch import (
    ALLREDUCE, PYTHON, check_allreduce, clean_environ, finish, free_port, run, start_ranks, stderr_until, tool,
)

pytestmark = pytest.mark.integration

GLOO_FALLBACK = "Unable to resolve hostname"  # gloo's warning when it binds loopback for want of an address


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
    found = check_allreduce(result.stdout, 4, launcher="torchrun")
    assert {r["gloo_interface"] for r in found} == {"lo"}  # one node: loopback, with no name lookup


def test_torchrun_with_two_nodes_on_one_machine():
    # How a two-node launch is tried out on one box: every rank reaches the master over loopback, so no node
    # says how it reached the master's (they all waited for that, their whole timeout, before).
    port = free_port()
    agents = [
        subprocess.Popen(
            [tool("torchrun"), "--nnodes=2", f"--node-rank={node}", "--nproc-per-node=2", "--master-addr=localhost",
             f"--master-port={port}", ALLREDUCE],
            env=clean_environ(SLURMDIST_INIT_TIMEOUT="30"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for node in (1, 0)
    ]
    results = finish(agents)
    for result in results:
        assert result.returncode == 0, result.stderr
    found = check_allreduce("".join(r.stdout for r in results), 4, launcher="torchrun")
    assert {r["gloo_interface"] for r in found} == {"lo"}


def test_shutdown_then_init_again_forms_a_second_group_under_fresh_keys():
    # torchrun's agent keeps serving the store between the two groups, as it does across restarts.
    environ = {**clean_environ(), "ALLREDUCE_TWICE": "1"}
    result = run([tool("torchrun"), "--standalone", "--nproc_per_node=2", ALLREDUCE], environ)
    assert result.returncode == 0, result.stderr
    found = check_allreduce(result.stdout, 2, launcher="torchrun")
    for record in found:
        assert record["sum_again"] == record["expected"]
        assert record["gloo_interface_after_shutdown"] is None  # slurmdist's own choice is taken back
        assert record["gloo_interface_again"] == "lo"


def test_init_again_after_shutdown_waits_out_rank_0s_previous_store():
    # No agent: rank 0 serves the store itself. Rank 1 shuts down and calls init() again while rank 0 is still
    # busy, so rank 1 reaches rank 0's first store, which closes under it; it must join the second one.
    procs = start_ranks(range(2), 2, free_port(), ALLREDUCE_TWICE="1", RANK0_LINGER="2")
    results = finish(procs)
    for result in results:
        assert result.returncode == 0, result.stderr
    for record in check_allreduce("".join(r.stdout for r in results), 2):
        assert record["sum_again"] == record["expected"]


def test_ranks_that_retry_after_a_timeout_meet_a_rank_that_came_late():
    # The same script everywhere, retrying init() after a timeout: ranks 0-1 give up after 3 s and call init()
    # again; rank 2 starts only once rank 0 has retried (a fixed delay raced the early ranks' torch import on
    # busy cores). A retry must meet a rank that is on its first call.
    port = free_port()
    early = start_ranks([0, 1], 3, port, SLURMDIST_INIT_TIMEOUT="3", INIT_RETRIES="8")
    retried = stderr_until(early[0], "attempt 0 failed, retrying")  # rank 0 did retry: the test tests something
    late = start_ranks([2], 3, port, SLURMDIST_INIT_TIMEOUT="3", INIT_RETRIES="8")
    results = finish(early + late)
    for result in results:
        assert result.returncode == 0, retried + result.stderr
    check_allreduce("".join(r.stdout for r in results), 3)


def test_this_cpu_torch_in_a_job_slurm_gave_gpus_warns_and_still_runs_gloo():
    # What a user sees when the venv got a CPU wheel on a GPU node: a warning naming Slurm's GPUs and the
    # build, then the job runs on the CPU as `auto` promises.
    result = run([PYTHON, ALLREDUCE], {**clean_environ(), "SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert result.returncode == 0, result.stderr
    check_allreduce(result.stdout, 1, launcher="single")
    assert "Slurm gave this task GPUs (SLURM_STEP_GPUS='0,1'" in result.stderr, result.stderr
    assert "CPU-only build" in result.stderr and "runs gloo on the CPU" in result.stderr


def test_a_gloo_interface_the_user_chose_is_kept():
    procs = start_ranks(range(2), 2, free_port(), GLOO_SOCKET_IFNAME="lo,lo")  # two gloo devices, not our "lo"
    found = check_allreduce("".join(r.stdout for r in finish(procs)), 2)
    assert {r["gloo_interface"] for r in found} == {"lo,lo"}


def test_a_gloo_interface_this_host_lacks_fails_before_the_rendezvous():
    started = time.monotonic()
    results = finish(start_ranks(range(2), 2, free_port(), GLOO_SOCKET_IFNAME="lo,no-such0"))
    for result in results:
        assert result.returncode != 0
        assert "GLOO_SOCKET_IFNAME='lo,no-such0' names no network interface" in result.stderr, result.stderr
        assert "'no-such0'" in result.stderr and "lo" in result.stderr
    assert time.monotonic() - started < 60  # not the rendezvous timeout: no rank waited for another


def test_a_single_process_is_told_of_a_gloo_interface_this_host_lacks_too():
    # gloo binds the variable's interface in a group of one as well; unchecked, torch's enforce failure came out.
    result = run([PYTHON, ALLREDUCE], {**clean_environ(), "GLOO_SOCKET_IFNAME": "no-such0"})
    assert result.returncode != 0
    assert "BackendError: GLOO_SOCKET_IFNAME='no-such0' names no network interface" in result.stderr, result.stderr


@pytest.mark.parametrize("world", WORLDS)
def test_mpirun_shares_the_port_over_mpi4py(world):
    env = clean_environ(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    result = run([tool("mpirun"), "-np", str(world), "--oversubscribe", PYTHON, ALLREDUCE], env)
    assert result.returncode == 0, result.stdout + result.stderr
    check_allreduce(result.stdout, world, launcher="openmpi")


def test_slurm_conf_and_scontrol_agree_on_every_nodes_address(slurm_cluster):
    # init() asks the node's slurm.conf first and scontrol only when the file does not say it plainly.
    from slurmdist.hosts import slurm_node_addr
    from slurmdist.slurm_conf import read_node_addr

    environ = client_environ(slurm_cluster.env)
    for node in ("node1", "node2"):
        from_scontrol = slurm_node_addr(node, environ)
        assert from_scontrol is not None and from_scontrol.startswith("127.0.0.")
        assert read_node_addr(node, environ) == from_scontrol


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
    # gloo binds the interface each rank reaches the master through (here lo: the nodes share this machine's
    # loopback), instead of looking up node names that do not resolve and falling back with a warning.
    assert {r["gloo_interface"] for r in found} == {"lo"}
    assert GLOO_FALLBACK not in result.stderr


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
    # Exported to the command: node1's ranks trust Slurm's NodeAddr for their own node (127.0.0.11 here).
    assert {r["gloo_interface"] for r in found} == {"lo"}
    assert GLOO_FALLBACK not in result.stderr


@pytest.mark.parametrize("start", ["slurmdist run", "env --format shell"])
def test_a_one_task_step_meets_itself_on_loopback(slurm_cluster, start):
    # `srun -n1`: the step's nodelist names node1, which is not in DNS; exported as the master, the command's
    # env:// start retried it until torch's 30-minute timeout.
    import shlex

    python, worker = shlex.quote(PYTHON), shlex.quote(str(ALLREDUCE))
    command = [PYTHON, "-m", "slurmdist", "run", "--", PYTHON, ALLREDUCE, "plain"] if start == "slurmdist run" \
        else ["bash", "-c", f'eval "$({python} -m slurmdist env --format shell)" && exec {python} {worker} plain']
    result = slurm_cluster.run(["srun", "-n1", *command], timeout=120, check=False,
                               env={"SLURMDIST_INIT_TIMEOUT": "60"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert check_allreduce(result.stdout, 1, launcher="plain")[0]["master_addr"] == "127.0.0.1"


def test_a_heterogeneous_step_forms_one_group(slurm_cluster):
    # Task 0 on node2, two tasks on node1: Slurm's sorted step nodelist starts with node1 and its layout
    # (2,1) is in name order, not task order.
    result = slurm_cluster.run(
        ["srun", "-w", "node2", "-N1", "-n1", ":", "-w", "node1", "-N1", "-n2", PYTHON, ALLREDUCE, "slurmdist"],
        timeout=120, check=False, env={"SLURMDIST_INIT_TIMEOUT": "60"})
    assert result.returncode == 0, result.stdout + result.stderr
    found = check_allreduce(result.stdout, 3, launcher="slurm")
    assert [r["host"] for r in sorted(found, key=lambda r: r["rank"])] == ["node2", "node1", "node1"]


def test_eval_of_env_shell_format_under_srun_exports_a_master_every_node_reaches(slurm_cluster):
    # The shell form of `slurmdist run`: node1 is not in DNS, so what the command's env:// start reads must be
    # Slurm's NodeAddr (the plain node name hung in torch's connect retries until its timeout).
    import shlex

    start = f'eval "$({shlex.quote(PYTHON)} -m slurmdist env --format shell)" && ' \
            f"exec {shlex.quote(PYTHON)} {shlex.quote(str(ALLREDUCE))} plain"
    result = slurm_cluster.run(["srun", "-N2", "-n2", "bash", "-c", start], timeout=120, check=False,
                               env={"SLURMDIST_INIT_TIMEOUT": "60"})
    assert result.returncode == 0, result.stdout + result.stderr
    found = check_allreduce(result.stdout, 2, launcher="plain")
    assert {r["host"] for r in found} == {"node1", "node2"}
    assert {r["gloo_interface"] for r in found} == {"lo"}


# mpirun on "two nodes" of one machine: each rank in a UTS namespace of its own, named after its node, with
# Open MPI's node-local variables made to agree (2 ranks per node). Across nodes MPI gives no master and no
# node numbers: rank 0's address is shared over mpi4py, the nodes numbered from the ranks' host names.
TWO_FAKE_NODES = ("hostname fake-node$((OMPI_COMM_WORLD_RANK / 2)) && OMPI_COMM_WORLD_LOCAL_SIZE=2 "
                  'OMPI_COMM_WORLD_LOCAL_RANK=$((OMPI_COMM_WORLD_RANK % 2)) exec "$@"')


@pytest.mark.parametrize("start", ["slurmdist run", "init"])
def test_mpirun_across_two_nodes_shares_the_master_and_numbers_the_nodes(start):
    # `slurmdist run`: resolve_master(), then torch's own env:// start; the worker reports GROUP_RANK, which
    # Lightning needs to take a launch for torchrun's. init(): the store over mpi4py, and DistEnv.node_rank.
    if os.geteuid() != 0:
        missing_prerequisite("naming each rank's host (unshare -u) needs root")
    env = clean_environ(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    command = [PYTHON, "-m", "slurmdist", "run", "--", PYTHON, ALLREDUCE, "plain"] if start == "slurmdist run" \
        else [PYTHON, ALLREDUCE, "slurmdist"]
    result = run([tool("mpirun"), "-np", "4", "--oversubscribe", require("unshare"), "-u", "sh", "-c", TWO_FAKE_NODES,
                  "sh", *command], env)
    assert result.returncode == 0, result.stdout + result.stderr
    found = check_allreduce(result.stdout, 4, launcher="plain" if start == "slurmdist run" else "openmpi")
    assert [r["node"] for r in sorted(found, key=lambda r: r["rank"])] == [[0, 2], [0, 2], [1, 2], [1, 2]]


def test_mpirun_ranks_without_the_batch_jobs_id_meet_under_rank_0s():
    # mpirun over ssh inside a batch job (`--mca plm rsh`): the ranks on the batch node inherit SLURM_JOB_ID,
    # those started over ssh do not (Open MPI forwards OMPI_* and -x only). The job id names the rendezvous keys.
    if os.geteuid() != 0:
        missing_prerequisite("naming each rank's host (unshare -u) needs root")
    env = clean_environ(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", SLURMDIST_INIT_TIMEOUT="30")
    batch_node_only = f'[ "$OMPI_COMM_WORLD_RANK" -lt 2 ] && export SLURM_JOB_ID=4242; {TWO_FAKE_NODES}'
    result = run([tool("mpirun"), "-np", "4", "--oversubscribe", require("unshare"), "-u", "sh", "-c", batch_node_only,
                  "sh", PYTHON, ALLREDUCE, "slurmdist"], env)
    assert result.returncode == 0, result.stdout + result.stderr
    check_allreduce(result.stdout, 4, launcher="openmpi")


KEEPS_VISIBILITY = """
import json, os, slurmdist
names = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")
before = {name: os.environ.get(name) for name in names}
env = slurmdist.init()
print(json.dumps({"before": before, "after": {name: os.environ.get(name) for name in names},
                  "device": str(env.device)}))
slurmdist.shutdown()
"""


def test_init_never_rewrites_the_visibility_variables():
    # They belong to the user and the scheduler (README): init() reads them, binds a device, and leaves them.
    visible = {"CUDA_VISIBLE_DEVICES": "3,1", "HIP_VISIBLE_DEVICES": "1", "ROCR_VISIBLE_DEVICES": "0,1",
               "ASCEND_RT_VISIBLE_DEVICES": "2"}
    result = run([PYTHON, "-c", KEEPS_VISIBILITY], {**clean_environ(), **visible})
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["before"] == seen["after"] == visible and seen["device"] == "cpu", seen

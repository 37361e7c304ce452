"""detect() over real captured launcher environments, and hand-written ones for launchers not runnable here."""

from __future__ import annotations

import logging
import re
import types

import pytest

from slurmdist import DistEnv, LaunchError, detect
from slurmdist.exporting import torchrun_variables
from slurmdist.launchers.slurm import pty_shell_hint
from slurmdist.ports import PORT_MAX, PORT_MIN, step_port
from tests.conftest import load_case

SLURM_STEP_CASES = ["slurm/srun_N2_tpn2", "slurm/sbatch_N2_tpn2_srun", "slurm/srun_gpus_per_node2"]


def detect_all(case: str):
    return [(environ, detect(types.MappingProxyType(environ))) for environ in load_case(case)]


@pytest.mark.parametrize("case", SLURM_STEP_CASES)
def test_srun_step_tasks_read_their_slurm_ids(case):
    results = detect_all(case)
    assert sorted(env.rank for _, env in results) == list(range(len(results)))
    for environ, env in results:
        assert env.launcher == "slurm"
        assert env.rank == int(environ["SLURM_PROCID"])
        assert env.local_rank == int(environ["SLURM_LOCALID"])
        assert env.node_rank == int(environ["SLURM_NODEID"])
        assert env.world_size == int(environ["SLURM_STEP_NUM_TASKS"]) == 4
        assert env.num_nodes == 2
        assert env.local_world_size == 2
        assert env.master_addr == "node1"
        assert env.job_id == environ["SLURM_JOB_ID"]


@pytest.mark.parametrize("case", SLURM_STEP_CASES)
def test_every_task_of_a_step_derives_the_same_port_below_the_ephemeral_range(case):
    ports = {env.master_port for _, env in detect_all(case)}
    assert len(ports) == 1
    assert PORT_MIN <= ports.pop() <= PORT_MAX


def test_steps_of_a_job_take_consecutive_ports_and_nearby_jobs_stay_apart():
    # The design that keeps two jobs on one node (or two steps of one allocation) apart: a job's steps count up
    # from its first port, and the first ports of nearby job ids spread over the whole range. With job ids 97
    # apart, step 97 of one job took step 0 of the next: a job script looping over srun got there.
    base = load_case("slurm/srun_N2_tpn2")[0]

    def port(job: str, step: str) -> int:
        return detect({**base, "SLURM_JOB_ID": job, "SLURM_STEP_ID": step}).master_port

    first = port("1000", "0")
    assert [port("1000", str(step)) - first for step in range(5)] == list(range(5))
    assert port("1000", "97") != port("1001", "0")
    # Back-to-back jobs (ids within 10) never meet within their first 1000 steps; within 50 ids, 250 steps.
    for jobs, steps in ((range(1000, 1011), 1000), (range(1000, 1051), 250)):
        ports = {step_port(str(job), str(step)) for job in jobs for step in range(steps)}
        assert len(ports) == len(jobs) * steps


def test_two_steps_of_one_job_and_two_jobs_get_different_ports():
    base = load_case("slurm/srun_N2_tpn2")[0]
    ports = set()
    for job in ("100", "101", "102"):
        for step in ("0", "1", "2"):
            ports.add(detect({**base, "SLURM_JOB_ID": job, "SLURM_STEP_ID": step}).master_port)
    assert len(ports) == 9


@pytest.mark.parametrize("name", ["SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS", "MASTER_PORT"])
def test_a_number_too_long_for_int_is_refused_naming_the_variable(name):
    # Python's int() refuses more than 4300 digits with a bare ValueError, which reached the CLI as a traceback.
    task = load_case("slurm/srun_N2_tpn2")[0]
    with pytest.raises(LaunchError, match=f"^{name}='7777.*(too large|is not a TCP port)"):
        detect({**task, name: "7" * 5000})


@pytest.mark.parametrize("name, value", [("SLURM_JOB_ID", "7" * 5000), ("SLURM_JOB_ID", "abc"),
                                         ("SLURM_JOB_ID", "12345678901"), ("SLURM_STEP_ID", "xyz"),
                                         ("SLURM_STEP_ID", "-1"), ("SLURM_STEP_ID", "1.5")])
def test_a_task_steps_ids_are_slurms_numbers_since_its_port_derives_from_them(name, value):
    task = load_case("slurm/srun_N2_tpn2")[0]
    with pytest.raises(LaunchError, match=f"{name}='{value[:20]}.*is not a .* id as Slurm sets it") as raised:
        detect({**task, name: value})
    assert raised.value.variable == name


def test_ids_at_slurms_limit_still_derive_a_port():
    task = load_case("slurm/srun_N2_tpn2")[0]
    assert PORT_MIN <= detect({**task, "SLURM_JOB_ID": "4294967295"}).master_port <= PORT_MAX


def test_explicit_master_wins_over_the_nodelist():
    base = load_case("slurm/srun_N2_tpn2")[0]
    env = detect({**base, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "23456"})
    assert (env.master_addr, env.master_port) == ("10.0.0.5", 23456)


def test_uneven_step_layout_gives_each_node_its_own_task_count():
    base = load_case("slurm/srun_N2_tpn2")[0]
    uneven = {**base, "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_NTASKS": "3"}
    on_node1 = detect({**uneven, "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"})
    on_node0 = detect({**uneven, "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0"})
    assert (on_node0.local_world_size, on_node1.local_world_size) == (2, 1)
    assert on_node1.world_size == 3


def test_step_variables_win_over_job_level_ones():
    base = load_case("slurm/srun_N2_tpn2")[0]
    # srun -n2 -N1 inside a 4-task, 2-node job: the job-level variables still describe the job.
    env = detect({**base, "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "1",
                  "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NODELIST": "node2", "SLURM_PROCID": "1",
                  "SLURM_LOCALID": "1", "SLURM_NODEID": "0"})
    assert (env.world_size, env.num_nodes, env.local_world_size, env.master_addr) == (2, 1, 2, "node2")


def test_sbatch_batch_script_with_several_tasks_fails_fast_with_an_srun_hint():
    (environ,) = load_case("slurm/sbatch_N2_tpn2_batchstep")
    with pytest.raises(LaunchError) as raised:
        detect(environ)
    message = str(raised.value)
    assert "srun" in message and "SLURM_NTASKS=4" in message and environ["SLURM_JOB_ID"] in message
    # The way out it names for a helper run once beside the steps is one that works.
    assert "SLURMDIST_LAUNCHER=single" in message
    assert detect({**environ, "SLURMDIST_LAUNCHER": "single"}).launcher == "single"


def test_sbatch_batch_script_with_one_task_is_a_single_process():
    (environ,) = load_case("slurm/sbatch_N2_tpn2_batchstep")
    one_task = {**environ, "SLURM_NTASKS": "1", "SLURM_NPROCS": "1", "SLURM_TASKS_PER_NODE": "1",
                "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "node1"}
    env = detect(one_task)
    assert (env.launcher, env.rank, env.world_size, env.job_id) == ("single", 0, 1, environ["SLURM_JOB_ID"])


def test_salloc_shell_runs_as_one_process_and_warns_that_srun_is_needed(caplog):
    (environ,) = load_case("slurm/salloc_N2_tpn2_shell")
    with caplog.at_level(logging.WARNING, logger="slurmdist"):
        env = detect(environ)
    assert (env.launcher, env.world_size, env.master_addr) == ("single", 1, "127.0.0.1")
    assert "srun" in caplog.text


def test_the_salloc_shell_warning_shows_once_per_process(caplog):
    # init(), is_main() and every print0 line call detect(): the launch does not change between them.
    (environ,) = load_case("slurm/salloc_N2_tpn2_shell")
    with caplog.at_level(logging.WARNING, logger="slurmdist"):
        for _ in range(3):
            detect(environ)
    warnings = [r.getMessage() for r in caplog.records if "not in an srun step" in r.getMessage()]
    assert len(warnings) == 1 and environ["SLURM_JOB_ID"] in warnings[0]


def test_openmpi_ranks_keep_openmpis_own_local_rank_order():
    for environ, env in detect_all("mpi/openmpi_np4"):
        assert env.launcher == "openmpi"
        assert env.rank == int(environ["OMPI_COMM_WORLD_RANK"])
        assert env.local_rank == int(environ["OMPI_COMM_WORLD_LOCAL_RANK"])
        assert (env.world_size, env.local_world_size, env.node_rank, env.num_nodes) == (4, 4, 0, 1)
        assert env.master_addr == "127.0.0.1"


def test_open_mpi_on_one_node_derives_its_port_from_the_launch_so_no_mpi_is_needed_to_meet():
    envs = [env for _, env in detect_all("mpi/openmpi_np4")]
    assert len({env.master_port for env in envs}) == 1 and PORT_MIN <= envs[0].master_port <= PORT_MAX
    other_launch = detect({**load_case("mpi/openmpi_np4")[0], "PMIX_NAMESPACE": "prterun-vm-9999@1"})
    assert other_launch.master_port != envs[0].master_port
    across_nodes = detect({**load_case("mpi/openmpi_np4")[0], "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert (across_nodes.master_addr, across_nodes.master_port) == (None, None)  # agreed over mpi4py at init


def test_mpich_hydra_is_read_through_pmi_variables():
    for environ, env in detect_all("mpi/mpich_np4"):
        assert env.launcher == "pmi"
        assert (env.rank, env.local_rank) == (int(environ["PMI_RANK"]), int(environ["MPI_LOCALRANKID"]))
        assert (env.world_size, env.local_world_size, env.master_addr) == (4, 4, "127.0.0.1")


def hydra_port_mode(rank: int, local_rank: int, local_size: int) -> dict:
    """What Hydra's proxy gives a rank under `mpiexec -pmi-port` (MPICH's pmip_cb.c): PMI_PORT and PMI_ID in
    place of PMI_FD, PMI_RANK and PMI_SIZE."""
    return {"PMI_PORT": "node1:40000", "PMI_ID": str(rank), "MPI_LOCALRANKID": str(local_rank),
            "MPI_LOCALNRANKS": str(local_size)}


def test_hydra_port_mode_says_no_world_size_and_is_refused_not_run_alone():
    with pytest.raises(LaunchError, match="-pmi-port mode") as raised:
        detect(hydra_port_mode(2, 2, 4))
    assert (raised.value.variable, raised.value.value) == ("PMI_ID", "2")
    # Inside an allocation the proxy is an srun task, whose step variables the ranks inherit.
    proxy_task = load_case("slurm/srun_N2_tpn2")[1]
    with pytest.raises(LaunchError, match="PMI_ID='3'"):
        detect({**proxy_task, **hydra_port_mode(3, 1, 2)})
    # MVAPICH2's mpirun_rsh sets PMI_PORT and PMI_ID beside its own complete variables: those are read.
    mvapich = detect({"PMI_PORT": "node1:45678", "PMI_ID": "1", "MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "4",
                      "MV2_COMM_WORLD_LOCAL_RANK": "1", "MV2_COMM_WORLD_LOCAL_SIZE": "2"})
    assert (mvapich.launcher, mvapich.rank, mvapich.world_size) == ("mvapich", 1, 4)
    # Hydra's default mode sets PMI_RANK/PMI_SIZE; a PMI_ID beside them is not read.
    (first, *_) = load_case("mpi/mpich_np4")
    assert detect({**first, "PMI_ID": first["PMI_RANK"], "PMI_PORT": "node1:40000"}).launcher == "pmi"


def test_torchrun_variables_are_taken_as_they_are():
    (environ,) = load_case("torchrun/standalone_np4")
    env = detect(environ)
    assert env.launcher == "torchrun"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (1, 1, 4, 4)
    assert (env.node_rank, env.num_nodes) == (0, 1)
    assert (env.master_addr, env.master_port) == ("localhost", 44343)


@pytest.mark.parametrize("world, local, placed", [("1", None, (0, 1)), ("4", "4", (0, 1)), ("4", "2", (None, None))])
def test_hand_set_torchrun_variables_place_the_node_only_when_every_rank_is_on_it(world, local, placed):
    # No GROUP_RANK/GROUP_WORLD_SIZE (set by hand, as Kubeflow and job scripts do): one node when the local size
    # is the world's, unknown otherwise.
    environ = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": world, "MASTER_ADDR": "h", "MASTER_PORT": "1234"}
    if local is not None:
        environ["LOCAL_WORLD_SIZE"] = local
    env = detect(environ)
    assert (env.launcher, env.node_rank, env.num_nodes) == ("torchrun", *placed)


def test_torchrun_inside_srun_wins_over_the_step():
    (torchrun_env,) = load_case("torchrun/standalone_np4")
    srun_task = load_case("slurm/srun_N2_tpn2")[3]
    env = detect({**srun_task, **torchrun_env})
    assert env.launcher == "torchrun" and env.world_size == 4 and env.job_id == srun_task["SLURM_JOB_ID"]


def torchrun_warnings(caplog, environ: dict) -> list:
    with caplog.at_level(logging.WARNING, logger="slurmdist"):
        env = detect(environ)
    assert env.launcher == "torchrun"
    return [r.getMessage() for r in caplog.records if "torchrun's group spans" in r.getMessage()]


def test_torchrun_standalone_in_each_task_of_a_multi_node_step_warns_that_the_nodes_train_apart(caplog):
    (torchrun_env,) = load_case("torchrun/standalone_np4")
    task = load_case("slurm/srun_N2_tpn2")[3]
    (warning,) = torchrun_warnings(caplog, {**task, **torchrun_env})
    assert "GROUP_WORLD_SIZE=1" in warning and "SLURM_STEP_NUM_NODES=2" in warning and "train apart" in warning
    assert f"srun step {task['SLURM_STEP_ID']} of job {task['SLURM_JOB_ID']}" in warning


def test_torchrun_standalone_in_the_batch_script_of_a_multi_node_job_warns_that_nodes_idle(caplog):
    (torchrun_env,) = load_case("torchrun/standalone_np4")
    (batch_script,) = load_case("slurm/sbatch_N2_tpn2_batchstep")
    (warning,) = torchrun_warnings(caplog, {**batch_script, **torchrun_env})
    assert "the batch script of job" in warning and "the other 1 stay idle" in warning


@pytest.mark.parametrize("case, extra", [
    ("slurm/srun_N2_tpn2", {"GROUP_WORLD_SIZE": "2", "GROUP_RANK": "1", "WORLD_SIZE": "8"}),  # one group
    ("slurm/srun_n1", {}),  # one node
    ("slurm/salloc_N2_tpn2_shell", {}),  # the salloc shell: not a launch of its own
    ("slurm/srun_N2_tpn2", {"SLURMDIST_LAUNCHER": "torchrun"}),  # apart on purpose
])
def test_torchrun_spanning_its_slurm_launch_does_not_warn(caplog, case, extra):
    (torchrun_env,) = load_case("torchrun/standalone_np4")
    assert torchrun_warnings(caplog, {**load_case(case)[0], **torchrun_env, **extra}) == []


def test_mpirun_inside_an_allocation_is_read_from_mpi_variables_not_the_daemon_step():
    daemon_step = load_case("slurm/srun_N2_tpn2")[0]
    daemon_step = {**daemon_step, "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
                   "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}
    rank = load_case("mpi/openmpi_np4")[2]
    env = detect({**daemon_step, **rank, "OMPI_COMM_WORLD_SIZE": "8"})
    assert (env.launcher, env.rank, env.world_size) == ("openmpi", 2, 8)


def test_srun_with_pmi2_is_still_slurm():
    task = load_case("slurm/srun_N2_tpn2")[2]
    env = detect({**task, "PMI_RANK": task["SLURM_PROCID"], "PMI_SIZE": "4", "PMI_FD": "7"})
    assert env.launcher == "slurm" and env.rank == 2


def cray_shasta_variables(task: dict, apid: str) -> dict:
    """What srun's mpi/cray_shasta plugin adds to a task (Slurm's mpi_cray_shasta.c): no PALS_LOCAL_SIZE."""
    return {"PALS_APID": apid, "PALS_RANKID": task["SLURM_PROCID"], "PALS_LOCAL_RANKID": task["SLURM_LOCALID"],
            "PALS_NODEID": task["SLURM_NODEID"], "PMI_RANK": task["SLURM_PROCID"], "PMI_SIZE": "4",
            "PMI_LOCAL_RANK": task["SLURM_LOCALID"], "PMI_LOCAL_SIZE": "2", "PMI_JOBID": task["SLURM_JOB_ID"]}


def test_srun_with_the_cray_mpi_plugin_is_still_slurm():
    # `srun --mpi=cray_shasta` (MpiDefault on many HPE Cray sites) sets PALS variables in every task, naming
    # the step in PALS_APID: read as a PALS launch, every task failed on the PALS_LOCAL_SIZE it never sets.
    for task in load_case("slurm/srun_N2_tpn2"):
        apid = f"{task['SLURM_JOB_ID']}.{task['SLURM_STEP_ID']}"
        env = detect({**task, **cray_shasta_variables(task, apid)})
        assert (env.launcher, env.rank, env.local_world_size, env.master_addr) == (
            "slurm", int(task["SLURM_PROCID"]), 2, "node1")


def test_pals_variables_of_another_step_are_not_taken_for_srun_s_own():
    task = load_case("slurm/srun_N2_tpn2")[3]
    with pytest.raises(LaunchError, match="PALS_LOCAL_SIZE"):
        detect({**task, **cray_shasta_variables(task, "7.3")})


def test_submitit_local_executor_wins_over_an_outer_allocation():
    outer = load_case("slurm/srun_N2_tpn2")[0]
    local = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "3", "SUBMITIT_LOCAL_GLOBALID": "2",
             "SUBMITIT_LOCAL_LOCALID": "2", "SUBMITIT_LOCAL_JOB_ID": "4242", "SUBMITIT_LOCAL_NODEID": "0",
             "SUBMITIT_LOCAL_JOB_NUM_NODES": "1"}
    env = detect({**outer, **local})
    assert (env.launcher, env.rank, env.world_size, env.master_addr) == ("submitit-local", 2, 3, "127.0.0.1")
    assert env.job_id == "4242" and PORT_MIN <= env.master_port <= PORT_MAX


def test_torchrun_inside_a_submitit_local_task_describes_its_own_workers():
    # A LocalExecutor task (1 of 2) that runs `torchrun --nproc-per-node=4`: each worker is rank 0-3 of
    # torchrun's 4, not the task it runs in. Read as the task, every worker would claim rank 1 of 2.
    local = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_GLOBALID": "1",
             "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_JOB_ID": "4242"}
    for worker in load_case("torchrun/standalone_np4"):
        env = detect({**local, **worker})
        assert (env.launcher, env.rank, env.world_size) == ("torchrun", int(worker["RANK"]), 4)


@pytest.mark.parametrize("step", ["interactive", "4294967290", "extern", "4294967292", "pending"])
def test_a_shell_in_a_non_task_step_is_not_an_srun_task(step, caplog):
    # salloc with LaunchParameters=use_interactive_step runs its shell in the "interactive" step: a python
    # started there is one process outside srun, as in a plain salloc shell, and hears the same warning.
    shell = load_case("slurm/salloc_N2_n4_shell")[0]
    with caplog.at_level(logging.WARNING, logger="slurmdist"):
        env = detect({**shell, "SLURM_STEP_ID": step})
    assert (env.launcher, env.world_size) == ("single", 1)
    assert "srun" in caplog.text


@pytest.mark.parametrize("port", ["0", "65536", "abc", "", "-1"])
def test_the_highest_tcp_port_is_a_valid_master_port(port):
    assert detect({**STEP, "MASTER_PORT": "65535"}).master_port == 65535
    with pytest.raises(LaunchError, match=f"MASTER_PORT='{port[:20]}.*' is not a TCP port \\(a whole number in "
                                          r"1..65535\): set it to a free TCP port") as raised:
        detect({**STEP, "MASTER_PORT": port})
    assert (raised.value.variable, raised.value.value) == ("MASTER_PORT", port)


@pytest.mark.parametrize("name", ["WORLD_SIZE", "LOCAL_WORLD_SIZE"])
def test_a_size_of_zero_says_what_to_do(name):
    explicit = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", name: "0"}
    with pytest.raises(LaunchError, match=f"^{name}='0' must be at least 1. Fix or unset it") as raised:
        detect(explicit)
    assert (raised.value.variable, raised.value.value) == (name, "0")


HAND_WRITTEN = {
    "pals": ({"PALS_RANKID": "5", "PALS_LOCAL_RANKID": "1", "PALS_LOCAL_SIZE": "4", "PMI_SIZE": "8",
              "PMI_RANK": "5", "PALS_NODEID": "1", "PALS_APID": "abc"}, (5, 1, 8, 4, 1, None)),
    "flux": ({"FLUX_TASK_RANK": "5", "FLUX_TASK_LOCAL_ID": "1", "FLUX_JOB_SIZE": "8", "FLUX_JOB_NNODES": "2",
              "FLUX_JOB_ID": "f2"}, (5, 1, 8, 4, None, 2)),
    "jsrun": ({"JSM_NAMESPACE_RANK": "6", "JSM_NAMESPACE_LOCAL_RANK": "0", "JSM_NAMESPACE_SIZE": "12",
               "JSM_NAMESPACE_LOCAL_SIZE": "6", "LSB_JOBID": "77"}, (6, 0, 12, 6, None, None)),
    "mvapich": ({"MV2_COMM_WORLD_RANK": "3", "MV2_COMM_WORLD_LOCAL_RANK": "1", "MV2_COMM_WORLD_SIZE": "4",
                 "MV2_COMM_WORLD_LOCAL_SIZE": "2", "PMI_RANK": "3", "PMI_SIZE": "4"}, (3, 1, 4, 2, None, None)),
}


@pytest.mark.parametrize("launcher", sorted(HAND_WRITTEN))
def test_launchers_not_runnable_here(launcher):
    environ, expected = HAND_WRITTEN[launcher]
    env = detect(environ)
    assert env.launcher == launcher
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.node_rank, env.num_nodes) == expected
    assert env.master_addr is None  # several nodes: resolved over MPI at init


def test_mpi_on_one_node_uses_loopback():
    env = detect({"JSM_NAMESPACE_RANK": "1", "JSM_NAMESPACE_LOCAL_RANK": "1", "JSM_NAMESPACE_SIZE": "2",
                  "JSM_NAMESPACE_LOCAL_SIZE": "2"})
    assert (env.master_addr, env.node_rank, env.num_nodes) == ("127.0.0.1", 0, 1)


def test_flux_tasks_are_flux_although_its_job_shell_serves_pmi_too():
    # Flux's job shell gives every task PMI_FD/PMI_RANK/PMI_SIZE (its own PMI server), never MPI_LOCALRANKID.
    environ = {"FLUX_TASK_RANK": "5", "FLUX_TASK_LOCAL_ID": "1", "FLUX_JOB_SIZE": "8", "FLUX_JOB_NNODES": "2",
               "FLUX_JOB_ID": "f2", "PMI_FD": "5", "PMI_RANK": "5", "PMI_SIZE": "8"}
    env = detect(environ)
    assert (env.launcher, env.rank, env.local_rank, env.local_world_size, env.num_nodes) == ("flux", 5, 1, 4, 2)
    single = detect({"FLUX_TASK_RANK": "0", "FLUX_TASK_LOCAL_ID": "0", "FLUX_JOB_SIZE": "1", "FLUX_JOB_NNODES": "1",
                     "PMI_FD": "5", "PMI_RANK": "0", "PMI_SIZE": "1"})
    assert single.launcher == "flux"
    # mpirun started by a Flux job: its complete variables win, as inside an srun step.
    mpirun = detect({**environ, "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
                     "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert (mpirun.launcher, mpirun.rank) == ("openmpi", 3)


def test_flux_jobs_inside_an_srun_started_flux_instance_are_flux_even_placed_as_the_step():
    # `srun -N2 --ntasks-per-node=1 flux start`, then `flux run -N2 -n2` twice at once: each job's tasks
    # inherit the broker step's variables and sit exactly where its tasks do. The step's port would be shared.
    broker = load_case("slurm/srun_N2_tpn2")[2]
    broker = {**broker, "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2",
              "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_PROCID": "1",
              "SLURM_LOCALID": "0"}
    assert detect(broker).launcher == "slurm"  # the broker itself
    jobs = [detect({**broker, "FLUX_TASK_RANK": "1", "FLUX_TASK_LOCAL_ID": "0", "FLUX_JOB_SIZE": "2",
                    "FLUX_JOB_NNODES": "2", "FLUX_JOB_ID": job}) for job in ("fA1", "fB2")]
    assert [(env.launcher, env.rank, env.world_size, env.node_rank) for env in jobs] == [("flux", 1, 2, 1)] * 2
    assert jobs[0].master_port is None  # found at init (rank 0 picks a free port), not derived from the step


def test_flux_node_rank_is_known_only_where_the_task_map_cannot_matter():
    # flux run -N2 -n4 --taskmap=cyclic puts rank 1 first on node 1, block on node 0: no task can tell which.
    base = {"FLUX_TASK_LOCAL_ID": "0", "FLUX_JOB_SIZE": "4", "FLUX_JOB_NNODES": "2", "FLUX_JOB_ID": "f2"}
    env = detect({**base, "FLUX_TASK_RANK": "1"})
    assert (env.rank, env.local_rank, env.local_world_size, env.num_nodes, env.node_rank) == (1, 0, 2, 2, None)
    assert "GROUP_RANK" not in torchrun_variables(env)
    one_per_node = {**base, "FLUX_TASK_RANK": "1", "FLUX_JOB_SIZE": "2"}  # block and cyclic agree
    assert detect(one_per_node).node_rank == 1
    one_node = {**base, "FLUX_TASK_RANK": "1", "FLUX_TASK_LOCAL_ID": "1", "FLUX_JOB_NNODES": "1"}
    assert detect(one_node).node_rank == 0


def test_uneven_flux_layout_is_refused_rather_than_guessed():
    with pytest.raises(LaunchError, match="FLUX_JOB_NNODES=2"):
        detect({"FLUX_TASK_RANK": "0", "FLUX_TASK_LOCAL_ID": "0", "FLUX_JOB_SIZE": "3", "FLUX_JOB_NNODES": "2"})
    # `flux run -n4` on 3-core nodes: 3 + 1, a count that divides. The third task of the full node can tell.
    with pytest.raises(LaunchError, match="Flux spread the job unevenly.*flux run -N2 --tasks-per-node=2") as raised:
        detect({"FLUX_TASK_RANK": "2", "FLUX_TASK_LOCAL_ID": "2", "FLUX_JOB_SIZE": "4", "FLUX_JOB_NNODES": "2"})
    assert (raised.value.variable, raised.value.value) == ("FLUX_TASK_LOCAL_ID", "2")


def test_nothing_is_a_single_process():
    env = detect({})
    assert env == DistEnv("single", 0, 0, 1, 1, 0, 1, "127.0.0.1", None, None)
    assert env.is_main


def test_default_environ_is_os_environ(monkeypatch):
    for name in list(__import__("os").environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SLURMDIST_LAUNCHER", "torchrun")
    for name, value in {"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    assert detect().rank == 2


def test_forcing_a_launcher_by_name():
    task = load_case("slurm/srun_N2_tpn2")[1]
    (torchrun_env,) = load_case("torchrun/standalone_np4")
    env = detect({**task, **torchrun_env, "SLURMDIST_LAUNCHER": "slurm"})
    assert env.launcher == "slurm" and env.rank == 1
    with pytest.raises(LaunchError, match="SLURMDIST_LAUNCHER='openmpi'"):
        detect({**task, "SLURMDIST_LAUNCHER": "openmpi"})
    with pytest.raises(LaunchError, match="not a launcher"):
        detect({"SLURMDIST_LAUNCHER": "pbs"})
    for blank in ("", " "):  # `export SLURMDIST_LAUNCHER=` in a job script clears it: detection as without it
        assert detect({**task, "SLURMDIST_LAUNCHER": blank}) == detect(task)


STEP = load_case("slurm/srun_N2_tpn2")[3]
CONTRADICTIONS = [
    ({"SLURM_PROCID": "4"}, "SLURM_PROCID"),
    ({"SLURM_PROCID": ""}, "SLURM_PROCID"),
    ({"SLURM_PROCID": "-1"}, "SLURM_PROCID"),
    ({"SLURM_PROCID": "three"}, "SLURM_PROCID"),
    ({"SLURM_PROCID": "99999999999999999999"}, "SLURM_PROCID"),
    ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID"),
    ({"SLURM_NODEID": "2"}, "SLURM_NODEID"),
    ({"SLURM_STEP_NUM_TASKS": "5"}, "SLURM_STEP_TASKS_PER_NODE"),
    ({"SLURM_STEP_NUM_TASKS": "0"}, "SLURM_STEP_NUM_TASKS"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "SLURM_STEP_TASKS_PER_NODE"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x2"}, "SLURM_STEP_TASKS_PER_NODE"),
    ({"SLURM_STEP_TASKS_PER_NODE": "two"}, "SLURM_STEP_TASKS_PER_NODE"),
    ({"SLURM_STEP_NODELIST": "node[2-1]"}, "SLURM_STEP_NODELIST"),
    ({"SLURM_STEP_NODELIST": "node[1-3]"}, "SLURM_STEP_NODELIST"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT"),
    ({"MASTER_PORT": "0"}, "MASTER_PORT"),
    ({"MASTER_ADDR": " "}, "MASTER_ADDR"),
    ({"MASTER_ADDR": "node1:29500"}, "MASTER_ADDR"),
    ({"MASTER_ADDR": "tcp://node1:29500"}, "MASTER_ADDR"),
    ({"MASTER_ADDR": "node1 node2"}, "MASTER_ADDR"),
]


@pytest.mark.parametrize("addr, fix", [("node1:29500", "MASTER_ADDR=node1 MASTER_PORT=29500"),
                                       ("[fd00::7]:29500", "MASTER_ADDR=[fd00::7] MASTER_PORT=29500")])
def test_a_port_in_master_addr_is_refused_with_the_split_to_use(addr, fix):
    # `export MASTER_ADDR=$(hostname):29500` reached the user as a failed lookup of 'node1:29500' at init().
    with pytest.raises(LaunchError, match=f"MASTER_ADDR='{re.escape(addr)}' holds a port.*here {re.escape(fix)}$"):
        detect({**STEP, "MASTER_ADDR": addr})


@pytest.mark.parametrize("addr", ["node1", "10.0.0.5", "fd00::7", "[fd00::7]", "fe80::1%eth0"])
def test_master_addr_takes_names_and_both_address_families(addr):
    assert detect({**STEP, "MASTER_ADDR": addr}).master_addr == addr


@pytest.mark.parametrize("changes,variable", CONTRADICTIONS, ids=[str(c) for c, _ in CONTRADICTIONS])
def test_malformed_or_contradictory_slurm_values_name_the_variable(changes, variable):
    with pytest.raises(LaunchError) as raised:
        detect({**STEP, **changes})
    assert variable in str(raised.value)
    if variable.startswith("MASTER_"):  # what the user set: the error carries it for tools, too
        assert (raised.value.variable, raised.value.value) == (variable, changes[variable])


def test_a_step_without_a_nodelist_asks_for_master_addr_and_takes_it_when_given():
    # A container that passes on only some SLURM_* variables: the message says to set MASTER_ADDR, so that
    # must be enough (it used to raise the same message with MASTER_ADDR set).
    no_nodelist = {name: value for name, value in STEP.items() if not name.endswith("NODELIST")}
    with pytest.raises(LaunchError, match="no nodelist .* set MASTER_ADDR"):
        detect(no_nodelist)
    env = detect({**no_nodelist, "MASTER_ADDR": "10.1.2.3"})
    assert (env.launcher, env.master_addr, env.rank) == ("slurm", "10.1.2.3", int(STEP["SLURM_PROCID"]))


@pytest.mark.parametrize("changes,variable", [
    ({"OMPI_COMM_WORLD_RANK": "4"}, "OMPI_COMM_WORLD_RANK"),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "x"}, "OMPI_COMM_WORLD_LOCAL_RANK"),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "5"}, "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ({"OMPI_COMM_WORLD_SIZE": ""}, "OMPI_COMM_WORLD_SIZE"),
])
def test_malformed_openmpi_values_name_the_variable(changes, variable):
    rank = load_case("mpi/openmpi_np4")[0]
    with pytest.raises(LaunchError, match=variable):
        detect({**rank, **changes})


@pytest.mark.parametrize("contradiction, variable", [
    ({"RANK": "4"}, "RANK"),
    ({"LOCAL_RANK": "2"}, "LOCAL_RANK"),
    ({"LOCAL_WORLD_SIZE": "8"}, "LOCAL_WORLD_SIZE"),  # more on this node than in the job (said as 8, not 7)
    ({"GROUP_RANK": "3", "GROUP_WORLD_SIZE": "2"}, "GROUP_RANK"),
    ({"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "5"}, "GROUP_WORLD_SIZE"),  # more nodes than ranks
])
def test_contradicting_torchrun_variables_are_named(contradiction, variable):
    environ = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", **contradiction}
    with pytest.raises(LaunchError, match=f"torchrun: {variable}={contradiction[variable]} but ") as raised:
        detect(environ)
    assert (raised.value.variable, raised.value.value) == (variable, contradiction[variable])


@pytest.mark.parametrize("contradiction, variable", [
    ({"LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}, "GROUP_WORLD_SIZE"),  # all 4 here
    ({"LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}, "GROUP_RANK"),  # node 1, yet node 0 would hold none
    ({"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "4"}, "GROUP_WORLD_SIZE"),  # 3 other nodes and 2 here: 5 of 4
    ({"LOCAL_SIZE": "3", "LOCAL_WORLD_SIZE": None, "CROSS_RANK": "2"}, "CROSS_RANK"),  # DeepSpeed's names
])
def test_more_nodes_than_the_ranks_left_for_them_are_a_contradiction(contradiction, variable):
    # Every node runs one rank at least: were accepted, as node 1 of 2 with all 4 ranks on this node.
    environ = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", **contradiction}
    environ = {name: value for name, value in environ.items() if value is not None}
    with pytest.raises(LaunchError, match=f"{variable}={contradiction[variable]} puts .* each running one process "
                                          "at least.* more than WORLD_SIZE=4") as raised:
        detect(environ)
    assert (raised.value.variable, raised.value.value) == (variable, contradiction[variable])
    # 1 + 1 + 2 ranks on three nodes is possible (DeepSpeed's --include gives nodes unequal counts).
    uneven = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2"}
    assert (detect(uneven).node_rank, detect({**uneven, "GROUP_WORLD_SIZE": "3"}).num_nodes) == (2, 3)


def test_a_topology_with_more_nodes_than_ranks_for_them_is_refused_whatever_the_launcher():
    from slurmdist.distenv import DistEnv

    with pytest.raises(LaunchError, match="pals: node_rank=3 puts 3 node.*local_world_size=2.*world_size=4"):
        DistEnv("pals", 1, 1, 4, 2, 3, None, None, None, None)
    assert DistEnv("pals", 1, 1, 4, 2, 2, None, None, None, None).node_rank == 2


@pytest.mark.parametrize("environ, variable", [
    ({**HAND_WRITTEN["flux"][0], "FLUX_TASK_LOCAL_ID": "4"}, "FLUX_TASK_LOCAL_ID"),  # 4 tasks per node: 0..3
    ({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_GLOBALID": "1",
      "SUBMITIT_LOCAL_LOCALID": "2", "SUBMITIT_LOCAL_JOB_ID": "7"}, "SUBMITIT_LOCAL_LOCALID"),
])
def test_a_local_id_beyond_the_node_names_the_launchers_variable(environ, variable):
    with pytest.raises(LaunchError, match=f"{variable}="):
        detect(environ)


@pytest.mark.parametrize("distribution", ["arbitrary", "Arbitrary", "ARBITRARY,pack", "arbitrary:block"])
def test_srun_arbitrary_is_recognised_however_it_is_written(distribution):
    # srun -m arbitrary: the master must come from SLURM_HOSTFILE, never from the nodelist's first node.
    task = load_case("slurm/srun_arbitrary_N2_n4")[1]
    assert detect({**task, "SLURM_DISTRIBUTION": distribution}).master_addr is None
    assert detect({**task, "SLURM_DISTRIBUTION": "block"}).master_addr == "node1"


def test_torchrun_without_local_world_size_asks_for_it():
    with pytest.raises(LaunchError, match="LOCAL_WORLD_SIZE"):
        detect({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})


def deepspeed_worker(rank: int, local_rank: int, node_rank: int) -> dict:
    """What deepspeed.launcher.launch exports to a worker of 2 nodes x 4: no LOCAL_WORLD_SIZE, no GROUP_*."""
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": "8", "LOCAL_SIZE": "4",
            "CROSS_RANK": str(node_rank), "CROSS_SIZE": "2", "MASTER_ADDR": "node1", "MASTER_PORT": "29500"}


def test_deepspeed_launcher_workers_are_read_from_its_own_names():
    # Its LOCAL_SIZE and CROSS_RANK/CROSS_SIZE stand for torchrun's LOCAL_WORLD_SIZE and GROUP_*: without
    # them every worker failed, asking for a LOCAL_WORLD_SIZE DeepSpeed's launcher never sets.
    for rank in range(8):
        env = detect(deepspeed_worker(rank, rank % 4, rank // 4))
        assert (env.launcher, env.rank, env.local_rank, env.world_size, env.local_world_size) == (
            "deepspeed", rank, rank % 4, 8, 4)
        assert (env.node_rank, env.num_nodes, env.master_addr, env.master_port) == (rank // 4, 2, "node1", 29500)


def test_a_helper_a_deepspeed_worker_starts_alone_is_still_one_process():
    # It inherits LOCAL_SIZE and CROSS_* and sets its own RANK/WORLD_SIZE/LOCAL_RANK (and maybe
    # LOCAL_WORLD_SIZE): DeepSpeed's names are read only as a set, for a world of several processes.
    alone = {**deepspeed_worker(5, 1, 1), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    for helper in (alone, {**alone, "LOCAL_WORLD_SIZE": "1"}):
        env = detect(helper)
        assert (env.launcher, env.rank, env.world_size, env.node_rank, env.num_nodes) == ("torchrun", 0, 1, 0, 1)
    # Nor is a stray CROSS_* read beside torchrun's LOCAL_WORLD_SIZE.
    by_hand = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "CROSS_RANK": "1",
               "CROSS_SIZE": "2"}
    assert (detect(by_hand).node_rank, detect(by_hand).num_nodes) == (0, 1)
    assert detect({**deepspeed_worker(5, 1, 1), "SLURMDIST_LAUNCHER": "deepspeed"}).launcher == "deepspeed"


def test_torchrun_names_win_over_deepspeed_ones_and_a_contradiction_names_the_variable():
    both = {**deepspeed_worker(5, 1, 1), "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2", "GROUP_WORLD_SIZE": "4"}
    env = detect(both)
    assert (env.launcher, env.local_world_size, env.node_rank, env.num_nodes) == ("torchrun", 2, 2, 4)
    with pytest.raises(LaunchError, match=r"deepspeed: CROSS_RANK=2 but CROSS_SIZE=2"):
        detect(deepspeed_worker(5, 1, 2))


@pytest.mark.parametrize("environ, missing", [
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500"}, "LOCAL_RANK"),  # env://
    ({"WORLD_SIZE": "4"}, "RANK"),
    ({"RANK": "3"}, "WORLD_SIZE"),
])
def test_an_incomplete_env_export_naming_several_processes_is_refused_not_run_alone(environ, missing):
    # Taken as a single process, each of the job's processes would train alone as rank 0 of 1.
    with pytest.raises(LaunchError, match=f"{missing} (is|and .* are) not, and no launcher") as raised:
        detect(environ)
    assert raised.value.variable == missing
    assert "LOCAL_WORLD_SIZE" in str(raised.value)


def test_a_pmix_rank_above_0_from_a_launcher_without_a_size_is_refused_not_run_alone():
    # PRRTE's prterun without Open MPI's personality sets PMIX_RANK and PMIX_NAMESPACE but no size: read as
    # a single process, every rank trained alone as rank 0 of 1.
    with pytest.raises(LaunchError, match="PMIX_RANK=3 says this process is rank 3") as raised:
        detect({"PMIX_RANK": "3", "PMIX_NAMESPACE": "prterun-host-1234@1"})
    assert (raised.value.variable, raised.value.value) == ("PMIX_RANK", "3")
    assert detect({"PMIX_RANK": "0", "PMIX_NAMESPACE": "prterun-host-1234@1"}).launcher == "single"
    assert detect(load_case("mpi/openmpi_np4")[3]).launcher == "openmpi"  # Open MPI sets PMIX_RANK too


@pytest.mark.parametrize("environ", [{"RANK": "0", "WORLD_SIZE": "1"}, {"RANK": "0"}, {"WORLD_SIZE": "1"}])
def test_an_export_naming_one_process_is_that_single_process(environ):
    assert detect(environ).launcher == "single"


def test_an_incomplete_export_inside_an_srun_step_leaves_the_step_to_srun():
    task = load_case("slurm/srun_N4_n8")[1]
    env = detect({**task, "RANK": task["SLURM_PROCID"], "WORLD_SIZE": task["SLURM_NTASKS"]})
    assert (env.launcher, env.rank, env.world_size) == ("slurm", 1, 8)


def test_pmi_without_local_rank_asks_for_the_launcher():
    with pytest.raises(LaunchError, match="MPI_LOCALNRANKS"):
        detect({"PMI_RANK": "0", "PMI_SIZE": "2"})


def test_detect_never_changes_its_input():
    for case in [*SLURM_STEP_CASES, "mpi/openmpi_np4", "slurm/salloc_N2_tpn2_shell"]:
        for environ in load_case(case):
            before = dict(environ)
            detect(environ)
            assert environ == before


@pytest.mark.parametrize("environ, quoted", [
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, "OMPI_COMM_WORLD_LOCAL_SIZE=3 but OMPI_COMM_WORLD_SIZE=2, so "
                                          "OMPI_COMM_WORLD_LOCAL_SIZE must be at most 2"),
    ({"FLUX_TASK_RANK": "0", "FLUX_TASK_LOCAL_ID": "0", "FLUX_JOB_SIZE": "2", "FLUX_JOB_NNODES": "3"},
     "FLUX_JOB_NNODES=3 but FLUX_JOB_SIZE=2, so FLUX_JOB_NNODES must be at most 2"),
])
def test_a_count_above_the_job_size_is_quoted_as_given(environ, quoted):
    with pytest.raises(LaunchError, match=quoted):
        detect(environ)


@pytest.mark.parametrize("step_id", ["batch", "4294967291", "4294967294"])  # the batch step's id since and before 20.11
def test_a_multi_task_batch_script_fails_fast_whatever_id_its_step_has(step_id):
    (batch,) = load_case("slurm/sbatch_N2_tpn2_batchstep")
    with pytest.raises(LaunchError, match="srun"):
        detect({**batch, "SLURM_STEP_ID": step_id})


@pytest.mark.parametrize("case, index", [("slurm/srun_N2_tpn2", 1), ("slurm/sbatch_N2_tpn2_batchstep", 0)])
@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_step_id_is_an_error_not_the_batch_script(case, index, blank):
    # Read as "no step", an srun task with a blanked SLURM_STEP_ID was told it is the batch script.
    environ = {**load_case(case)[index], "SLURM_STEP_ID": blank}
    environ.pop("SLURM_STEPID", None)
    with pytest.raises(LaunchError, match=r"SLURM_STEP_ID='\s*' is empty.*Unset those, or start the process with srun") \
            as raised:
        detect(environ)
    assert (raised.value.variable, raised.value.value) == ("SLURM_STEP_ID", blank)


def test_a_blank_step_id_defers_to_the_other_spelling():
    task = load_case("slurm/srun_N2_tpn2")[1]
    assert detect({**task, "SLURM_STEP_ID": "", "SLURM_STEPID": task["SLURM_STEP_ID"]}) == detect(task)


@pytest.mark.parametrize("step_id", ["4294967292", "4294967295"])  # the extern step since and before 20.11
def test_the_extern_step_is_not_a_task_step(step_id):
    (task,) = load_case("slurm/srun_N2_tpn2")[:1]
    assert detect({**task, "SLURM_STEP_ID": step_id}).launcher != "slurm"


HUGE_NODELIST = "nid[" + ",".join(f"{i:06d}" for i in range(0, 40000, 2))  # 20,000 hosts, unterminated
SRUN_ADVICE = "start the process with srun"


@pytest.mark.parametrize("name, value, advice", [
    ("SLURM_STEP_NODELIST", HUGE_NODELIST + "]", SRUN_ADVICE),  # more hosts than the step's nodes
    ("SLURM_STEP_NODELIST", HUGE_NODELIST, SRUN_ADVICE),  # does not parse
    ("SLURM_STEP_TASKS_PER_NODE", ",".join(["2"] * 30000), SRUN_ADVICE),  # too many nodes
    ("SLURM_STEP_TASKS_PER_NODE", ",".join(["2"] * 30000) + ",x", "expected a list such as"),  # does not parse
])
def test_a_long_value_is_quoted_short_in_the_error_every_rank_logs(name, value, advice):
    task = load_case("slurm/srun_N2_tpn2")[0]
    with pytest.raises(LaunchError) as raised:
        detect({**task, name: value})
    message = str(raised.value)
    assert name in message and f"({len(value)} characters)" in message and len(message) < 700, message
    assert advice in message
    assert raised.value.value == value  # the whole value stays on the exception


def test_a_pals_node_index_past_the_ranks_is_refused():
    # PALS is the one MPI launcher that numbers nodes: node 5 of a 4-rank launch cannot exist.
    pals = {"PALS_RANKID": "1", "PMI_SIZE": "4", "PALS_LOCAL_RANKID": "0", "PALS_LOCAL_SIZE": "1"}
    assert detect({**pals, "PALS_NODEID": "1"}).node_rank == 1
    with pytest.raises(LaunchError, match=r"PALS_NODEID.*5.*PMI_SIZE"):
        detect({**pals, "PALS_NODEID": "5"})


def test_forcing_mpich_by_name_points_at_pmi():
    with pytest.raises(LaunchError, match=r"SLURMDIST_LAUNCHER='mpich' .*MPICH, Intel MPI and other Hydra .* are pmi"):
        detect({"SLURMDIST_LAUNCHER": "mpich", "PMI_RANK": "0", "PMI_SIZE": "1"})


def test_master_endpoint_is_both_halves_or_says_how_to_get_them():
    resolved = DistEnv("slurm", 1, 1, 4, 2, 0, 2, "node1", 29500, "7")
    assert resolved.master_endpoint() == ("node1", 29500)
    # An MPI launch across nodes leaves both to resolve_master() (over mpi4py).
    unresolved = DistEnv("openmpi", 1, 1, 4, 2, None, None, None, None, None)
    with pytest.raises(LaunchError, match=r"openmpi: the master address and port are not resolved yet .*resolve_master"):
        unresolved.master_endpoint()
    # One process: init() forms its group with no rendezvous and leaves the port unset; "init() does" was wrong.
    with pytest.raises(LaunchError, match=r"single: a single process \(world size 1\) has no master port"):
        detect({}).master_endpoint()


@pytest.mark.parametrize("parent, tty, rank, hinted", [
    (["bash"], True, 0, True),  # `srun -n4 --pty bash`, then `python train.py` typed at it
    (["-bash"], True, 0, True),
    (["/bin/zsh", "-l"], True, 0, True),
    (["bash", "-c", "python train.py"], True, 0, False),  # --pty bash -c: every task runs the command
    (["bash", "job.sh"], True, 0, False),  # a script, in every task too
    (["slurmstepd: [7.0]"], True, 0, False),  # `srun -n4 --pty python train.py`
    (["bash"], False, 0, False),  # no terminal: not the shell the user types at
    (["bash"], True, 1, False),  # only task 0 runs the interactive shell
])
def test_rank_0_typed_at_an_srun_pty_shell_is_told_why_the_others_cannot_come(parent, tty, rank, hinted):
    task = {**load_case("slurm/srun_N2_tpn2")[rank], "SLURM_PTY_PORT": "40123"}
    hint = pty_shell_hint(detect(task), task, parent, tty)
    assert (hint is not None) == hinted
    if hinted:
        assert "rank 0 of 4 of srun step" in hint and "the other 3 ended" in hint and "srun --overlap" in hint and "would never arrive" in hint
    assert pty_shell_hint(detect(task), {k: v for k, v in task.items() if k != "SLURM_PTY_PORT"}, parent, tty) is None

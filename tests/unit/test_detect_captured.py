"""detect() over every launch captured from the local cluster: each launch must describe one consistent job.

The checks are invariants a correct reading must satisfy, not values copied from the files: ranks are exactly
0..N-1, every node's local ranks are exactly 0..local_world_size-1, per-node sizes add up to the world size,
and every process of a launch agrees on the master.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from typing import Dict, List, Tuple

import pytest

from slurmdist import DistEnv, LaunchError, RendezvousError, detect, hostlist, notices
from slurmdist.hosts import hostfile_master
from tests.conftest import FIXTURES, load_case

ALL_SLURM = sorted(p.name for p in (FIXTURES / "slurm").iterdir() if p.is_dir())
BATCH = [name for name in ALL_SLURM if name.endswith("_batchstep")]
SALLOC = [name for name in ALL_SLURM if name.endswith("_shell")]
LAUNCHES = [name for name in ALL_SLURM if name not in BATCH + SALLOC] + ["mpi/openmpi_np4", "mpi/mpich_np4"]


def case_path(name: str) -> str:
    return name if "/" in name else f"slurm/{name}"


def launches_of(name: str) -> Dict[Tuple[str, str], List[Tuple[dict, DistEnv]]]:
    """Processes of one capture grouped by (job, step): arrays and concurrent steps are separate launches."""
    groups: Dict[Tuple[str, str], List[Tuple[dict, DistEnv]]] = defaultdict(list)
    for environ in load_case(case_path(name)):
        key = (environ.get("SLURM_JOB_ID", ""), environ.get("SLURM_STEP_ID", ""))
        groups[key].append((environ, detect(environ)))
    return groups


def test_every_capture_is_classified():
    assert set(BATCH) | set(SALLOC) | {n for n in LAUNCHES if "/" not in n} == set(ALL_SLURM)
    assert len(LAUNCHES) >= 12


@pytest.mark.parametrize("name", LAUNCHES)
def test_each_launch_is_one_consistent_job(name):
    for group in launches_of(name).values():
        envs = [env for _, env in group]
        world = envs[0].world_size
        assert sorted(env.rank for env in envs) == list(range(world))
        assert {env.world_size for env in envs} == {world}
        assert len({(env.master_addr, env.master_port) for env in envs}) == 1
        by_node: Dict[object, List[DistEnv]] = defaultdict(list)
        for environ, env in group:
            by_node[environ.get("SLURMD_NODENAME", env.node_rank)].append(env)
        for node_envs in by_node.values():
            sizes = {env.local_world_size for env in node_envs}
            assert len(sizes) == 1
            assert sorted(env.local_rank for env in node_envs) == list(range(sizes.pop()))
        assert sum(node_envs[0].local_world_size for node_envs in by_node.values()) == world


@pytest.mark.parametrize("name", [n for n in LAUNCHES if "/" not in n])
def test_slurm_launches_agree_with_the_tasks_own_node(name):
    for group in launches_of(name).values():
        task0_node = next(environ.get("SLURMD_NODENAME") for environ, env in group if env.rank == 0)
        for environ, env in group:
            if env.launcher != "slurm":
                continue
            assert env.rank == int(environ["SLURM_PROCID"]) and env.local_rank == int(environ["SLURM_LOCALID"])
            assert len(hostlist.expand(environ["SLURM_STEP_NODELIST"])) == env.num_nodes
            # The master is the node task 0 runs on; under -m arbitrary the variables cannot say which that
            # is (init() reads SLURM_HOSTFILE), and a guess would leave every rank waiting at the wrong host.
            arbitrary = environ.get("SLURM_DISTRIBUTION") == "arbitrary"
            assert env.master_addr == (None if arbitrary else task0_node)


def test_arbitrary_layout_master_comes_from_the_hostfile_srun_used(tmp_path):
    # The file capture.sh gave srun; Slurm put task 0 on its first host, node2, not the nodelist's node1.
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# task 0 on the second node\nnode2,node1\nnode2*1\nnode1\n")
    group = next(iter(launches_of("srun_arbitrary_N2_n4").values()))
    task0_node = next(environ["SLURMD_NODENAME"] for environ, env in group if env.rank == 0)
    for environ, env in group:
        assert hostfile_master({**environ, "SLURM_HOSTFILE": str(hostfile)}) == task0_node == "node2"


def test_arbitrary_layout_from_a_w_list_asks_for_master_addr_at_once():
    # srun -m arbitrary -w node2,node1,node1: no hostfile, and the nodelist the tasks see is sorted, so no
    # task can tell where task 0 runs; guessing node1 would leave every rank waiting at the wrong host.
    for environ in load_case("slurm/srun_arbitrary_w_N2_n3"):
        assert "SLURM_HOSTFILE" not in environ and detect(environ).master_addr is None
        with pytest.raises(RendezvousError, match="srun -w` list.*Set MASTER_ADDR to task 0.s node"):
            hostfile_master(environ)
        assert detect({**environ, "MASTER_ADDR": "node2"}).master_addr == "node2"


def test_uneven_srun_layout_from_the_cluster():
    envs = [env for group in launches_of("srun_N2_n3").values() for _, env in group]
    assert sorted((env.node_rank, env.local_world_size) for env in envs) == [(0, 2), (0, 2), (1, 1)]


def test_packed_four_node_layout():
    envs = [env for group in launches_of("srun_N4_n8").values() for _, env in group]
    assert {env.num_nodes for env in envs} == {4}
    per_node = {env.node_rank: env.local_world_size for env in envs}
    assert sum(per_node.values()) == 8 and len(per_node) == 4


def test_concurrent_steps_of_one_allocation_use_different_ports():
    ports = {key: {env.master_port for _, env in group} for key, group in launches_of("salloc_two_concurrent_steps").items()}
    assert len(ports) == 2 and all(len(p) == 1 for p in ports.values())
    assert len(set.union(*ports.values())) == 2


def test_array_tasks_are_separate_jobs_with_separate_ports():
    groups = launches_of("sbatch_array_srun")
    assert len(groups) == 2
    assert len({env.master_port for group in groups.values() for _, env in group}) == 2


def test_mpirun_inside_an_allocation_reads_open_mpi_not_the_daemon_step():
    for environ, env in next(iter(launches_of("salloc_N2_mpirun_np4").values())):
        assert env.launcher == "openmpi"
        assert env.rank == int(environ["OMPI_COMM_WORLD_RANK"])
        assert env.local_rank == int(environ["OMPI_COMM_WORLD_LOCAL_RANK"])


def test_mpirun_inside_an_allocation_wins_even_where_rank_and_size_match_the_daemon_step():
    # The captured `mpirun -np 4` launch, as `mpirun -np 2` with both ranks on node 1 (by-slot mapping): rank 0
    # of 2 is also what the daemon step says (task 0 of 2), but its placement is not (one daemon per node).
    # Reading the step there would put rank 0 on another port than rank 1.
    captured = next(iter(launches_of("salloc_N2_mpirun_np4").values()))[0][0]
    found = []
    for rank in (0, 1):
        environ = {**captured, "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": str(rank),
                   "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
        found.append(detect(environ))
    assert [(env.launcher, env.rank, env.local_world_size) for env in found] == [("openmpi", 0, 2), ("openmpi", 1, 2)]
    assert len({(env.master_addr, env.master_port) for env in found}) == 1


def daemon_step_task(task: int, nodes: int) -> Dict[str, str]:
    """The captured mpirun rank's Slurm variables, as those of daemon `task` of an N-node daemon step."""
    captured = next(iter(launches_of("salloc_N2_mpirun_np4").values()))[0][0]
    everywhere = f"node[1-{nodes}]"
    return {**captured, "SLURM_STEP_NUM_TASKS": str(nodes), "SLURM_STEP_NUM_NODES": str(nodes),
            "SLURM_NTASKS": str(nodes), "SLURM_NNODES": str(nodes), "SLURM_JOB_NUM_NODES": str(nodes),
            "SLURM_STEP_TASKS_PER_NODE": f"1(x{nodes})",
            "SLURM_STEP_NODELIST": everywhere, "SLURM_NODELIST": everywhere, "SLURM_JOB_NODELIST": everywhere,
            "SLURM_PROCID": str(task), "SLURM_NODEID": str(task), "SLURM_GTIDS": str(task), "SLURM_LOCALID": "0",
            "SLURMD_NODENAME": f"node{task + 1}", "SLURM_TOPOLOGY_ADDR": f"node{task + 1}"}


@pytest.mark.parametrize("daemons", [(0, 1), (1, 0), (0, 2, 1)], ids=["in order", "reversed", "rank 0 in place"])
def test_mpirun_inside_an_allocation_is_read_the_same_way_on_every_rank(daemons):
    # One rank per node, on the nodes in `--host` order. Where a rank sits as its node's daemon does (rank 0 of
    # 3 on node 1, task 0 of the daemon step), reading the step there and MPI on its neighbours split the
    # launch in two halves that wait for each other until the timeout.
    found = []
    for rank, daemon in enumerate(daemons):
        environ = {**daemon_step_task(daemon, len(daemons)), "OMPI_COMM_WORLD_SIZE": str(len(daemons)),
                   "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                   "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_NODE_RANK": "0", "PMIX_RANK": str(rank)}
        found.append(detect(environ))
    assert [(env.launcher, env.rank) for env in found] == [("openmpi", rank) for rank in range(len(daemons))]
    assert {(env.master_addr, env.master_port) for env in found} == {(None, None)}  # agreed over MPI at init


@pytest.fixture
def inherited_warnings(caplog):
    caplog.set_level(logging.WARNING, logger="slurmdist")
    return lambda: [r.getMessage() for r in caplog.records if "most likely inherited" in r.getMessage()]


def test_mpi_variables_inherited_into_an_srun_step_get_a_warning(inherited_warnings):
    # A job submitted from inside an `mpirun -np 1` rank: every task of `srun -N2 -n4` carries rank 0 of 1.
    # A step with two tasks on a node cannot be mpirun's daemons (one per node), so the variables are suspect.
    stale = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
             "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "PMIX_NAMESPACE": "prterun-vm-1234@1"}
    task = load_case("slurm/srun_N2_tpn2")[1]
    assert (detect({**task, **stale}).launcher, detect({**task, **stale}).world_size) == ("openmpi", 1)
    (warned,) = inherited_warnings()
    assert "OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE say this process is rank 0 of 1" in warned
    assert "task 1 of 4 of srun step" in warned and "SLURMDIST_LAUNCHER=slurm" in warned
    assert "or each srun task started an mpirun of its own" in warned  # `srun -n2 mpirun ...` warns alike
    forced = detect({**task, **stale, "SLURMDIST_LAUNCHER": "slurm"})
    assert (forced.launcher, forced.rank, forced.world_size) == ("slurm", 1, 4)


def test_mpirun_ranks_inside_a_daemon_step_get_no_warning(inherited_warnings):
    for environ, _ in next(iter(launches_of("salloc_N2_mpirun_np4").values())):
        detect(environ)
    assert inherited_warnings() == []


def test_torchrun_variables_left_over_under_mpirun_get_a_warning(stale_warnings):
    # `eval "$(slurmdist env --format shell)"` in this shell, then mpirun: each rank would train alone.
    ranks = load_case("mpi/openmpi_np4")
    stale = by_hand(RANK=0, WORLD_SIZE=1, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1)
    assert all(detect({**rank, **stale}).world_size == 1 for rank in ranks)  # used, as under srun
    warned = stale_warnings()
    assert len(warned) == 4
    assert all(re.search(r"WORLD_SIZE=1 .* rank [0-3] of 4 .* of this openmpi launch", w) for w in warned)
    assert "mpirun slurmdist run" in warned[0] and "SLURMDIST_LAUNCHER=torchrun" in warned[0]
    placed = [detect({**rank, **by_hand(RANK=int(rank["OMPI_COMM_WORLD_RANK"]), WORLD_SIZE=4,
                                      LOCAL_RANK=int(rank["OMPI_COMM_WORLD_LOCAL_RANK"]), LOCAL_WORLD_SIZE=4)})
              for rank in ranks]
    assert [env.rank for env in placed] == [int(r["OMPI_COMM_WORLD_RANK"]) for r in ranks]
    assert len(stale_warnings()) == 4  # `mpirun slurmdist run` placed them as Open MPI does: no word


def by_hand(**variables: int) -> Dict[str, str]:
    """torchrun's variables as a script exports them itself (no TORCHELASTIC_RUN_ID)."""
    return {name: str(value) for name, value in variables.items()}


@pytest.fixture
def stale_warnings(caplog):
    """The warnings detect() gives about hand-exported torchrun variables, each process's first time."""
    caplog.set_level(logging.WARNING, logger="slurmdist")
    return lambda: [r.getMessage() for r in caplog.records if "set by hand" in r.getMessage()]


@pytest.mark.parametrize("name", ["slurm/srun_N2_tpn2", "mpi/openmpi_np4"])
def test_single_forced_in_a_launch_of_several_runs_each_alone_with_a_warning(name, caplog):
    # `export SLURMDIST_LAUNCHER=single` in the job script for a helper: every later step's tasks train alone.
    caplog.set_level(logging.WARNING, logger="slurmdist")
    for environ in load_case(name):
        env = detect({**environ, "SLURMDIST_LAUNCHER": "single"})
        assert (env.launcher, env.rank, env.world_size) == ("single", 0, 1)  # what was asked for
    warned = [r.getMessage() for r in caplog.records if "SLURMDIST_LAUNCHER=single, but" in r.getMessage()]
    assert len(warned) == 4, caplog.text
    assert re.search(r"is (task|rank) [0-3] of 4 of (srun step 0 of job \d+|this openmpi launch): each", warned[0])
    assert "`SLURMDIST_LAUNCHER=single python prep.py`), not with export" in warned[0]
    caplog.clear()
    for quiet in (load_case("slurm/sbatch_N2_tpn2_batchstep")[0], load_case("slurm/srun_n1")[0], {}):
        detect({**quiet, "SLURMDIST_LAUNCHER": "single"})  # the helper it is meant for: no word
    assert "SLURMDIST_LAUNCHER=single, but" not in caplog.text


def test_torchrun_variables_exported_once_in_the_job_script_get_a_warning_in_every_task_they_misplace(stale_warnings):
    # `export RANK=$SLURM_PROCID ...` in the batch script: every task inherits the batch step's 0.
    tasks = load_case("slurm/srun_N2_tpn2")
    stale = by_hand(RANK=0, WORLD_SIZE=4, LOCAL_RANK=0, LOCAL_WORLD_SIZE=2)
    assert detect({**tasks[0], **stale}).launcher == "torchrun" and stale_warnings() == []  # task 0: in its place
    for task in tasks[1:]:
        env = detect({**task, **stale})
        assert (env.launcher, env.rank) == ("torchrun", 0)  # used as set: no task can tell a mistake from a plan
    warned = stale_warnings()
    assert len(warned) == 3 and all(re.search(r"RANK=0 WORLD_SIZE=4 .* task [1-3] of 4", w) for w in warned)
    assert "exported once in the job script" in warned[0].lower() and "SLURMDIST_LAUNCHER=torchrun" in warned[0]
    detect({**tasks[1], **stale})
    assert len(stale_warnings()) == 3  # once per process, however often detect() runs


def test_the_warning_waits_for_a_detect_that_can_show_it(stale_warnings):
    # A log line that works out its rank runs detect() with slurmdist's records dropped: that does not count.
    from slurmdist.logs import rank_and_size

    environ = {**load_case("slurm/srun_N2_tpn2")[1], **by_hand(RANK=0, WORLD_SIZE=4, LOCAL_RANK=0, LOCAL_WORLD_SIZE=2)}
    assert rank_and_size(environ) == (0, 4) and stale_warnings() == []
    detect(environ)
    assert len(stale_warnings()) == 1


def test_torchrun_variables_of_a_smaller_world_get_a_warning_unless_forced(stale_warnings):
    # A notebook's RANK=0 WORLD_SIZE=1, or an evaluation helper's on purpose: each task would train alone.
    task = load_case("slurm/srun_N2_tpn2")[2]
    assert detect({**task, **by_hand(RANK=0, WORLD_SIZE=1, LOCAL_RANK=0)}).world_size == 1
    assert len(stale_warnings()) == 1 and "task 2 of 4" in stale_warnings()[0]
    forced = {**task, **by_hand(RANK=0, WORLD_SIZE=1, LOCAL_RANK=0), "SLURMDIST_LAUNCHER": "torchrun", "RANK": "1",
              "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    assert detect(forced).world_size == 2 and len(stale_warnings()) == 1  # meant: no word


def test_torchrun_variables_of_a_launcher_inside_the_tasks_or_torchrun_itself_are_used(stale_warnings):
    tasks = load_case("slurm/srun_N2_tpn2")
    for index, task in enumerate(tasks):  # one launcher per task starting two workers each: 8 ranks
        for worker in (0, 1):
            exported = by_hand(RANK=2 * index + worker, WORLD_SIZE=8, LOCAL_RANK=2 * (index % 2) + worker,
                               LOCAL_WORLD_SIZE=4)
            assert detect({**task, **exported}).rank == 2 * index + worker
        # torchrun's own (TORCHELASTIC_RUN_ID) are never second-guessed
        torchrun = {**by_hand(RANK=0, WORLD_SIZE=1, LOCAL_RANK=0), "TORCHELASTIC_RUN_ID": "42"}
        assert detect({**task, **torchrun}).world_size == 1
    assert stale_warnings() == []


def test_torchrun_variables_that_mpirun_inside_the_allocation_placed_are_used(stale_warnings):
    # `mpirun slurmdist run -- python train.py` in an allocation: the ranks carry the daemon step's variables,
    # and the exported ones place them as Open MPI does (here 2 ranks on node 1, as many as the daemon step's tasks).
    captured = next(iter(launches_of("salloc_N2_mpirun_np4").values()))[0][0]
    for rank in (0, 1):
        environ = {**captured, "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": str(rank),
                   "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
        exported = by_hand(RANK=rank, WORLD_SIZE=2, LOCAL_RANK=rank, LOCAL_WORLD_SIZE=2)
        assert (detect({**environ, **exported}).launcher, detect({**environ, **exported}).rank) == ("torchrun", rank)
    assert stale_warnings() == []


def test_a_heterogeneous_step_meets_on_its_first_components_node_and_counts_each_nodes_tasks():
    # `srun -w node2 -n1 : -w node1 -n2`: task 0 runs on node2, but Slurm sorts the step's nodelist (node[1-2])
    # and its layout (2,1) by name, while SLURM_NODEID follows the tasks (node2 is node 0).
    found = [detect(environ) for environ in load_case(case_path("srun_het_N2"))]
    assert [(env.rank, env.local_rank, env.local_world_size, env.node_rank) for env in found] == [
        (0, 0, 1, 0), (1, 0, 2, 1), (2, 1, 2, 1)]
    assert {(env.master_addr, env.master_port) for env in found} == {("node2", found[0].master_port)}


def test_a_step_of_one_component_of_a_heterogeneous_job_meets_on_its_own_first_node():
    # `srun --het-group=1` in that allocation: only node1's two tasks. The job's variables still say
    # heterogeneous, but the first component (node2) is not in the step, so task 0 is on node1.
    task = load_case(case_path("srun_het_N2"))[1]
    environ = {**task, "SLURM_STEP_NODELIST": "node1", "SLURM_JOB_NODELIST": "node1", "SLURM_NODELIST": "node1",
               "SLURM_STEP_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1",
               "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2", "SLURM_STEP_TASKS_PER_NODE": "2",
               "SLURM_TASKS_PER_NODE": "2", "SLURM_NODEID": "0", "SLURM_PROCID": "0"}
    env = detect(environ)
    assert (env.master_addr, env.local_world_size, env.world_size) == ("node1", 2, 2)


def test_a_step_with_part_of_the_first_component_meets_on_that_components_node_in_the_step():
    # `srun -N1 -n1 --het-group=0 : --het-group=1 -n2` in the 3-node allocation (component 0 = node[2-3],
    # component 1 = node1): the step has node2 (task 0) and node1; the component's list stays the allocation's.
    task = load_case(case_path("srun_het_N3"))[0]
    environ = {**task, "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_NODELIST": "node[1-2]", "SLURM_STEP_NUM_NODES": "2",
               "SLURM_NNODES": "2", "SLURM_STEP_NUM_TASKS": "3", "SLURM_NTASKS": "3", "SLURM_NPROCS": "3",
               "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_TASKS_PER_NODE": "2,1", "SLURMD_NODENAME": "node2",
               "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    env = detect(environ)
    assert (env.master_addr, env.world_size, env.local_world_size) == ("node2", 3, 1)


@pytest.mark.parametrize("nodelists", [
    {"SLURM_STEP_NODELIST": "node[1-3]"},  # one node more than the step has: named as the contradiction
    # Only the job's list, longer than the step: it cannot place the node (this raised IndexError too).
    {"SLURM_STEP_NODELIST": None, "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_NODELIST": "node[1-3]"},
])
def test_a_heterogeneous_step_whose_nodelist_disagrees_with_its_node_count(nodelists):
    # This node (node3) sits past the end of the step's layout: an error naming the list, or SLURM_NODEID.
    task = load_case(case_path("srun_het_N2"))[1]
    environ = {name: value for name, value in {**task, **nodelists, "SLURMD_NODENAME": "node3"}.items() if value}
    if nodelists.get("SLURM_STEP_NODELIST"):
        with pytest.raises(LaunchError, match=r"SLURM_STEP_NODELIST='node\[1-3\]' names 3 hosts but the step has 2"):
            detect(environ)
    else:
        node = int(task["SLURM_NODEID"])
        env = detect(environ)
        assert (env.node_rank, env.local_world_size) == (node, int(task["SLURM_STEP_TASKS_PER_NODE"].split(",")[node]))


def test_an_empty_step_id_variable_leaves_the_other_spelling_to_say():
    for task in load_case(case_path("srun_N2_tpn2")):
        step = task.get("SLURM_STEP_ID") or task["SLURM_STEPID"]
        for empty, other in (("SLURM_STEP_ID", "SLURM_STEPID"), ("SLURM_STEPID", "SLURM_STEP_ID")):
            env = detect({**task, empty: "", other: step})
            assert (env.launcher, env.rank, env.world_size) == ("slurm", int(task["SLURM_PROCID"]), int(task["SLURM_STEP_NUM_TASKS"]))


def test_srun_with_pmi2_from_the_cluster_is_slurm():
    for _, env in next(iter(launches_of("srun_pmi2_N2_n4").values())):
        assert env.launcher == "slurm"


def srun_default_tasks(environ: dict) -> int:
    """How many tasks a plain `srun` in this job starts (Slurm's rule): -n when given, else one task per
    node (or --ntasks-per-node each). SLURM_TASKS_PER_NODE alone is CPUs, not tasks (the exclusive capture)."""
    if "SLURM_NTASKS" in environ:
        return int(environ["SLURM_NTASKS"])
    return int(environ["SLURM_JOB_NUM_NODES"]) * int(environ.get("SLURM_NTASKS_PER_NODE", "1"))


@pytest.mark.parametrize("name", BATCH)
def test_batch_scripts_fail_fast_unless_srun_would_start_one_task(name):
    for environ in load_case(case_path(name)):
        tasks = srun_default_tasks(environ)
        if "SLURM_STEP_ID" in environ:  # submitted from inside an srun task, whose step variables it inherited
            with pytest.raises(LaunchError, match="left over from another srun step"):
                detect(environ)
        elif tasks > 1:
            with pytest.raises(LaunchError, match="srun"):
                detect(environ)
        else:
            env = detect(environ)
            assert (env.launcher, env.world_size) == ("single", 1)


def test_a_batch_script_submitted_from_an_srun_task_refuses_the_step_variables_it_inherited():
    # Rank 0 of `srun -N2 -n2` ran `sbatch -N1 -n1 --wrap "python eval.py"`: the new job's batch script carries
    # the old step's SLURM_STEP_* beside its own job's variables. Read as they stand it was rank 0 of 2, and
    # init() waited its whole timeout for a rank 1 that never comes.
    (environ,) = load_case("slurm/sbatch_from_srun_task_batchstep")
    assert environ["SLURM_STEP_NUM_NODES"] == "2" and environ["SLURM_NNODES"] == "1"
    with pytest.raises(LaunchError) as raised:
        detect(environ)
    message = str(raised.value)
    assert "SLURM_STEP_NUM_NODES=2 but SLURM_NNODES=1" in message and "unset ${!SLURM_STEP_@} SLURM_STEPID" in message
    assert (raised.value.variable, raised.value.value) == ("SLURM_STEP_NUM_NODES", "2")
    # What the advice leaves is the batch script of a one-task job: one process.
    unset = {name: value for name, value in environ.items() if not name.startswith("SLURM_STEP")}
    assert (detect(unset).launcher, detect(unset).world_size) == ("single", 1)
    # SLURMDIST_LAUNCHER=slurm takes the step as it stands (a nested `srun -E` inside a smaller step).
    assert detect({**environ, "SLURMDIST_LAUNCHER": "slurm"}).world_size == 2


def test_more_tasks_in_the_step_than_the_job_says_is_only_a_warning_as_srun_preserve_env_makes_it(caplog):
    # `srun -E -n8 -c1` in a job of `-n2 -c4`: a real step whose tasks see the job's SLURM_NTASKS=2. A one-node
    # job submitted from a one-node step of several tasks looks the same, so a warning, not an error.
    caplog.set_level(logging.WARNING, logger="slurmdist")
    tasks = load_case("slurm/srun_preserve_env_n8_in_n2_job")
    assert {(t["SLURM_STEP_NUM_TASKS"], t["SLURM_NTASKS"]) for t in tasks} == {("8", "2")}
    assert sorted(detect(task).rank for task in tasks) == list(range(8))
    warned = [r.getMessage() for r in caplog.records if "SLURM_STEP_NUM_TASKS=8 but SLURM_NTASKS=2" in r.getMessage()]
    assert len(warned) == 1 and "--preserve-env (-E)" in warned[0] and "SLURMDIST_LAUNCHER=slurm silences" in warned[0]
    caplog.clear()
    notices.forget()
    assert detect({**tasks[5], "SLURMDIST_LAUNCHER": "slurm"}).rank == 5
    assert "but SLURM_NTASKS" not in caplog.text


def test_a_step_that_srun_started_in_another_job_is_read_as_that_step():
    # `srun --jobid=B` from job A: the task keeps A's SLURM_JOB_ID and SLURM_JOB_NODELIST, but srun set
    # SLURM_NNODES and SLURM_NTASKS to the step's own counts, so its step variables are not taken for left over.
    (environ,) = load_case("slurm/srun_jobid_of_other_job")
    assert environ["SLURM_JOB_NODELIST"] != environ["SLURM_STEP_NODELIST"]
    env = detect(environ)
    assert (env.launcher, env.world_size, env.master_addr) == ("slurm", 1, environ["SLURMD_NODENAME"])


def test_an_exclusive_job_without_a_task_count_is_one_process():
    # sbatch --exclusive (or --gres=gpu:1 --cpus-per-gpu=8) and `python train.py`: no -n, so Slurm's
    # SLURM_TASKS_PER_NODE=8 counts CPUs. One process is what the job asked for.
    (environ,) = load_case("slurm/sbatch_exclusive_batchstep")
    assert "SLURM_NTASKS" not in environ and environ["SLURM_TASKS_PER_NODE"] == "8"
    env = detect(environ)
    assert (env.launcher, env.world_size) == ("single", 1)


def test_two_nodes_without_a_task_count_name_sruns_default():
    (environ,) = load_case("slurm/sbatch_N2_no_n_batchstep")
    with pytest.raises(LaunchError, match=r"asked for 2 tasks \(SLURM_NNODES=2, one task per node\)"):
        detect(environ)


@pytest.mark.parametrize("name", SALLOC)
def test_salloc_shells_are_single_processes_with_a_warning(name, caplog):
    (environ,) = load_case(case_path(name))
    with caplog.at_level(logging.WARNING, logger="slurmdist"):
        env = detect(environ)
    assert env.launcher == "single" and "srun" in caplog.text

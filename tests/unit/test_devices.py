"""Device ordinals over captured Slurm environments with fake device counts (no GPU here)."""

from __future__ import annotations

import pytest

from slurmdist.detection import detect, is_own_srun_task
from slurmdist.devices import DevicePlan, device_ordinal, gpus_per_task, listed, narrowed_per_task, plan
from slurmdist.errors import BackendError
from slurmdist.exporting import torchrun_variables


def ordinal(environ, count, device_type="cuda", **kw):
    """The ordinal init() binds: the same detection and own-task test as slurmdist.process_group."""
    env = detect(environ)
    return device_ordinal(device_type, env.local_rank, env.local_world_size, count, environ,
                          task_is_rank=is_own_srun_task(env, environ), **kw)


def under_slurmdist_run(task):
    """What `srun slurmdist run -- python train.py` hands the command in this srun task."""
    return {**task, **torchrun_variables(detect(task)), "TORCHELASTIC_USE_AGENT_STORE": "True"}


def test_gpus_per_node_picks_by_local_rank(case):
    tasks = case("slurm/srun_gpus_per_node2")
    assert [ordinal(t, 2) for t in tasks] == [detect(t).local_rank for t in tasks]


def test_gpus_per_task_leaves_each_task_ordinal_zero(case):
    # --gpus-per-task=1: the step owns two GPUs on the node, each task sees only its own.
    for index, task in enumerate(case("slurm/srun_gpus_per_node2")):
        narrowed = {**task, "CUDA_VISIBLE_DEVICES": str(index % 2), "SLURM_GPUS_PER_TASK": "1"}
        assert narrowed_per_task(narrowed, "cuda", 1, task_is_rank=True)
        assert ordinal(narrowed, 1) == 0


@pytest.mark.parametrize("variables, expected", [
    ({"SLURM_GPUS_PER_TASK": "a100:2"}, 2),
    ({"SLURMD_TRES_BIND": "gres/gpu:per_task:1"}, 1),
    ({"SLURM_TRES_PER_TASK": "cpu:4,gres/gpu:2"}, 2),
    ({"SLURM_GPUS_PER_TASK": "7" * 5000}, None),  # past Python's int() limit: corrupt, not a request
    ({"SLURM_TRES_PER_TASK": "gres/gpu:" + "7" * 5000}, None),
])
def test_gpus_per_task_from_each_variable_slurm_exports(variables, expected):
    assert gpus_per_task(variables) == expected


def test_step_gpus_longer_than_visible_means_narrowed(case):
    task = {**case("slurm/srun_gpus_per_node2")[1], "CUDA_VISIBLE_DEVICES": "1"}
    assert ordinal(task, 1) == 0


def test_captured_gpus_per_task_launch_gives_every_task_ordinal_zero(case):
    tasks = case("slurm/srun_N2_tpn2_gpus_per_task1")
    assert [ordinal({**t, "CUDA_VISIBLE_DEVICES": "0"}, 1) for t in tasks] == [0] * len(tasks)


def test_slurmdist_run_under_gpus_per_task_binds_each_tasks_own_gpu(case):
    # srun --gpus-per-task=1 slurmdist run -- python train.py: the command reads torchrun's variables, but
    # each process is still its own srun task with its own GPU.
    for task in case("slurm/srun_N2_tpn2_gpus_per_task1"):
        child = under_slurmdist_run(task)
        assert detect(child).launcher == "torchrun" and is_own_srun_task(detect(child), child)
        assert ordinal(child, 1) == 0


def test_a_job_script_exporting_ranks_that_disagree_with_the_step_is_not_its_own_task(case):
    task = case("slurm/srun_N2_tpn2_gpus_per_task1")[1]
    child = {**under_slurmdist_run(task), "LOCAL_RANK": "0", "RANK": "0"}
    assert not is_own_srun_task(detect(child), child)  # detect() warns about them (test_detect_captured)


@pytest.mark.parametrize("variables, expected", [
    ({"SLURM_GPUS_PER_TASK": "2"}, 2),
    ({"SLURM_GPUS_PER_TASK": "a100:2"}, 2),
    ({"SLURMD_TRES_BIND": "gpu:per_task:2"}, 2),          # srun's tasks, Slurm 22.05 (captured below)
    ({"SLURMD_TRES_BIND": "gres/gpu:verbose,per_task:3"}, 3),
    ({"SLURM_TRES_PER_TASK": "cpu:4,gres/gpu:2"}, 2),     # Slurm 23.11+
    ({"SLURM_TRES_PER_TASK": "gres/gpu:a100:1"}, 1),
    ({"SLURM_TRES_PER_TASK": "cpu=4,gres/gpu=2"}, 2),
    ({"SLURMD_TRES_BIND": "gpu:closest"}, None),
    ({"SLURM_TRES_PER_TASK": "cpu:4"}, None),
    ({}, None),
])
def test_gpus_per_task_from_whichever_variable_carries_it(variables, expected):
    assert gpus_per_task(variables) == expected


def test_captured_gpus_per_task_two_gives_each_task_ordinal_zero(case):
    # srun -N2 --ntasks-per-node=2 --gpus-per-task=2 on nodes with 4 GPUs: srun's tasks carry no
    # SLURM_GPUS_PER_TASK, only SLURMD_TRES_BIND; each sees its own two GPUs.
    tasks = case("slurm/srun_N2_tpn2_gpus_per_task2")
    assert all("SLURM_GPUS_PER_TASK" not in t for t in tasks)
    assert [gpus_per_task(t) for t in tasks] == [2] * len(tasks)
    assert [ordinal(t, len(t["CUDA_VISIBLE_DEVICES"].split(","))) for t in tasks] == [0] * len(tasks)
    assert [ordinal(under_slurmdist_run(t), 2) for t in tasks] == [0] * len(tasks)


def test_gpus_per_task_n_owned_by_the_task_is_ordinal_zero(case):
    # --ntasks-per-node=2 --gpus-per-task=2 on a 4-GPU node: each task sees its own two.
    task = {**case("slurm/srun_N2_tpn2")[1], "SLURM_GPUS_PER_TASK": "2", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert ordinal(task, 2) == 0


def torchrun_child(case, local_rank, nproc):
    """The captured torchrun --standalone rank, renumbered as local rank `local_rank` of `nproc`."""
    captured = case("torchrun/standalone_np4")[0]
    numbers = {"RANK": local_rank, "LOCAL_RANK": local_rank, "ROLE_RANK": local_rank, "WORLD_SIZE": nproc,
               "LOCAL_WORLD_SIZE": nproc, "ROLE_WORLD_SIZE": nproc}
    return {**captured, **{name: str(value) for name, value in numbers.items()}}


def test_torchrun_ranks_inside_one_narrowed_task_pick_by_local_rank(case):
    # srun --ntasks-per-node=1 --gpus-per-task=4 torchrun --nproc-per-node=4: the four ranks share the
    # task's four GPUs, so ordinal 0 for all of them would stack them on one GPU.
    slurm_task = case("slurm/srun_gpus_per_node2")[0]
    for local_rank in range(4):
        child = torchrun_child(case, local_rank, 4)
        environ = {**slurm_task, **child, "SLURM_GPUS_PER_TASK": "4", "SLURM_GPUS_ON_NODE": "4",
                   "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
        assert detect(environ).launcher == "torchrun"
        assert ordinal(environ, 4) == local_rank


def test_torchrun_on_part_of_a_nodes_gpus_picks_by_local_rank(case):
    # CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node=2 inside a job that owns four GPUs on the node.
    slurm_task = {**case("slurm/srun_gpus_per_node2")[0], "SLURM_STEP_GPUS": "0,1,2,3", "SLURM_GPUS_ON_NODE": "4"}
    for local_rank in range(2):
        environ = {**slurm_task, **torchrun_child(case, local_rank, 2), "CUDA_VISIBLE_DEVICES": "0,1"}
        assert ordinal(environ, 2) == local_rank


def test_tasks_sharing_several_gpus_pick_by_local_rank_not_all_zero(case):
    # --gpu-bind=closest: two tasks see the same two GPUs of their socket; both on ordinal 0 would share one.
    first, second = case("slurm/srun_N2_tpn2")[:2]
    shared = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_GPUS_ON_NODE": "4"}
    assert [ordinal({**t, **shared}, 2) for t in (first, second)] == [0, 1]


def test_one_gpu_on_the_node_is_not_a_task_of_its_own(case):
    # Two tasks, one GPU in the whole step on this node: both would land on it. That is the mistake the
    # error is for, not a per-task narrowing.
    task = {**case("slurm/srun_N2_tpn2")[1], "CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "1",
            "SLURM_STEP_GPUS": "0"}
    with pytest.raises(BackendError, match="2 tasks on this node but only 1 cuda device"):
        ordinal(task, 1)


def test_more_tasks_than_devices_is_an_error_naming_the_variable(case):
    task = {**case("slurm/srun_N2_tpn2")[1], "CUDA_VISIBLE_DEVICES": "0"}
    with pytest.raises(BackendError, match="CUDA_VISIBLE_DEVICES='0'.*SLURMDIST_SHARE_DEVICES"):
        ordinal(task, 1)


def test_more_tasks_than_devices_stops_every_rank_of_the_node_not_only_those_without_one(case):
    # srun -n8 on a node with 4 GPUs: ranks 0-3 would otherwise wait out the rendezvous for 4-7.
    for local_rank in range(8):
        with pytest.raises(BackendError, match="8 tasks on this node but only 4 cuda .* local ranks 4-7"):
            device_ordinal("cuda", local_rank, 8, 4, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert [device_ordinal("cuda", r, 4, 4, {}) for r in range(4)] == [0, 1, 2, 3]


def test_a_rank_given_its_own_device_by_another_launcher_is_told_how_to_say_so():
    # jsrun -g1, or an affinity script exporting CUDA_VISIBLE_DEVICES per rank: one device each, not a mistake.
    with pytest.raises(BackendError, match="SLURMDIST_SHARE_DEVICES=1 .* jsrun -g1"):
        device_ordinal("cuda", 1, 6, 1, {"CUDA_VISIBLE_DEVICES": "1"})
    assert device_ordinal("cuda", 1, 6, 1, {"CUDA_VISIBLE_DEVICES": "1", "SLURMDIST_SHARE_DEVICES": "1"}) == 0


def test_sharing_when_asked(case):
    task = {**case("slurm/srun_N2_tpn2")[1], "SLURMDIST_SHARE_DEVICES": "1"}
    assert ordinal(task, 1) == 0
    assert ordinal(case("slurm/srun_N2_tpn2")[1], 1, share=True) == 0


def test_no_visible_device_is_an_error(case):
    with pytest.raises(BackendError, match="no cuda device"):
        ordinal(case("slurm/srun_N2_tpn2")[0], 0)


def test_openmpi_local_rank_order_is_respected(case):
    # Open MPI's local ranks are not world-rank order (0,2,1,3): each still gets a distinct device.
    ordinals = [ordinal(t, 4) for t in case("mpi/openmpi_np4")]
    assert sorted(ordinals) == [0, 1, 2, 3]
    assert ordinals == [detect(t).local_rank for t in case("mpi/openmpi_np4")]


def test_npu_uses_ascend_variable():
    environ = {"ASCEND_RT_VISIBLE_DEVICES": "4"}
    with pytest.raises(BackendError, match="ASCEND_RT_VISIBLE_DEVICES='4'.*ASCEND_RT_VISIBLE_DEVICES=.SLURM_LOCALID"):
        device_ordinal("npu", 1, 2, 1, environ)  # not an srun task of its own: the ranks share one NPU
    assert device_ordinal("npu", 1, 2, 2, environ) == 1


def test_npu_narrowed_per_task_is_ordinal_zero(case):
    # The usual recipe, `export ASCEND_RT_VISIBLE_DEVICES=$SLURM_LOCALID` in each srun task of an 8-NPU node.
    for task in case("slurm/srun_N2_tpn2"):
        narrowed = {**task, "ASCEND_RT_VISIBLE_DEVICES": task["SLURM_LOCALID"]}
        assert ordinal(narrowed, 1, device_type="npu") == 0
        assert ordinal(under_slurmdist_run(narrowed), 1, device_type="npu") == 0
    # The same line in the batch script instead expands once, to the batch step's 0: every task on NPU 0.
    for task in case("slurm/srun_N2_tpn2"):
        stacked = {**task, "ASCEND_RT_VISIBLE_DEVICES": "0"}
        for environ in (stacked, under_slurmdist_run(stacked)):
            if environ["SLURM_LOCALID"] == "0":
                assert ordinal(environ, 1, device_type="npu") == 0
                continue
            with pytest.raises(BackendError, match=r"local rank 1 sees only NPU 0 .*in the batch script "
                                                   r"\(an export, or inside srun bash"):
                ordinal(environ, 1, device_type="npu")
            assert ordinal({**environ, "SLURMDIST_SHARE_DEVICES": "1"}, 1, device_type="npu") == 0
    # Two NPUs left to a task of two local ranks: local rank picks among them, as before.
    assert ordinal({**case("slurm/srun_N2_tpn2")[1], "ASCEND_RT_VISIBLE_DEVICES": "2,3"}, 2, device_type="npu") == 1


def test_a_visibility_list_longer_than_torch_counts_is_not_taken_for_one_gpu_per_task(case):
    # srun --gpus-per-node=2 (captured): both tasks see "0,1". Torch counts 1 when a listed GPU is gone
    # (CUDA stops at the first unusable entry) or they are MIG instances (a process uses only the first).
    for task in case("slurm/srun_gpus_per_node2"):
        assert len(listed(task["CUDA_VISIBLE_DEVICES"])) == 2 and task["SLURM_GPUS_ON_NODE"] == "2"
        assert not narrowed_per_task(task, "cuda", 1, task_is_rank=True)
        with pytest.raises(BackendError, match=r"2 ranks on this node need a cuda device each, and "
                                               r"CUDA_VISIBLE_DEVICES='0,1' lists 2, but torch sees only 1: "
                                               r".*MIG instances.*srun --ntasks-per-node=2 --gpus-per-task=1.*"
                                               r"SLURMDIST_SHARE_DEVICES=1"):
            plan("cuda", detect(task).local_rank, 2, 1, task, task_is_rank=True, backend="nccl")
        mig = {**task, "CUDA_VISIBLE_DEVICES": "MIG-aaaa,MIG-bbbb"}
        with pytest.raises(BackendError, match="CUDA_VISIBLE_DEVICES='MIG-aaaa,MIG-bbbb' lists 2"):
            ordinal(mig, 1)
        assert ordinal({**mig, "SLURMDIST_SHARE_DEVICES": "1"}, 1) == 0
    # One process alone needs one device: the first it sees is fine. So is one listed GPU per task.
    assert device_ordinal("cuda", 0, 1, 1, {"CUDA_VISIBLE_DEVICES": "0,1"}) == 0
    assert ordinal({**case("slurm/srun_gpus_per_node2")[1], "CUDA_VISIBLE_DEVICES": "1"}, 1) == 0
    with pytest.raises(BackendError, match="ASCEND_RT_VISIBLE_DEVICES='0,1' lists 2.*npu-smi"):
        device_ordinal("npu", 1, 2, 1, {"ASCEND_RT_VISIBLE_DEVICES": "0,1"}, task_is_rank=True)
    # Ranks torchrun starts inside one task: the advice is theirs, not srun's.
    with pytest.raises(BackendError, match=r"torchrun --nproc-per-node=2"):
        device_ordinal("cuda", 1, 2, 1, {"CUDA_VISIBLE_DEVICES": "0,1"})


def test_a_rocm_wrapper_that_gives_each_rank_its_gpu_through_hip_is_still_narrowed():
    # Slurm sets CUDA_VISIBLE_DEVICES and ROCR_VISIBLE_DEVICES to the node's 8 GPUs on AMD nodes too; a per-rank
    # wrapper narrows HIP_VISIBLE_DEVICES (or ROCR_VISIBLE_DEVICES) to the rank's own, which torch then sees alone.
    eight = ",".join(map(str, range(8)))
    base = {"SLURM_STEP_GPUS": eight, "CUDA_VISIBLE_DEVICES": eight, "SLURM_GPUS_ON_NODE": "8"}
    for wrapper in ({"ROCR_VISIBLE_DEVICES": eight, "HIP_VISIBLE_DEVICES": "3"}, {"ROCR_VISIBLE_DEVICES": "3"}):
        assert plan("cuda", 3, 8, 1, {**base, **wrapper}, task_is_rank=True, backend="nccl").ordinal == 0


def test_a_binding_count_of_another_resource_is_not_the_gpus():
    assert gpus_per_task({"SLURMD_TRES_BIND": "gres/gpu:closest+gres/nic:per_task:1"}) is None
    assert gpus_per_task({"SLURMD_TRES_BIND": "gres/nic:closest+gres/gpu:per_task:2"}) == 2


def test_npu_messages_name_the_container_runtimes_variable():
    with pytest.raises(BackendError, match="ASCEND_VISIBLE_DEVICES='1'") as raised:
        plan("npu", 1, 4, 1, {"ASCEND_VISIBLE_DEVICES": "1"}, task_is_rank=True, backend="hccl")
    assert "ASCEND_RT_VISIBLE_DEVICES is not set" not in str(raised.value)


def test_an_explicit_ordinal_past_the_visible_devices_says_they_count_from_zero():
    with pytest.raises(BackendError, match=r"cuda:3 asked for, .*CUDA_VISIBLE_DEVICES='3'.*counts within the "
                                           r"visible devices, from 0.*device='cuda:N' with N below 1"):
        plan("cuda", 0, 1, 1, {"CUDA_VISIBLE_DEVICES": "3"}, index=3)


def test_rocm_messages_show_the_variables_slurm_set(case):
    # On ROCm nodes Slurm sets ROCR_VISIBLE_DEVICES (and CUDA_VISIBLE_DEVICES); the message shows each.
    task = {**case("slurm/srun_N2_tpn2")[1], "ROCR_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0"}
    with pytest.raises(BackendError, match="HIP_VISIBLE_DEVICES='0', ROCR_VISIBLE_DEVICES='0'"):
        ordinal(task, 1)
    with pytest.raises(BackendError, match="CUDA_VISIBLE_DEVICES is not set"):
        ordinal(case("slurm/srun_N2_tpn2")[1], 0)


def test_plan():
    assert plan("cpu", 3, 4, 0, {}) == DevicePlan("cpu", None)
    assert plan("cpu", 3, 4, 0, {}).device_ids is None
    cuda = plan("cuda", 1, 2, 2, {})
    assert (cuda.device, cuda.device_ids) == ("cuda:1", (1,))
    assert plan("cuda", 1, 2, 4, {}, index=3).device == "cuda:3"
    with pytest.raises(BackendError, match="cuda:5"):
        plan("cuda", 0, 1, 2, {}, index=5)


def test_never_writes_the_environment(case):
    task = case("slurm/srun_gpus_per_node2")[1]
    before = dict(task)
    ordinal(task, 2)
    assert task == before


def test_one_gpu_each_but_fewer_gpus_on_the_node_than_tasks_is_refused(case):
    # srun -n4 --gpus-per-node=2 --gpu-bind=closest, one GPU per socket: each task sees one GPU, but two tasks
    # see the same one. Ordinal 0 everywhere would stack them without a word.
    tasks = [case("slurm/srun_N2_tpn2")[0]] * 4
    for local_rank in range(4):
        # Slurm narrows SLURM_STEP_GPUS with the task's binding (see srun_N2_tpn2_gpus_per_task1).
        environ = {**tasks[local_rank], "CUDA_VISIBLE_DEVICES": str(local_rank % 2),
                   "SLURM_STEP_GPUS": str(local_rank % 2), "SLURM_GPUS_ON_NODE": "2"}
        with pytest.raises(BackendError, match=r"4 tasks on this node but only 2 cuda device\(s\) on it "
                                               r"\(SLURM_GPUS_ON_NODE=2\).* local ranks 2-3 have no device"):
            device_ordinal("cuda", local_rank, 4, 1, environ, task_is_rank=True)
        assert device_ordinal("cuda", local_rank, 4, 1, {**environ, "SLURMDIST_SHARE_DEVICES": "1"},
                              task_is_rank=True) == 0
    # As many tasks as the node's GPUs, one each: the per-task narrowing stands.
    assert device_ordinal("cuda", 1, 2, 1, {"CUDA_VISIBLE_DEVICES": "1", "SLURM_GPUS_ON_NODE": "2"},
                          task_is_rank=True) == 0


def test_tasks_left_a_shared_part_of_enough_gpus_are_told_to_ask_for_one_each():
    # srun -n4 --gpus-per-node=4 --gpu-bind=closest, two GPUs per socket: each task sees its socket's two. The
    # node has a GPU per task, so "start fewer tasks" would be the wrong advice.
    for local_rank, visible in enumerate(["0,1", "2,3", "0,1", "2,3"]):
        environ = {"CUDA_VISIBLE_DEVICES": visible, "SLURM_GPUS_ON_NODE": "4", "SLURMD_TRES_BIND": "gpu:closest"}
        with pytest.raises(BackendError, match=r"4 tasks on this node, which has 4 GPUs \(SLURM_GPUS_ON_NODE=4\), "
                                               r"but Slurm left this task 2 of them .*--gpus-per-task=1"):
            device_ordinal("cuda", local_rank, 4, 2, environ, task_is_rank=True)
        # Ranks torchrun starts inside one task share what it sees: the generic advice stands for them.
        with pytest.raises(BackendError, match="torchrun --nproc-per-node=2"):
            device_ordinal("cuda", local_rank, 4, 2, environ, task_is_rank=False)


def test_the_steps_own_gpus_per_task_wins_over_the_jobs_inherited_one():
    # sbatch --gpus-per-task=1 (exported as SLURM_GPUS_PER_TASK), then `srun -n4 --gpus-per-task=2` in the script.
    step = {"SLURM_GPUS_PER_TASK": "1", "SLURMD_TRES_BIND": "gpu:per_task:2", "SLURM_GPUS_ON_NODE": "8",
            "SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert gpus_per_task(step) == 2
    assert device_ordinal("cuda", 1, 4, 2, step, task_is_rank=True) == 0
    assert gpus_per_task({"SLURM_GPUS_PER_TASK": "a100:2", "SLURMD_TRES_BIND": "gres/gpu:closest"}) == 2


@pytest.mark.parametrize("value", ["y", "2", "enable"])
def test_a_share_setting_that_is_neither_yes_nor_no_is_refused_naming_it(value):
    with pytest.raises(BackendError, match=f"SLURMDIST_SHARE_DEVICES='{value}' is neither yes nor no"):
        device_ordinal("cuda", 3, 4, 2, {"SLURMDIST_SHARE_DEVICES": value})
    assert device_ordinal("cuda", 3, 4, 2, {"SLURMDIST_SHARE_DEVICES": " On "}) == 1


def test_ranks_of_a_launcher_inside_one_task_are_told_the_launchers_way_out():
    with pytest.raises(BackendError, match=r"local rank 1 has no device .*torchrun --nproc-per-node=1"):
        device_ordinal("cuda", 0, 2, 1, {"CUDA_VISIBLE_DEVICES": "0"}, task_is_rank=False)


def test_gpus_per_task_overridden_by_an_explicit_gpu_bind_is_not_told_to_add_one():
    # srun --gpus-per-task=1 --gpu-bind=closest: the explicit bind replaces per_task:1 (srun's manual), so each
    # task sees its socket's GPUs. Advice to add --gpu-bind=closest would bring back this very error.
    environ = {"SLURMD_TRES_BIND": "gpu:closest", "SLURM_GPUS_PER_TASK": "1", "SLURM_GPUS_ON_NODE": "4",
               "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "0,1"}
    with pytest.raises(BackendError) as refused:
        device_ordinal("cuda", 1, 4, 2, environ, task_is_rank=True)
    said = str(refused.value)
    assert "asked for --gpus-per-task=1, but an explicit --gpu-bind (SLURMD_TRES_BIND='gpu:closest') replaced" in said
    assert "--gpus-per-task=1 without --gpu-bind, or --gpu-bind=single:1" in said
    assert "with --gpu-bind=closest" not in said


def test_gpus_per_task_two_with_an_explicit_closest_bind_is_not_taken_as_each_tasks_own():
    # srun -n4 --gpus-per-task=2 --gpu-bind=closest, one socket holding GPUs 0 and 1: tasks 0 and 1 both see
    # those two, each exactly the count it asked for. Ordinal 0 in both would stack them on GPU 0.
    environ = {"SLURMD_TRES_BIND": "gres/gpu:closest", "SLURM_TRES_PER_TASK": "cpu:8,gres/gpu:2",
               "SLURM_GPUS_ON_NODE": "8", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "0,1"}
    for local_rank in range(2):
        with pytest.raises(BackendError, match=r"asked for --gpus-per-task=2, but an explicit --gpu-bind "
                                               r"\(SLURMD_TRES_BIND='gres/gpu:closest'\) replaced"):
            device_ordinal("cuda", local_rank, 4, 2, environ, task_is_rank=True)
    # The implied binding (per_task:2) does leave each task its own two, whatever another resource's says.
    for bind in ("gres/gpu:per_task:2", "gres/gpu:per_task:2+gres/nic:closest"):
        assert device_ordinal("cuda", 1, 4, 2, {**environ, "SLURMD_TRES_BIND": bind}, task_is_rank=True) == 0


def test_cuda_visible_devices_expanded_once_in_the_batch_step_is_refused_above_local_rank_0(case):
    # srun bash -c "CUDA_VISIBLE_DEVICES=$SLURM_LOCALID ..." in double quotes: every task of a step that owns
    # both GPUs sees GPU 0 alone. (An export in the batch script is overwritten by Slurm in each task.)
    for task in case("slurm/srun_gpus_per_node2"):
        stacked = {**task, "CUDA_VISIBLE_DEVICES": "0"}
        if task["SLURM_LOCALID"] == "0":
            assert ordinal(stacked, 1) == 0
            continue
        with pytest.raises(BackendError, match=r"local rank 1 sees only GPU 0 \(CUDA_VISIBLE_DEVICES='0', "
                                               r"ROCR_VISIBLE_DEVICES='0,1'\).*written in the batch script.*"
                                               r"single quotes.*--gpus-per-task=1") as refused:
            ordinal(stacked, 1)
        assert "an export" not in str(refused.value)
        # HIP_VISIBLE_DEVICES, which Slurm never sets: an export in the batch script is a cause there.
        hip = {**task, "HIP_VISIBLE_DEVICES": "0"}
        hip.pop("CUDA_VISIBLE_DEVICES", None)
        with pytest.raises(BackendError, match=r"`HIP_VISIBLE_DEVICES=\$SLURM_LOCALID` written in the batch script "
                                               r"\(an export, or inside srun bash"):
            ordinal(hip, 1)
        assert ordinal({**stacked, "SLURMDIST_SHARE_DEVICES": "1"}, 1) == 0
        # Set in each task, in single quotes: its own GPU, ordinal 0.
        assert ordinal({**task, "CUDA_VISIBLE_DEVICES": task["SLURM_LOCALID"]}, 1) == 0
    # Slurm's own per-task binding narrows SLURM_STEP_GPUS too: GPU 0 alone at local rank 1 is then fine (a site
    # whose cgroups renumber each task's GPU from 0).
    for task in case("slurm/srun_N2_tpn2_gpus_per_task1"):
        assert ordinal({**task, "CUDA_VISIBLE_DEVICES": "0", "ROCR_VISIBLE_DEVICES": "0"}, 1) == 0


def test_ranks_sharing_gpus_are_refused_under_nccl_before_the_rendezvous(case):
    # srun --gpus-per-node=2 with 4 tasks, SLURMDIST_SHARE_DEVICES=1: every task sees both GPUs, so two ranks
    # land on each; NCCL would fail at the first collective ("Duplicate GPU detected").
    for local_rank in range(4):
        environ = {**case("slurm/srun_gpus_per_node2")[0], "SLURMDIST_SHARE_DEVICES": "1"}
        for backend in ("nccl", "cpu:gloo,cuda:nccl"):
            with pytest.raises(BackendError, match=r"SLURMDIST_SHARE_DEVICES=1 puts the node's 4 ranks on its 2 "
                                                   r"GPU\(s\) \(SLURM_GPUS_ON_NODE=2.*NCCL refuses.*"
                                                   r"backend='gloo', device='cuda'"):
                plan("cuda", local_rank, 4, 2, environ, task_is_rank=True, backend=backend)
        assert plan("cuda", local_rank, 4, 2, environ, task_is_rank=True, backend="gloo").ordinal == local_rank % 2
    # Ranks that each see other GPUs share none, whatever the counts: jsrun -g1 (no Slurm GPU count), or tasks
    # left part of the node's GPUs.
    jsrun_rank = {"CUDA_VISIBLE_DEVICES": "3", "SLURMDIST_SHARE_DEVICES": "1"}
    assert plan("cuda", 3, 6, 1, jsrun_rank, backend="nccl").ordinal == 0
    part = {"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_GPUS_ON_NODE": "4", "SLURMDIST_SHARE_DEVICES": "1"}
    assert plan("cuda", 3, 4, 2, part, task_is_rank=True, backend="nccl").ordinal == 1
    # One GPU per socket left to each task (--gpu-bind=closest), two sockets, four tasks: two share each GPU.
    closest = {"CUDA_VISIBLE_DEVICES": "1", "SLURM_GPUS_ON_NODE": "2", "SLURMDIST_SHARE_DEVICES": "1"}
    with pytest.raises(BackendError, match=r"puts the node's 4 ranks on its 2 GPU\(s\)"):
        plan("cuda", 3, 4, 1, closest, task_is_rank=True, backend="nccl")
    # All of the node's GPUs visible although Slurm counts fewer (visibility widened by hand): one each.
    wide = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "SLURM_GPUS_ON_NODE": "2"}
    assert plan("cuda", 3, 4, 8, wide, task_is_rank=True, backend="nccl").ordinal == 3

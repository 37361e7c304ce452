"""Device ordinals over captured Slurm environments with fake device counts (no GPU here)."""

from __future__ import annotations

import pytest

from slurmdist.detection import detect
from slurmdist.devices import DevicePlan, device_ordinal, narrowed_per_task, plan
from slurmdist.errors import BackendError


def ordinal(environ, count, **kw):
    env = detect(environ)
    return device_ordinal("cuda", env.local_rank, env.local_world_size, count, environ, **kw)


def test_gpus_per_node_picks_by_local_rank(case):
    tasks = case("slurm/srun_gpus_per_node2")
    assert [ordinal(t, 2) for t in tasks] == [detect(t).local_rank for t in tasks]


def test_gpus_per_task_leaves_each_task_ordinal_zero(case):
    # --gpus-per-task=1: the step owns two GPUs on the node, each task sees only its own.
    for index, task in enumerate(case("slurm/srun_gpus_per_node2")):
        narrowed = {**task, "CUDA_VISIBLE_DEVICES": str(index % 2), "SLURM_GPUS_PER_TASK": "1"}
        assert narrowed_per_task(narrowed, "cuda", 1)
        assert ordinal(narrowed, 1) == 0


def test_step_gpus_longer_than_visible_means_narrowed(case):
    task = {**case("slurm/srun_gpus_per_node2")[1], "CUDA_VISIBLE_DEVICES": "1"}
    assert ordinal(task, 1) == 0


def test_more_tasks_than_devices_is_an_error_naming_the_variable(case):
    task = {**case("slurm/srun_N2_tpn2")[1], "CUDA_VISIBLE_DEVICES": "0"}
    with pytest.raises(BackendError, match="CUDA_VISIBLE_DEVICES='0'.*SLURMDIST_SHARE_DEVICES"):
        ordinal(task, 1)


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
    with pytest.raises(BackendError, match="ASCEND_RT_VISIBLE_DEVICES='4'"):
        device_ordinal("npu", 1, 2, 1, environ)
    assert device_ordinal("npu", 1, 2, 2, environ) == 1


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

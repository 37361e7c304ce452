"""Backend choice over capability values, and this CPU build's real answers."""

from __future__ import annotations

import re
import sys

import pytest

from slurmdist.backends import (
    BackendChoice, Capabilities, check_index, choose, parse_backend, probe, split_device, unused_gpus,
)
from slurmdist.errors import BackendError, SlurmdistError

CPU = Capabilities(torch_version="2.13.0+cpu", gloo=True)
CUDA = Capabilities(torch_version="2.13.0+cu128", cuda_build=True, cuda_devices=4, nccl=True, gloo=True)
NPU = Capabilities(torch_version="2.13.0", torch_npu=True, npu_devices=8, gloo=True)


@pytest.mark.parametrize(
    "caps, expected",
    [(CPU, BackendChoice("gloo", "cpu")), (CUDA, BackendChoice("nccl", "cuda")), (NPU, BackendChoice("hccl", "npu"))],
)
def test_auto(caps, expected):
    assert choose("auto", caps) == expected


def test_auto_with_device_override():
    assert choose("auto", CUDA, "cpu") == BackendChoice("gloo", "cpu")
    assert choose("auto", NPU, "cpu") == BackendChoice("gloo", "cpu")


def test_auto_on_a_cuda_build_without_nccl_runs_gloo():
    # Some source builds (USE_NCCL=0) and Windows wheels: CUDA works, nccl is absent.
    no_nccl = CUDA._replace(nccl=False)
    assert choose("auto", no_nccl) == BackendChoice("gloo", "cpu")
    with pytest.raises(BackendError, match="'nccl' is not built into"):
        choose("nccl", no_nccl)
    # GPUs left idle are worth a word, unless the CPU was chosen by name.
    warning = unused_gpus("auto", choose("auto", no_nccl), no_nccl, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert "sees 4 GPU(s) (CUDA_VISIBLE_DEVICES='0,1,2,3') but was built without NCCL" in warning
    assert "device='cuda'" in warning and choose("auto", no_nccl, "cuda") == BackendChoice("gloo", "cuda")
    assert unused_gpus("gloo", choose("gloo", no_nccl), no_nccl, {}) is None


def test_explicit_and_mixed_forms():
    assert choose("gloo", CUDA) == BackendChoice("gloo", "cpu")
    assert choose("cpu:gloo,cuda:nccl", CUDA) == BackendChoice("cpu:gloo,cuda:nccl", "cuda")
    assert parse_backend("cpu:gloo, cuda:nccl") == {"cpu": "gloo", "cuda": "nccl"}


def test_the_mixed_form_reaches_torch_without_the_spaces_torch_reads_as_a_device_type():
    # torch took " cuda" for a device type it does not know: a RuntimeError after the rendezvous.
    assert choose(" CPU:Gloo , cuda:nccl ", CUDA) == BackendChoice("cpu:gloo,cuda:nccl", "cuda")


def test_a_device_type_named_twice_is_refused_before_any_network_wait():
    with pytest.raises(BackendError, match="names cpu twice"):
        choose("cpu:gloo,cpu:mpi", CPU)


@pytest.mark.parametrize(
    "backend, caps, advice",
    [
        ("nccl", CPU, "CPU-only build.*install a CUDA"),
        ("mpi", CUDA, "USE_MPI=1"),
        ("hccl", Capabilities(npu_import_error="torch_npu is not installed"), "torch_npu is not installed.*torch-npu"),
        ("cpu:gloo,cuda:nccl", CPU, "nccl"),
        ("nvlink", CPU, "unknown backend 'nvlink'"),
        ("cpu:gloo,tpu:xla", CPU, "DEVICE:BACKEND"),
    ],
)
def test_missing_backend_says_what_to_install(backend, caps, advice):
    with pytest.raises(BackendError, match=advice):
        choose(backend, caps)


NO_GPU = CUDA._replace(cuda_devices=0)


@pytest.mark.parametrize("backend, caps, device, says", [
    # No backend for the tensors this process would use: its first collective would fail, not init().
    ("cuda:nccl", NO_GPU, None, r"names no backend for the cpu tensors .* sees no cuda device.*add 'cpu:gloo'"),
    ("cuda:gloo", NO_GPU, None, "names no backend for the cpu tensors"),
    ("cuda:nccl", CUDA, "cpu", "names no backend for the cpu tensors .* or pass a device it names"),
    # nccl and hccl move their accelerator's tensors only.
    ("cpu:nccl", CUDA, None, "pairs nccl with cpu tensors, but nccl moves cuda tensors only"),
    ("cpu:hccl,npu:hccl", NPU, None, "pairs hccl with cpu tensors"),
    # gloo and mpi move CPU and CUDA tensors, not NPU ones (torch's Backend.backend_capability).
    ("cpu:gloo,npu:gloo", NPU, None, "pairs gloo with npu tensors, but gloo moves cpu and cuda tensors only: "
                                     "pair npu with hccl"),
    ("cpu:gloo,cuda:hccl", NPU, None, "pairs hccl with cuda tensors, but hccl moves npu tensors only: pair cuda "
                                      "with nccl"),
])
def test_a_per_device_backend_must_serve_the_device_in_use(backend, caps, device, says):
    with pytest.raises(BackendError, match=says):
        choose(backend, caps, device)
    assert choose("cpu:gloo,cuda:nccl", NO_GPU) == BackendChoice("cpu:gloo,cuda:nccl", "cpu")  # the CPU half serves


def test_nccl_built_but_no_gpu_visible():
    with pytest.raises(BackendError, match="CUDA_VISIBLE_DEVICES is not set"):
        choose("nccl", Capabilities(cuda_build=True, nccl=True))
    with pytest.raises(BackendError, match="CUDA_VISIBLE_DEVICES='NoDevFiles'"):
        choose("nccl", Capabilities(cuda_build=True, nccl=True), None, {"CUDA_VISIBLE_DEVICES": "NoDevFiles"})


def test_this_cpu_build():
    caps = probe("auto")
    assert caps.gloo and not caps.nccl and not caps.mpi and caps.cuda_devices == 0
    assert choose("auto", caps) == BackendChoice("gloo", "cpu")
    for backend in ("nccl", "mpi", "hccl"):
        with pytest.raises(SlurmdistError):
            choose(backend, probe(backend))


def test_auto_looks_for_torch_npu_only_where_an_ascend_device_could_be(monkeypatch, tmp_path):
    import importlib.util

    from slurmdist import backends

    asked = []
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: asked.append(name) or real_find_spec(name, *a))
    monkeypatch.setattr(backends, "ASCEND_DEVICE", str(tmp_path / "davinci_manager"))
    assert probe("auto", environ={}).npu_import_error is None and asked == []  # this machine: no NPU to find
    assert probe("auto", environ={"ASCEND_RT_VISIBLE_DEVICES": ""}).npu_import_error is None and asked == []
    (tmp_path / "davinci_manager").touch()
    assert probe("auto", environ={}).npu_import_error == "torch_npu is not installed" and asked == ["torch_npu"]
    (tmp_path / "davinci_manager").unlink()
    for name in backends.VISIBILITY_VARIABLES["npu"] + backends.CANN_VARIABLES:  # no driver device, an Ascend setup
        asked.clear()
        assert probe("auto", environ={name: "0,1"}).npu_import_error == "torch_npu is not installed", name
        assert asked == ["torch_npu"], name


@pytest.mark.parametrize("environ, sign", [
    ({"ASCEND_RT_VISIBLE_DEVICES": "0,1"}, "ASCEND_RT_VISIBLE_DEVICES='0,1'"),
    ({"ASCEND_VISIBLE_DEVICES": "3"}, "ASCEND_VISIBLE_DEVICES='3'"),
    ({"ASCEND_HOME_PATH": "/usr/local/Ascend/ascend-toolkit/latest"}, None),  # a toolkit, also on CPU nodes
    ({"ASCEND_RT_VISIBLE_DEVICES": " "}, None),
    ({}, None),
])
def test_npu_sign_names_what_shows_npus_are_meant_for_this_process(monkeypatch, tmp_path, environ, sign):
    from slurmdist import backends

    monkeypatch.setattr(backends, "ASCEND_DEVICE", str(tmp_path / "davinci_manager"))
    assert backends.npu_sign(environ) == sign
    (tmp_path / "davinci_manager").touch()
    assert backends.npu_sign(environ) == (sign or f"the Ascend driver's {tmp_path / 'davinci_manager'} exists")


def test_auto_on_the_cpu_of_an_npu_node_warns_and_says_why():
    from slurmdist.backends import BackendChoice, unused_npus

    cpu = BackendChoice("gloo", "cpu")
    missing = Capabilities(torch_version="2.13.0", npu_import_error="torch_npu is not installed",
                           npu_sign="ASCEND_RT_VISIBLE_DEVICES='0'")
    warning = unused_npus("auto", cpu, missing)
    assert "ASCEND_RT_VISIBLE_DEVICES='0'" in warning and "torch_npu is not installed" in warning
    assert "torch-npu matching torch 2.13.0" in warning and "backend='gloo'" in warning
    no_npu = missing._replace(torch_npu=True, npu_import_error=None)
    assert "torch_npu sees no NPU" in unused_npus("auto", cpu, no_npu)
    assert unused_npus("gloo", cpu, missing) is None  # the CPU asked for by name
    assert unused_npus("auto", cpu, missing._replace(npu_sign=None)) is None  # a toolkit alone: no NPU meant
    assert unused_npus("auto", BackendChoice("hccl", "npu"), no_npu._replace(npu_devices=8)) is None
    assert unused_npus("auto", cpu, no_npu._replace(npu_devices=8)) is None  # device="cpu" on a working NPU node
    assert probe("hccl").npu_import_error == "torch_npu is not installed"  # asked for by name: always looked for
    assert probe("auto", "npu").npu_import_error == "torch_npu is not installed"  # device="npu": looked for too


def test_no_warning_about_unused_accelerators_when_the_cpu_is_asked_for(recwarn):
    from slurmdist import process_group
    from slurmdist.detection import detect

    env = detect({})
    gave_gpus = {"SLURM_STEP_GPUS": "0,1", "SLURM_JOB_ID": "5"}  # Slurm gave GPUs this CPU-only torch cannot see
    process_group._choose_device(env, "auto", "cpu", gave_gpus)
    assert [str(w.message) for w in recwarn] == []
    process_group._choose_device(env, "auto", None, gave_gpus)
    assert any("Slurm gave this task GPUs" in str(w.message) for w in recwarn)


def test_split_device():
    assert split_device(None) == (None, None)
    assert split_device("cuda:1") == ("cuda", 1)
    assert split_device("cpu") == ("cpu", None)
    assert split_device("cpu:0") == ("cpu", 0)
    assert split_device(1) == (None, 1)  # as torch.cuda.set_device(1): the chosen accelerator's
    for bad, message in (("tpu", "unknown device"), ("cuda:", "not a number"), (-1, "counts from 0"),
                         ("cuda:\u00b2", "not a number"), ("cuda:" + "7" * 5000, "not a number"),
                         ("cpu:3", "one CPU device")):
        with pytest.raises(BackendError, match=message):
            split_device(bad)


def test_a_bare_index_on_the_cpu_names_nothing():
    with pytest.raises(BackendError, match="device=0 is an accelerator index"):
        check_index(0, choose("auto", CPU))
    check_index(0, choose("auto", CUDA))
    check_index("cpu:0", choose("auto", CPU))


def test_backend_names_are_case_insensitive():
    assert choose("HCCL", NPU) == BackendChoice("hccl", "npu")
    assert choose(" Auto ", CUDA) == BackendChoice("nccl", "cuda")
    # probe() imports torch_npu for any spelling of hccl: here it is missing, and says so.
    assert probe("HCCL").npu_import_error == probe("hccl").npu_import_error == "torch_npu is not installed"


@pytest.mark.parametrize("backend, caps, device, needs", [
    ("nccl", CUDA, "cpu", "nccl' runs on cuda devices only"),
    ("hccl", NPU, "cpu", "hccl' runs on npu devices only"),
    ("nccl", CUDA._replace(torch_npu=True, npu_devices=2), "npu", "backend='hccl'.*or device='cuda'"),
    ("gloo", NPU, "npu", "gloo' runs on cpu and cuda devices only, not on device='npu'.*backend='hccl'"),
    ("mpi", NPU._replace(mpi=True), "npu", "mpi' runs on cpu and cuda devices only.*or device='cpu'"),
])
def test_an_accelerator_backend_on_another_device_fails_before_any_network_wait(backend, caps, device, needs):
    with pytest.raises(BackendError, match=needs):
        choose(backend, caps, device)


def test_gloo_runs_on_cuda_tensors_too():
    assert choose("gloo", CUDA, "cuda") == BackendChoice("gloo", "cuda")


def test_auto_on_the_cpu_despite_slurm_gpus_warns_naming_them():
    environ = {"SLURM_STEP_GPUS": "0", "SLURM_GPUS_ON_NODE": "1", "CUDA_VISIBLE_DEVICES": "0"}
    warning = unused_gpus("auto", choose("auto", CPU), CPU, environ)
    assert warning is not None
    for shown in ("SLURM_STEP_GPUS='0'", "SLURM_GPUS_ON_NODE='1'", "CUDA_VISIBLE_DEVICES='0'", "CPU-only build",
                  CPU.torch_version):
        assert shown in warning
    broken_driver = CUDA._replace(cuda_devices=0)
    assert "sees no device" in unused_gpus("auto", choose("auto", broken_driver), broken_driver, environ)
    # Nothing to say: gloo asked for by name, no GPUs from Slurm, or torch sees the GPUs.
    assert unused_gpus("gloo", choose("gloo", CPU), CPU, environ) is None
    assert unused_gpus("auto", choose("auto", CPU), CPU, {"SLURM_GPUS_ON_NODE": "0", "SLURM_STEP_GPUS": ""}) is None
    assert unused_gpus("auto", choose("auto", CUDA), CUDA, environ) is None


def test_asking_for_a_missing_device_gives_advice_that_works():
    # auto with device='cuda' on a CPU machine chose gloo already: "pass backend='gloo'" would change nothing.
    with pytest.raises(BackendError, match="sees none") as auto:
        choose("auto", CPU, "cuda")
    assert "backend='gloo'" not in str(auto.value) and "device='cpu'" in str(auto.value)
    with pytest.raises(BackendError, match="pass backend='gloo'"):
        choose("nccl", CUDA._replace(cuda_devices=0), None)



@pytest.mark.parametrize("device", ["cuda:1", "cuda:0"])
def test_a_missing_device_is_quoted_as_it_was_given(device):
    import slurmdist

    with pytest.raises(BackendError, match=re.escape(f"device={device!r} was asked for but this process sees none")):
        slurmdist.init(device=device, environ={})


@pytest.mark.parametrize("backend", [None, 3, ["gloo"]])
def test_init_refuses_a_backend_that_is_not_a_name_before_anything_else(backend):
    import slurmdist

    with pytest.raises(BackendError, match=re.escape(f"backend={backend!r} is not a backend name: use 'auto'")):
        slurmdist.init(backend, environ={})


def test_auto_asked_for_npus_without_torch_npu_says_so():
    no_npu = Capabilities(npu_import_error="torch_npu is not installed")
    with pytest.raises(BackendError, match=r"device='npu' was asked for .*torch_npu is not installed.*--gres=npu"):
        choose("auto", no_npu, "npu", {"ASCEND_RT_VISIBLE_DEVICES": "0"})


def test_a_torch_that_is_installed_but_fails_to_import_keeps_its_own_error(monkeypatch):
    # A broken dependency or a missing CUDA library: "install torch" would send the user the wrong way.
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    with pytest.raises(ModuleNotFoundError, match="torch.distributed"):
        probe("auto", environ={})


def test_init_without_torch_says_to_install_it(monkeypatch):
    # `pip install slurmdist` alone (torch is the site's choice of build): an error of slurmdist's, not a bare
    # ModuleNotFoundError from deep inside init().
    monkeypatch.setitem(sys.modules, "torch", None)  # import fails as when torch is not installed
    with pytest.raises(BackendError, match=r"slurmdist.init\(\) needs PyTorch.*pip install torch"):
        probe("auto", environ={})


def test_init_hands_its_backend_to_the_device_plan_so_nccl_sharing_stops_before_the_network(monkeypatch, case):
    from slurmdist import devices, process_group
    from slurmdist.detection import detect

    monkeypatch.setattr(process_group.backends, "probe", lambda *args: CUDA._replace(cuda_devices=2))
    monkeypatch.setattr(devices, "device_count", lambda device_type: 2)
    monkeypatch.setattr(devices, "bind", lambda device_plan: device_plan.device)
    environ = {**case("slurm/srun_gpus_per_node2")[1], "SLURMDIST_SHARE_DEVICES": "1", "SLURM_NTASKS_PER_NODE": "4"}
    env = detect(environ).replace(local_world_size=4, node_rank=0, num_nodes=1)  # all four on one node
    with pytest.raises(BackendError, match="NCCL refuses two ranks of one group on one GPU"):
        process_group._choose_device(env, "auto", None, environ)
    assert process_group._choose_device(env, "gloo", "cuda", environ).device == "cuda:1"


def test_a_rocm_torch_that_slurms_two_visibility_variables_left_without_gpus_is_told_why(case):
    # Slurm's default gres flags set ROCR_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES to the same "1" (captured);
    # HIP applies the second to what the first left, renumbered from 0: torch sees no GPU (gres.conf(5)).
    task = case("slurm/srun_N2_tpn2_gpus_per_task1")[1]
    rocm = Capabilities(torch_version="2.13.0+rocm6.4", cuda_build=True, nccl=True, gloo=True)
    warning = unused_gpus("auto", choose("auto", rocm), rocm, task)
    assert "ROCR_VISIBLE_DEVICES='1'" in warning and "HIP applies CUDA_VISIBLE_DEVICES" in warning
    # Slurm set GPU_DEVICE_ORDINAL='1' too (opencl_env), which HIP applies as well: unsetting only
    # CUDA_VISIBLE_DEVICES would still leave no GPU.
    assert task["GPU_DEVICE_ORDINAL"] == "1"
    assert "unset CUDA_VISIBLE_DEVICES GPU_DEVICE_ORDINAL" in warning and "Flags=amd_gpu_env" in warning
    only_ordinal = {name: value for name, value in task.items() if name != "CUDA_VISIBLE_DEVICES"}
    assert "HIP applies GPU_DEVICE_ORDINAL" in unused_gpus("auto", choose("auto", rocm), rocm, only_ordinal)
    assert "nvidia-smi" not in warning
    with pytest.raises(BackendError, match="sees none .*HIP applies CUDA_VISIBLE_DEVICES .*amd_gpu_env"):
        choose("nccl", rocm, None, task)
    # A CUDA build, or ROCR_VISIBLE_DEVICES alone (Flags=amd_gpu_env): the usual advice.
    assert "nvidia-smi" in unused_gpus("auto", choose("auto", CUDA._replace(cuda_devices=0)),
                                       CUDA._replace(cuda_devices=0), task)
    alone = {name: value for name, value in task.items() if name not in ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")}
    assert "nvidia-smi" in unused_gpus("auto", choose("auto", rocm), rocm, alone)
    # Indexes within what ROCR left mask nothing: the usual advice, not this one.
    within = {**task, "ROCR_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0", "GPU_DEVICE_ORDINAL": "0"}
    assert "nvidia-smi" in unused_gpus("auto", choose("auto", rocm), rocm, within)
    # A UUID names its GPU wherever it is: no index to fall past.
    uuid = {**within, "HIP_VISIBLE_DEVICES": "GPU-5a1c2b", "ROCR_VISIBLE_DEVICES": "0,1"}
    assert "HIP applies" not in unused_gpus("auto", choose("auto", rocm), rocm, uuid)


@pytest.mark.parametrize("backend, device_ids, expected", [
    ("nccl", (1,), [1]),
    ("hccl", (3,), [3]),                 # torch guessed the current NPU and warned on every call
    ("cpu:gloo,cuda:nccl", (2,), [2]),
    ("gloo", (1,), None),                # gloo bound to a GPU still runs its barrier on the CPU
    ("gloo", None, None),
    ("cpu:gloo,cuda:nccl", None, None),  # the CPU half on a node without GPUs
])
def test_barrier_names_the_bound_device_where_an_accelerator_backend_runs_it(backend, device_ids, expected):
    from slurmdist.distenv import DistEnv
    from slurmdist.process_group import barrier_device_ids

    env = DistEnv("slurm", 0, 0, 2, 2, 0, 1, "n1", 29500, None, device_ids=device_ids, backend=backend)
    assert barrier_device_ids(env) == expected

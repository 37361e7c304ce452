"""Backend choice over capability values, and this CPU build's real answers."""

from __future__ import annotations

import pytest

from slurmdist.backends import BackendChoice, Capabilities, choose, parse_backend, probe, split_device
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


def test_explicit_and_mixed_forms():
    assert choose("gloo", CUDA) == BackendChoice("gloo", "cpu")
    assert choose("cpu:gloo,cuda:nccl", CUDA) == BackendChoice("cpu:gloo,cuda:nccl", "cuda")
    assert parse_backend("cpu:gloo, cuda:nccl") == {"cpu": "gloo", "cuda": "nccl"}


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


def test_nccl_built_but_no_gpu_visible():
    with pytest.raises(BackendError, match="CUDA_VISIBLE_DEVICES"):
        choose("nccl", Capabilities(cuda_build=True, nccl=True))


def test_this_cpu_build():
    caps = probe("auto")
    assert caps.gloo and not caps.nccl and not caps.mpi and caps.cuda_devices == 0
    assert choose("auto", caps) == BackendChoice("gloo", "cpu")
    for backend in ("nccl", "mpi", "hccl"):
        with pytest.raises(SlurmdistError):
            choose(backend, probe(backend))


def test_split_device():
    assert split_device(None) == (None, None)
    assert split_device("cuda:1") == ("cuda", 1)
    assert split_device("cpu") == ("cpu", None)
    with pytest.raises(BackendError):
        split_device("tpu")


def test_asking_for_a_missing_device_gives_advice_that_works():
    # auto with device='cuda' on a CPU machine chose gloo already: "pass backend='gloo'" would change nothing.
    with pytest.raises(BackendError, match="sees none") as auto:
        choose("auto", CPU, "cuda")
    assert "backend='gloo'" not in str(auto.value) and "device='cpu'" in str(auto.value)
    with pytest.raises(BackendError, match="pass backend='gloo'"):
        choose("nccl", CUDA._replace(cuda_devices=0), None)

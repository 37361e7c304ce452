"""Which communication backend and device type to use, decided before any network wait.

The decision is a pure function of the request and a `Capabilities` value, so every combination (CUDA, NPU,
MPI-enabled builds) is tested here on a CPU-only machine. Only `probe()` imports torch (and torch_npu when an
NPU backend is possible), because importing torch_npu is what registers the `hccl` backend.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, Dict, Mapping, NamedTuple, Optional

from .devices import VISIBILITY_VARIABLES, listed, visibility
from .envvars import whole_number
from .errors import BackendError

KNOWN_BACKENDS = ("nccl", "hccl", "mpi", "gloo")
BACKEND_DEVICE = {"nccl": "cuda", "hccl": "npu", "mpi": "cpu", "gloo": "cpu"}
DEVICE_TYPES = ("cpu", "cuda", "npu")
# The Ascend driver's control device: every host and container that can see an NPU has it.
ASCEND_DEVICE = "/dev/davinci_manager"
# CANN's set_env.sh: the toolkit is there, which it also is on login and CPU nodes of an Ascend cluster.
CANN_VARIABLES = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")


# Records on init()'s path are NamedTuples: every rank defines them, and a dataclass costs about 1 ms to
# create (it compiles its generated methods) where a NamedTuple costs a tenth of that.
class Capabilities(NamedTuple):
    """What this torch build and machine offer; `npu_devices` counts only when torch_npu imported."""

    torch_version: str = "?"
    cuda_build: bool = False
    cuda_devices: int = 0
    torch_npu: bool = False
    npu_devices: int = 0
    nccl: bool = False
    mpi: bool = False
    gloo: bool = True
    npu_import_error: Optional[str] = None
    npu_sign: Optional[str] = None  # what shows NPUs are meant for this process, when something does


class BackendChoice(NamedTuple):
    """The backend string for `init_process_group` and the device type tensors should live on."""

    backend: str
    device_type: str


def probe(requested: str = "auto", device_type: Optional[str] = None,
          environ: Optional[Mapping[str, str]] = None) -> Capabilities:
    """Ask torch what it can do. Imports torch_npu only when an NPU backend could be chosen (or the caller
    asked for an NPU device)."""
    requested = requested.strip().lower()
    environ = os.environ if environ is None else environ
    try:
        import torch
        import torch.distributed as dist
    except ModuleNotFoundError as exc:
        if exc.name != "torch":  # torch is there but fails to import: its own error says why
            raise
        raise BackendError("slurmdist.init() needs PyTorch, which this Python does not have: install it (pip install "
                           "torch; the CPU build and CUDA builds are at https://pytorch.org), or use the python of "
                           "the environment that has it") from None

    if not dist.is_available():
        raise BackendError(
            f"torch {torch.__version__} was built without torch.distributed; install a standard PyTorch wheel"
        )
    cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    sign = npu_sign(environ)
    wants_npu = "hccl" in requested or "npu" in requested or device_type == "npu" or (
        requested == "auto" and cuda_devices == 0 and (sign is not None or _cann_installed(environ)))
    torch_npu, npu_devices, npu_error = False, 0, None
    if wants_npu and importlib.util.find_spec("torch_npu") is not None:
        try:
            importlib.import_module("torch_npu")  # registers torch.npu and the hccl backend
            torch_npu = True
            npu = getattr(torch, "npu", None)
            npu_devices = npu.device_count() if npu is not None and npu.is_available() else 0
        except Exception as exc:  # a broken CANN install raises all sorts of things at import
            npu_error = f"{type(exc).__name__}: {exc}"
    elif wants_npu:
        npu_error = "torch_npu is not installed"
    return Capabilities(
        torch_version=torch.__version__,
        cuda_build=torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None,
        cuda_devices=cuda_devices,
        torch_npu=torch_npu,
        npu_devices=npu_devices,
        nccl=dist.is_nccl_available(),
        mpi=dist.is_mpi_available(),
        gloo=dist.is_gloo_available(),
        npu_import_error=npu_error,
        npu_sign=sign,
    )


def npu_sign(environ: Mapping[str, str]) -> Optional[str]:
    """What shows that NPUs are meant for this process (torch_npu imported, an NPU visibility variable, the
    Ascend driver's device), for messages; None when nothing does. Looking for torch_npu among the installed
    packages scans every import path, a tenth of a millisecond per rank (more on a busy or network file
    system), so `auto` looks only where this, or an installed CANN toolkit, says NPUs may be found."""
    if "torch_npu" in sys.modules:
        return "torch_npu is imported"
    for name in VISIBILITY_VARIABLES["npu"]:
        if environ.get(name, "").strip():
            return f"{name}={environ[name]!r}"
    if os.path.exists(ASCEND_DEVICE):
        return f"the Ascend driver's {ASCEND_DEVICE} exists"
    return None


def _cann_installed(environ: Mapping[str, str]) -> bool:
    return any(environ.get(name) for name in CANN_VARIABLES)


def parse_backend(requested: str) -> Dict[str, str]:
    """`"nccl"` -> {"": "nccl"}; torch's `"cpu:gloo,cuda:nccl"` -> {"cpu": "gloo", "cuda": "nccl"}."""
    text = requested.strip().lower()
    if ":" not in text:
        if text not in KNOWN_BACKENDS:
            raise BackendError(
                f"unknown backend {requested!r}; use 'auto', one of {', '.join(KNOWN_BACKENDS)}, "
                "or torch's per-device form such as 'cpu:gloo,cuda:nccl'"
            )
        return {"": text}
    mapping: Dict[str, str] = {}
    for part in text.split(","):
        device_type, sep, name = part.partition(":")
        device_type, name = device_type.strip(), name.strip()
        if not sep or device_type not in DEVICE_TYPES or name not in KNOWN_BACKENDS:
            raise BackendError(
                f"cannot read {part!r} in backend {requested!r}; write DEVICE:BACKEND pairs separated by "
                f"commas, DEVICE in {', '.join(DEVICE_TYPES)}, BACKEND in {', '.join(KNOWN_BACKENDS)}"
            )
        if device_type in mapping:  # torch refuses it too, but only inside init_process_group
            raise BackendError(f"backend {requested!r} names {device_type} twice; give each device type one backend")
        mapping[device_type] = name
    return mapping


def torch_form(mapping: Mapping[str, str]) -> str:
    """A per-device mapping as torch's backend string, `cpu:gloo,cuda:nccl`, without the spaces torch would
    read as part of a device type."""
    return ",".join(f"{device}:{name}" for device, name in mapping.items())


def _missing_advice(caps: Capabilities) -> Dict[str, "tuple[bool, str]"]:
    """Backend -> (available?, what to install or build when not)."""
    npu_reason = caps.npu_import_error or "not importable"
    build = f"this torch ({caps.torch_version}{', a CPU-only build' if not caps.cuda_build else ''})"
    return {
        "nccl": (caps.nccl, f"backend 'nccl' is not built into {build}; install a CUDA (or ROCm) build of PyTorch "
                 "from https://pytorch.org/get-started/locally/, or pass backend='gloo' (or 'auto')"),
        "mpi": (caps.mpi, f"backend 'mpi' is not built into {build}: PyPI and conda wheels never include it. "
                "Build PyTorch from source with USE_DISTRIBUTED=1 USE_MPI=1 and your cluster's mpicc on PATH, "
                "or pass backend='auto' (gloo/nccl still start fine under mpirun)"),
        "hccl": (caps.torch_npu, f"backend 'hccl' needs Ascend's torch_npu ({npu_reason}); pip install torch-npu matching torch {caps.torch_version}, source the CANN "
                 "set_env.sh, or pass backend='auto'"),
        "gloo": (caps.gloo, f"backend 'gloo' is not built into {build}; install a standard PyTorch wheel or "
                 "choose another backend"),
    }


def check_available(name: str, caps: Capabilities) -> None:
    """Raise a `BackendError` saying what to install or build when this torch lacks `name`."""
    available, advice = _missing_advice(caps)[name]
    if not available:
        raise BackendError(advice)


def choose(
    requested: str, caps: Capabilities, device: Optional[str] = None, environ: Optional[Mapping[str, str]] = None,
    asked: Any = None,
) -> BackendChoice:
    """Pick the backend and device type. `device` ('cpu', 'cuda', 'npu') overrides the device type;
    `environ` and `asked` (the device as the caller gave it: 'cuda:1', a torch.device) only feed messages.

    auto: CUDA devices -> nccl, NPUs under torch_npu -> hccl, otherwise gloo on the CPU.
    """
    environ = {} if environ is None else environ
    if requested.strip().lower() == "auto":
        if caps.cuda_devices > 0 and caps.nccl and device in (None, "cuda"):
            choice = BackendChoice("nccl", "cuda")
        elif caps.npu_devices > 0 and device in (None, "npu"):
            choice = BackendChoice("hccl", "npu")
        else:
            choice = BackendChoice("gloo", device or "cpu")
        shown = device if asked is None else asked
        return _checked(choice, caps, environ, subject=f"device={shown!r} was asked for" if device else None)
    mapping = parse_backend(requested)
    for name in mapping.values():
        check_available(name, caps)
    if "" in mapping:
        choice = BackendChoice(mapping[""], device or BACKEND_DEVICE[mapping[""]])
        return _checked(choice, caps, environ)
    for device_type, name in mapping.items():
        if device_type in DEVICE_TYPES and device_type not in MOVES[name]:
            raise BackendError(f"backend {requested.strip()!r} pairs {name} with {device_type} tensors, but {name} "
                               f"moves {_or(MOVES[name])} tensors only: pair {device_type} with "
                               f"{_serves(device_type)}")
    accelerators = [d for d in ("cuda", "npu") if d in mapping and _count(d, caps) > 0]
    device_type = device or (accelerators[0] if accelerators else "cpu")
    if device_type not in mapping:  # the group would have no backend for this process's tensors
        sees = "" if device else f" (it sees no {' or '.join(d for d in mapping if d != 'cpu')} device: " \
            f"{visibility(next(iter(mapping)), environ)})"
        other_way = "pass a device it names" if device else "check that the job asked for devices"
        raise BackendError(f"backend {requested.strip()!r} names no backend for the {device_type} tensors this "
                           f"process would use{sees}, so its first collective would fail: add "
                           f"'{device_type}:gloo' to it, or {other_way}")
    choice = BackendChoice(torch_form(mapping), device_type)
    return _checked(choice, caps, environ)


def _count(device_type: str, caps: Capabilities) -> int:
    return {"cuda": caps.cuda_devices, "npu": caps.npu_devices}.get(device_type, 1)


# The tensors each backend can move (torch's Backend.backend_capability; torch_npu registers hccl for npu): a
# pairing outside it fails at the first collective ("No backend type associated with device type npu"), not
# at init, so it is refused before any network wait.
MOVES = {"nccl": ("cuda",), "hccl": ("npu",), "gloo": ("cpu", "cuda"), "mpi": ("cpu", "cuda")}


def _or(devices: "tuple[str, ...]") -> str:
    return " and ".join(devices)


def _serves(device_type: str) -> str:
    """The backend to name in advice for a device type's tensors."""
    return {"npu": "hccl", "cuda": "nccl"}.get(device_type, "gloo")


def _checked(choice: BackendChoice, caps: Capabilities, environ: Mapping[str, str],
             subject: Optional[str] = None) -> BackendChoice:
    """`choice` if this process can run it; `subject` says what asked for the device, for messages (backend
    'auto' picked no backend the user named)."""
    if choice.device_type not in DEVICE_TYPES:
        raise BackendError(f"unknown device type {choice.device_type!r}; use one of {', '.join(DEVICE_TYPES)}")
    moves = MOVES.get(choice.backend)
    # Only for a backend the user named: `auto` falls back to gloo for a device it cannot find, which the
    # missing-device message below explains.
    if subject is None and moves is not None and choice.device_type not in moves:
        if choice.device_type == "npu":
            advice = f"pass backend='hccl' (or 'auto') for the NPUs, or device={moves[0]!r}"
        else:
            advice = f"pass device={moves[0]!r} (or leave device out), or backend='gloo' for the CPU"
        raise BackendError(f"backend {choice.backend!r} runs on {_or(moves)} devices only, not on "
                           f"device={choice.device_type!r} (its first collective would fail); {advice}")
    if _count(choice.device_type, caps) == 0:
        cause = _unusable(choice.device_type, caps) or (
            rocm_masked(caps, environ) if choice.device_type == "cuda" else None)
        ask = "--gres=npu:N" if choice.device_type == "npu" else "srun --gpus-per-task / --gres"
        subject = subject or f"backend {choice.backend!r} needs a {choice.device_type} device"
        raise BackendError(
            f"{subject} but this process sees none "
            f"({visibility(choice.device_type, environ)}{'; ' + cause if cause else ''}); check that the job asked "
            f"for devices ({ask}) and that the variable names devices of this node, or {_cpu_advice(choice)}"
        )
    return choice


def _unusable(device_type: str, caps: Capabilities) -> Optional[str]:
    """Why this torch cannot use such devices at all, when it cannot: said before where they might be."""
    if device_type == "npu" and not caps.torch_npu:
        return caps.npu_import_error or "torch_npu is not installed"
    if device_type == "cuda" and not caps.cuda_build:
        return f"torch {caps.torch_version} is a CPU-only build"
    return None


# Where Slurm says it gave this task GPUs (gres/gpu): when torch sees none, `auto` falling back to the CPU
# is almost always a broken install (a CPU-only torch, a driver mismatch), not the plan.
SLURM_GPU_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE")


def unused_gpus(
    requested: str, choice: BackendChoice, caps: Capabilities, environ: Mapping[str, str]
) -> Optional[str]:
    """A warning when `auto` chose the CPU although Slurm allocated GPUs to this task, or torch sees GPUs its
    build has no NCCL for, else None."""
    if requested.strip().lower() != "auto" or choice.device_type != "cpu":
        return None
    if caps.cuda_devices > 0:  # and no NCCL, or auto would have chosen it
        return (f"torch {caps.torch_version} sees {caps.cuda_devices} GPU(s) ({visibility('cuda', environ)}) but "
                "was built without NCCL, so backend 'auto' runs gloo on the CPU. Install a PyTorch build with "
                "NCCL (PyTorch's CUDA wheels for Linux have it), or pass device='cuda' to run gloo on the GPUs")
    given = [f"{name}={environ[name]!r}" for name in SLURM_GPU_VARIABLES if _names_gpus(name, environ.get(name))]
    if not given:
        return None
    masked = rocm_masked(caps, environ)
    if masked is not None:
        return (f"Slurm gave this task GPUs ({', '.join(given)}; {visibility('cuda', environ)}) but torch "
                f"{caps.torch_version} sees none: {masked}. Until then backend 'auto' runs gloo on the CPU")
    build = "a CPU-only build" if not caps.cuda_build else "its CUDA runtime sees no device"
    return (
        f"Slurm gave this task GPUs ({', '.join(given)}; {visibility('cuda', environ)}) but torch "
        f"{caps.torch_version} sees none ({build}), so backend 'auto' runs gloo on the CPU. Install a CUDA "
        "build of PyTorch or check the driver (nvidia-smi); pass backend='gloo' if the CPU is intended"
    )


def rocm_masked(caps: Capabilities, environ: Mapping[str, str]) -> Optional[str]:
    """Why a ROCm torch sees no GPU where Slurm set ROCR_VISIBLE_DEVICES beside CUDA_VISIBLE_DEVICES (or HIP's,
    or GPU_DEVICE_ORDINAL, which gres.conf's default opencl_env sets and HIP honours too): HIP applies the
    second to what the first already left, renumbered from 0, so both naming GPU 1 leave none. None where that
    is not the case."""
    left = listed(environ.get("ROCR_VISIBLE_DEVICES", ""))
    if "rocm" not in caps.torch_version or not left:
        return None
    # Only an index past what ROCR left masks them all ("1" after ROCR's "1": HIP's devices count from 0); a
    # UUID ("GPU-5a1c...") names a GPU whatever its place, as HIP reads it.
    second = [name for name in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
              if any(index.isdigit() and int(index) >= len(left) for index in listed(environ.get(name, "")))]
    if not second:
        return None
    return (f"on ROCm, HIP applies {' and '.join(second)} to the GPUs ROCR_VISIBLE_DEVICES left, renumbered from "
            f"0, so the two Slurm set together can leave none. Unset {' and '.join(second)} in the task (srun bash "
            f"-c 'unset {' '.join(second)}; exec python train.py'), or ask the site for gres.conf Flags=amd_gpu_env, "
            "which makes Slurm set ROCR_VISIBLE_DEVICES alone")


def unused_npus(requested: str, choice: BackendChoice, caps: Capabilities) -> Optional[str]:
    """A warning when `auto` chose the CPU on what is plainly an NPU node (`npu_sign`), else None: a missing or
    broken torch_npu would otherwise train on the CPU without a word."""
    if (requested.strip().lower() != "auto" or choice.device_type != "cpu" or caps.npu_sign is None
            or caps.npu_devices > 0):  # NPUs work, and the CPU was asked for (device="cpu")
        return None
    if caps.npu_import_error is not None:
        why = f"torch_npu cannot be used ({caps.npu_import_error})"
    else:
        why = "torch_npu sees no NPU (npu-smi info shows what the driver sees)"
    return (
        f"this looks like an Ascend NPU node ({caps.npu_sign}) but {why}, so backend 'auto' runs gloo on the CPU. "
        f"Install torch-npu matching torch {caps.torch_version} and source CANN's set_env.sh, or pass "
        "backend='gloo' if the CPU is intended"
    )


def _names_gpus(name: str, value: Optional[str]) -> bool:
    """SLURM_GPUS_ON_NODE is a count; the others list GPU indices ("0" is GPU 0)."""
    value = (value or "").strip()
    if name != "SLURM_GPUS_ON_NODE":
        return bool(value)
    count = whole_number(value)
    return bool(value) and (count is None or count > 0)


def check_index(device: Any, choice: BackendChoice) -> None:
    """A bare index (`device=1`) means the chosen accelerator's; on the CPU it names nothing."""
    if isinstance(device, int) and not isinstance(device, bool) and choice.device_type == "cpu":
        raise BackendError(f"device={device!r} is an accelerator index, but backend {choice.backend!r} runs on "
                           "the CPU here; leave device out, or pass 'cuda:N' / 'npu:N'")


def _cpu_advice(choice: BackendChoice) -> str:
    """How to run without the missing device: drop `device=` when gloo was already the backend."""
    if choice.backend == "gloo":
        return f"leave out device={choice.device_type!r} (or pass device='cpu') to run gloo on the CPU"
    return "pass backend='gloo' to run on the CPU"


def split_device(device: Any) -> "tuple[Optional[str], Optional[int]]":
    """`None`, `'cuda'`, `'cuda:1'`, a `torch.device`, or an index of the chosen accelerator (`1`, as
    torch.cuda.set_device takes) -> (type or None, index or None)."""
    if device is None:
        return None, None
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise BackendError(f"device={device!r}: an index counts from 0")
        return None, device
    text = str(device)
    kind, colon, index = text.partition(":")
    if kind not in DEVICE_TYPES:
        raise BackendError(f"unknown device {text!r}; use 'cpu', 'cuda', 'npu' or one with an index, 'cuda:1'")
    number = whole_number(index)
    if colon and number is None:
        raise BackendError(f"device index in {text!r} is not a number (write {kind!r} or '{kind}:0')")
    if kind == "cpu" and number:  # torch takes 'cpu:3' and runs on the one CPU device: a mistake, silently
        raise BackendError(f"device={text!r}: torch has one CPU device, 'cpu' (or 'cpu:0'); to pin a rank to "
                           "cores, use srun --cpus-per-task and --cpu-bind, or taskset")
    return kind, number

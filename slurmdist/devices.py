"""Which accelerator ordinal a process uses: pure functions over the environment and a device count.

The count comes from torch, which already honours `CUDA_VISIBLE_DEVICES` (and ROCm's HIP/ROCR variables) /
`ASCEND_RT_VISIBLE_DEVICES`; the environment tells whether visibility was narrowed to an srun task's own
devices (`--gpus-per-task`, `--gpu-bind=per_task`, a per-task `ASCEND_RT_VISIBLE_DEVICES`), in which case
that task's first device is ordinal 0 whatever its local rank. slurmdist
reads these variables and never writes them: a visibility variable belongs to the user and the scheduler.
"""

from __future__ import annotations

import re
from typing import List, Mapping, NamedTuple, Optional, Tuple

from .envvars import whole_number
from .errors import BackendError

# What narrows the devices a process sees, per device type. On ROCm, Slurm sets the HIP/ROCR variables
# beside CUDA_VISIBLE_DEVICES, and torch honours all three.
VISIBILITY_VARIABLES = {
    "cuda": ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
    "npu": ("ASCEND_RT_VISIBLE_DEVICES",),
}
SHARE_VARIABLE = "SLURMDIST_SHARE_DEVICES"
TRUE_WORDS = ("1", "true", "yes", "on")
# `--gpus-per-task=N` as each kind of process sees it: sbatch/salloc export SLURM_GPUS_PER_TASK ("2",
# "a100:2"); srun does not, but slurmd hands every task the step's binding (SLURMD_TRES_BIND
# "gpu:per_task:2", "gres/gpu:per_task:2"), and Slurm 23.11+ exports SLURM_TRES_PER_TASK ("cpu:4,gres/gpu:2").
_BIND_PER_TASK = re.compile(r"\bper_task:(\d+)")
_TRES_GPU = re.compile(r"gres[/:]gpu(?::[^:,=]+)?[:=](\d+)(?:,|$)")


def visibility(device_type: str, environ: Mapping[str, str]) -> str:
    """The visibility variables that are set, with their values, for messages: "CUDA_VISIBLE_DEVICES='0,1'"."""
    names = VISIBILITY_VARIABLES.get(device_type, ())
    shown = [f"{name}={environ[name]!r}" for name in names if name in environ]
    return ", ".join(shown) if shown else f"{names[0] if names else 'no visibility variable'} is not set"


def gpus_per_task(environ: Mapping[str, str]) -> Optional[int]:
    """N from `--gpus-per-task=N`, whichever variable carries it here; None when the job did not ask. The
    step's own binding first: SLURM_GPUS_PER_TASK is the job's (sbatch exports it), and a step of that job
    started with another `--gpus-per-task` inherits it unchanged."""
    bind = environ.get("SLURMD_TRES_BIND", "")
    found = _BIND_PER_TASK.search(bind) if "gpu" in bind else None
    found = found or _TRES_GPU.search(environ.get("SLURM_TRES_PER_TASK", ""))
    if found:
        return whole_number(found.group(1))
    return whole_number(environ.get("SLURM_GPUS_PER_TASK", "").rpartition(":")[2])  # "2" or "a100:2"


class DevicePlan(NamedTuple):
    """`device` as a string torch accepts ('cpu', 'cuda:0') and the `device_ids` DDP wants (None on CPU)."""

    device_type: str
    ordinal: Optional[int]  # not `index`, which would hide tuple.index

    @property
    def device(self) -> str:
        return self.device_type if self.ordinal is None else f"{self.device_type}:{self.ordinal}"

    @property
    def device_ids(self) -> Optional[Tuple[int, ...]]:
        return None if self.ordinal is None else (self.ordinal,)


def narrowed_per_task(
    environ: Mapping[str, str], device_type: str, device_count: int, task_is_rank: bool
) -> bool:
    """True when this task was left only its own devices, so local rank must not pick among them.

    Only an srun task that is itself a rank (`task_is_rank`) can be narrowed for itself: the ranks torchrun or
    mpirun start inside one task share what it sees. GPUs: `--gpus-per-task=N` (see `gpus_per_task`) and
    exactly N visible, or a single visible GPU where the step owns more on this node (`SLURM_STEP_GPUS`,
    `SLURM_GPUS_ON_NODE`). Several visible GPUs without `--gpus-per-task` (e.g. `--gpu-bind=closest`) may be
    shared with other tasks: local rank picks among them. NPUs: Slurm sets no Ascend variable, so a single
    NPU in `ASCEND_RT_VISIBLE_DEVICES` was chosen for this task on purpose (`=$SLURM_LOCALID`).
    """
    if not task_is_rank:
        return False
    if device_type == "npu":
        return device_count == 1 and len(_chosen_npus(environ)) == 1
    if device_type != "cuda":
        return False
    if gpus_per_task(environ) == device_count:
        return True
    if device_count != 1:
        return False
    step_gpus = environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS")
    if step_gpus is not None and len([g for g in step_gpus.split(",") if g.strip()]) > 1:
        return True
    on_node = environ.get("SLURM_GPUS_ON_NODE", "")
    return (whole_number(on_node) or 0) > 1


FALSE_WORDS = ("", "0", "false", "no", "off")


def share_requested(environ: Mapping[str, str]) -> bool:
    value = environ.get(SHARE_VARIABLE, "")
    if value.strip().lower() in TRUE_WORDS:
        return True
    if value.strip().lower() in FALSE_WORDS:
        return False
    raise BackendError(f"{SHARE_VARIABLE}={value!r} is neither yes nor no: set it to 1 to let ranks share devices, "
                       "or 0 (or unset it)")


def device_ordinal(
    device_type: str,
    local_rank: int,
    local_world_size: int,
    device_count: int,
    environ: Mapping[str, str],
    share: Optional[bool] = None,
    task_is_rank: bool = False,
) -> int:
    """The ordinal (within what this process sees) that local rank `local_rank` should bind.

    More tasks on a node than visible devices is an error unless sharing was asked for
    (`SLURMDIST_SHARE_DEVICES=1`), because silently stacking ranks on one GPU is a common, slow mistake.
    """
    if device_count < 1:
        ask = "--gres=npu:N" if device_type == "npu" else "srun --gpus-per-task=1"
        raise BackendError(
            f"no {device_type} device is visible to local rank {local_rank} ({visibility(device_type, environ)}); "
            f"ask the scheduler for devices ({ask}) or run on the CPU with backend='gloo'"
        )
    if narrowed_per_task(environ, device_type, device_count, task_is_rank):
        if device_type == "npu" and local_rank > 0 and _chosen_npus(environ) == ["0"] and not _sharing(environ, share):
            raise BackendError(
                f"local rank {local_rank} sees only NPU 0 ({visibility(device_type, environ)}), which is what an "
                "`export ASCEND_RT_VISIBLE_DEVICES=$SLURM_LOCALID` in the batch script gives every task: it expands "
                "once, in the batch step, whose SLURM_LOCALID is 0, so all the node's ranks would share NPU 0. Set "
                "it in each task instead: srun bash -c 'ASCEND_RT_VISIBLE_DEVICES=$SLURM_LOCALID exec python "
                f"train.py'; or, if they are meant to share it, set {SHARE_VARIABLE}=1"
            )
        on_node = _gpus_on_node(device_type, environ)
        if on_node is None or local_world_size <= on_node or _sharing(environ, share):
            return 0
        # Each task sees one GPU, but the node has fewer than tasks (`--gpu-bind=closest` with one GPU per
        # socket, a wrapper narrowing it): some tasks see the same one.
        raise _too_few(device_type, local_world_size, on_node, f"on it (SLURM_GPUS_ON_NODE={on_node}), each task "
                       f"seeing one ({visibility(device_type, environ)}), so some see the same one", task_is_rank)
    if local_world_size <= device_count:
        return local_rank
    if _sharing(environ, share):
        return local_rank % device_count
    # Every rank of the node stops here, not only those without a device: the others would wait for them
    # until the rendezvous timed out.
    on_node = _gpus_on_node(device_type, environ)
    if task_is_rank and on_node is not None and device_count < on_node and local_world_size <= on_node:
        raise _given_a_part(local_world_size, device_count, on_node, visibility(device_type, environ))
    raise _too_few(device_type, local_world_size, device_count, f"visible ({visibility(device_type, environ)})",
                   task_is_rank)


def _chosen_npus(environ: Mapping[str, str]) -> List[str]:
    """The NPUs ASCEND_RT_VISIBLE_DEVICES names (empty pieces dropped)."""
    return [d.strip() for d in environ.get("ASCEND_RT_VISIBLE_DEVICES", "").split(",") if d.strip()]


def _gpus_on_node(device_type: str, environ: Mapping[str, str]) -> Optional[int]:
    """The job's GPUs on this node (SLURM_GPUS_ON_NODE), for CUDA; None when unknown or not CUDA."""
    return whole_number(environ.get("SLURM_GPUS_ON_NODE", "")) if device_type == "cuda" else None


def _sharing(environ: Mapping[str, str], share: Optional[bool]) -> bool:
    return share_requested(environ) if share is None else share


def _too_few(device_type: str, ranks: int, devices: int, seen: str, task_is_rank: bool) -> BackendError:
    """More ranks on a node than its devices, and no word that they may share."""
    without = f"rank {devices} has no device of its" if ranks - devices == 1 else \
        f"ranks {devices}-{ranks - 1} have no device of their"
    return BackendError(
        f"{ranks} tasks on this node but only {devices} {device_type} device(s) {seen}: local {without} own. Start one rank per device ({_one_each(device_type, devices, task_is_rank)}), "
        f"or set {SHARE_VARIABLE}=1 to let ranks share them (also what to set when your launcher or a wrapper "
        "already gives each rank its own device: jsrun -g1, an affinity script exporting the visibility variable "
        "per rank)"
    )


def _given_a_part(ranks: int, seen: int, on_node: int, visible: str) -> BackendError:
    """The node has a GPU for every task, but Slurm left each task a few it shares with others (`--gpu-bind=
    closest`: the GPUs near the task's socket). Which of them is this task's depends on how srun spread the
    tasks over the sockets, which a task cannot see; fewer tasks, as the generic advice says, is wrong here."""
    return BackendError(
        f"{ranks} tasks on this node, which has {on_node} GPUs (SLURM_GPUS_ON_NODE={on_node}), but Slurm left this "
        f"task {seen} of them ({visible}), shared with other tasks (--gpu-bind=closest or a per-socket binding), so "
        "local rank cannot tell which one is its own. Ask srun for one GPU per task: --gpus-per-task=1 (with "
        f"--gpu-bind=closest to keep it near the task's cores). {SHARE_VARIABLE}=1 would make ranks pick among "
        "the visible GPUs by local rank, which can put two ranks on one GPU while another sits idle"
    )


def _one_each(device_type: str, count: int, task_is_rank: bool = True) -> str:
    """How to give each rank a device of its own, for a message: srun's tasks, or the ranks a launcher inside
    one task starts."""
    if device_type == "npu":
        under_srun = f"srun --ntasks-per-node={count}, or ASCEND_RT_VISIBLE_DEVICES=$SLURM_LOCALID in each task"
    else:
        under_srun = f"srun --ntasks-per-node={count} --gpus-per-task=1"
    if task_is_rank:
        return under_srun
    return f"torchrun --nproc-per-node={count}, mpirun with {count} ranks per node, or {under_srun}"


def plan(
    device_type: str,
    local_rank: int,
    local_world_size: int,
    device_count: int,
    environ: Mapping[str, str],
    index: Optional[int] = None,
    task_is_rank: bool = False,
) -> DevicePlan:
    """The device for this process: CPU has no index; an explicit `index` wins over the local-rank rule.
    `task_is_rank`: this process is an srun task of its own (see `narrowed_per_task`)."""
    if device_type == "cpu":
        return DevicePlan("cpu", None)
    if index is not None:
        if not 0 <= index < device_count:
            raise BackendError(
                f"{device_type}:{index} asked for, but this process sees {device_count} {device_type} device(s) "
                f"({visibility(device_type, environ)})"
            )
        return DevicePlan(device_type, index)
    ordinal = device_ordinal(device_type, local_rank, local_world_size, device_count, environ,
                             task_is_rank=task_is_rank)
    return DevicePlan(device_type, ordinal)


def device_count(device_type: str) -> int:
    """How many devices of this type torch sees (after the visibility variables). Imports torch."""
    import torch

    if device_type == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    module = getattr(torch, device_type, None)
    return module.device_count() if module is not None and module.is_available() else 0


def bind(device_plan: DevicePlan) -> object:
    """Make the planned device current (the one side effect here) and return the `torch.device`."""
    import torch

    if device_plan.device_type == "cuda":
        torch.cuda.set_device(device_plan.ordinal)
    elif device_plan.device_type == "npu":
        torch.npu.set_device(device_plan.ordinal)  # type: ignore[attr-defined]  # registered by torch_npu
    return torch.device(device_plan.device)

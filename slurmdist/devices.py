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

# What narrows the devices a process sees, per device type. On ROCm, Slurm sets ROCR_VISIBLE_DEVICES beside
# CUDA_VISIBLE_DEVICES, and HIP applies the second to what the first left (backends.rocm_masked).
# Ascend's container runtime narrows a container's NPUs with ASCEND_VISIBLE_DEVICES (ranges such as "0-3"
# allowed); the runtime's own ASCEND_RT_VISIBLE_DEVICES narrows a process's.
VISIBILITY_VARIABLES = {
    "cuda": ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
    "npu": ("ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES"),
}
# The variables that list one process's own devices, per device type: on ROCm, HIP applies HIP_VISIBLE_DEVICES
# (else CUDA_VISIBLE_DEVICES) to what ROCR_VISIBLE_DEVICES left, so the shortest list set is what it can see.
# ASCEND_VISIBLE_DEVICES, a container's (and ranges allowed), is not one.
PER_PROCESS_LISTS = {"cuda": VISIBILITY_VARIABLES["cuda"], "npu": VISIBILITY_VARIABLES["npu"][:1]}
SHARE_VARIABLE = "SLURMDIST_SHARE_DEVICES"
SLURM_SETS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")  # in each task of a step with GPUs
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
    found = next(filter(None, (_BIND_PER_TASK.search(clause) for clause in _gpu_bind_clauses(environ))), None)
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
    mpirun start inside one task share what it sees. GPUs: `--gpus-per-task=N` (see `gpus_per_task`) not
    overridden by an explicit `--gpu-bind=closest`, and exactly N visible, or a single visible GPU where the
    step owns more on this node (`SLURM_STEP_GPUS`, `SLURM_GPUS_ON_NODE`). Several visible GPUs without
    `--gpus-per-task` (e.g. `--gpu-bind=closest`) may be shared with other tasks: local rank picks among them.
    NPUs: Slurm sets no Ascend variable, so a single NPU in `ASCEND_RT_VISIBLE_DEVICES` was chosen for this
    task on purpose (`=$SLURM_LOCALID`). Never where every visibility list names more devices than torch sees
    (`visibility_longer_than_count`: a failed GPU, MIG instances): one visible then says nothing of whose it is.
    """
    if not task_is_rank or visibility_longer_than_count(device_type, device_count, environ):
        return False
    if device_type == "npu":
        return device_count == 1 and len(_chosen_npus(environ)) == 1
    if device_type != "cuda":
        return False
    if gpus_per_task(environ) == device_count and not _bound_closest(environ):
        return True
    if device_count != 1:
        return False
    if len(listed(environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS") or "")) > 1:
        return True
    on_node = environ.get("SLURM_GPUS_ON_NODE", "")
    return (whole_number(on_node) or 0) > 1


def _gpu_bind_clauses(environ: Mapping[str, str]) -> List[str]:
    """The GPU clauses of the step's binding: SLURMD_TRES_BIND holds one per resource
    ("gres/gpu:closest+gres/nic:per_task:1"), and another resource's count is not the GPUs'."""
    clauses = environ.get("SLURMD_TRES_BIND", "").split("+")
    return [clause for clause in clauses if clause.startswith(("gres/gpu:", "gpu:"))]


def _bound_closest(environ: Mapping[str, str]) -> bool:
    """An explicit `--gpu-bind=closest`, which replaces the per-task binding `--gpus-per-task=N` implies (srun's
    manual): each task sees its socket's GPUs, so tasks of one socket see the same N and are not narrowed to
    their own, however many they asked for."""
    return any("closest" in clause for clause in _gpu_bind_clauses(environ))


def visibility_longer_than_count(device_type: str, device_count: int,
                                 environ: Mapping[str, str]) -> Optional[Tuple[str, int]]:
    """The visibility variable whose list is the shortest of those set, as shown in messages
    ("CUDA_VISIBLE_DEVICES='0,1'"), and its length, when even it names more devices than torch counts; else None. CUDA stops at the first entry that names no usable
    device (a GPU gone from the bus), and a CUDA process uses only the first of several MIG instances: the list
    then no longer says which device is whose, and ranks that pick by it end up on one device."""
    lists = [(len(listed(environ[name])), name) for name in PER_PROCESS_LISTS.get(device_type, ()) if name in environ]
    if not lists:
        return None
    length, name = min(lists)
    return (f"{name}={environ[name]!r}", length) if length > device_count else None


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
        on_node = _gpus_on_node(device_type, environ)
        if on_node is not None and local_world_size > on_node and not _sharing(environ, share):
            # Each task sees one GPU, but the node has fewer than tasks (`--gpu-bind=closest` with one GPU per
            # socket, a wrapper narrowing it): some tasks see the same one.
            raise _too_few(device_type, local_world_size, on_node, f"on it (SLURM_GPUS_ON_NODE={on_node}), each "
                           f"task seeing one ({visibility(device_type, environ)}), so some see the same one",
                           task_is_rank)
        expanded_once = _set_once_for_all_tasks(device_type, local_rank, environ)
        if expanded_once is not None and not _sharing(environ, share):
            raise _expanded_in_the_batch_step(device_type, local_rank, expanded_once, environ)
        return 0
    if local_world_size <= device_count:
        return local_rank
    if _sharing(environ, share):
        return local_rank % device_count
    # Every rank of the node stops here, not only those without a device: the others would wait for them
    # until the rendezvous timed out.
    beyond = visibility_longer_than_count(device_type, device_count, environ)
    if beyond:
        raise _fewer_than_listed(device_type, local_world_size, device_count, beyond, task_is_rank)
    on_node = _gpus_on_node(device_type, environ)
    if task_is_rank and on_node is not None and device_count < on_node and local_world_size <= on_node:
        raise _given_a_part(local_world_size, device_count, on_node, environ)
    raise _too_few(device_type, local_world_size, device_count, f"visible ({visibility(device_type, environ)})",
                   task_is_rank)


def listed(devices: str) -> List[str]:
    """The devices a comma-separated list names (SLURM_STEP_GPUS='0,1', a visibility variable), empty pieces
    dropped."""
    return [device.strip() for device in devices.split(",") if device.strip()]


def _chosen_npus(environ: Mapping[str, str]) -> List[str]:
    """The NPUs this process's list (ASCEND_RT_VISIBLE_DEVICES) names."""
    return listed(environ.get(PER_PROCESS_LISTS["npu"][0], ""))


def _set_once_for_all_tasks(device_type: str, local_rank: int, environ: Mapping[str, str]) -> Optional[str]:
    """The visibility variable that leaves a task above local rank 0 device 0 alone where the step gave the node
    more, as `VAR=$SLURM_LOCALID` written in the batch script leaves it every task (the line expands once, in
    the batch step, whose SLURM_LOCALID is 0); None otherwise. Slurm's own per-task binding narrows
    SLURM_STEP_GPUS with the task's GPUs, so a single "0" beside several step GPUs is not Slurm's doing. NPUs:
    Slurm sets no Ascend variable, so a single NPU 0 is always someone's `$SLURM_LOCALID`."""
    if local_rank == 0:
        return None
    if device_type == "npu":
        return "ASCEND_RT_VISIBLE_DEVICES" if _chosen_npus(environ) == ["0"] else None
    # The step's own list only: Slurm narrows it with each task's binding, never the job's.
    if gpus_per_task(environ) == 1 or len(listed(environ.get("SLURM_STEP_GPUS", ""))) < 2:
        return None
    return next((name for name in VISIBILITY_VARIABLES["cuda"] if environ.get(name, "").strip() == "0"), None)


def _expanded_in_the_batch_step(device_type: str, local_rank: int, variable: str,
                                environ: Mapping[str, str]) -> BackendError:
    kind = "NPU" if device_type == "npu" else "GPU"
    slurm_way = "" if device_type == "npu" else "; or let Slurm give each task its own: srun --gpus-per-task=1"
    # Slurm sets CUDA_VISIBLE_DEVICES (and ROCR_VISIBLE_DEVICES) anew in every task of a step with GPUs, so an
    # export of those in the batch script narrows nothing (checked on the local cluster); HIP's, and NPUs',
    # for which Slurm sets nothing, it does.
    written = "inside" if variable in SLURM_SETS else "an export, or inside"
    return BackendError(
        f"local rank {local_rank} sees only {kind} 0 ({visibility(device_type, environ)}), which is what "
        f"`{variable}=$SLURM_LOCALID` written in the batch script ({written} srun bash -c \"...\" in "
        "double quotes) gives every task: it expands once, in the batch step, whose SLURM_LOCALID is 0, so all "
        f"the node's ranks would share {kind} 0. Set it in each task instead, in single quotes: srun bash -c "
        f"'{variable}=$SLURM_LOCALID exec python train.py'{slurm_way}. If they are meant to share it, or a per-rank "
        f"wrapper gave this rank {kind} 0 on purpose, set {SHARE_VARIABLE}=1"
    )


def _fewer_than_listed(device_type: str, ranks: int, devices: int, beyond: Tuple[str, int],
                       task_is_rank: bool) -> BackendError:
    """The visibility list names more devices than torch sees (`visibility_longer_than_count`), and the node's
    ranks need more than torch sees."""
    if device_type == "npu":
        why = "a listed NPU is missing or failed (npu-smi info shows what the driver sees)"
    else:
        why = ("a listed GPU is missing or failed (CUDA stops at the first entry naming no usable device; "
               "nvidia-smi, or rocm-smi on AMD, shows what the driver sees), or they are NVIDIA MIG instances, of "
               f"which a CUDA process uses only the first: give each rank its own ({_one_each('cuda', ranks, task_is_rank)})")
    return BackendError(
        f"{ranks} ranks on this node need a {device_type} device each, and {beyond[0]} lists {beyond[1]}, but "
        f"torch sees only {devices}: {why}. Fix the "
        f"list or the device, or set {SHARE_VARIABLE}=1 to let ranks share the {devices} it sees"
    )


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


def _given_a_part(ranks: int, seen: int, on_node: int, environ: Mapping[str, str]) -> BackendError:
    """The node has a GPU for every task, but Slurm left each task a few it shares with others (`--gpu-bind=
    closest`: the GPUs near the task's socket). Which of them is this task's depends on how srun spread the
    tasks over the sockets, which a task cannot see; fewer tasks, as the generic advice says, is wrong here.
    An explicit `--gpu-bind` overrides the one-GPU binding `--gpus-per-task` implies (srun's manual), so the
    advice must not pair them."""
    asked, bind = gpus_per_task(environ), environ.get("SLURMD_TRES_BIND")
    shown = f" (SLURMD_TRES_BIND={bind!r})" if bind else ""
    overridden = (f" The job asked for --gpus-per-task={asked}, but an explicit --gpu-bind{shown} replaced the "
                  "one-per-task binding it implies." if asked is not None else "")
    return BackendError(
        f"{ranks} tasks on this node, which has {on_node} GPUs (SLURM_GPUS_ON_NODE={on_node}), but Slurm left this "
        f"task {seen} of them ({visibility('cuda', environ)}), shared with other tasks (--gpu-bind=closest or a "
        f"per-socket binding), so local rank cannot tell which one is its own.{overridden} Ask srun for one GPU "
        "per task: --gpus-per-task=1 without --gpu-bind, or --gpu-bind=single:1 to keep each task's GPU near its "
        f"cores. {SHARE_VARIABLE}=1 would make ranks pick among the visible GPUs by local rank, which can put two "
        "ranks on one GPU while another sits idle"
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
    backend: str = "",
) -> DevicePlan:
    """The device for this process: CPU has no index; an explicit `index` wins over the local-rank rule.
    `task_is_rank`: this process is an srun task of its own (see `narrowed_per_task`); `backend` (torch's
    spelling, "cpu:gloo,cuda:nccl" included) refuses sharing that backend cannot do."""
    if device_type == "cpu":
        return DevicePlan("cpu", None)
    if index is not None:
        if not 0 <= index < device_count:
            raise BackendError(
                f"{device_type}:{index} asked for, but this process sees {device_count} {device_type} device(s) "
                f"({visibility(device_type, environ)}): an ordinal counts within the visible devices, from 0, "
                f"whatever their physical numbers. Pass device='{device_type}:N' with N below {device_count}, or "
                f"device='{device_type}' to pick by local rank"
            )
        return DevicePlan(device_type, index)
    ordinal = device_ordinal(device_type, local_rank, local_world_size, device_count, environ,
                             task_is_rank=task_is_rank)
    if "nccl" in backend and device_type == "cuda":
        _refuse_stacked_for_nccl(local_world_size, device_count, environ, task_is_rank)
    return DevicePlan(device_type, ordinal)


def _refuse_stacked_for_nccl(local_world_size: int, device_count: int, environ: Mapping[str, str],
                             task_is_rank: bool) -> None:
    """NCCL takes one rank per GPU in a group: a second rank on a GPU fails at the group's first collective
    ("Duplicate GPU detected", ncclInvalidUsage), after the whole job met. Refused only where stacking is
    certain: more ranks on the node than the node has GPUs (SLURM_GPUS_ON_NODE) and than this rank sees (a
    rank that sees more GPUs than Slurm counts, visibility widened by hand, picks one of its own). Ranks of a
    launcher that narrows each to a GPU of its own (jsrun -g1, a wrapper) share none, whatever their counts say,
    and no Slurm count is there to compare with."""
    on_node = _gpus_on_node("cuda", environ)
    if on_node is None or local_world_size <= max(on_node, device_count):
        return
    raise BackendError(
        f"{SHARE_VARIABLE}=1 puts the node's {local_world_size} ranks on its {on_node} GPU(s) "
        f"(SLURM_GPUS_ON_NODE={on_node}, {visibility('cuda', environ)}), but NCCL refuses two ranks of one group on "
        f"one GPU: the first collective would fail with 'Duplicate GPU detected'. Start one rank per GPU "
        f"({_one_each('cuda', on_node, task_is_rank)}), or share the GPUs over gloo, which can but is slower: "
        "slurmdist.init(backend='gloo', device='cuda')"
    )


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

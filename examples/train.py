"""A small DDP training run that starts unchanged under every launcher slurmdist reads.

    python examples/train.py --steps 100 --out result.json                  # one process
    srun python examples/train.py --steps 100 --out result.json             # one task per GPU
    torchrun --nproc-per-node=4 examples/train.py --steps 100 --out r.json   # or mpirun, submitit, sbatch

Why it is built this way:
- The global batch (`--batch-size`) is fixed and split across ranks by a `DistributedSampler`, so every step
  sees the same samples whatever the world size: one process reaches the same loss as four (to float
  rounding), and the same world size gives bit-identical parameters under every launcher.
- Everything a resumed run needs lives in one `TrainState`, saved atomically by rank 0. A run finds its
  checkpoint at start and continues, so a requeued job (`sbatch --requeue`, `--signal`) loses little work;
  SIGUSR2 (or the signal SLURMDIST_REQUEUE_SIGNAL names, as `slurmdist sbatch --signal` exports it) asks for a
  checkpoint at the next step boundary (with `--requeue`, rank 0 then requeues the Slurm job,
  which resumes under the same job id, instead of running into its time limit); SIGTERM (scancel, the time
  limit, a preemption) for a checkpoint and a clean stop, at a step all ranks agree on, with exit status 143.
  A job that cannot be requeued (not a Slurm job, submitted without --requeue, out of requeues) stops the same
  way after the warning's checkpoint, with one line saying why and exit status 75: resubmit it to resume.
- Rank 0 writes `--out` as JSON: {"world_size": W, "loss": L, "checksum": sha256 of the final parameters}.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

# Slurm's warning (SIGUSR2) or a SIGTERM may come while torch imports (seconds, more as the ranks start
# together): with no handler yet, either would end the process, saving nothing. Held until main() has its
# handlers, which then hear them (`replay_held_signals`). As a script only: an importer has its own handlers.
import slurmdist.requeue  # noqa: E402  # imports no torch: fast enough to come before the signals' handlers

# What `#SBATCH --signal=USR2@120` sends before the time limit (USR2: NCCL has used SIGUSR1 itself); a script
# that `slurmdist sbatch --signal PWR@90` rendered says so in SLURMDIST_REQUEUE_SIGNAL.
try:
    CHECKPOINT_SIGNAL = slurmdist.requeue.parse_signal()
except slurmdist.requeue.RequeueError as bad_signal:  # SLURMDIST_REQUEUE_SIGNAL=KILL: say so, no traceback
    print(f"train.py: {bad_signal}", file=sys.stderr)
    sys.exit(2)
HELD_SIGNALS: List[int] = []
if __name__ == "__main__":
    for held in (CHECKPOINT_SIGNAL, signal.SIGTERM):
        signal.signal(held, lambda signum, frame: HELD_SIGNALS.append(signum))

import torch  # noqa: E402  # after the handlers above, on purpose
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler, TensorDataset

import slurmdist

FEATURES, HIDDEN = 16, 32
STOPPED_EXIT_STATUS = 128 + signal.SIGTERM  # what the shell reports for a process ended by SIGTERM
NOT_REQUEUED_EXIT_STATUS = 75  # sysexits' EX_TEMPFAIL: saved but not requeued (--requeue): resubmit to resume


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps in total (resumed runs included)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the data, the model and the sample order")
    parser.add_argument("--out", type=Path, help="rank 0 writes the result JSON here")
    parser.add_argument("--checkpoint", type=Path, help="resume from this file if it exists; save to it")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                        help="also save every N steps (default: only at the end and on SIGUSR2)")
    parser.add_argument("--requeue", action="store_true",
                        help="on SIGUSR2, save and requeue the Slurm job (slurmdist.requeue), which then resumes; "
                        "needs --checkpoint and a job submitted with --requeue")
    parser.add_argument("--batch-size", type=int, default=48,
                        help="GLOBAL batch, split evenly across ranks (48 divides by 1, 2, 3, 4, 6, 8, 12, 16)")
    parser.add_argument("--batches-per-epoch", type=int, default=20, help="synthetic data set size, in batches")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--log-every", type=int, default=10, metavar="N", help="rank 0 logs every N steps")
    parser.add_argument("--backend", default="auto", help="slurmdist.init backend: auto, nccl, hccl, gloo, mpi")
    parser.add_argument("--step-seconds", type=float, default=0.0, metavar="S",
                        help="spend at least S seconds on each step, sleeping the rest: a short run that lasts long "
                        "enough to try a preemption, requeue and resume by hand (the result is unchanged)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads per process when training on CPU (many ranks share few cores)")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "batches_per_epoch", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not (math.isfinite(args.step_seconds) and args.step_seconds >= 0):
        parser.error(f"--step-seconds must be a number of seconds, 0 or more, not {args.step_seconds}")
    if args.requeue and not args.checkpoint:
        parser.error("--requeue needs --checkpoint: the requeued job resumes from it")
    return args


# --- the pieces: data, model, sample order, state ----------------------------------------------------------


def make_data(seed: int, samples: int) -> TensorDataset:
    """A fixed nonlinear regression problem: every rank builds the same tensors from the seed."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, FEATURES, generator=generator)
    weights = torch.randn(FEATURES, 1, generator=generator) / math.sqrt(FEATURES)
    targets = torch.sin(3 * inputs @ weights) + 0.05 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(inputs, targets)


def make_model(seed: int) -> nn.Module:
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))
    torch.random.set_rng_state(generator_state)
    return model


def step_indices(sampler: DistributedSampler, step: int, local_batch: int) -> List[int]:
    """This rank's sample indices for global step `step`: a pure function of the step, so a resumed run
    continues mid-epoch exactly where the checkpoint left off. Rank r's slice of each epoch's permutation is
    positions r, r+W, r+2W, ..., so local batch i of all ranks together is permutation positions
    [i*B, (i+1)*B): the same global batch for any world size W that divides B."""
    steps_per_epoch = len(sampler) // local_batch
    epoch, index = divmod(step, steps_per_epoch)
    sampler.set_epoch(epoch)
    return list(sampler)[index * local_batch:(index + 1) * local_batch]


@dataclass
class TrainState:
    """Everything a resumed run needs, in one object: a signal handler or a requeue saves it whole."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    config: Dict[str, Any]  # what must match for a resume to continue the same run
    step: int = 0
    history: List[float] = field(default_factory=list)  # logged global losses

    def state_dict(self) -> Dict[str, Any]:
        return {
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "config": self.config,
            "history": self.history,
        }

    def load_state_dict(self, saved: Dict[str, Any]) -> None:
        if saved["config"] != self.config:
            raise SystemExit(
                f"train.py: the checkpoint was written by a different run ({saved['config']}), this run is "
                f"{self.config}: pass another --checkpoint path or the same --seed/--batch-size"
            )
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.step = int(saved["step"])
        self.history = list(saved["history"])


# --- files: atomic writes --------------------------------------------------------------------------------


def write_atomically(path: Path, write: Callable[[Any], None]) -> None:
    """Write via a temporary file in the same directory, fsync, rename: a reader (or a resumed run after a
    crash mid-write) sees the old file or the new one, never half of one. The file gets the usual permissions
    (0666 less the umask: collaborators can read it), and once it is in place, temporary files that a save
    killed midway (SIGKILL after the time limit) left behind are removed: one writer per path, rank 0."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.parent / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}"
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a crash
    finally:
        os.close(directory)
    leftover = re.compile(rf"\.{re.escape(path.name)}\.\d+\.[0-9a-f]{{8}}")  # this file's, not ckpt.pt.1's
    for candidate in path.parent.glob(f".{glob.escape(path.name)}.*"):
        if leftover.fullmatch(candidate.name):
            candidate.unlink(missing_ok=True)


def save_checkpoint(state: TrainState, path: Path) -> None:
    write_atomically(path, lambda stream: torch.save(state.state_dict(), stream))


def load_checkpoint(path: Path) -> Optional[Dict[str, Any]]:
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def checksum(model: nn.Module) -> str:
    """sha256 over parameter names and float32 bytes: equal only when training was bit-identical."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def full_loss(model: nn.Module, data: TensorDataset) -> float:
    """Mean squared error of `model` over the whole data set: the same number for the same parameters."""
    inputs, targets = data.tensors
    device = next(model.parameters()).device
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(inputs.to(device)), targets.to(device)))


# --- training --------------------------------------------------------------------------------------------


class CheckpointRequest:
    """Set by signals, read by the loop at the next step boundary.

    SIGUSR2 (Slurm's `--signal` warning): save a checkpoint and go on. SIGTERM (scancel, the time limit, a
    preemption without warning): save a checkpoint and stop.
    """

    def __init__(self) -> None:
        self.requested = False
        self.stopping = False

    def install(self) -> None:
        # Without a handler SIGUSR2 would kill the process: Slurm's warning signal must never do that.
        signal.signal(CHECKPOINT_SIGNAL, lambda signum, frame: setattr(self, "requested", True))
        signal.signal(signal.SIGTERM, lambda signum, frame: setattr(self, "stopping", True))

    def agree(self, requested_anywhere: bool) -> None:
        """Some rank got the warning: rank 0 saves, whichever rank Slurm signalled."""
        self.requested = self.requested or requested_anywhere


class RequeueAfterSave:
    """The request `train()` polls, when the warning signal means "save, then requeue the job".

    Rank 0 reads `.requested` at every step boundary, saves the checkpoint when it is set, then clears it;
    clearing it after the signal means "saved": requeue now (`scontrol requeue`; Slurm then ends every rank, and
    the requeued job resumes from the checkpoint). SIGTERM before the warning (scancel, a preemption) still
    saves and stops every rank at one step, as with `CheckpointRequest` (the preemption object catches it:
    `ending`); after the warning, SIGTERM is the requeue taking effect and ends the process at once.
    """

    def __init__(self, preemption: "slurmdist.requeue.Preemption") -> None:
        self.preemption = preemption
        self.not_requeued = False  # rank 0 saved, but the job cannot be requeued: every rank stops

    def install(self) -> None:
        """Nothing to add: `slurmdist.requeue.install()` already listens for both signals."""

    def agree(self, requested_anywhere: bool) -> None:
        """Some rank got the warning: rank 0 saves and requeues, whichever rank Slurm signalled."""
        self.preemption.agree(requested_anywhere)

    @property
    def stopping(self) -> bool:
        return self.preemption.ending

    @property
    def requested(self) -> bool:
        return self.preemption.requested

    @requested.setter
    def requested(self, value: bool) -> None:
        # After a SIGTERM every rank stops at this step (`all_agree_to_stop`) and returns 143 itself; a
        # preemption's SIGTERM within a partition's GraceTime also requeues (Slurm would not: see `preempted`).
        ending = self.preemption.ending and not self.preemption.preempted()
        if not value and self.preemption.requested and not ending and not self.not_requeued:
            try:
                self.preemption.requeue()  # rank 0: scontrol requeue, then wait to be ended
            except slurmdist.requeue.RequeueError as error:  # not a Slurm job, not requeueable, out of requeues
                print(f"train.py: checkpoint saved; {error}", file=sys.stderr)
                self.not_requeued = True


class Stopped(Exception):
    """Training stopped early, after saving its checkpoint; `status` is the exit status."""

    def __init__(self, step: int, status: int) -> None:
        super().__init__(step, status)
        self.step, self.status = step, status


def stop_status(request: Any) -> int:
    """Why this rank would stop now, as the exit status to stop with; 0 to go on."""
    if getattr(request, "stopping", False):
        return STOPPED_EXIT_STATUS
    return NOT_REQUEUED_EXIT_STATUS if getattr(request, "not_requeued", False) else 0


def all_agree_to_stop(request: Any, env: slurmdist.DistEnv) -> int:
    """0 while every rank goes on; else, on every rank at the same step, the status to stop with (SIGTERM's
    wins). Slurm signals the ranks at slightly different moments, only rank 0 learns that the job cannot be
    requeued, and a rank that stopped alone would leave the others waiting in a collective. The warning is
    shared in the same all_reduce (`request.agree`): one that reached only some ranks still makes rank 0 save."""
    status = stop_status(request)
    if env.world_size == 1:
        return status
    import torch.distributed as dist

    flags = torch.tensor([float(status), float(request.requested)], device=env.device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    request.agree(bool(flags[1].item()))
    return int(flags[0].item())


def global_mean(value: torch.Tensor, world_size: int) -> float:
    import torch.distributed as dist

    value = value.detach().clone()
    if world_size > 1:
        dist.all_reduce(value)
    return float(value) / world_size


def settle_buckets(ddp: DistributedDataParallel, inputs: torch.Tensor) -> None:
    """One backward of a zero loss, before any real step, so that every real step reduces gradients the same way.

    DDP regroups its gradient buckets after its first backward, and that first reduction rounds differently
    from the later ones. Without this, a resumed run (whose first step is a fresh DDP's first backward) would
    end a few bits away from an uninterrupted one. The zero loss leaves gradients, momentum and parameters as
    they were.
    """
    (ddp(inputs).sum() * 0).backward()
    ddp.module.zero_grad(set_to_none=True)


Request = Any  # CheckpointRequest or RequeueAfterSave: `.requested` (settable), `.stopping` (and `.not_requeued`)


def train(args: argparse.Namespace, env: slurmdist.DistEnv, request: Request) -> Dict[str, Any]:
    """Train to `args.steps` (resuming from `args.checkpoint` if present); return rank 0's result."""
    if args.batch_size % env.world_size:
        raise SystemExit(
            f"train.py: --batch-size {args.batch_size} (global) does not split evenly across {env.world_size} "
            "ranks; pick a multiple of the world size"
        )
    local_batch = args.batch_size // env.world_size
    data = make_data(args.seed, args.batch_size * args.batches_per_epoch)
    model = make_model(args.seed).to(env.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = TrainState(model, optimizer, config={"seed": args.seed, "batch_size": args.batch_size,
                                                 "batches_per_epoch": args.batches_per_epoch, "lr": args.lr})
    saved = load_checkpoint(args.checkpoint) if args.checkpoint else None
    if saved is not None:
        state.load_state_dict(saved)
        slurmdist.print0(f"resumed from {args.checkpoint} at step {state.step}")
    ddp = DistributedDataParallel(model, device_ids=env.device_ids)
    settle_buckets(ddp, inputs=data.tensors[0][:1].to(env.device))
    sampler = DistributedSampler(data, num_replicas=env.world_size, rank=env.rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    inputs, targets = data.tensors
    started = time.monotonic()
    while state.step < args.steps:
        step_started = time.monotonic()
        indices = step_indices(sampler, state.step, local_batch)
        loss = nn.functional.mse_loss(ddp(inputs[indices].to(env.device)), targets[indices].to(env.device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        state.step += 1
        if args.step_seconds:  # no sleep(0) syscall per step in a plain run
            time.sleep(max(0.0, args.step_seconds - (time.monotonic() - step_started)))
        if state.step % args.log_every == 0 or state.step == args.steps:
            state.history.append(global_mean(loss, env.world_size))
            slurmdist.print0(f"step {state.step}/{args.steps}  loss {state.history[-1]:.6f}  "
                             f"({time.monotonic() - started:.1f} s)")
        stop = all_agree_to_stop(request, env)
        due = args.checkpoint_every and state.step % args.checkpoint_every == 0
        if args.checkpoint and (due or request.requested or stop):
            if env.is_main:
                save_checkpoint(state, args.checkpoint)
            request.requested = False  # on every rank: the warning was agreed on, and is answered
        if stop:
            why = "SIGTERM" if stop == STOPPED_EXIT_STATUS else "not requeued"
            slurmdist.print0(f"{why}: stopped at step {state.step}" +
                             (f", checkpoint {args.checkpoint}" if args.checkpoint else " (no --checkpoint)"))
            raise Stopped(state.step, stop)
    if args.checkpoint and env.is_main:
        save_checkpoint(state, args.checkpoint)
    return {"world_size": env.world_size, "loss": full_loss(model, data), "checksum": checksum(model),
            "steps": state.step, "launcher": env.launcher}


def replay_held_signals() -> None:
    """Deliver the signals that came before main() installed its handlers (see HELD_SIGNALS), to them."""
    while HELD_SIGNALS:
        signal.raise_signal(HELD_SIGNALS.pop(0))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    request: Request = CheckpointRequest()
    try:
        if args.requeue:  # reads the launch too (its rank): the batch-script mistake is caught here first
            request = RequeueAfterSave(slurmdist.requeue.install(CHECKPOINT_SIGNAL))
        request.install()
        replay_held_signals()
        env = slurmdist.init(backend=args.backend)
    except slurmdist.SlurmdistError as error:  # a launch mistake: say what to do, no traceback
        print(f"train.py: {error}", file=sys.stderr)
        return 2
    if env.device.type == "cpu":
        torch.set_num_threads(args.threads)
    master = f", master {env.master_addr}:{env.master_port}" if env.world_size > 1 else ""
    nodes = f" on {env.num_nodes} node(s)" if env.num_nodes else ""  # MPI across nodes does not say how many
    slurmdist.print0(f"{env.launcher}: {env.world_size} rank(s){nodes}, {env.backend} on {env.device.type}{master}")
    try:
        status = train_and_report(args, env, request)
        slurmdist.barrier()  # nobody tears the group down while rank 0 still writes its files
    finally:
        slurmdist.shutdown()
    return status


def train_and_report(args: argparse.Namespace, env: slurmdist.DistEnv, request: Request) -> int:
    """Train; rank 0 writes the result. The exit status: 0, 143 when SIGTERM stopped training early, 75 when
    the warning came and (--requeue) the job could not be requeued."""
    try:
        result = train(args, env, request)
    except Stopped as stopped:
        return stopped.status
    if env.is_main:
        if args.out:
            write_atomically(args.out, lambda stream: stream.write(json.dumps(result, indent=1).encode()))
        slurmdist.print0(f"done: loss {result['loss']:.6f}  checksum {result['checksum'][:16]}...  "
                         f"-> {args.out or '(no --out)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

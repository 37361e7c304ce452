"""Submit examples/train.py's DDP training from Python: multi-node, preemptible, resumed from its checkpoint.

    python examples/submit_train.py --nodes 2 --tasks-per-node 2 --steps 200 --checkpoint runs/ckpt.pt
    python examples/submit_train.py --cluster local --tasks-per-node 2 --steps 50 --checkpoint /tmp/c.pt
    python examples/submit_train.py --nodes 2 --tasks-per-node 2 --sweep 0 1 2 --checkpoint runs/seed.pt

`Train` is a `slurmdist.requeue.Resumable`: when Slurm sends the requeue signal (`--signal=USR2@120`, or
`scancel --signal=USR2 JOB`), rank 0 saves train.py's whole `TrainState` at the next step boundary, the job is
requeued, and the requeued run resumes from the saved step. Every rank returns train.py's result plus
`resumed_from_step` and `restarts`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence

import slurmdist
from slurmdist.requeue import Preemption, Resumable, restart_count
from slurmdist.submit import Submitter, result

TRAIN_PY = Path(__file__).resolve().with_name("train.py")


def load_train(path: str) -> ModuleType:
    """examples/train.py as a module (examples/ is not a package, and the job may run from another dir)."""
    name = "slurmdist_example_train"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


class Train(Resumable):
    """train.py's training as one submitit job; `train_args` are train.py's options (not --checkpoint)."""

    def __init__(self, train_args: Sequence[str], checkpoint_path: str, **options: Any) -> None:
        super().__init__(checkpoint_path, **options)
        self.train_args = list(train_args)
        self.train_py = str(TRAIN_PY)

    def run(self, preemption: Preemption) -> Dict[str, Any]:
        import torch

        train = load_train(self.train_py)
        args = train.parse_args([*self.train_args, "--checkpoint", str(self.checkpoint_path)])
        saved = train.load_checkpoint(self.checkpoint_path)
        env = slurmdist.init(backend=args.backend)
        if env.device.type == "cpu":
            torch.set_num_threads(args.threads)
        try:
            outcome = train.train(args, env, train.RequeueAfterSave(preemption))
            slurmdist.barrier()  # nobody tears the group down while rank 0 still saves
        except train.Stopped as stopped:  # saved, then stopped early: say why in the job's error, not as a tuple
            raise RuntimeError(stopped_because(train, stopped, self.checkpoint_path)) from None
        finally:
            slurmdist.shutdown()
        return {**outcome, "resumed_from_step": 0 if saved is None else int(saved["step"]),
                "restarts": restart_count(os.environ)}


def stopped_because(train: ModuleType, stopped: Any, checkpoint: str) -> str:
    """Why training stopped early, for the job's error: the run ends, but its checkpoint resumes it."""
    if stopped.status == train.STOPPED_EXIT_STATUS:
        why = "SIGTERM came without a warning first (scancel, or a preemption)"
    else:
        why = "the warning came but the job could not be requeued (rank 0's log says why: a limit, not sbatch)"
    return (f"training stopped at step {stopped.step}: {why}. The checkpoint {checkpoint} was saved: a job "
            "Slurm requeues (PreemptMode=REQUEUE) resumes from it; else submit the job again")


def train_seed(seed: int, steps: int, checkpoint: str) -> Dict[str, Any]:
    """One point of a sweep (a job array element): its own checkpoint file, resumable like `Train`."""
    return Train(["--steps", str(steps), "--seed", str(seed)], f"{checkpoint}.seed{seed}")()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--tasks-per-node", type=int, default=None, help="CPU-only jobs")
    parser.add_argument("--gpus-per-node", type=int, default=0, help="one task per GPU")
    parser.add_argument("--time", default="30", help="time limit (minutes or HH:MM:SS)")
    parser.add_argument("--partition")
    parser.add_argument("--folder", default="slurmdist-logs/%j")
    parser.add_argument("--cluster", choices=("auto", "slurm", "local"), default="auto")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", required=True, help="checkpoint file (one per seed with --sweep)")
    parser.add_argument("--sweep", type=int, nargs="+", metavar="SEED", help="one job per seed (a job array)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the result(s)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        return submit_and_report(args)
    except slurmdist.SlurmdistError as error:  # a bad request or a failed job: say so, no traceback of ours
        print(f"submit_train.py: {error}", file=sys.stderr)
        return 2


def submit_and_report(args: argparse.Namespace) -> int:
    submitter = Submitter(nodes=args.nodes, tasks_per_node=args.tasks_per_node, gpus_per_node=args.gpus_per_node,
                          time=args.time, partition=args.partition, folder=args.folder, cluster=args.cluster)
    if args.sweep:
        count = len(args.sweep)
        jobs = submitter.map_array(train_seed, args.sweep, [args.steps] * count, [args.checkpoint] * count)
    else:
        jobs = [submitter.submit(Train(["--steps", str(args.steps), "--seed", str(args.seed)], args.checkpoint))]
    seeds: List[int] = args.sweep or [args.seed]
    for seed, job in zip(seeds, jobs):
        print(f"seed {seed}: job {job.job_id}, log {job.paths.stdout}", file=sys.stderr)
    for seed, job in zip(seeds, jobs):
        print(json.dumps({"seed": seed, **result(job, timeout=args.timeout)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A rank of a small gloo job that can be told to fail; every rank reports what happened to it as JSON.

    python fault_worker.py OUT_DIR [--fault none|never-start|die|hang|die-in-rendezvous|freeze-in-rendezvous]
                                   [--victim RANK]

Ranks other than the victim run slurmdist.init() and then all_reduce steps until --steps. The victim:
- never-start: never calls init (as if its node never launched it), and leaves once the others reported;
- die: exits abruptly (os._exit) after init, at step --at;
- hang: stops taking part in collectives at step --at (alive, silent), and leaves once the others reported;
- die-in-rendezvous: rank 0 hosting the store dies --at seconds into init(), while it waits for the --late
  rank (which starts init() only once rank 0 is dead);
- freeze-in-rendezvous: rank 0 hosting the store stops itself (SIGSTOP, as Ctrl-Z or a debugger would) once
  every rank but the --late one checked in (which starts init() only then); a child forked beforehand kills
  it once the others reported.
Each rank writes OUT_DIR/rank<R>.json: outcome, error type and message, wall-clock exit time, master port;
the victim writes OUT_DIR/fault.json with the wall-clock time of the fault. Bounded everywhere: a rank that
waits for the others gives up after --linger seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from exiting import exit_with  # a sibling module: the worker runs as a script from this directory

STARTED = time.time()


def write(path: Path, record: dict) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(record))
    os.replace(temporary, path)


def wait_until(ready: Callable[[], bool], linger: float) -> None:
    """Wait (bounded by `linger` seconds) until `ready()`."""
    end = time.monotonic() + linger
    while not ready() and time.monotonic() < end:
        time.sleep(0.05)


def others_reported(out: Path, world: int, me: int, linger: float) -> None:
    """Wait (bounded) until every other rank wrote its report."""
    wait_until(lambda: all((out / f"rank{r}.json").exists() for r in range(world) if r != me), linger)


def kill_once_others_reported(out: Path, world: int, me: int, linger: float) -> None:
    """Fork a child that kills this process (stopped by then) once the other ranks reported."""
    parent = os.getpid()
    if os.fork() == 0:
        others_reported(out, world, me, linger)
        os.kill(parent, signal.SIGKILL)
        os._exit(0)


def freeze_once_checked_in(me, late: int, fault) -> None:
    """In rank 0: stop this whole process once every rank but `late` checked in at its store."""
    from store_probe import wait_until_checked_in  # a sibling of this script

    others = [rank for rank in range(me.world_size) if rank != late]
    wait_until_checked_in(me.master_port, os.environ, others, timeout=60)
    fault()
    os.kill(os.getpid(), signal.SIGSTOP)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--fault", default="none")
    parser.add_argument("--victim", type=int, default=-1)
    parser.add_argument("--at", type=float, default=3, help="step (die, hang) or seconds (die-in-rendezvous)")
    parser.add_argument("--late", type=int, default=-1,
                        help="this rank starts init() only after the victim's fault (the rendezvous faults)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--linger", type=float, default=90.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import slurmdist

    me = slurmdist.detect()
    victim = me.rank == args.victim
    report = {"rank": me.rank, "host": os.uname().nodename, "launcher": me.launcher, "start": STARTED}

    def fault() -> None:
        write(args.out / "fault.json", {"rank": me.rank, "fault": args.fault, "time": time.time()})

    if victim and args.fault == "never-start":
        fault()
        others_reported(args.out, me.world_size, me.rank, args.linger)
        return 0
    if victim and args.fault == "freeze-in-rendezvous":
        kill_once_others_reported(args.out, me.world_size, me.rank, args.linger)
    if me.rank == args.late:
        # Join only once rank 0 is frozen or dead: it cannot meet everyone first, however the imports went.
        wait_until((args.out / "fault.json").exists, args.linger)

    import torch
    import torch.distributed as dist

    if victim and args.fault == "freeze-in-rendezvous":
        threading.Thread(target=freeze_once_checked_in, args=(me, args.late, fault), daemon=True).start()
    if victim and args.fault == "die-in-rendezvous":  # armed after torch's import: --at seconds into init()
        timer = threading.Timer(args.at, lambda: (fault(), os._exit(17)))
        timer.daemon = True
        timer.start()
    try:
        env = slurmdist.init("gloo")
        report["master_port"] = env.master_port
        report["init_seconds"] = time.time() - STARTED
        (args.out / f"ready{env.rank}").touch()  # for tests that inject the fault from outside
        total = torch.zeros(1)
        for step in range(1, args.steps + 1):
            if victim and step == args.at and args.fault == "die":
                fault()
                os._exit(17)
            if victim and step == args.at and args.fault == "hang":
                fault()
                others_reported(args.out, env.world_size, env.rank, args.linger)
                os._exit(0)
            value = torch.tensor([float(env.rank + step)])
            dist.all_reduce(value)
            total += value
            time.sleep(0.05)
        report.update(outcome="ok", sum=total.item())
        slurmdist.barrier()
    except Exception as error:  # reported, then a non-zero exit like an uncaught error
        report.update(outcome="error", error=type(error).__name__, message=str(error).strip()[:600],
                      end=time.time())
        write(args.out / f"rank{me.rank}.json", report)
        print(f"rank {me.rank}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        os._exit(1)
    report["end"] = time.time()
    write(args.out / f"rank{me.rank}.json", report)
    slurmdist.shutdown()
    return 0


if __name__ == "__main__":
    exit_with(main())

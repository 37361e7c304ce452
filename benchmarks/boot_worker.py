"""One rank of a bootstrap run: form the process group, one all_reduce, one JSON record in BENCH_RESULT_DIR.

`python boot_worker.py slurmdist` calls `slurmdist.init()`; `python boot_worker.py torch` calls
`torch.distributed.init_process_group()` with env:// as a torchrun user does; `by-hand` is the least a start
without an agent can do (see start_by_hand). A standalone script (no imports from the benchmarks package)
so that srun, torchrun and mpirun can start it from any directory.
Importing torch is left out of the timed part: every launcher pays it alike. With BENCH_SYNC_DIR and
BENCH_RANKS set, every rank waits after its imports until all have imported (a file each in that
directory), so the timed part starts together on every rank instead of whenever torch finished importing
on a busy machine.
"""

import json
import os
import socket
import sys
import time

PROCESS_START = time.time()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


# Seconds spent in each phase of slurmdist.init(), measured by wrapping its internals (names may change:
# a phase whose function is gone is simply not reported).
PHASES = {}
PHASE_NAMES = (
    ("process_group", "detect", "launch detection (detect())"),
    ("process_group", "_choose_device", "backend and device choice"),
    ("rendezvous", "resolve_addresses", "master name resolution (DNS, else Slurm's NodeAddr)"),
    ("rendezvous", "mpi_comm", "mpi4py import and MPI_Init"),
    ("rendezvous", "open_store", "store: host it / wait for it and join"),
    ("rendezvous.Rendezvous", "check_in", "check in at the store (arrival key and counter)"),
    ("process_group", "_choose_gloo_interface", "gloo interface choice (with the wait for a remote rank's reach)"),
    ("process_group", "_init_group", "init_process_group on the store (gloo mesh)"),
)


def _wrap(module, name, label):
    function = getattr(module, name, None)
    if function is None:
        return

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            PHASES[label] = PHASES.get(label, 0.0) + time.perf_counter() - start

    setattr(module, name, timed)


LOADING = "loading slurmdist's modules (before the timed part)"


def load_slurmdist():
    """Import what `slurmdist.init()` runs on before the timed part, as this worker imports torch.distributed
    for the torch starts: a script that writes `from slurmdist import init` loads them at that line."""
    start = time.perf_counter()
    from slurmdist import process_group, rendezvous

    PHASES[LOADING] = time.perf_counter() - start
    modules = {"process_group": process_group, "rendezvous": rendezvous}
    for dotted, name, label in PHASE_NAMES:
        module_name, _, attribute = dotted.partition(".")
        owner = modules[module_name]
        _wrap(getattr(owner, attribute) if attribute else owner, name, label)


def start_slurmdist():
    import slurmdist

    env = slurmdist.init()
    return env.rank, env.world_size, torch.device(env.device or "cpu"), slurmdist.shutdown


def start_torch():
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device, dist.destroy_process_group


def start_by_hand():
    """The least a start without an agent can do, written out with no library: rank 0 serves the store, the
    others poll its port every millisecond and join, then `init_process_group()` on it. slurmdist.init() has
    this shape; the difference between the two is slurmdist's own cost."""
    from datetime import timedelta

    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    timeout = timedelta(seconds=60)
    if rank == 0:
        store = dist.TCPStore(addr, port, world, True, timeout, wait_for_workers=False)
    else:
        deadline = time.monotonic() + timeout.total_seconds()
        while True:
            try:
                # bytes: a str host makes Python's first lookup import the idna codec (~1 ms), which
                # slurmdist does not pay either.
                socket.create_connection((addr.encode(), port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.001)
        store = dist.TCPStore(addr, port, world, False, timeout)
    dist.init_process_group("gloo", store=dist.PrefixStore("by-hand", store), rank=rank, world_size=world)
    return rank, world, torch.device("cpu"), dist.destroy_process_group


STARTS = {"slurmdist": start_slurmdist, "torch": start_torch, "by-hand": start_by_hand}


def wait_for_everyone(timeout: float = 600.0) -> None:
    directory = os.environ.get("BENCH_SYNC_DIR")
    if not directory:
        return
    expected = int(os.environ["BENCH_RANKS"])
    with open(os.path.join(directory, f"{socket.gethostname()}-{os.getpid()}"), "w"):
        pass
    deadline = time.monotonic() + timeout
    while len(os.listdir(directory)) < expected:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(os.listdir(directory))} of {expected} ranks started within {timeout:.0f} s")
        time.sleep(0.002)


def main() -> int:
    mode = sys.argv[1]
    if mode == "slurmdist":
        load_slurmdist()
    wait_for_everyone()
    imported = time.time()
    cpu_start = time.process_time()
    rank, world, device, stop = STARTS[mode]()
    ready = time.time()
    tensor = torch.ones(1, device=device)
    dist.all_reduce(tensor)
    if device.type == "cuda":
        torch.cuda.synchronize()
    done = time.time()
    cpu = time.process_time() - cpu_start
    if int(tensor.item()) != world:
        print(f"rank {rank}: all_reduce gave {tensor.item()}, expected {world}", file=sys.stderr)
        return 1
    record = {"rank": rank, "world": world, "process": PROCESS_START, "start": imported, "ready": ready,
              "done": done, "cpu": cpu, "backend": str(dist.get_backend()), "phases": PHASES}
    # A file per rank: launchers merge their children's stdout, and lines from two ranks can interleave.
    with open(os.path.join(os.environ.get("BENCH_RESULT_DIR", "."), f"rank{rank}.json"), "w") as out:
        json.dump(record, out)
    stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

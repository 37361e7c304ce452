"""Scaling: bootstrap time against world size on this machine, and slurmdist's rendezvous work against
simulated world sizes up to 4096 (many store clients in two processes), which must stay linear.

Real processes stop at 32 here (two cores, ~130 MiB per torch process); beyond that, only the store traffic
slurmdist adds can be measured, by simulating ranks as store clients: each rank's own work is a constant
number of store operations, so the total must grow linearly with the world size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Dict, List, Tuple

from . import bootstrap, plots
from .context import Context
from .report import Goal, Section, image, seconds, table
from .timing import Stats, loglog_slope

CLIENTS = Path(__file__).resolve().parent / "store_clients.py"
WORKERS = 2
CONNECTIONS = 4  # TCPStore clients per worker process, shared by its simulated ranks (see store_clients.py)
SLOPE_LINEAR = 1.25  # log-log slope above this would mean worse than linear


def run(ctx: Context) -> Section:
    section = Section("scaling", "Scaling with world size")
    _processes(ctx, section)
    _simulated(ctx, section)
    return section


DNS_NOTE = (
    "A per-rank time of about 5 s (or a multiple of it) is a DNS query left unanswered, not start-up work: 5 s "
    "is the resolver's timeout, this sandbox's DNS server was seen to leave about 3 queries in 100 unanswered "
    "(when this note was written; this run does not count them), and every "
    "rank makes some (torch's store client looks the store's address up in reverse, gloo looks up the node's "
    "own name unless told its interface, as slurmdist does and torchrun does not, and on this cluster the "
    "ranks on node2 look up node1, which is not in DNS). The more "
    "ranks, the likelier one of them stalls, and the gloo mesh makes every rank wait for it. See "
    "[troubleshooting](init.md#troubleshooting)."
)


def _processes(ctx: Context, section: Section) -> None:
    sizes = [2, 4] if ctx.quick else [2, 4, 8, 16, 32]
    runs = ctx.runs(2, 1)
    names = [bootstrap.OURS, bootstrap.TORCHRUN]
    section.add(ctx.header(f"Bootstrap against world size {sizes[0]}..{sizes[-1]} processes: {' vs '.join(names)}",
                           f"{runs} interleaved runs per size, one from 16 ranks up (sizes the bootstrap benchmark "
                           "already ran in this process are reused, with its runs: the runs column)"), "")
    for ranks in sizes:
        if not all((name, ranks) in bootstrap.RESULTS for name in names):
            bootstrap.measure(names, ranks, runs if ranks < 16 else 1, ctx)
    rows: List[List[str]] = []
    series: Dict[str, Tuple[List[float], List[float]]] = {}
    for name in names:
        for ranks in sizes:
            result = bootstrap.RESULTS.get((name, ranks))
            if result is None or result.failure is not None or not result.wall:
                reason = result.failure.reason if result and result.failure else "no result"
                rows.append([str(ranks), name, f"failed: {reason}", "", ""])
                continue
            per_rank, wall = Stats(tuple(result.per_rank)), Stats(tuple(result.wall))
            rows.append([str(ranks), name, seconds(per_rank.median), seconds(wall.median), str(wall.runs)])
            for label, value in ((f"{name}: per rank", per_rank.median), (f"{name}: job wall", wall.median)):
                xs, ys = series.setdefault(label, ([], []))
                xs.append(ranks)
                ys.append(value)
    section.add(*table(["ranks", "launch", "per rank: init -> all_reduce done (median)", "job wall (median)", "runs"],
                       sorted(rows, key=lambda r: (int(r[0]), r[1]))), "")
    section.add(DNS_NOTE, "")
    bootstrap.phase_table(section, sizes[-1])
    image(section, plots.lines(ctx.img_dir / "scaling-processes.png", series,
                               title=f"Bootstrap vs world size (processes on {os.cpu_count()} cores)",
                               xlabel="ranks",
                               ylabel="seconds (median)"), "bootstrap time against world size")


def _simulated(ctx: Context, section: Section) -> None:
    sizes = [64, 256, 1024] if ctx.quick else [64, 256, 1024, 4096]
    section.add(ctx.header(f"slurmdist's rendezvous store work at simulated world sizes {sizes[0]}..{sizes[-1]} "
                           f"({WORKERS} processes of simulated ranks against one TCPStore) vs the least a "
                           "store-based start does", "one run per size"), "")
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=300), wait_for_workers=False)
    measured: Dict[int, Dict[str, float]] = {}
    for world in sizes:
        ctx.say(f"  simulated world size {world}")
        measured[world] = _simulate(server.port, world)
    rows = []
    for world, t in measured.items():
        base = t["baseline_arrive"] + t["baseline_wait"]
        ours = t["slurmdist_check_in"] + t["slurmdist_wait_all"]
        rows.append([f"{world:,}", seconds(base), seconds(ours),
                     f"{(ours - base) / world * 1e6:.1f} µs", seconds(t["report_missing"]),
                     "yes" if t.get("report_names_them") else "NO"])
    section.add(*table(["world size", "baseline: add + wait, all ranks",
                        "slurmdist: check_in + wait_all, all ranks", "added per rank",
                        "one rank names the missing 1/8", "message names them"], rows), "")
    section.add(f"Times are for all simulated ranks (the slower of the two processes per phase), which share "
                f"{CONNECTIONS} store connections per process: opening one TCPStore client per simulated rank "
                "was seen to stall 5 s about once in 30 connections on this machine (when this was written, "
                "not counted in this run), which would have made the run minutes long: torch's client looks "
                "the store's address up in reverse on every connect, and a DNS server that leaves a query "
                "unanswered costs the resolver's 5 s timeout (raw TCP connects do not stall). "
                "The baseline is the least any store-based start does (one counter increment and one wait per "
                "rank). `Rendezvous.fail()` is the path a timeout takes: one rank checks every rank's arrival "
                "key once.", "")
    series = {
        "slurmdist check_in + wait_all": (list(measured), [t["slurmdist_check_in"] + t["slurmdist_wait_all"] for t in measured.values()]),
        "baseline add + wait": (list(measured), [t["baseline_arrive"] + t["baseline_wait"] for t in measured.values()]),
        "slurmdist report of missing ranks": (list(measured), [t["report_missing"] for t in measured.values()]),
    }
    image(section, plots.lines(ctx.img_dir / "scaling-rendezvous.png", series, reference_slope="slurmdist check_in + wait_all",
                               title="Rendezvous store work vs simulated world size", xlabel="world size",
                               ylabel="seconds, all ranks"), "rendezvous store work against world size")
    _goal(section, measured)


def _simulate(port: int, world: int) -> Dict[str, float]:
    """One simulated rendezvous of `world` ranks split over WORKERS processes; per phase the slower one."""
    prefix = f"sim{world}"
    bounds = [world * i // WORKERS for i in range(WORKERS + 1)]
    procs = [subprocess.Popen([sys.executable, str(CLIENTS), "127.0.0.1", str(port), prefix, str(world),
                               str(bounds[i]), str(bounds[i + 1]), str(WORKERS), str(CONNECTIONS)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(WORKERS)]
    results: List[dict] = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120 + world * 0.1)
            if proc.returncode != 0:
                raise RuntimeError(f"store clients exited with {proc.returncode}: {err.strip()[-300:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    merged: Dict[str, float] = {}
    for result in results:
        for key, value in result.items():
            merged[key] = value if isinstance(value, bool) else max(merged.get(key, 0.0), value)
    return merged


def _goal(section: Section, measured: Dict[int, Dict[str, float]]) -> None:
    worlds = list(measured)
    ours = [t["slurmdist_check_in"] + t["slurmdist_wait_all"] for t in measured.values()]
    report = [t["report_missing"] for t in measured.values()]
    slope, report_slope = loglog_slope(worlds, ours), loglog_slope(worlds, report)
    section.goals.append(Goal(
        f"slurmdist's rendezvous work linear in world size up to {worlds[-1]:,} (never quadratic)",
        f"log-log slope {slope:.2f} (check_in + wait_all), {report_slope:.2f} (naming missing ranks); "
        f"per rank {ours[0] / worlds[0] * 1e6:.0f} µs at {worlds[0]}, {ours[-1] / worlds[-1] * 1e6:.0f} µs at {worlds[-1]:,}",
        slope <= SLOPE_LINEAR and report_slope <= SLOPE_LINEAR))

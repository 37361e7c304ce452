"""Start-up cost: importing what asks "who am I" in a fresh interpreter, and `detect()` on an srun task's
environment, against submitit's JobEnvironment + TorchDistributedEnvironment and Lightning's SLURMEnvironment.

Imports are timed inside a fresh child process (interpreter start-up is the same for every tool and left
out). `import slurmdist` alone loads almost nothing (names load on first use), so slurmdist's row is
`from slurmdist import detect`, the same work as the peers' imports. Detection is timed twice: repeated in
this process with every tool imported beforehand (the environment restored before each call, because
Lightning writes MASTER_ADDR/MASTER_PORT into os.environ when read), and as the first call of a fresh
process, which is what a job pays.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import Callable, Dict, List, Tuple

from .context import Context
from .machine import REPO
from .report import TIMING_HEADER, Goal, Section, seconds, table, timing_rows
from .timing import Runner, Stats, first_call, interleave, run_process, timed_calls

HEAVY = ("torch", "mpi4py", "submitit", "numpy")
IMPORT_GOAL = 0.050
DETECT_GOAL = 100e-6
DETECT_FIRST_GOAL = 1e-3  # once per process: nothing cached, the nodelist's patterns not yet compiled
SRUN_CASE = REPO / "tests" / "fixtures" / "slurm" / "srun_N2_tpn2" / "task1.env"

# What a user of each tool imports before it can ask who this process is.
OURS = "slurmdist (from slurmdist import detect)"
IMPORTS = {
    OURS: "from slurmdist import detect",
    "slurmdist (from slurmdist import init, without torch)": "from slurmdist import init",
    "slurmdist (import slurmdist alone: names load on first use)": "import slurmdist",
    "submitit": "import submitit",
    "lightning (SLURMEnvironment)": "from lightning.fabric.plugins.environments import SLURMEnvironment",
    "torch.distributed (for scale)": "import torch.distributed",
}
SLOW_IMPORTS = ("lightning (SLURMEnvironment)", "torch.distributed (for scale)")

_CHILD = """
import json, sys, time
start = time.perf_counter()
{statement}
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def srun_environment() -> Dict[str, str]:
    """Task 1 of `srun -N2 -n4` as captured on the local cluster (tests/fixtures), plus the variable
    submitit sets in the jobs it submits (its JobEnvironment refuses to work without it)."""
    env: Dict[str, str] = {"SUBMITIT_EXECUTOR": "slurm"}
    for line in SRUN_CASE.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def import_runner(statement: str, seen: Dict[str, set]) -> Runner:
    """A runner importing in a fresh interpreter and returning the import's own time; records which heavy
    modules came along."""

    def run() -> float:
        code = _CHILD.format(statement=statement, heavy=HEAVY)
        _, done = run_process([sys.executable, "-c", code], timeout=120, cwd=str(REPO))
        result = json.loads(done.stdout.strip().splitlines()[-1])
        seen.setdefault(statement, set()).update(result["heavy"])
        return float(result["seconds"])

    return run


def detectors() -> Tuple[Dict[str, Callable[[], Tuple[int, int, str]]], Dict[str, str]]:
    """(rank, world size, master address) readers per installed tool, and why others are missing."""
    from slurmdist.detection import detect

    def ours() -> Tuple[int, int, str]:
        env = detect()
        return env.rank, env.world_size, str(env.master_addr)

    found: Dict[str, Callable[[], Tuple[int, int, str]]] = {"slurmdist detect()": ours}
    missing: Dict[str, str] = {}
    try:
        from submitit.helpers import TorchDistributedEnvironment

        def submitit_env() -> Tuple[int, int, str]:
            env = TorchDistributedEnvironment()
            return env.rank, env.world_size, env.master_addr

        found["submitit TorchDistributedEnvironment()"] = submitit_env
    except ImportError as exc:
        missing["submitit"] = f"not installed ({exc})"
    try:
        from lightning.fabric.plugins.environments import SLURMEnvironment

        def lightning_env() -> Tuple[int, int, str]:
            if not SLURMEnvironment.detect():
                raise RuntimeError("SLURMEnvironment.detect() is False on an srun task")
            env = SLURMEnvironment()
            env.main_port  # read like Lightning's strategy does; it also sets MASTER_PORT
            return env.global_rank(), env.world_size(), env.main_address

        found["lightning SLURMEnvironment"] = lightning_env
    except ImportError as exc:
        missing["lightning"] = f"not installed (`pip install lightning` to measure it): {exc}"
    return found, missing


def _answer(read: Callable[[], Tuple[int, int, str]], restore: Callable[[], None]) -> object:
    """(rank, world size, master) from one tool, or the error it raised."""
    restore()
    try:
        return read()
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:150]}"


def run(ctx: Context) -> Section:
    section = Section("startup", "Start-up cost: import and detection")
    _imports(ctx, section)
    _detection(ctx, section)
    return section


def _imports(ctx: Context, section: Section) -> None:
    runs = ctx.runs(7, 3)
    names = [n for n in IMPORTS if not (ctx.quick and n in SLOW_IMPORTS)]
    absent = [n for n in names if importlib.util.find_spec(n.split()[0].split(".")[0]) is None]
    names = [n for n in names if n not in absent]
    section.add(ctx.header(f"Import time in a fresh interpreter: {', '.join(names)}",
                           f"{runs} interleaved runs each, one fresh process per run"), "")
    seen: Dict[str, set] = {}
    outcomes = interleave({name: import_runner(IMPORTS[name], seen) for name in names}, runs, warmup=1)
    section.add(*table(["import", *TIMING_HEADER[1:], "torch, mpi4py, submitit or numpy imported"],
                       [row + [", ".join(sorted(seen.get(IMPORTS[row[0].strip("*")], ()))) or "none"]
                        for row in timing_rows(outcomes, OURS)]), "")
    if ctx.quick:
        section.add(f"_--quick leaves out {', '.join(SLOW_IMPORTS)} (several seconds each here)._", "")
    if absent:
        section.add(f"_Not installed, so not measured: {', '.join(absent)} (`pip install` it to compare)._", "")
    # The time goal is on what asking "who am I" needs; init()'s modules only promise to leave torch, mpi4py
    # and submitit out (the training script imports torch itself, seconds here).
    for name in [n for n in IMPORTS if n.startswith("slurmdist")]:
        outcome, heavy = outcomes.get(name), sorted(seen.get(IMPORTS[name], ()))
        bound = IMPORT_GOAL if name == OURS else None
        claim = (f"`{IMPORTS[name]}`{f' under {seconds(bound)},' if bound else ''} importing no "
                 "torch/mpi4py/submitit")
        if isinstance(outcome, Stats):
            section.goals.append(Goal(claim, f"median {seconds(outcome.median)}; heavy modules: "
                                      f"{', '.join(heavy) or 'none'}",
                                      (bound is None or outcome.median < bound) and not heavy))
        else:
            section.goals.append(Goal(claim, "failed", None))


def _detection(ctx: Context, section: Section) -> None:
    environment = srun_environment()
    found, missing = detectors()
    runs, calls = ctx.runs(15, 5), ctx.runs(200, 50)
    section.add(ctx.header(f"Who am I on an srun task (`srun -N2 -n4`, task 1): {', '.join(found)}",
                           f"{runs} interleaved runs of {calls} calls each"), "")
    saved = dict(os.environ)

    def restore() -> None:
        os.environ.clear()
        os.environ.update(environment)

    try:
        answers = {name: _answer(read, restore) for name, read in found.items()}
        expected = answers["slurmdist detect()"]
        runners = {name: timed_calls(read, calls, setup=restore) for name, read in found.items()
                   if answers[name] == expected}
        outcomes = interleave(runners, runs)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    rows = timing_rows(outcomes, "slurmdist detect()")
    for name, answer in answers.items():
        if name not in runners:
            rows.append([name, f"not timed: {answer} instead of {expected}", "", "", "", ""])
    rows += [[name, reason, "", "", "", ""] for name, reason in missing.items()]
    section.add(*table(TIMING_HEADER, rows), "")
    section.add("Each call answers rank, world size and master address; submitit's "
                "`TorchDistributedEnvironment()` builds its `JobEnvironment` and expands the nodelist, "
                "Lightning's `SLURMEnvironment` is detected, built and asked for its main address and port.", "")
    _detect_goal(section, outcomes.get("slurmdist detect()"), "repeated in one process")
    _first_detection(ctx, section, environment, [name for name in runners])


# Each tool's "who am I" as a fresh process asks it once: (imports, outside the clock; the call).
FIRST_CALLS = {
    "slurmdist detect()": ("from slurmdist import detect",
                           "env = detect(); env.rank, env.world_size, env.master_addr"),
    "submitit TorchDistributedEnvironment()": ("from submitit.helpers import TorchDistributedEnvironment",
                                               "env = TorchDistributedEnvironment(); env.rank, env.world_size, "
                                               "env.master_addr"),
    "lightning SLURMEnvironment": ("from lightning.fabric.plugins.environments import SLURMEnvironment",
                                   "SLURMEnvironment.detect(); env = SLURMEnvironment(); env.main_port; "
                                   "env.global_rank(), env.world_size(), env.main_address"),
}


def _first_detection(ctx: Context, section: Section, environment: Dict[str, str], tools: List[str]) -> None:
    """The first call in a fresh process: what a rank pays (caches empty), which the repeated calls hide."""
    runs = ctx.runs(9, 3)
    env = {**environment, "PATH": os.environ.get("PATH", "")}
    runners = {name: first_call(*FIRST_CALLS[name], env=env, cwd=str(REPO)) for name in tools}
    outcomes = interleave(runners, runs)
    section.add(f"The same question asked once, as a rank asks it: the first call in a fresh interpreter on "
                f"that task's environment, the tool imported before the clock starts; median of {runs} processes "
                "per tool, interleaved.", "", *table(TIMING_HEADER, timing_rows(outcomes, "slurmdist detect()")), "")
    _detect_goal(section, outcomes.get("slurmdist detect()"), "first call in a fresh process", DETECT_FIRST_GOAL)


def _detect_goal(section: Section, ours: object, how: str, goal: float = DETECT_GOAL) -> None:
    claim = f"`detect()` on an srun environment under {seconds(goal)}, {how}"
    section.goals.append(Goal(claim, f"median {seconds(ours.median)}" if isinstance(ours, Stats) else "failed",
                              ours.median < goal if isinstance(ours, Stats) else None))

"""Hostlist expansion: slurmdist.hostlist against python-hostlist, submitit's parser and `scontrol`.

Every tool's output is first checked against slurmdist's (a tool that expands a case differently is
reported, not timed). slurmdist keeps formatted numbers across calls, which the peers do not: it is timed
with that memo emptied before each call, and once more, apart, with it warm. scontrol is a whole process,
so it is compared with slurmdist's own command, `slurmdist hostlist expand`, also a whole process.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from . import plots
from .context import Context
from .machine import REPO
from .report import TIMING_HEADER, Goal, Section, image, seconds, table, timing_rows
from .timing import (Failure, Outcome, Runner, Stats, first_call, interleave, loglog_slope, run_process, timed,
                     timed_calls)

OURS = "slurmdist"
OURS_WARM = "slurmdist, memo warm (same list again)"
OURS_COMMAND = "slurmdist hostlist expand (process)"
SCONTROL = "scontrol (process)"
ARG_MAX = 128 * 1024 - 1  # Linux's limit on one argument: longer lists cannot reach scontrol at all
FIRST_GOAL = 50e-6
SPEEDUP_GOAL = 1.5
SLOPE_LINEAR = 1.15  # log-log slope above this would mean worse than linear


def fragmented(hosts: int, *, prefix: str = "nid", width: int = 5, mean: int = 4, seed: int = 1) -> Tuple[str, int]:
    """A nodelist of `hosts` hosts in runs of 1..2*mean-1 with gaps, as a busy scheduler hands out:
    (text, number of fragments). Deterministic, so every run measures the same list."""
    rng = random.Random(seed)
    parts: List[str] = []
    number, total = 1, 0
    while total < hosts:
        length = min(rng.randint(1, 2 * mean - 1), hosts - total)
        last = number + length - 1
        parts.append(f"{number:0{width}d}" if length == 1 else f"{number:0{width}d}-{last:0{width}d}")
        number, total = last + 1 + rng.randint(1, 3), total + length
    return f"{prefix}[{','.join(parts)}]", len(parts)


def cases() -> Dict[str, str]:
    """The issue's four shapes, by label."""
    text, pieces = fragmented(4096)
    return {
        "100k hosts (cpu[00001-50000],gpu[...])": "cpu[00001-50000],gpu[00001-50000]",
        "10k range (n[00001-10000])": "n[00001-10000]",
        f"4096 nodes in {pieces} fragments": text,
        "64 groups of 128 (r[01-64]n[001-128])": "r[01-64]n[001-128]",
        "three groups, 8192 hosts (c[1-4]r[01-16]n[001-128])": "c[1-4]r[01-16]n[001-128]",
    }


def first_cases() -> Dict[str, str]:
    """The 100k-host list for first(), compact and as a busy scheduler fragments it (about 100 KB of text)."""
    text, pieces = fragmented(100_000, width=7, mean=16)
    return {"compact 100k-host list": next(iter(cases().values())),
            f"100k hosts in {pieces} fragments ({len(text) // 1000} KB)": text}


# Each Python tool's expansion as a fresh process runs it once: (imports, outside the clock; the call).
FIRST_CALLS = {
    OURS: ("from slurmdist.hostlist import expand", "expand(sys.argv[1])"),
    "python-hostlist": ("import hostlist", "hostlist.expand_hostlist(sys.argv[1], allow_duplicates=True)"),
    "submitit": ("from submitit.slurm.slurm import _parse_node_list", "_parse_node_list(sys.argv[1])"),
}


PEER_PACKAGES = {"python-hostlist": "python-hostlist", "submitit": "submitit"}  # tool: what pip installs


def expanders() -> Dict[str, Callable[[str], List[str]]]:
    """Python expanders that are installed, slurmdist first."""
    from slurmdist.hostlist import expand

    found: Dict[str, Callable[[str], List[str]]] = {OURS: expand}
    try:
        import hostlist as python_hostlist

        found["python-hostlist"] = lambda text: python_hostlist.expand_hostlist(text, allow_duplicates=True)
    except ImportError:
        pass
    try:
        from submitit.slurm.slurm import _parse_node_list

        found["submitit"] = _parse_node_list
    except ImportError:
        pass
    return found


def _one_argument(text: str) -> None:
    """Refuse a list no command line can carry: longer than Linux's limit on one argument."""
    if len(text) > ARG_MAX:
        raise RuntimeError(f"the list is {len(text)} characters, beyond Linux's {ARG_MAX + 1}-byte argument limit")


class Scontrol:
    """`scontrol show hostnames` with the two-line slurm.conf it needs (no daemon)."""

    def __init__(self, workdir: Path) -> None:
        self.path = shutil.which("scontrol")
        conf = workdir / "slurm.conf"
        conf.write_text("ClusterName=x\nSlurmctldHost=localhost\n")
        self.env = dict(os.environ, SLURM_CONF=str(conf))

    def expand(self, text: str) -> List[str]:
        if self.path is None:
            raise RuntimeError("scontrol is not installed")
        _one_argument(text)
        _, done = run_process([self.path, "show", "hostnames", text], env=self.env, timeout=60)
        if "Invalid hostlist" in done.stdout + done.stderr:
            raise RuntimeError("scontrol rejected the list")
        return done.stdout.split()


def runners_for(text: str, tools: Mapping[str, Callable[[str], List[str]]], scontrol: Optional[Scontrol],
                warm: bool = False) -> Tuple[Dict[str, Runner], Dict[str, Failure]]:
    """A timed runner per tool whose output matches slurmdist's, and why the others are left out; `warm`
    adds slurmdist with its memo kept from the call before (OURS_WARM)."""
    candidates: Dict[str, Callable[[str], List[str]]] = dict(tools)
    if scontrol is not None:
        candidates[SCONTROL] = scontrol.expand
    runners, left_out = checked_runners(text, tools[OURS](text), candidates)
    if warm:
        runners[OURS_WARM] = timed(lambda: tools[OURS](text))
    return runners, left_out


def checked_runners(text: str, expected: List[str], candidates: Mapping[str, Callable[[str], List[str]]]
                    ) -> Tuple[Dict[str, Runner], Dict[str, Failure]]:
    """A timed runner per candidate that expands `text` to the `expected` hosts, and why the others cannot."""
    runners: Dict[str, Runner] = {}
    left_out: Dict[str, Failure] = {}
    for name, expand in candidates.items():
        try:
            got = expand(text)
        except Exception as exc:
            left_out[name] = Failure(f"cannot expand it ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        if sorted(got) != sorted(expected):
            left_out[name] = Failure(f"different hosts ({len(got)} vs {len(expected)})")
            continue
        # The same hosts in another order (three bracket groups or more: scontrol's order is not the plain
        # product's) is the same work: timed, and said.
        label = name if got == expected else f"{name} (same hosts, not in scontrol's order)"
        runners[label] = timed(lambda expand=expand: expand(text), _forget_memo if name == OURS else None)
    return runners, left_out


def _forget_memo() -> None:
    """Empty slurmdist's memo of formatted numbers: each timed call then does the whole work, as the peers'."""
    from slurmdist import hostlist

    hostlist._TABLES.clear()
    hostlist._TAILS.clear()


class Command:
    """`slurmdist hostlist expand` as a user's script runs it: the console script beside this Python."""

    def __init__(self) -> None:
        script = Path(sys.executable).with_name("slurmdist")
        self.argv = [str(script)] if script.exists() else [sys.executable, "-m", "slurmdist"]

    def expand(self, text: str) -> List[str]:
        _one_argument(text)
        _, done = run_process([*self.argv, "hostlist", "expand", text], timeout=60)
        return done.stdout.split()


def run(ctx: Context) -> Section:
    tools = expanders()
    runs = ctx.runs(15, 5)
    section = Section("hostlist", "Hostlists: full expansion to a list")
    peers = [name for name in tools if name != OURS]
    section.add(ctx.header(f"slurmdist.hostlist.expand vs {', '.join(peers) or 'no Python peer'}; "
                           "`slurmdist hostlist expand` vs `scontrol show hostnames` (whole processes)",
                           f"{runs} interleaved runs per tool and case after one warm-up"), "")
    missing = [name for name in PEER_PACKAGES if name not in tools]
    if missing:
        section.add(f"Not installed here, so not measured: {', '.join(missing)} (pip install "
                    f"{' '.join(PEER_PACKAGES[name] for name in missing)}).", "")
    with tempfile.TemporaryDirectory() as tmp:
        scontrol = Scontrol(Path(tmp))
        results = _cases(ctx, section, tools, scontrol, runs)
        first_calls = _first_calls(ctx, section, results)
        sizes = _linearity(ctx, section, tools, scontrol)
    _first(ctx, section, tools)
    _goals(section, results, sizes)
    section.goals.insert(1, _speedup_goal(first_calls, "on the first call in a fresh process", 1.0))
    section.add("Ratios are each tool's median over slurmdist's median in the same run (above 1: slurmdist "
                "is faster). The Python peers keep duplicates (`allow_duplicates=True`); with three bracket "
                "groups or more their order is not scontrol's, which the tables say.")
    return section


def _cases(ctx: Context, section: Section, tools, scontrol: Scontrol, runs: int) -> Dict[str, Dict[str, Outcome]]:
    results: Dict[str, Dict[str, Outcome]] = {}
    rows: List[List[str]] = []
    for label, text in cases().items():
        runners, left_out = runners_for(text, tools, None, warm=True)
        ctx.say(f"  {label}: {', '.join(runners)}")
        outcomes = {**interleave(runners, runs), **left_out}
        results[label] = outcomes
        rows += timing_rows(outcomes, OURS, label=[label])
    section.add(*table(["case", *TIMING_HEADER], rows), "")
    section.add(f"`{OURS_WARM}` expands the list it expanded just before, with the numbers formatted then: what "
                "a process that expands one nodelist again pays. It is not counted against the peers; its ratio column "
                "is against slurmdist's own first expansion (below 1: the memo pays off), not a peer's.", "")
    groups = list(results)
    values = chart_values(results, [*tools, OURS_WARM])
    image(section, plots.bars(ctx.img_dir / "hostlist-cases.png", [g.split(" (")[0] for g in groups], values,
                              title="Hostlist expansion (median, lower is better)", ylabel="seconds", log=True),
          "hostlist expansion per case")
    _as_commands(ctx, section, scontrol, runs)
    return results


def _as_commands(ctx: Context, section: Section, scontrol: Scontrol, runs: int) -> None:
    """scontrol against slurmdist's command: whole processes both, as a job script calls them."""
    from slurmdist.hostlist import expand

    command = Command()
    section.add(f"As commands a job script runs: `slurmdist hostlist expand` against `scontrol show hostnames`, "
                f"each a whole process (Python's start-up and slurmdist's import included); {runs} interleaved "
                "runs.", "")
    rows: List[List[str]] = []
    for label, text in cases().items():
        runners, left_out = checked_runners(text, expand(text), {OURS_COMMAND: command.expand,
                                                                 SCONTROL: scontrol.expand})
        rows += timing_rows({**interleave(runners, runs), **left_out}, OURS_COMMAND, label=[label])
    section.add(*table(["case", *TIMING_HEADER[:-1], "time / the command's"], rows), "")


def chart_values(results: Mapping[str, Mapping[str, Outcome]], tools: List[str]) -> Dict[str, List[Optional[float]]]:
    """Each tool's median per case, for the chart (None where it could not expand the case)."""
    return {tool: [_median(_by_tool(outcomes, tool)) for outcomes in results.values()] for tool in tools}


def _by_tool(outcomes: Mapping[str, Outcome], tool: str) -> Optional[Outcome]:
    """A tool's outcome whatever its label says beside the name ("submitit (same hosts, ...)")."""
    return next((o for label, o in outcomes.items() if label == tool or label.split(" (")[0] == tool), None)


def _first_calls(ctx: Context, section: Section, results: Dict[str, Dict[str, Outcome]]
                 ) -> Dict[str, Dict[str, Outcome]]:
    """Each case's first expansion in a fresh process, per Python tool that expanded it right above: the
    usual use (a job expands its nodelist once), where nothing is memoised or compiled yet."""
    runs = ctx.runs(7, 3)
    section.add(f"The same cases as a job meets them, once: the first call in a fresh interpreter, the tool "
                f"imported before the clock starts; median of {runs} processes per tool and case, interleaved. "
                "The table above repeats each call in one process, where the allocator and compiled patterns "
                "are warm (slurmdist's memo of formatted numbers is emptied before each of its calls there).",
                "")
    outcomes: Dict[str, Dict[str, Outcome]] = {}
    rows: List[List[str]] = []
    for label, text in cases().items():
        expanded = [tool for tool, outcome in results[label].items()
                    if isinstance(outcome, Stats) and tool.split(" (")[0] in FIRST_CALLS]
        runners = {tool: first_call(*FIRST_CALLS[tool.split(" (")[0]], args=[text], cwd=str(REPO))
                   for tool in expanded}
        outcomes[label] = interleave(runners, runs)
        rows += timing_rows(outcomes[label], OURS, label=[label])
    section.add(*table(["case", *TIMING_HEADER], rows), "")
    return outcomes


def _linearity(ctx: Context, section: Section, tools, scontrol: Scontrol) -> Dict[str, Dict[int, Outcome]]:
    sizes = [1000, 10_000, 100_000] if ctx.quick else [1000, 3000, 10_000, 30_000, 100_000, 300_000, 1_000_000]
    runs = ctx.runs(5, 3)
    ctx.say(f"  linearity: {len(sizes)} sizes, {runs} runs each")
    by_tool: Dict[str, Dict[int, Outcome]] = {}
    for hosts in sizes:
        text, pieces = fragmented(hosts, width=7, mean=16, seed=hosts)
        runners, left_out = runners_for(text, tools, scontrol)
        for tool, outcome in {**interleave(runners, runs), **left_out}.items():
            by_tool.setdefault(tool, {})[hosts] = outcome
    rows = []
    for tool, per_size in by_tool.items():
        ok = {h: o for h, o in per_size.items() if isinstance(o, Stats)}
        cells = [f"{seconds(o.median)} ({o.median / h * 1e9:.0f} ns/host)" if isinstance(o, Stats) else "n/a"
                 for h, o in per_size.items()]
        slope = loglog_slope(list(ok), [o.median for o in ok.values()]) if len(ok) > 1 else float("nan")
        rows.append([tool, *cells, f"{slope:.2f}"])
    section.add(f"Time against list size: the same shape (runs of 1-31 nodes with gaps, `nid[...]`) from "
                f"{sizes[0]:,} to {sizes[-1]:,} hosts, median of {runs} runs. The slope of log(time) against "
                "log(hosts) is 1 for linear, 2 for quadratic. scontrol cannot take lists longer than one "
                "command-line argument (128 KiB).", "")
    section.add(*table(["tool", *[f"{h:,} hosts" for h in sizes], "log-log slope"], rows), "")
    reasons = sorted({(tool, o.reason) for tool, per in by_tool.items() for o in per.values()
                      if isinstance(o, Failure)})
    if reasons:
        section.add("n/a: " + "; ".join(f"{tool} {reason}" for tool, reason in reasons) + ". Its slope covers the "
                    "sizes it took.", "")
    series = {tool: ([h for h, o in per.items() if isinstance(o, Stats)],
                     [o.median for o in per.values() if isinstance(o, Stats)]) for tool, per in by_tool.items()}
    image(section, plots.lines(ctx.img_dir / "hostlist-linearity.png", series, title="Hostlist expansion time vs size",
                               xlabel="hosts", ylabel="seconds (median)", reference_slope=OURS),
          "hostlist expansion time against size")
    return by_tool


FIRST_CALLS_PER_RUN = 200


def _first(ctx: Context, section: Section, tools) -> None:
    from slurmdist.hostlist import first

    runs = ctx.runs(9, 3)
    ours = f"{OURS} first(), mean of {FIRST_CALLS_PER_RUN} calls"
    section.add("The first host of a 100k-host list (the rendezvous host). Peers have no such function; "
                "what their users write instead is to expand and take element 0. first() checks the whole "
                "first item's syntax, so a list that is one long bracket costs time in its length. A first() "
                f"call is too short for one reading of the clock: each run times {FIRST_CALLS_PER_RUN} in a row "
                "and gives their mean (later calls find the parser's patterns compiled), while each peer's "
                "expand()[0] is one call.", "")
    for label, text in first_cases().items():
        runners: Dict[str, Runner] = {ours: timed_calls(lambda text=text: first(text), FIRST_CALLS_PER_RUN)}
        for name, expand in tools.items():
            if name != OURS:
                runners[f"{name}: expand()[0]"] = timed(lambda expand=expand, text=text: expand(text)[0])
        outcomes = interleave(runners, runs)
        section.add(f"{label}:", "", *table(TIMING_HEADER, timing_rows(outcomes, ours)), "")
        section.goals.append(_first_goal(outcomes.get(ours), label))


def _first_goal(outcome: Optional[Outcome], label: str) -> Goal:
    claim = f"`first()` under {seconds(FIRST_GOAL)} on the {label} (mean of a run's calls)"
    if not isinstance(outcome, Stats):
        return Goal(claim, "failed", None)
    return Goal(claim, f"median {seconds(outcome.median)}", outcome.median < FIRST_GOAL)


def _speedup_goal(results: Dict[str, Dict[str, Outcome]], how: str, goal: float) -> Goal:
    """Whether slurmdist is at least `goal` times faster than the fastest Python peer on every case."""
    worst: Optional[Tuple[float, str, str]] = None
    for label, outcomes in results.items():
        ours = outcomes.get(OURS)
        peers = {t: o for t, o in outcomes.items() if t not in (OURS, OURS_WARM, SCONTROL) and isinstance(o, Stats)}
        if not isinstance(ours, Stats) or not peers:
            continue
        fastest = min(peers, key=lambda t: peers[t].median)
        speedup = peers[fastest].median / ours.median
        if worst is None or speedup < worst[0]:
            worst = (speedup, label, fastest)
    claim = (f"at least {goal}x faster than the fastest Python peer on every case, {how}" if goal != 1.0 else
             f"no slower than the fastest Python peer on any case, {how}")
    if worst is None:
        return Goal(claim, "no peer measured", None)
    return Goal(claim, f"lowest: {worst[0]:.2f}x vs {worst[2]} on {worst[1]}", worst[0] >= goal)


def _goals(section: Section, results: Dict[str, Dict[str, Outcome]], sizes: Dict[str, Dict[int, Outcome]]) -> None:
    section.goals.insert(0, _speedup_goal(results, "repeated in one process", SPEEDUP_GOAL))
    ours = {h: o for h, o in sizes.get(OURS, {}).items() if isinstance(o, Stats)}
    claim = f"linear in hosts ({_hosts(min(ours, default=0))}..{_hosts(max(ours, default=0))})"
    if len(ours) > 1:
        slope = loglog_slope(list(ours), [o.median for o in ours.values()])
        per_host = [o.median / h * 1e9 for h, o in ours.items()]
        section.goals.insert(1, Goal(claim, f"log-log slope {slope:.2f}; {min(per_host):.0f}-{max(per_host):.0f} ns/host",
                                     slope <= SLOPE_LINEAR))
    else:
        section.goals.insert(1, Goal(claim, "not measured", None))


def _hosts(count: int) -> str:
    """1000 -> '1k', 1000000 -> '1M'."""
    return f"{count // 1_000_000}M" if count >= 1_000_000 else f"{count // 1000}k"


def _median(outcome: Optional[Outcome]) -> Optional[float]:
    return outcome.median if isinstance(outcome, Stats) else None


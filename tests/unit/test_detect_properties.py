"""Property-based tests: `detect()` over generated environments, and linear cost of the parsers it relies on.

- Mixed, malformed environments (every launcher's variables at once, empty, negative, non-numeric, huge and
  contradictory values, broken nodelists and task-per-node strings): only `SlurmdistError` escapes, the input
  mapping is never changed, and whatever is returned is a consistent topology.
- Valid environments of every launcher round-trip: detect() gives back the topology they were built from,
  and exporting it as torchrun's variables and detecting again gives the same topology.
- The hostlist parser (nodelists) and the task-per-node parser cost time linear in their input or output and
  memory bounded by a cap: checked by growth ratios and allocation peaks, never by absolute times.

Default profile: a few hundred cases per property. ``HYPOTHESIS_PROFILE=slow``: 100,000 mixed environments.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
from types import MappingProxyType
from typing import Callable, Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmdist import hostlist
from slurmdist.detection import READERS, detect
from slurmdist.distenv import DistEnv
from slurmdist.errors import HostlistError, LaunchError, SlurmdistError
from slurmdist.exporting import torchrun_variables
from slurmdist.launchers import mpi
from slurmdist.ports import step_port

RELIABILITY_SECTION = "Bad input: detect() and the parsers it uses"

SLOW = os.environ.get("HYPOTHESIS_PROFILE") == "slow"
# Own settings objects (not registered profiles), so this file never changes other files' settings.
FUZZ = settings(max_examples=100_000 if SLOW else 400, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ROUND_TRIP = settings(max_examples=20_000 if SLOW else 200, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.too_slow])

# --- the variables every launcher reads ---------------------------------------------------------------------

COUNT_VARIABLES = [
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_PORT",
    "SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_LOCALID", "SUBMITIT_LOCAL_NTASKS",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS",
    "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_RESTART_COUNT",
    "FLUX_TASK_RANK", "FLUX_JOB_SIZE", "FLUX_JOB_NNODES", "FLUX_TASK_LOCAL_ID",
    *sorted({name for spec in mpi.SPECS for name in (spec.rank, spec.size, spec.local_rank, spec.local_size,
                                                      spec.node_rank) if name}),
]
TEXT_VARIABLES = {
    "MASTER_ADDR": ["127.0.0.1", "node1", "[::1]", "", " ", "no-such-host.invalid", "a b"],
    "TORCHELASTIC_RUN_ID": ["none", "", "abc"],
    "TORCHELASTIC_USE_AGENT_STORE": ["True", "False", ""],
    "SUBMITIT_EXECUTOR": ["local", "slurm", ""],
    "SUBMITIT_LOCAL_JOB_ID": ["123", "", " "],
    "SLURM_STEP_ID": ["0", "1", "batch", "extern", "interactive", "4294967294", "4294967290", "", " ", "-1", "x"],
    "SLURM_STEPID": ["0", "3", "batch", ""],
    "SLURM_JOB_ID": ["1", "42", "", " ", "12_3", "-5", "8" * 5000],
    "SLURM_JOBID": ["42", ""],
    "FLUX_JOB_ID": ["f2abc", ""],
    "LSB_JOBID": ["7", ""],
    "PBS_JOBID": ["9.pbs", ""],
    "PALS_APID": ["ab-cd", ""],
    "SLURMDIST_LAUNCHER": [*READERS, "single", "", " slurm ", "pbs", "SLURM"],
}
NODELIST_VARIABLES = ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"]
LAYOUT_VARIABLES = ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]

MALFORMED_COUNTS = [
    "", " ", "\t", "-1", "-0", "--1", "abc", "1.5", "1e3", "+3", "0x10", " 2 ", "3\n", "nan", "None",
    "\u0661", "\u00b2", "\uff11", str(2**31 - 1), str(2**31), str(2**63), "9" * 400, "0" * 300 + "1",
    "7" * 5000,  # past Python's 4300-digit limit for int(): a bare ValueError unless refused first
]
counts = st.one_of(
    st.integers(0, 8).map(str),                  # plausible: keeps many cases deep inside the readers
    st.integers(0, 70000).map(str),
    st.sampled_from(MALFORMED_COUNTS),
    st.text(max_size=6),
)
BROKEN_NODELISTS = [
    "", " ", ",", "node[", "node]", "n[1-", "n[-3]", "n[3-1]", "n[1,,2]", "n[a-b]", "n[ 1]", "n[+1]",
    "n[1-99999999999999999999999]", "n[1-18446744073709551616]", "n[1-2]x[", "[]", "n[1-2][", "a]b[1]",
    "a[1-2]b[1-2]" * 30, "x" * 300, "n[" + "9" * 40 + "]", "n[0-4294967295]", "gpu[1-2]-ib", "n[1-2]]",
]
nodelists = st.one_of(
    st.sampled_from(["node1", "node[1-2]", "node[1-4]", "n[01-16,20]", "a,b", "node[1-2],gpu7"]),
    st.sampled_from(BROKEN_NODELISTS),
    st.text(st.sampled_from("n0123456789[],- x\t"), max_size=24),
)
BROKEN_LAYOUTS = [
    "", " ", "2(x", "(x2)", "2(x0)", "2(x-1)", "2(x3", "1,,2", "x", "-1", "2(x3)(x2)", "1(x2147483647)",
    "1(x2147483646)", "3(x99999999999)", "1(x4294967296)", ",", "2(x1),", "\u0662", "2 (x2)",
    "2(x" + "9" * 5000 + ")",
]
layouts = st.one_of(
    st.sampled_from(["1", "2", "4", "2(x2)", "2,1", "4(x2)", "2(x3),1", "1(x4)"]),
    st.sampled_from(BROKEN_LAYOUTS),
    st.text(st.sampled_from("0123456789(x),-"), max_size=14),
)


def value_for(name: str) -> st.SearchStrategy[str]:
    if name in NODELIST_VARIABLES:
        return nodelists
    if name in LAYOUT_VARIABLES:
        return layouts
    if name in TEXT_VARIABLES:
        return st.one_of(st.sampled_from(TEXT_VARIABLES[name]), st.text(max_size=6))
    return counts


ALL_VARIABLES = sorted({*COUNT_VARIABLES, *TEXT_VARIABLES, *NODELIST_VARIABLES, *LAYOUT_VARIABLES})


# --- valid environments of every launcher -------------------------------------------------------------------


@st.composite
def topologies(draw: st.DrawFn, even: bool = True) -> Tuple[List[int], int]:
    """(tasks on each node, global rank): Slurm may be uneven, the other launchers are even."""
    nodes = draw(st.integers(1, 4))
    if even:
        layout = [draw(st.integers(1, 4))] * nodes
    else:
        layout = draw(st.lists(st.integers(1, 4), min_size=nodes, max_size=nodes))
    return layout, draw(st.integers(0, sum(layout) - 1))


def place(layout: List[int], rank: int) -> Tuple[int, int]:
    """(node index, local rank) of `rank` when ranks fill the nodes in order (block distribution)."""
    for node, tasks in enumerate(layout):
        if rank < tasks:
            return node, rank
        rank -= tasks
    raise AssertionError("rank outside the layout")


def compress_counts(layout: List[int]) -> str:
    """Slurm's task-per-node notation: [2, 2, 1] -> '2(x2),1'."""
    runs: List[List[int]] = []
    for tasks in layout:
        if runs and runs[-1][0] == tasks:
            runs[-1][1] += 1
        else:
            runs.append([tasks, 1])
    return ",".join(f"{tasks}(x{repeat})" if repeat > 1 else str(tasks) for tasks, repeat in runs)


Expected = Dict[str, object]


@st.composite
def valid_launches(draw: st.DrawFn) -> Tuple[Dict[str, str], Expected]:
    """A complete, consistent environment of one launcher, and the topology detect() must read from it."""
    launcher = draw(st.sampled_from(["slurm", "torchrun", "submitit-local", "flux",
                                     *(spec.launcher for spec in mpi.SPECS)]))
    layout, rank = draw(topologies(even=launcher != "slurm"))
    node, local = place(layout, rank)
    world, nodes, per_node = sum(layout), len(layout), layout[node]
    expected: Expected = {"launcher": launcher, "rank": rank, "local_rank": local, "world_size": world,
                          "local_world_size": per_node, "node_rank": node, "num_nodes": nodes}
    if launcher == "slurm":
        job, step = str(draw(st.integers(1, 10**7))), str(draw(st.integers(0, 50)))
        hosts = [f"node{i + 1:0{draw(st.integers(1, 3))}d}" for i in range(nodes)]
        environ = {"SLURM_JOB_ID": job, "SLURM_STEP_ID": step, "SLURM_PROCID": str(rank),
                   "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node), "SLURM_STEP_NUM_TASKS": str(world),
                   "SLURM_NTASKS": str(world), "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_NNODES": str(nodes),
                   "SLURM_STEP_TASKS_PER_NODE": compress_counts(layout),
                   "SLURM_STEP_NODELIST": hostlist.compress(hosts), "SLURM_JOB_NODELIST": hostlist.compress(hosts)}
        expected.update(master_addr=hosts[0], master_port=step_port(job, step), job_id=job)
    elif launcher == "torchrun":
        port = draw(st.integers(1, 65535))
        environ = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local),
                   "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": str(nodes),
                   "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "none"}
        expected.update(master_addr="10.0.0.1", master_port=port)
    elif launcher == "submitit-local":
        layout, rank = [world], rank  # the LocalExecutor runs every task on this machine
        environ = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_GLOBALID": str(rank),
                   "SUBMITIT_LOCAL_LOCALID": str(rank), "SUBMITIT_LOCAL_NTASKS": str(world),
                   "SUBMITIT_LOCAL_JOB_ID": "77"}
        expected.update(local_rank=rank, local_world_size=world, node_rank=0, num_nodes=1,
                        master_addr="127.0.0.1", master_port=step_port("77", "0"))
    elif launcher == "flux":
        environ = {"FLUX_TASK_RANK": str(rank), "FLUX_JOB_SIZE": str(world), "FLUX_JOB_NNODES": str(nodes),
                   "FLUX_TASK_LOCAL_ID": str(local)}
        expected.update(master_addr="127.0.0.1" if nodes == 1 else None, master_port=None)
        if nodes > 1 and per_node > 1:  # Flux exports no node index, and the task map is not known to a task
            expected.update(node_rank=None)
    else:
        spec = next(s for s in mpi.SPECS if s.launcher == launcher)
        environ = {spec.rank: str(rank), spec.size: str(world), spec.local_rank: str(local),
                   spec.local_size: str(per_node)}
        if spec.node_rank:
            environ[spec.node_rank] = str(node)
        if nodes > 1 and not spec.node_rank:  # no MPI launcher says which node this is
            expected.update(node_rank=None, num_nodes=None)
        if nodes > 1 and spec.node_rank:
            expected.update(num_nodes=None)
        expected.update(master_addr="127.0.0.1" if nodes == 1 else None, master_port=None)
    return environ, expected


TOPOLOGY_FIELDS = ("rank", "local_rank", "world_size", "local_world_size")


@st.composite
def mixed_environments(draw: st.DrawFn) -> Dict[str, str]:
    """A valid launch of one launcher, plus other launchers' variables, with some values made malformed."""
    environ: Dict[str, str] = {}
    if draw(st.booleans()):
        environ.update(draw(valid_launches())[0])
    extra = draw(st.lists(st.sampled_from(ALL_VARIABLES), max_size=8, unique=True))
    for name in extra:
        environ[name] = draw(value_for(name))
    if environ and draw(st.booleans()):
        for name in draw(st.lists(st.sampled_from(sorted(environ)), max_size=3, unique=True)):
            environ[name] = draw(value_for(name))
    return environ


def check_consistent(env: DistEnv) -> None:
    assert 0 <= env.rank < env.world_size
    assert 0 <= env.local_rank < env.local_world_size <= env.world_size
    if env.node_rank is not None and env.num_nodes is not None:
        assert 0 <= env.node_rank < env.num_nodes
    assert env.master_port is None or 0 < env.master_port < 65536


class Tally:
    """Counts the cases a property saw and its slowest one, for the report."""

    def __init__(self) -> None:
        self.cases = 0
        self.errors = 0
        self.slowest = 0.0

    def time(self, function: Callable[[], object]) -> object:
        started = time.perf_counter()
        try:
            return function()
        finally:
            self.cases += 1
            self.slowest = max(self.slowest, time.perf_counter() - started)


# --- detect() -----------------------------------------------------------------------------------------------


def test_detect_lets_only_slurmdist_errors_escape_and_never_changes_its_input(reliability_record):
    tally = Tally()
    messages: Dict[str, int] = {}

    @FUZZ
    @given(mixed_environments())
    def check(environ: Dict[str, str]) -> None:
        before = dict(environ)
        try:
            env = tally.time(lambda: detect(MappingProxyType(environ)))  # read-only: a write would raise
        except SlurmdistError as error:
            tally.errors += 1
            text = str(error)
            assert text.strip() and "Traceback" not in text
            if isinstance(error, LaunchError) and error.variable is not None:
                messages[error.variable] = messages.get(error.variable, 0) + 1
        else:
            assert isinstance(env, DistEnv)
            check_consistent(env)
        assert environ == before

    check()
    reliability_record(
        "detect() over mixed, malformed launcher environments",
        f"{tally.cases} generated environments ({len(ALL_VARIABLES)} variables of 10 launchers, valid launches "
        "mixed with stale variables of others; empty, negative, non-numeric, unicode-digit, huge and "
        "contradictory values; broken nodelists and task-per-node strings)",
        "malformed environment", tally.slowest,
        f"{tally.errors} refused with a SlurmdistError naming the variable ({len(messages)} distinct variables "
        f"named), {tally.cases - tally.errors} consistent topologies; nothing else raised; input never changed",
    )
    assert tally.cases >= (100_000 if SLOW else 100)


def test_valid_environments_round_trip(reliability_record):
    tally = Tally()

    @ROUND_TRIP
    @given(valid_launches())
    def check(launch: Tuple[Dict[str, str], Expected]) -> None:
        environ, expected = launch
        env = tally.time(lambda: detect(environ))
        assert {name: getattr(env, name) for name in expected} == expected
        # What `slurmdist run` exports reads back as the same topology.
        again = detect(torchrun_variables(env))
        assert again.launcher == "torchrun"
        for name in (*TOPOLOGY_FIELDS, "node_rank", "num_nodes", "master_addr", "master_port"):
            assert getattr(again, name) == getattr(env, name), name

    check()
    reliability_record(
        "valid launches of every launcher round-trip",
        f"{tally.cases} generated valid launches (slurm uneven layouts, torchrun, submitit-local, flux, "
        f"{', '.join(spec.launcher for spec in mpi.SPECS)})",
        "none (control)", tally.slowest,
        "detect() returns the generating topology; exporting it as torchrun variables reads back the same",
    )


# Run in a child with its address space capped: a parser that believes the number would otherwise take the
# test run (and the machine) down with it instead of failing.
MEMORY_PROBE = """
import json, resource, sys, time, tracemalloc
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from slurmdist.detection import detect
environ = json.loads(sys.argv[1])
tracemalloc.start()
started = time.perf_counter()
try:
    detect(environ)
    outcome = "accepted"
except Exception as error:
    outcome = f"{type(error).__name__}: {error}"
print(json.dumps({"outcome": outcome, "seconds": time.perf_counter() - started,
                  "peak": tracemalloc.get_traced_memory()[1]}))
"""


@pytest.mark.parametrize("raw", ["1(x2147483646)", "2(x100000000)", "1(x99999999),1(x99999999)"])
def test_task_per_node_strings_cannot_exhaust_memory(raw, reliability_record):
    """A corrupt SLURM_STEP_TASKS_PER_NODE such as '1(x2147483646)' must be refused, not expanded to 2**31 ints."""
    environ = {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
               "SLURM_NODEID": "0", "SLURM_NTASKS": "1", "SLURM_NNODES": "1", "SLURM_STEP_TASKS_PER_NODE": raw,
               "SLURM_STEP_NODELIST": "node1"}
    done = subprocess.run([sys.executable, "-c", MEMORY_PROBE, json.dumps(environ)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout)
    reliability_record(f"huge task-per-node string {raw!r}", "SLURM_STEP_TASKS_PER_NODE", "corrupt variable",
                       probe["seconds"], f"{probe['outcome'][:110]}...; peak {probe['peak'] / 1e6:.2f} MB allocated")
    assert probe["outcome"].startswith("LaunchError: SLURM_STEP_TASKS_PER_NODE"), probe
    assert probe["peak"] < 64 * 2**20  # bounded by a node cap, not by the number the variable claims


# --- linear cost: counted interpreter work, never times -----------------------------------------------------


def interpreter_events(function: Callable[[], object]) -> int:
    """Python lines run and calls made (C functions too) while `function` runs: a measure of its work that,
    unlike a time, does not move with the other processes on this machine. Run once first, uncounted: a
    first call also compiles regular expressions (Python code in `re`) and fills caches."""
    try:
        function()
    except SlurmdistError:
        pass
    events = 0

    def count(frame: object, event: str, arg: object) -> Callable:
        nonlocal events
        events += 1
        return count

    sys.settrace(count)
    sys.setprofile(lambda frame, event, arg: count(frame, event, arg) if event == "c_call" else None)
    try:
        function()
    except SlurmdistError:
        pass
    finally:
        sys.setprofile(None)
        sys.settrace(None)
    return events


def best_time(function: Callable[[], object], repeats: int = 5) -> float:
    """Least of several timings: the run least disturbed by the other processes on this machine."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        try:
            function()
        except SlurmdistError:
            pass
        best = min(best, time.perf_counter() - started)
    return best


def step_environ(nodelist: str) -> Dict[str, str]:
    return {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0", "SLURM_NTASKS": "1", "SLURM_NNODES": "1", "SLURM_STEP_TASKS_PER_NODE": "1",
            "SLURM_STEP_NODELIST": nodelist}


# Inputs of size n that a naive parser (backtracking regex, repeated slicing, quadratic joins) handles in
# O(n**2) or worse. Each is fed to expand, count, first and to detect() as a step nodelist.
ADVERSARIAL: Dict[str, Callable[[int], str]] = {
    "many plain hosts": lambda n: ",".join(f"h{i}" for i in range(n)),
    "many single-number groups": lambda n: ",".join(f"n[{i}]" for i in range(n)),
    "one group, many ranges": lambda n: "n[" + ",".join(str(2 * i) for i in range(n)) + "]",
    "unterminated bracket after a long list": lambda n: "n[1]," * n + "n[",
    "stray bracket at the end": lambda n: "n[1-2]," * n + "]",
    "long run of separators": lambda n: ",," * n + " x" + " \t" * n,
    "long digit string": lambda n: "n[" + "0" * (8 * n) + "1-2]",
    "huge number": lambda n: "n[" + "9" * (8 * n) + "]",
    "long name": lambda n: "a" * (8 * n),
    "open brackets": lambda n: "[" * n,
    "nested-looking groups": lambda n: "a[1-2]b" * n,
}
GROWTH = 8  # input n vs 8n: linear is ~8x, quadratic 64x


@pytest.mark.parametrize("shape", sorted(ADVERSARIAL))
def test_hostlist_and_detect_cost_grows_linearly(shape, reliability_record):
    make = ADVERSARIAL[shape]
    small, large = make(300), make(300 * GROWTH)
    ratios = {}
    functions = {"expand": hostlist.expand, "count": hostlist.count, "first": hostlist.first,
                 "detect": lambda text: detect(step_environ(text))}
    for name, function in functions.items():
        ratios[name] = interpreter_events(lambda: function(large)) / interpreter_events(lambda: function(small))
    worst = max(ratios, key=ratios.get)
    reliability_record(
        f"nodelist cost, {shape}", f"{len(small)} vs {len(large)} characters into expand/count/first/detect",
        "adversarial nodelist", best_time(lambda: detect(step_environ(large)), 1),
        f"work ratio (interpreter events) for {GROWTH}x input: worst {ratios[worst]:.1f} ({worst}); quadratic "
        f"would be {GROWTH ** 2}",
    )
    # Linear work gives about 8 (fixed costs pull it lower), quadratic 64. Regular-expression matching runs
    # in C and is not counted: benchmarks/hostlists.py times it against the input size.
    assert ratios[worst] < GROWTH * 4, ratios


def expansion_peak(text: str, **limit: int) -> int:
    """Peak bytes allocated while `expand` refuses `text` for having too many hosts."""
    tracemalloc.start()
    try:
        with pytest.raises(HostlistError, match="expands to more than"):
            hostlist.expand(text, **limit)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_expansion_memory_is_capped_with_a_clear_error(reliability_record):
    """A short item naming up to 2**64 hosts, or just over the cap, is refused before any host is built."""
    cases = ["n[0-18446744073709551615]", "a[1-1000]b[1-1000]c[1-1000]", f"n[1-{hostlist.DEFAULT_LIMIT + 1}]"]
    peak = max(expansion_peak(text) for text in cases)
    with pytest.raises(HostlistError, match="more than 10 hosts; if that many are really meant, pass a larger limit="):
        hostlist.expand("n[1-11]", limit=10)
    reliability_record(
        "hostlist expansion over the host cap (one item)", f"{len(cases)} items of up to 2**64 hosts, cap "
        f"{hostlist.DEFAULT_LIMIT}", "oversized nodelist", None,
        f"HostlistError 'expands to more than {hostlist.DEFAULT_LIMIT} hosts' before building any; peak "
        f"{peak / 1e6:.3f} MB",
    )
    assert peak < 2**20


def test_many_items_over_the_cap_are_refused_before_building(reliability_record):
    limit = 200_000
    text = "x[0-99999]," * 3  # 300,000 hosts in three items
    peak = expansion_peak(text, limit=limit)
    reliability_record(
        "hostlist expansion over the host cap (several items)", f"3 items of 100,000 hosts, limit={limit}",
        "oversized nodelist", None,
        f"HostlistError, but only after building the first {limit} hosts: peak {peak / 1e6:.1f} MB "
        "(KNOWN BUG: with the default cap a hostile list allocates GBs first)" if peak >= 2**20 else
        f"refused before building any host: peak {peak / 1e6:.3f} MB",
    )
    assert peak < 2**20


def test_count_never_builds_hosts():
    """count() validates a 2**40-host list with no more memory than its text."""
    tracemalloc.start()
    try:
        assert hostlist.count("n[0-1099511627775]") == 2**40
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20

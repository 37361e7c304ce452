"""Repeated, interleaved timings and their summary (median, min, max).

Tools are measured round-robin, one run of each per round, with the starting tool rotating, so a burst of
load from another process hits every tool alike and the ratio between medians stays meaningful.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

#: One run of one tool: returns the seconds that count (it may exclude its own set-up).
Runner = Callable[[], float]


@dataclass(frozen=True)
class Stats:
    """Seconds of each run of one tool."""

    samples: Tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def runs(self) -> int:
        return len(self.samples)


@dataclass(frozen=True)
class Failure:
    """Why a tool could not be measured; the report shows it instead of numbers."""

    reason: str


Outcome = Union[Stats, Failure]


def interleave(runners: Mapping[str, Runner], runs: int, warmup: int = 1) -> Dict[str, Outcome]:
    """Run every runner `runs` times round-robin (after `warmup` untimed rounds); a runner that raises is
    recorded as a Failure and dropped, the others go on."""
    samples: Dict[str, List[float]] = {name: [] for name in runners}
    failed: Dict[str, Failure] = {}
    names = list(runners)
    for round_ in range(warmup + runs):
        shift = round_ % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            if name in failed:
                continue
            try:
                seconds = runners[name]()
            except Exception as exc:  # a peer that cannot do this case: say so, measure the rest
                failed[name] = Failure(f"{type(exc).__name__}: {_first_line(exc)}")
                continue
            if round_ >= warmup:
                samples[name].append(seconds)
    return {name: failed.get(name) or Stats(tuple(samples[name])) for name in names}


def timed(function: Callable[[], object], setup: Optional[Callable[[], None]] = None) -> Runner:
    """A runner timing one call, after a full collection so that garbage from the previous tool is not
    charged to this one (the collector stays on: users run with it on); `setup` runs first, outside the clock."""

    def run() -> float:
        if setup is not None:
            setup()
        gc.collect()
        start = time.perf_counter()
        function()
        return time.perf_counter() - start

    return run


def timed_calls(function: Callable[[], object], calls: int, setup: Optional[Callable[[], None]] = None) -> Runner:
    """A runner giving the mean seconds per call over `calls` calls, each timed alone so that `setup`
    (e.g. restoring an environment a tool mutates) is not counted."""

    def run() -> float:
        gc.collect()
        total = 0.0
        for _ in range(calls):
            if setup is not None:
                setup()
            start = time.perf_counter()
            function()
            total += time.perf_counter() - start
        return total / calls

    return run


_FIRST_CALL = """
import sys, time
{setup}
start = time.perf_counter()
{call}
print(time.perf_counter() - start)
"""


def first_call(setup: str, call: str, args: Sequence[str] = (), env: Optional[Mapping[str, str]] = None,
               cwd: Optional[str] = None) -> Runner:
    """A runner timing one `call` in a new interpreter, after `setup` (the imports) outside the clock: what a
    process that asks once pays (memos empty, patterns not yet compiled), which repeated calls in one
    process hide. `args` reach the child as sys.argv[1:]."""

    def run() -> float:
        code = _FIRST_CALL.format(setup=setup, call=call)
        _, done = run_process([sys.executable, "-c", code, *args], env=env, timeout=120, cwd=cwd)
        return float(done.stdout.strip().splitlines()[-1])

    return run


def run_process(
    argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None, timeout: float = 120.0, cwd: Optional[str] = None
) -> Tuple[float, subprocess.CompletedProcess]:
    """Run a command to completion: (wall seconds, result). Raises on timeout or a non-zero exit status,
    with the end of its stderr, so the caller can report why."""
    start = time.perf_counter()
    # A session of its own: on a timeout the whole of it goes (torchrun's workers, an srun's), not only the
    # launcher, so that nothing left behind loads the cores while the next runs are timed.
    proc = subprocess.Popen(list(argv), env=None if env is None else dict(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):  # a process in a session of its own keeps the pipes
            proc.communicate(timeout=10)
        raise
    seconds = time.perf_counter() - start
    done = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"{os.path.basename(argv[0])} exited with status {done.returncode}: {' / '.join(tail)}")
    return seconds, done


def stats_of(values: Sequence[float]) -> Outcome:
    """Stats of values gathered some other way (per-rank times); a Failure when there are none."""
    return Stats(tuple(values)) if values else Failure("no samples")


def loglog_slope(sizes: Sequence[float], seconds: Sequence[float]) -> float:
    """Least-squares slope of log(time) against log(size): 1 is linear, 2 quadratic."""
    import math

    xs = [math.log(s) for s in sizes]
    ys = [math.log(t) for t in seconds]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    num = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    den = sum((x - mean_x) ** 2 for x in xs)
    return num / den if den else float("nan")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else ""

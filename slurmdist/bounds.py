"""The bounds every rendezvous wait keeps: the init timeout (argument, `SLURMDIST_INIT_TIMEOUT`, default),
one deadline shared by all the steps of a rendezvous, short polls, and a wait on a descriptor that cannot
outlive its bound."""

from __future__ import annotations

import math
import select
import time
from datetime import timedelta
from typing import Any, Callable, Iterator, Mapping, Optional, Set, Tuple, Union

from .errors import RendezvousError

DEFAULT_TIMEOUT = 300.0
TIMEOUT_VARIABLE = "SLURMDIST_INIT_TIMEOUT"

# Seconds between connection attempts to a store not yet listening: ranks usually start within a few ms of
# rank 0, so the first retries are short (a refused connect costs microseconds).
POLL_FIRST, POLL_MAX = 0.001, 0.05


def poll_pauses() -> Iterator[float]:
    """Seconds to sleep between polls: POLL_FIRST, doubling up to POLL_MAX."""
    pause = POLL_FIRST
    while True:
        yield pause
        pause = min(POLL_MAX, pause * 2)


class Deadline:
    """One absolute deadline shared by every wait of a rendezvous. `knob` is what set it, which a message
    that says "raise the timeout" names (`timeout_knob`)."""

    def __init__(self, seconds: float, knob: str = TIMEOUT_VARIABLE) -> None:
        self.seconds, self.knob = seconds, knob
        self.start = time.monotonic()
        self.end = self.start + seconds
        # (IP, port) of every store this rendezvous joined: what the store watchdog cuts if a call to one
        # outlives the deadline (see store_watchdog).
        self.endpoints: Set[Tuple[str, int]] = set()

    def elapsed(self) -> float:
        """Seconds since the rendezvous began (past `seconds` when a step overran it)."""
        return time.monotonic() - self.start

    def remaining(self, floor: float = 0.001) -> float:
        return max(floor, self.end - time.monotonic())

    def at_most(self, seconds: float) -> float:
        """`seconds`, or what is left when that is less: the bound of one step inside the rendezvous."""
        return min(seconds, self.remaining())

    def expired(self) -> bool:
        return time.monotonic() >= self.end


def init_timeout(timeout: Union[float, timedelta, None], environ: Mapping[str, str]) -> float:
    """The rendezvous bound in seconds: the argument, else `SLURMDIST_INIT_TIMEOUT`, else 300."""
    if timeout is not None:
        return positive_seconds("timeout", timeout, RendezvousError)
    return seconds_from(environ, TIMEOUT_VARIABLE, DEFAULT_TIMEOUT, RendezvousError)


def seconds_from(environ: Mapping[str, str], variable: str, default: float,
                 error: Callable[[str], Exception]) -> float:
    """`variable` as a positive number of seconds, or `default` when it is unset or blank: `export VAR=` in a
    job script means "no value" there, as for every other slurmdist variable."""
    value = environ.get(variable, "")
    return default if isinstance(value, str) and not value.strip() else positive_seconds(variable, value, error)


def timeout_knob(timeout: Union[float, timedelta, None], argument: str) -> str:
    """What set the init timeout: `argument` (how the caller gave `timeout`) when given, which wins over the
    variable, else the variable."""
    return TIMEOUT_VARIABLE if timeout is None else argument


# A bound beyond this is a typo or `inf`, and torch's timedelta cannot hold much more (OverflowError).
MAX_SECONDS = 365 * 24 * 3600.0


def positive_seconds(source: str, value: Any, error: Callable[[str], Exception]) -> float:
    """`value` (an argument or a variable's text) as a positive number of seconds; `error` names `source`."""
    try:
        if isinstance(value, bool):  # float(True) is 1.0: `timeout=True` is a mistake, not one second
            raise TypeError
        # A timedelta, as torch's own init_process_group(timeout=...) takes one.
        seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    except (TypeError, ValueError):
        given_in_code = "" if isinstance(value, str) else " (or a timedelta)"  # a variable or option is text
        raise error(f"{source}={value!r} is not a number of seconds; give one such as 300{given_in_code}, "
                    f"positive and at most {MAX_SECONDS:.0f} (a year)") from None
    if not 0 < seconds <= MAX_SECONDS:
        raise error(f"{source}={value!r} must be a positive number of seconds, at most {MAX_SECONDS:.0f} "
                    "(a year)")
    return seconds


POLL_MAX_MS = 2**31 - 1  # poll()'s longest wait


def readable_within(fd: int, seconds: Optional[float] = None) -> bool:
    """True when `fd` turns readable (its writer closed it, the process a pidfd names ended) within `seconds`,
    or ever when None. poll, not select: select refuses descriptors numbered 1024 or above, which a process
    with many files open gets, and the wait was then silently gone."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if seconds is None:
        return bool(poller.poll(None))
    end = time.monotonic() + seconds
    while True:  # in slices: poll() takes at most 2**31-1 ms (24.8 days), and raises OverflowError beyond
        left = end - time.monotonic()
        if poller.poll(max(0, min(POLL_MAX_MS, math.ceil(left * 1000)))):
            return True
        if left <= POLL_MAX_MS / 1000:
            return False

"""Exceptions raised by slurmdist.

Every message names the variable, host or value at fault and says what to do, because the person reading it
is usually looking at the log of a job that has already failed on a cluster.
"""

from __future__ import annotations

QUOTE_MAX = 160  # characters of a value an error message quotes whole


def quoted(text: str) -> str:
    """`text` as an error message quotes it: whole when short; else its start and end, and its length, so a
    100k-node list does not fill every rank's log with one message."""
    if len(text) <= QUOTE_MAX:
        return repr(text)
    return f"{text[:QUOTE_MAX // 2]!r}...{text[-QUOTE_MAX // 4:]!r} ({len(text)} characters)"


class SlurmdistError(Exception):
    """Base class of every error slurmdist raises on purpose."""


class LaunchError(SlurmdistError):
    """The launcher environment is missing, malformed or contradicts itself."""

    def __init__(self, message: str, variable: str | None = None, value: str | None = None) -> None:
        super().__init__(message)
        self.variable = variable
        self.value = value


class HostlistError(SlurmdistError, ValueError):
    """A Slurm hostlist expression does not parse."""


class RendezvousError(SlurmdistError):
    """The process group could not be formed: timeout, unreachable or unresolvable master, busy port."""


class BackendError(SlurmdistError):
    """The requested communication backend or device is not available in this torch build."""

"""Linux's /proc, read without raising: a file's text, and the fields of a process's or thread's stat line."""

from __future__ import annotations

import os
from typing import List, Optional


def read(path: str) -> Optional[str]:
    """The file's text, or None (the process or thread ended meanwhile, or there is no /proc)."""
    try:
        with open(path) as stream:
            return stream.read()
    except OSError:
        return None


def stat_fields(stat: str) -> List[str]:
    """The fields of a /proc/PID/stat (or .../task/TID/stat) line after the command name: [0] is the state
    letter ('R' running, 'S' asleep, ...), [19] the start time. The name comes in parentheses and may hold
    spaces and ')', so the fields start after the last one. Empty for a line without it."""
    _, paren, fields = stat.rpartition(")")
    return fields.split() if paren else []


def process_stat(pid: object) -> List[str]:
    """`stat_fields` of process `pid` (a number, or its digits as text); empty when it is gone."""
    return stat_fields(read(f"/proc/{str(pid).strip()}/stat") or "")


def parent_argv() -> List[str]:
    """This process's parent's command line (['bash'], ['-bash'], ['bash', '-c', '...']); [] without /proc."""
    text = read(f"/proc/{os.getppid()}/cmdline")
    return text.rstrip("\0").split("\0") if text else []


def process_age() -> Optional[float]:
    """Seconds since this process started (its stat start time against the system's uptime); None without
    /proc."""
    fields = process_stat("self")
    uptime = (read("/proc/uptime") or "").split()
    try:
        return float(uptime[0]) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError):
        return None


def catches(signum: int) -> bool:
    """Whether this process has a handler of its own for `signum` in the kernel's view (the SigCgt mask of
    /proc/self/status): one a C library installed (faulthandler.register), which Python's signal.getsignal()
    reports as the default. False without /proc."""
    for line in (read("/proc/self/status") or "").splitlines():
        if line.startswith("SigCgt:"):
            try:
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
            except (IndexError, ValueError):
                return False
    return False

"""Reading launcher variables: integers, task-per-node lists and job ids, with errors that name the variable.

Readers call these instead of `int(environ[...])` so that an empty, negative or non-numeric value reaches the
user as "SLURM_PROCID='' is empty" rather than a bare ValueError from deep inside a job.
"""

from __future__ import annotations

import os
from typing import List, Mapping, Optional, Sequence, Tuple

from .errors import LaunchError, quoted

# torch stores ranks and sizes as 32-bit ints; anything larger is a corrupt variable, not a big job.
MAX_COUNT = 2**31 - 1
# A task-per-node list names one count per node; more nodes than this is a corrupt variable, and expanding
# '1(x2147483646)' literally would allocate 16 GiB. (The largest machines have tens of thousands of nodes.)
MAX_NODES = 2**20

# What to do about a count that does not parse or is out of range.
FIX_ADVICE = ("Fix or unset it (launchers set it per process: a bad value usually comes from a hand-written export "
              "or an outer job).")

JOB_ID_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID", "FLUX_JOB_ID", "LSB_JOBID", "PBS_JOBID", "PALS_APID")


STRINGS_ONLY = frozenset({str})


def require_mapping(environ: Mapping[str, str]) -> Mapping[str, str]:
    """`environ` itself when it is a mapping of strings to strings; else a TypeError that says so, not
    "'int' object has no attribute 'strip'" from deep inside (`{"RANK": 1}` in a test), nor a silent "no
    launcher" for bytes names (`os.environb`)."""
    if not isinstance(environ, Mapping):
        raise TypeError(f"environ={environ!r} must be a mapping of variable names to values, such as os.environ")
    if environ is os.environ or STRINGS_ONLY.issuperset(map(type, environ)) and STRINGS_ONLY.issuperset(
            map(type, environ.values())):  # os.environ holds strings by construction; the rest: a walk in C
        return environ
    for name, value in environ.items():
        if not (isinstance(name, str) and isinstance(value, str)):
            wrong = name if not isinstance(name, str) else value
            if isinstance(wrong, (bytes, bytearray)):
                hint = "decode them (os.environ, not os.environb)"
            elif value is None:
                hint = "leave the name out for a variable that is not set"
            else:
                hint = f"write {name}={str(value)!r}" if isinstance(name, str) else ""
            raise TypeError(f"environ[{name!r}]={value!r}: environment variable names and values are strings, as in "
                            f"os.environ, not {type(wrong).__name__}" + (f"; {hint}" if hint else ""))
    return environ


def is_whole(value: object, minimum: int) -> bool:
    """Whether `value`, given in code, is an int (not a bool: True is no count) of at least `minimum`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def whole_number(text: str, max_digits: int = 18) -> Optional[int]:
    """`text` as an int when it is ASCII digits only, with at most `max_digits` significant ones; else None.
    `str.isdigit()` alone also passes '²' (which int() refuses) and '١' (which it reads), and Python refuses
    int() on more than 4300 digits with a bare ValueError; no count, port or id has 19."""
    if not (text.isdigit() and text.isascii()):
        return None
    significant = text.lstrip("0")
    return int(significant or "0") if len(significant) <= max_digits else None


def parse_count(name: str, raw: str, *, minimum: int = 0) -> int:
    """`raw` as a whole number >= `minimum`, or a LaunchError naming `name` and the value."""
    text = raw.strip()
    if not text:
        raise LaunchError(
            f"{name} is set but empty; unset it or launch through the launcher that sets it", name, raw
        )
    if not (text.isdigit() and text.isascii()):
        if text.startswith("-") and text[1:].isdigit():
            problem = "is negative"
        else:
            problem = "is not a whole number"
        raise LaunchError(f"{name}={quoted(raw)} {problem}; expected an integer >= {minimum}. {FIX_ADVICE}", name, raw)
    value = whole_number(text)
    if value is None or value > MAX_COUNT:
        raise LaunchError(f"{name}={quoted(raw)} is too large (over {MAX_COUNT}); the variable is corrupt", name, raw)
    if value < minimum:
        raise LaunchError(f"{name}={quoted(raw)} must be at least {minimum}. {FIX_ADVICE}", name, raw)
    return value


def read_count(environ: Mapping[str, str], name: str, *, minimum: int = 0) -> Optional[int]:
    """The variable as a count, or None when it is not set at all."""
    raw = environ.get(name)
    return None if raw is None else parse_count(name, raw, minimum=minimum)


def first_count(
    environ: Mapping[str, str], names: Sequence[str], *, minimum: int = 0
) -> Optional[Tuple[str, int]]:
    """(name, value) of the first of `names` that is set, or None when none is."""
    for name in names:
        raw = environ.get(name)
        if raw is not None:
            return name, parse_count(name, raw, minimum=minimum)
    return None


def require_count(
    environ: Mapping[str, str], name: str, launcher: str, *, minimum: int = 0, why: str = ""
) -> int:
    """The variable as a count; missing is an error, since `launcher` always sets it."""
    value = read_count(environ, name, minimum=minimum)
    if value is None:
        why = why or "the environment is incomplete"
        raise LaunchError(
            f"{launcher} launch detected but {name} is not set: {why}. "
            f"Start the process with the launcher that sets it (not a hand-written export), or set {name}.",
            name,
        )
    return value


def parse_tasks_per_node(name: str, raw: str) -> List[int]:
    """Slurm's compressed per-node counts, e.g. ``'2(x3),1'`` -> ``[2, 2, 2, 1]``."""
    counts: List[int] = []
    if not raw.strip():
        raise LaunchError(f"{name} is set but empty; expected a list such as '4(x2)' or '2,1'", name, raw)
    for item in raw.split(","):
        item = item.strip()
        count_text, sep, repeat_text = item.partition("(x")
        if sep:
            if not repeat_text.endswith(")"):
                raise LaunchError(f"{name}={quoted(raw)}: {item!r} is not of the form COUNT(xREPEAT)", name, raw)
            repeat = _tasks_number(name, raw, repeat_text[:-1], minimum=1)
        else:
            repeat = 1
        count = _tasks_number(name, raw, count_text, minimum=0)
        if len(counts) + repeat > MAX_NODES:
            raise LaunchError(f"{name}={quoted(raw)} describes more than {MAX_NODES} nodes; the variable is corrupt",
                              name, raw)
        counts.extend([count] * repeat)
    return counts


def _tasks_number(name: str, raw: str, text: str, *, minimum: int) -> int:
    try:
        return parse_count(name, text, minimum=minimum)
    except LaunchError:
        raise LaunchError(
            f"{name}={quoted(raw)} does not parse: {text!r} is not a count; expected a list such as '4(x2)' or '2,1'",
            name,
            raw,
        ) from None


def read_text(environ: Mapping[str, str], name: str) -> Optional[str]:
    """A non-empty text variable (stripped), None when unset; set-but-empty is an error, not a default."""
    raw = environ.get(name)
    if raw is None:
        return None
    if not raw.strip():
        raise LaunchError(f"{name} is set but empty; give it a value or unset it", name, raw)
    return raw.strip()


MAX_PORT = 65535


def explicit_master(environ: Mapping[str, str]) -> Tuple[Optional[str], Optional[int]]:
    """MASTER_ADDR and MASTER_PORT when set: whatever the launcher, what the user exported wins."""
    raw = environ.get("MASTER_PORT")
    port = None if raw is None else whole_number(raw.strip(), max_digits=5)
    if raw is not None and (port is None or not 1 <= port <= MAX_PORT):  # '', 'abc', '-1', '0', '70000'
        raise LaunchError(
            f"MASTER_PORT={quoted(raw)} is not a TCP port (a whole number in 1..{MAX_PORT}): set it to a free TCP "
            "port, or unset it and let slurmdist derive one",
            "MASTER_PORT",
            raw,
        )
    return _master_host(read_text(environ, "MASTER_ADDR")), port


def _master_host(addr: Optional[str]) -> Optional[str]:
    """MASTER_ADDR as torch takes it: one host name or address ('[v6]' too), not a URL or 'host:port', which
    would otherwise reach the user as a lookup failure of that text long after start."""
    if addr is None:
        return None
    host, colon, port = addr.rpartition(":")
    fix = ""
    if "://" in addr:
        problem = "is a URL"
    elif any(char.isspace() for char in addr):
        problem = "holds a space"
    elif colon and port.isdigit() and (host.count(":") == 0 or host.endswith("]")):  # not a bare IPv6 address
        problem, fix = "holds a port", f": here MASTER_ADDR={host} MASTER_PORT={port}"
    else:
        return addr
    raise LaunchError(f"MASTER_ADDR={quoted(addr)} {problem}: it names the rank-0 host alone (a name, or an IPv4 or "
                      f"IPv6 address), and the port goes in MASTER_PORT{fix}", "MASTER_ADDR", addr)


def scheduler_job_id(environ: Mapping[str, str]) -> Optional[str]:
    """The batch scheduler's job id, whichever scheduler this is (None outside any)."""
    for name in JOB_ID_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            return value
    return None


def check_index(launcher: str, name: str, value: int, size_name: str, size: int) -> None:
    """`value` (read from `name`) must be a valid index into `size`; say which variables disagree."""
    if value >= size:
        _contradiction(launcher, name, value, size_name, size, f"below {size}")


def check_within(launcher: str, name: str, value: int, size_name: str, size: int) -> None:
    """`value` (a count read from `name`) may not exceed `size`: a node holds no more tasks than the job."""
    if value > size:
        _contradiction(launcher, name, value, size_name, size, f"at most {size}")


def _contradiction(launcher: str, name: str, value: int, size_name: str, size: int, bound: str) -> None:
    raise LaunchError(
        f"{launcher}: {name}={value} but {size_name}={size}, so {name} must be {bound}. The variables "
        "contradict each other: relaunch, or unset stale ones inherited from an outer job.",
        name,
        str(value),
    )

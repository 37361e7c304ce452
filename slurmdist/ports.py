"""A rendezvous port every task of a Slurm step derives alone, without talking to the others."""

from __future__ import annotations

import zlib

from .envvars import whole_number

# Below Linux's ephemeral range (32768-60999), so the port is never already taken by some outgoing
# connection's local end, and above the 1-9999 range where well-known services live.
PORT_MIN = 10000
PORT_MAX = 32767
_SPAN = PORT_MAX - PORT_MIN + 1

# Consecutive job ids land this far apart, leaving room for that many steps of one job before its ports
# could meet the next job's: two jobs sharing a node, or two steps of one allocation, never collide in practice.
_JOB_STRIDE = 97


def step_port(job_id: str, step_id: str) -> int:
    """Port for (job, step): the same on every task of a step, different for two steps of one job."""
    return PORT_MIN + (_as_number(job_id) * _JOB_STRIDE + _as_number(step_id)) % _SPAN


def _as_number(text: str) -> int:
    """Numeric ids as themselves (so steps stay consecutive); anything else through a stable hash."""
    text = text.strip()
    number = whole_number(text)
    return zlib.crc32(text.encode()) if number is None else number

"""A rendezvous port every task of a Slurm step derives alone, without talking to the others."""

from __future__ import annotations

import zlib

from .envvars import whole_number

# Below Linux's ephemeral range (32768-60999), so the port is never already taken by some outgoing
# connection's local end, and above the 1-9999 range where well-known services live.
PORT_MIN = 10000
PORT_MAX = 32767
_SPAN = PORT_MAX - PORT_MIN + 1

# How far apart consecutive job ids land: about the span divided by the golden ratio (and coprime with it), so
# the first ports of nearby jobs spread evenly over the span instead of queueing up. A job's steps take
# consecutive ports, and jobs within 10 ids of each other (back-to-back submissions, the likeliest to share a
# node) meet only after 1272 steps of one of them; within 50 ids, after 286; within 100, after 79. A stride of
# 97 put step 97 of one job on step 0 of the next: a job script looping over srun reached it.
_JOB_STRIDE = 14071


def step_port(job_id: str, step_id: str) -> int:
    """Port for (job, step): the same on every task of a step, different for two steps of one job."""
    return PORT_MIN + (_as_number(job_id) * _JOB_STRIDE + _as_number(step_id)) % _SPAN


def _as_number(text: str) -> int:
    """Numeric ids as themselves (so steps stay consecutive); anything else through a stable hash."""
    text = text.strip()
    number = whole_number(text)
    return zlib.crc32(text.encode()) if number is None else number

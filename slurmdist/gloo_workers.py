"""Let gloo's worker threads finish their last collective before the interpreter ends.

A gloo group runs collectives on worker threads of its own. Such a thread marks a collective done (the caller
returns) and only then drops its references to it. The collective's tensors belong to Python objects, so
dropping them takes the GIL. If the program has meanwhile returned from `main()` and Python is finalizing,
Python ends any thread that asks for the GIL, and ending it inside a C++ destructor aborts the process:
`terminate called without an active exception`, exit 134, after a run that finished. Seen here with a DDP
model (which keeps its group alive past `destroy_process_group()`, so its threads are never joined) on busy
cores, where the thread can wait milliseconds to run: one run in 3-20.

So the exit handler `init()` registers waits, briefly and with the GIL released (Python runs exit handlers
before it starts shutting down), until every such thread is asleep and stayed asleep across a pause: it did
not run at all, so it waits for new work, not for the GIL. Linux only (the threads are found by name in
/proc/self/task); elsewhere nothing is waited for.
"""

from __future__ import annotations

import os
import time
from typing import Dict, Tuple

from .procfs import read, stat_fields

TASK_DIR = "/proc/self/task"
WORKER_NAME = "pt_gloo_runloop"  # torch's name for a gloo group's worker threads (Linux keeps 15 bytes)
PAUSE = 0.002  # seconds between looks, with the GIL released
BOUND = 2.0  # a worker still busy after this (a collective of another group) is left to run

# A worker thread: its scheduler state letter, and how often and how long it ran (schedstat), when known.
Snapshot = Dict[str, Tuple[str, str]]


def workers(tasks: str = TASK_DIR) -> Snapshot:
    """The gloo worker threads of this process, each with its state and run counters."""
    try:
        tids = os.listdir(tasks)
    except OSError:
        return {}
    found: Snapshot = {}
    for tid in tids:
        if (read(f"{tasks}/{tid}/comm") or "").strip() != WORKER_NAME:
            continue
        fields = stat_fields(read(f"{tasks}/{tid}/stat") or "")
        if fields:
            found[tid] = (fields[0], read(f"{tasks}/{tid}/schedstat") or "")
    return found


def idle(before: Snapshot, after: Snapshot) -> bool:
    """Every worker asleep in both looks and not run between them. A thread woken by the GIL's release
    in between would have run; one still dropping a collective's tensors would show as running."""
    return after == before and all(state == "S" for state, _ in after.values())


def wait_until_idle(tasks: str = TASK_DIR, bound: float = BOUND, pause: float = PAUSE) -> bool:
    """Block (at most `bound` seconds, sleeping with the GIL released) until gloo's worker threads in this
    process are idle or gone. False when some were still busy at the bound."""
    deadline = time.monotonic() + bound
    before = workers(tasks)
    while before:
        time.sleep(pause)
        after = workers(tasks)
        if idle(before, after):
            return True
        if time.monotonic() >= deadline:
            return False
        before = after
    return True

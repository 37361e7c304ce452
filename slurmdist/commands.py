"""Short external commands (scontrol, squeue, sacct) under a bound that holds to the end.

`subprocess.run(timeout=...)` kills a child that overruns, then waits for it without a bound. A child in
uninterruptible sleep (a hung NFS or Lustre mount, a stuck device) survives SIGKILL until the kernel lets go,
and the caller, a rank inside `init()` or a signal handler about to requeue the job, hangs with it. Here the
wait after the kill is bounded too: a child that has not died within `REAP_GRACE` is left to the interpreter,
which reaps it later, and the caller gets its `TimeoutExpired` in time.
"""

from __future__ import annotations

import subprocess
from typing import Mapping, Optional, Sequence

REAP_GRACE = 1.0  # seconds to wait for a killed child to be gone


def run(command: Sequence[str], timeout: float, env: Optional[Mapping[str, str]] = None) -> "subprocess.CompletedProcess[str]":
    """Run `command` with no stdin, capturing its text output; `subprocess.TimeoutExpired` after `timeout`
    seconds, plus at most `REAP_GRACE`. `OSError` (not found, not executable) as `subprocess.run` raises it."""
    proc = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=None if env is None else dict(env))
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.communicate(timeout=REAP_GRACE)
        except subprocess.TimeoutExpired:  # not dead yet (or a grandchild holds its pipes): leave it
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        raise subprocess.TimeoutExpired(list(command), timeout) from None
    return subprocess.CompletedProcess(list(command), proc.returncode, stdout, stderr)

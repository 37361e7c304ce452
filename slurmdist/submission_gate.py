"""The one way from a submission to sbatch (or the local controller), closed once the submitter gives up on it.

Why: submitit pickles the job, then starts sbatch, in the process environment slurmdist made the job's (see
`submit.enter_job_environment`). A submission given up on (the submission timeout, Ctrl-C) gives the caller its own
environment back at once. One that is still pickling then must not start sbatch at all: sbatch would run in the
caller's environment (its RANK, its SLURM_JOB_ID) and queue a job nobody follows. The executors pass each start
through the gate of the thread that submits (`through_gate`); the submitter closes it (`Gate.close`).
"""

from __future__ import annotations

import functools
import shutil
import threading
from typing import Any, Callable, List, Optional, TypeVar

T = TypeVar("T")


class SubmissionAbandoned(Exception):
    """Raised in a submission's own thread when it reaches its start after the submitter gave up on it."""


class Gate:
    def __init__(self) -> None:
        self._lock = threading.Lock()  # held while a start runs: closing then finds it taken
        self._closed = False
        self.passed = False  # something started through it

    def through(self, start: Callable[[], T]) -> T:
        with self._lock:
            if self._closed:
                raise SubmissionAbandoned("the submitter gave up on this submission before it started the job")
            self.passed = True
            return start()

    def close(self) -> bool:
        """Let nothing more through; True when nothing went through (nor is going through now)."""
        if not self._lock.acquire(blocking=False):  # a start is under way: sbatch has the job's environment
            return False
        try:
            self._closed = True
            return not self.passed
        finally:
            self._lock.release()


_local = threading.local()


def open_in_this_thread(gate: Optional[Gate]) -> None:
    """Make `gate` the one this thread's submission starts through."""
    _local.gate = gate


def through_gate(start: Callable[[], T]) -> T:
    """`start()` through this thread's gate, if it has one (a submission outside `submit._submitting` has none)."""
    gate: Optional[Gate] = getattr(_local, "gate", None)
    return start() if gate is None else gate.through(start)


@functools.lru_cache(maxsize=None)
def gated_slurm_executor() -> type:
    """submitit's SlurmExecutor, starting sbatch through this thread's gate (imports submitit)."""
    from submitit import SlurmExecutor

    class GatedSlurmExecutor(SlurmExecutor):  # type: ignore[misc]  # submitit is not type-checked here
        def _submit_command(self, command: str) -> object:
            return through_gate(lambda: super(GatedSlurmExecutor, self)._submit_command(command))

        def _make_submission_command(self, submission_file_path: Any) -> List[str]:
            return in_a_session_of_its_own(super()._make_submission_command(submission_file_path))

    return GatedSlurmExecutor


def in_a_session_of_its_own(command: List[str]) -> List[str]:
    """`command` run by setsid(1), where there is one: out of the terminal's foreground process group, which a
    Ctrl-C signals whole. sbatch killed halfway through its request may have queued the job already, which
    then fails (submitit had not made its folder yet) with nothing left to cancel it; left to run, it answers,
    and the submission cancels the job it queued. setsid execs the command in place (a child of Popen leads no
    process group, so it does not fork). A `map_array` of several jobs goes through a plain SlurmExecutor that
    submitit makes itself, which this does not reach."""
    setsid = shutil.which("setsid")
    return [setsid, *command] if setsid else command

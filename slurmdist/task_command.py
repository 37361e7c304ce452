"""The command a submitted job runs in each task (`Submitter.submit_command`, `slurmdist submit`): one rank per
task, its output going straight to the task's log, and the task's signals handled so that a requeue, a
preemption or a cancel reaches the command and no command outlives its task.

Runs inside the job's tasks, unpickled there: it imports neither submitit nor torch."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Tuple

from . import commands
from .requeue import (
    ENDED_EXIT_STATUS, LOCAL_CONTROLLER_VARIABLE, LOCAL_REQUEUE_EXIT_CODE, exit_without_result, parse_signal,
    under_local_executor,
)


@dataclass(frozen=True)
class Command:
    """Run `argv` in every task (one rank each), its output going straight to the task's log; fail on a
    non-zero exit. Under Slurm the signals reach the command directly (Slurm signals every process of the
    step); submitit's LocalExecutor signals only the task, which passes them on."""

    argv: Tuple[str, ...]
    cwd: Optional[str] = None

    def __call__(self) -> int:
        import signal as signals

        local = under_local_executor(os.environ)
        env = {**os.environ, LOCAL_CONTROLLER_VARIABLE: str(os.getppid())} if local else None
        relay = _SignalRelay(local)
        with relay.installed(parse_signal(None)):
            # Locally the command leads a process group of its own, which the task signals as Slurm signals
            # every process of a step (torchrun's or mpirun's workers too).
            try:
                child = subprocess.Popen(list(self.argv), cwd=self.cwd, env=env, start_new_session=local,
                                         preexec_fn=_dies_with_this_process() if local else None)
            except OSError as exc:  # raised from here, it is the job's result: said as a failed command is
                raise CommandFailed(not_started_text(self.argv[0], exc, self.cwd)) from None
            try:
                relay.started(child)
                code = child.wait()
            finally:  # left by an exception (Ctrl-C, the local controller's SIGINT): the command goes too
                _kill_if_running(child, whole_group=local)
        if local and code == LOCAL_REQUEUE_EXIT_CODE:  # the command asked the local controller for a restart
            exit_without_result(LOCAL_REQUEUE_EXIT_CODE)
        if relay.ended or code in (-signals.SIGTERM, ENDED_EXIT_STATUS):
            # Slurm ended the job (preemption, scancel, the time limit, the end after a requeue): this run has
            # no result. Raising would make submitit write the error as the job's result, which `results()`
            # would read after a requeue before the new run replaced it; Slurm's state says what happened.
            exit_without_result(ENDED_EXIT_STATUS)
        if code != 0:
            raise CommandFailed(f"command {exit_text(code)}: {shlex.join(self.argv)}")
        return code


class CommandFailed(RuntimeError):
    """The command ended non-zero; why is in the task's log, which `results()` quotes (the name is how it
    recognises this failure in the remote traceback)."""


class _SignalRelay:
    """The task's signal handling while its command runs. SIGTERM (Slurm ending the job, or the local
    controller restarting it) marks the run as ended and is waited out: the command may be saving a
    checkpoint, and the task must not exit before it (submitit's own handler ignores SIGTERM and would report
    the run as the job's result). Under the LocalExecutor the warning and SIGTERM are passed on to the
    command's process group, which the controller does not signal (SIGINT is not: the controller's, or a
    Ctrl-C, ends this task, and the command's group with it).

    A SIGINT that comes while the command is being started is held until it has started (`started()`), then
    delivered as it would have been: raised inside the fork, it would land in one of the interpreter's at-fork
    hooks, which drop exceptions, and the task would wait for its command instead of ending it."""

    def __init__(self, local: bool) -> None:
        self.local = local
        self.child: Optional[subprocess.Popen] = None
        self.ended = False
        self._pending: List[int] = []  # signals to pass on that came while the command was being started
        self._interrupt_handler: Any = None  # SIGINT's own handler, while SIGINT is held (None: it is not)
        self._interrupted = False  # a SIGINT came while it was held

    def _pass_on(self, signum: int) -> None:
        if not self.local:
            return
        child = self.child
        if child is None:
            self._pending.append(signum)
        else:
            with contextlib.suppress(ProcessLookupError):  # the group has gone
                os.killpg(child.pid, signum)

    def started(self, child: subprocess.Popen) -> None:
        self.child = child
        pending, self._pending = self._pending, []
        for signum in pending:
            self._pass_on(signum)
        self._release_interrupt()

    def _hold_interrupt(self, signum: int, frame: Any) -> None:
        self._interrupted = True

    def _release_interrupt(self) -> None:
        """Give SIGINT its own handler back, and deliver a held one to it (KeyboardInterrupt, by default)."""
        import signal as signals

        if self._interrupt_handler is None:
            return
        signals.signal(signals.SIGINT, self._interrupt_handler)
        self._interrupt_handler = None
        if self._interrupted:
            signals.raise_signal(signals.SIGINT)

    def _on_term(self, signum: int, frame: Any) -> None:
        self.ended = True
        self._pass_on(signum)

    @contextlib.contextmanager
    def installed(self, warning: int) -> Iterator["_SignalRelay"]:
        import signal as signals

        # Handlers, not SIG_IGN: exec resets handlers to the default, so the command still gets its signals.
        handlers = {warning: lambda signum, frame: self._pass_on(signum), signals.SIGTERM: self._on_term}
        previous = {number: signals.signal(number, handler) for number, handler in handlers.items()}
        # Not held when it is the warning (passed on instead), nor when its handler is not Python's to give back.
        if warning != signals.SIGINT and signals.getsignal(signals.SIGINT) is not None:
            self._interrupt_handler = signals.signal(signals.SIGINT, self._hold_interrupt)
        try:
            yield self
        finally:
            for number, handler in previous.items():
                signals.signal(number, handler)
            self._release_interrupt()  # the command never started (it could not be run)


PR_SET_PDEATHSIG = 1  # prctl(2)


def _dies_with_this_process() -> Optional[Callable[[], None]]:
    """For Popen's preexec_fn: the kernel SIGKILLs the command when this task dies. submitit's local controller
    SIGKILLs the task at a cancel or the time limit, and the command would run on without a parent, holding its
    GPU. None where there is no prctl (not Linux). Resolved here, in the parent: the child only calls it."""
    import signal as signals

    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):  # a Python without ctypes, a libc without prctl
        return None
    parent, kill = os.getpid(), int(signals.SIGKILL)

    def set_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, kill)
        if os.getppid() != parent:  # the task died before the call: the kernel will not tell this child
            os._exit(1)

    return set_death_signal


def _kill_if_running(child: subprocess.Popen, whole_group: bool) -> None:
    """SIGKILL the command (and, when it leads its own group, every process it started) unless it has ended."""
    import signal as signals

    if whole_group:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signals.SIGKILL)
    elif child.poll() is None:
        child.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=commands.REAP_GRACE)


def started_where(cwd: Optional[str] = None) -> str:
    """" (on NODE, in DIRECTORY)", for a message about a command that did not start: every rank of a step prints
    one, and the node and directory tell them apart."""
    return f" (on {os.uname().nodename}, in {cwd or os.getcwd()})"


def not_started_text(program: str, exc: OSError, cwd: Optional[str]) -> str:
    """Why the command could not start, in the words `slurmdist run` uses."""
    import errno

    where = started_where(cwd)
    if exc.errno == errno.ENOENT and exc.filename == cwd:
        return f"cannot run {program!r}: its working directory {cwd!r} does not exist{where}"
    if exc.errno == errno.ENOENT and os.sep in program:
        return f"command not found: {program!r}: no such file{where}"
    if exc.errno == errno.ENOENT:
        return f"command not found: {program!r}: not on the task's PATH, or not a file there{where}"
    if exc.errno == errno.EACCES:
        return f"command is not executable: {program!r}{where}"
    return f"cannot run {program!r}: {exc.strerror or exc}{where}"


def exit_text(code: int) -> str:
    """'exited with status 3', or 'was killed by SIGUSR2' for a negative subprocess status."""
    import signal as signals

    if code >= 0:
        return f"exited with status {code}"
    try:
        name = signals.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    hint = " (the requeue warning: handle it in the command, or pick one it handles with --signal)" if (
        -code == parse_signal(None)) else ""
    return f"was killed by {name}{hint}"

"""Checkpoint and requeue when Slurm warns of preemption or the time limit, then resume where training stopped.

Slurm sends a signal shortly before it ends a job (``#SBATCH --signal=USR2@120``, or
``scancel --signal=USR2 JOB`` by hand or by a preemption policy). The protocol, on every rank::

    preemption = slurmdist.requeue.install()     # before the training loop
    for step in ...:
        train_step()
        if preemption.requested:                 # set by the signal, read at a step boundary
            if env.is_main:
                save_checkpoint(path)            # a consistent state: between two steps
            preemption.requeue()                 # rank 0: `scontrol requeue`; then every rank ends

Only rank 0 acts: the other ranks keep stepping and are ended by Slurm when the requeue takes effect, so no rank
ever leaves a collective half-done and nothing raises. A warning that reaches only some ranks (Slurm signals
each at its own moment; `scancel --signal -w NODE`) must still reach rank 0: share `requested` at each step
boundary (an all_reduce MAX) and pass the result to `preemption.agree()` on every rank (examples/train.py does). To make that end immediate, the handler restores
SIGTERM's default action when the warning arrives (submitit otherwise ignores SIGTERM and the ranks would
wait out Slurm's KillWait). The requeued job starts the same script, which loads the checkpoint and resumes.

SIGTERM without a warning before it (a preemption, which sends the warning only where the cluster sets
`preempt_send_user_signal`; `scancel`; a time limit the warning did not precede) also sets `requested`: rank 0
saves at the next step boundary as above, and `requeue()` then ends it without requeueing, since Slurm is
ending the job itself (and requeues a preempted job on its own), unless Slurm is preempting it within a
partition's GraceTime (`Preemption.preempted()`): Slurm then requeues only a job still running when the grace
time is over, so rank 0 requeues it itself. The other ranks keep stepping until Slurm ends
them, and fail in their next collective once rank 0 has left it: they must not stop first, since Slurm signals
each rank at its own moment and rank 0 may not have saved yet. To have every rank stop cleanly at one step,
agree on it: an all_reduce (MAX) of `preemption.requested` at each step boundary, then every rank saves or
stops at the same step (examples/train.py does this).

The signal defaults to SIGUSR2, not SIGUSR1 (NCCL has used SIGUSR1); set it per call or with
``SLURMDIST_REQUEUE_SIGNAL``. Nothing here imports torch or submitit.
"""

from __future__ import annotations

import enum
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Dict, List, Mapping, Optional, Union

from . import commands, procfs
from .envvars import is_whole, whole_number
from .errors import SlurmdistError

log = logging.getLogger("slurmdist")

SIGNAL_VARIABLE = "SLURMDIST_REQUEUE_SIGNAL"
MAX_REQUEUES_VARIABLE = "SLURMDIST_MAX_REQUEUES"
DEFAULT_SIGNAL = "USR2"
DEFAULT_MAX_REQUEUES = 10
# submitit's LocalExecutor restarts a job whose task exits with this status: its local "requeue".
LOCAL_REQUEUE_EXIT_CODE = 144
# ... at most this many times (its controller runs a job six times at most); then the job ends with no result.
LOCAL_MAX_RESTARTS = 5
# The local controller's pid, for a command that `Submitter.submit_command` runs (its parent is the task).
LOCAL_CONTROLLER_VARIABLE = "SLURMDIST_LOCAL_CONTROLLER_PID"
REQUEUE_COMMAND_TIMEOUT = 60.0  # seconds for `scontrol requeue`
ENDED_EXIT_STATUS = 128 + signal.SIGTERM  # rank 0 after saving on a SIGTERM: what a shell reports for it
KILL_WAIT_TIMEOUT = 120.0  # seconds rank 0 waits for Slurm to end it after a requeue (KillWait is 30 s by default)

MAX_SIGNAL_DELAY = 65535  # the most seconds sbatch --signal=SIG@DELAY takes
SIGNAL_EARLY = 60  # seconds Slurm may send the warning ahead of the asked time (its event resolution)

SignalSpec = Union[str, int, signal.Signals, None]
DEFAULT_SIGNAL_DELAY = 120  # seconds between the warning signal and the time limit: room to save a checkpoint
UNCATCHABLE = frozenset({signal.SIGKILL, signal.SIGSTOP})
# Signals Slurm sends a job it ends (scancel, preemption, time limit), refused as the warning, and why.
SENT_WHEN_ENDING = {
    # The warning asks to requeue: scancel would then requeue the job, not end it.
    signal.SIGTERM: "is also what scancel, a preemption and the time limit send, so a cancelled job would requeue "
                    "itself",
    # Sent just before that SIGTERM: taken as the warning, it puts SIGTERM back to fatal before any save.
    signal.SIGCONT: "is what Slurm sends just before the SIGTERM that ends a job (scancel, preemption, time limit), "
                    "so the job would stop without saving",
}

_CRASH = "reports a crash (of this process or of a library in it)"
_TIMER = "is what timers send (signal.alarm, profilers)"
_JOB_CONTROL = "is terminal job control, sent by the kernel and shells"
# Signals the kernel or the process's own libraries send without any warning meant: each would checkpoint and
# requeue a job that was told nothing. SIGURG is left: only TCP urgent data, which nothing here uses, sends it.
SENT_ON_THEIR_OWN = {
    signal.SIGCHLD: "is what the kernel sends whenever a child process ends (a DataLoader worker, any subprocess)",
    signal.SIGPIPE: "is what the kernel sends when a process writes to a pipe nobody reads",
    signal.SIGWINCH: "is what a terminal sends when its window changes size",
    signal.SIGXFSZ: "is what the kernel sends when a file grows past the size limit",
    signal.SIGIO: "is what the kernel sends for asynchronous I/O",
    signal.SIGINT: "is what Ctrl-C and a local job's cancel send, which would then requeue the job, not stop it",
    # init() also takes it as "stop" (slurmdist.signal_cut): a warning during the rendezvous would break it.
    signal.SIGHUP: "is what a closing terminal or ssh session sends (and init() stops its rendezvous on it)",
    **dict.fromkeys((signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT, signal.SIGTRAP,
                     signal.SIGSYS), _CRASH),
    **dict.fromkeys((signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF), _TIMER),
    **dict.fromkeys((signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU), _JOB_CONTROL),
}


__all__ = ["RequeueError", "Preemption", "Resumable", "install", "restart_count"]


class RequeueError(SlurmdistError):
    """The job could not be requeued (not a Slurm job, too many requeues, `scontrol requeue` failed)."""


class Action(enum.Enum):
    """What rank 0 does once its checkpoint is saved."""

    SLURM_REQUEUE = "scontrol requeue"
    LOCAL_RESTART = "exit for submitit's LocalExecutor to restart"
    GIVE_UP = "stop: no requeue possible"


@dataclass(frozen=True)
class Plan:
    """The requeue decision for this job, made from its environment alone (see `plan`)."""

    action: Action
    job_id: Optional[str] = None
    reason: str = ""
    command: List[str] = field(default_factory=list)


# --- pure parts -----------------------------------------------------------------------------------------------


def parse_signal(spec: SignalSpec = None, environ: Optional[Mapping[str, str]] = None, *,
                 named: Optional[str] = None) -> signal.Signals:
    """`spec` ('USR2', 'SIGUSR2', 12, a Signals) as a signal; None reads SLURMDIST_REQUEUE_SIGNAL, else USR2.
    `named`: how errors name the value (an option as the user typed it); by default, where it came from."""
    from_environ = False
    if spec is None:
        environ = os.environ if environ is None else environ
        spec = environ.get(SIGNAL_VARIABLE, "").strip() or DEFAULT_SIGNAL
        from_environ = SIGNAL_VARIABLE in environ
    if named is None:
        named = f"{SIGNAL_VARIABLE}={spec!r}" if from_environ else f"requeue signal {spec!r}"
    if isinstance(spec, signal.Signals):
        sig = spec
    else:
        text = str(spec).strip().upper()
        try:
            number = whole_number(text)
            sig = signal.Signals(number) if number is not None else signal.Signals[
                text if text.startswith("SIG") else "SIG" + text]
        except (KeyError, ValueError):
            if "@" in text:  # sbatch's --signal=USR2@60 form
                raise RequeueError(
                    f"{named} is sbatch's SIG@SECONDS form; give the signal alone ({text.partition('@')[0] or 'USR2'}) "
                    "and the seconds before the time limit apart: signal_delay=SECONDS where slurmdist submits the "
                    "job, sbatch's own --signal in a job script"
                ) from None
            if not text:
                raise RequeueError(f"{named} names no signal: leave it out for the default, USR2, or name one such "
                                   "as URG") from None
            raise RequeueError(
                f"{named} is not a signal name or number; use e.g. USR2 (the default) or URG"
            ) from None
    if sig in UNCATCHABLE:
        raise RequeueError(f"{named} cannot be caught, so no checkpoint could follow it; use e.g. USR2")
    why = SENT_WHEN_ENDING.get(sig) or SENT_ON_THEIR_OWN.get(sig)
    if why:
        raise RequeueError(f"{named} {why}; use a signal that only the warning sends, e.g. USR2 (the default)")
    return sig


def signal_delay_problem(delay: int, minutes: Optional[int], *, what: str, within: str, time_name: str,
                         delay_name: str) -> Optional[str]:
    """What is wrong with a warning `delay` seconds before a `minutes`-minute time limit (None: no limit), or
    None. The other arguments name the options, as the caller's user wrote them (`what`: the delay, `within`:
    the limit)."""
    if delay > MAX_SIGNAL_DELAY:
        return f"{what} is more than Slurm's --signal accepts ({MAX_SIGNAL_DELAY} s)"
    if delay == 0:  # Slurm takes a warning time of 0 for none, and submitit's local controller does too
        return (f"{what} would mean no warning at all: Slurm sends none 0 s before the limit. Give the seconds "
                f"before the limit to warn at (the default is {DEFAULT_SIGNAL_DELAY} s)")
    if minutes is None:  # nothing to warn before
        return None
    # Slurm may send the warning up to a minute early: a job warned at its start would requeue forever.
    longest = minutes * 60 - SIGNAL_EARLY - 1
    if delay <= longest:
        return None
    shorter = f", or {delay_name} to at most {longest} s" if longest >= 0 else ""
    return (f"{what} leaves no time to train within {within} ({minutes} min): Slurm sends the warning that long "
            f"before the limit, and up to {SIGNAL_EARLY} s earlier, so the job would be warned (and requeued) as "
            f"it starts. Set {time_name} to at least {(delay + SIGNAL_EARLY) // 60 + 1} min{shorter}")


# The signal names Slurm's --signal option knows (sig_name2num in Slurm's sources; 22.05 refuses WINCH, PIPE
# and the rest by name). It takes any signal by number.
SLURM_SIGNAL_NAMES = frozenset(
    ("HUP", "INT", "QUIT", "ABRT", "KILL", "ALRM", "TERM", "USR1", "USR2", "URG", "CONT", "STOP", "TSTP", "TTIN",
     "TTOU", "XCPU"))


def slurm_name(sig: signal.Signals) -> str:
    """How Slurm's --signal option takes `sig`: 'USR2' for SIGUSR2, the number for a name it does not know."""
    name = sig.name[3:]
    return name if name in SLURM_SIGNAL_NAMES else str(int(sig))


def under_local_executor(environ: Mapping[str, str]) -> bool:
    """Run by submitit's LocalExecutor (a task, or a command a task started)."""
    return environ.get("SUBMITIT_EXECUTOR") == "local"


def local_restarts_file(environ: Mapping[str, str]) -> Optional[Path]:
    """Where this local job counts its restarts: beside its logs, in submitit's folder for it. None when the
    variables that name it are missing (the job then restarts without a count, as submitit alone would)."""
    folder, job = environ.get("SUBMITIT_FOLDER", ""), environ.get("SUBMITIT_LOCAL_JOB_ID", "").strip()
    if not folder or not job:
        return None
    return Path(folder.replace("%j", job).replace("%t", "0")) / f"{job}_slurmdist_restarts"


def restart_count(environ: Mapping[str, str]) -> int:
    """How many times this job was requeued by Slurm, or restarted by submitit's LocalExecutor (the count
    slurmdist keeps beside its logs), already: 0 on its first run."""
    if under_local_executor(environ):
        counter = LocalRestarts.of(environ)
        return counter.count() if counter is not None else 0
    raw = environ.get("SLURM_RESTART_COUNT", "").strip()
    return whole_number(raw) or 0


def requeue_limit(value: Optional[int], environ: Mapping[str, str]) -> int:
    """The requeue limit: `value`, else SLURMDIST_MAX_REQUEUES, else 10."""
    if value is not None:
        if not is_whole(value, 0):
            raise RequeueError(f"max_requeues={value!r} must be a whole number of requeues, 0 or more (0: never "
                               f"requeue; None: {MAX_REQUEUES_VARIABLE}, else {DEFAULT_MAX_REQUEUES})")
        return value
    raw = environ.get(MAX_REQUEUES_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_MAX_REQUEUES
    limit = whole_number(raw)
    if limit is None:
        raise RequeueError(f"{MAX_REQUEUES_VARIABLE}={raw!r} is not a whole number of requeues; set it to 0 or "
                           f"more, or unset it for the default {DEFAULT_MAX_REQUEUES}")
    return limit


def plan(environ: Mapping[str, str], limit: int, local_restarts: int = 0) -> Plan:
    """How this job gets requeued: by Slurm, by submitit's LocalExecutor, or not at all (and why).
    `local_restarts`: how many times the LocalExecutor restarted this job already (it keeps no count)."""
    if under_local_executor(environ):
        if local_restarts >= limit:
            return Plan(Action.GIVE_UP, reason=f"the local job was already restarted {local_restarts} times (limit "
                                               f"{limit}; raise it with max_requeues= or {MAX_REQUEUES_VARIABLE})")
        if local_restarts >= LOCAL_MAX_RESTARTS:
            return Plan(Action.GIVE_UP, reason=f"submitit's LocalExecutor restarts a job at most "
                                               f"{LOCAL_MAX_RESTARTS} times; rerun to resume")
        return Plan(Action.LOCAL_RESTART)
    job_id = environ.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        return Plan(Action.GIVE_UP, reason="this is not a Slurm job (SLURM_JOB_ID is unset); rerun to resume")
    done = restart_count(environ)
    if done >= limit:
        times = "1 time" if done == 1 else f"{done} times"
        return Plan(Action.GIVE_UP, job_id, f"job {job_id} was already requeued {times} (limit {limit}; "
                                            f"raise it with max_requeues= or {MAX_REQUEUES_VARIABLE})")
    job_id = _requeue_id(environ, job_id)
    return Plan(Action.SLURM_REQUEUE, job_id, command=["scontrol", "requeue", job_id])


def _requeue_id(environ: Mapping[str, str], job_id: str) -> str:
    """The id that names this job alone. One element of an array has SLURM_JOB_ID equal to SLURM_ARRAY_JOB_ID
    (the array's own record: element 1 of 0-1 on the local cluster), which scontrol reads as the whole array:
    every element, finished ones included, would be requeued. `<array job id>_<index>` names only this element."""
    array_job = environ.get("SLURM_ARRAY_JOB_ID", "").strip()
    task = environ.get("SLURM_ARRAY_TASK_ID", "").strip()
    return f"{array_job}_{task}" if array_job and task else job_id


# --- the signal handler and the requeue (side effects) --------------------------------------------------------


class Preemption:
    """Set when the requeue signal arrives; `requeue()` acts on it. Create it with `install()`."""

    def __init__(self, sig: signal.Signals, limit: int, rank: int) -> None:
        self.signal = sig
        self.max_requeues = limit
        self.rank = rank
        self.received_at: Optional[float] = None
        self.ending = False  # SIGTERM came first: Slurm is ending the job (preemption, scancel, time limit)
        self._preempted: Optional[bool] = None  # asked of Slurm once, after a SIGTERM (see `preempted`)
        self._previous: Any = None
        self._previous_term: Any = None
        self._installed = False

    @property
    def requested(self) -> bool:
        """True once the signal arrived: checkpoint at the next step boundary, then call `requeue()`."""
        return self.received_at is not None

    def install(self) -> "Preemption":
        if threading.current_thread() is not threading.main_thread():
            raise RequeueError("slurmdist.requeue.install() must run in the main thread (Python delivers signals there)")
        # SIGTERM's handler first: a warning that lands between the two lines sets SIGTERM back to its default
        # (see _on_signal), which installing SIGTERM's handler after it would undo.
        if self.signal != signal.SIGTERM:
            self._previous_term = signal.signal(signal.SIGTERM, self._on_terminate)
        self._previous = signal.signal(self.signal, self._on_signal)
        self._installed = True
        return self

    def uninstall(self) -> None:
        """Give the signals back to whatever handled them before (SIGTERM stays fatal after a warning)."""
        if self._installed:
            signal.signal(self.signal, self._previous if self._previous is not None else signal.SIG_DFL)
            if signal.getsignal(signal.SIGTERM) == self._on_terminate:
                previous = self._previous_term
                signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            self._installed = False

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        # Only flags: a handler runs between two bytecodes, maybe inside a step, where nothing may be saved.
        if self.received_at is None:
            self.received_at = time.monotonic()
        # Slurm ends the job with SIGTERM once rank 0 requeued it: every rank must then die at once, even one
        # blocked in a collective (a Python-level handler would never run there).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        log.warning("slurmdist: rank %d got %s: checkpoint and requeue at the next step boundary",
                    self.rank, self.signal.name)

    def _on_terminate(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.received_at is None:
            self.received_at = time.monotonic()
        if self.ending:  # a preemption's SIGTERM can come twice (from slurmstepd, and passed on by srun)
            return
        self.ending = True
        log.warning("slurmdist: rank %d got SIGTERM (preemption, scancel, the time limit, or srun ending the step "
                    "because another task failed: see its error above): checkpoint at the next step boundary; Slurm "
                    "is ending the job", self.rank)

    def agree(self, requested_anywhere: bool) -> None:
        """Take the warning as received here when some rank got it (`requested_anywhere`: an all_reduce MAX of
        `requested` at the step boundary, on every rank). Slurm signals each rank at its own moment, and
        `scancel --signal` on one node reaches only its ranks: rank 0 must still save and requeue, and every
        rank's SIGTERM must turn fatal, as the warning itself makes it."""
        if requested_anywhere and self.received_at is None:
            self.received_at = time.monotonic()
            if threading.current_thread() is threading.main_thread():  # only it may set a handler
                signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def preempted(self, environ: Optional[Mapping[str, str]] = None) -> bool:
        """After a SIGTERM: whether it is a preemption's (Slurm set the job's PreemptTime), asked of `scontrol
        show job` once, within a bound; False outside Slurm or when Slurm does not say. A partition with a
        GraceTime sends SIGTERM and ends the job only when the grace time is over, and a job whose steps ended
        before that is not requeued: the preempted job must requeue itself, as after the warning."""
        if self._preempted is None:
            self._preempted = self.ending and preemption_started(os.environ if environ is None else environ)
        return self._preempted

    def requeue(self, environ: Optional[Mapping[str, str]] = None) -> None:
        """After rank 0 saved its checkpoint: requeue the job and end this process.

        On ranks other than 0 this returns at once: they keep stepping until Slurm ends them (a rank may get its
        signal before rank 0 does, and must not leave rank 0 alone in a collective before it saved). On rank 0
        it does not return: it requeues and waits (bounded) to be ended, or, after a SIGTERM that no warning
        preceded, exits at once (status 143) without requeueing: Slurm is ending the job and requeues a
        preempted one itself. Raises `RequeueError` when the job cannot be requeued (not under Slurm, or out of
        requeues): the checkpoint is saved, resubmit to resume.
        """
        if self.rank != 0:
            return
        environ = os.environ if environ is None else environ
        if self.ending and not self.preempted(environ):
            log.warning("slurmdist: checkpoint saved; not requeued by slurmdist, since Slurm is ending the job")
            exit_without_result(ENDED_EXIT_STATUS)
        if self.ending:  # a preemption in its grace time: Slurm requeues only a job still running at its end
            log.warning("slurmdist: checkpoint saved; Slurm is preempting the job (its PreemptTime is set): "
                        "requeueing it, since a job that ends within the partition's GraceTime is not requeued")
        counter = LocalRestarts.of(environ) if under_local_executor(environ) else None
        restarts = counter.count() if counter else 0
        if counter is None and restart_count(environ) >= self.max_requeues:  # before giving up: Slurm's own count
            environ = with_slurms_restart_count(environ)
        decision = plan(environ, self.max_requeues, restarts)
        if decision.action is Action.GIVE_UP:
            raise RequeueError(f"not requeued: {decision.reason}")
        if decision.action is Action.LOCAL_RESTART:
            if counter is not None:
                counter.record(restarts + 1)
            _restart_local_job()
        try:
            _run_requeue(decision.command)
        except RequeueError as error:
            if not self.ending:
                raise
            # Preempted: Slurm may be requeueing the job already (no GraceTime), which refuses ours.
            log.warning("slurmdist: %s; Slurm is ending the job", error)
            exit_without_result(ENDED_EXIT_STATUS)
        log.warning("slurmdist: requeued job %s; waiting for Slurm to end this run", decision.job_id)
        _wait_to_be_ended(KILL_WAIT_TIMEOUT)


def install(
    sig: SignalSpec = None, *, max_requeues: Optional[int] = None, rank: Optional[int] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Preemption:
    """Start listening for the requeue signal (default SLURMDIST_REQUEUE_SIGNAL, else USR2) on this rank.

    `rank` defaults to the launcher's (SLURM_PROCID, SUBMITIT_LOCAL_GLOBALID, RANK), read without touching
    torch, so this can run before `slurmdist.init()`: a signal that arrives during start-up is not lost.
    """
    environ = os.environ if environ is None else environ
    if rank is None:
        rank = launcher_rank(environ)
    elif not is_whole(rank, 0):
        raise RequeueError(f"rank={rank!r} must be this process's global rank, 0 or more (None: the launcher's)")
    return Preemption(parse_signal(sig, environ), requeue_limit(max_requeues, environ), rank).install()


def carry_on_past_the_warning(environ: Mapping[str, str]) -> None:
    """In a Slurm job (or a submitit local one), keep the requeue signal (SLURMDIST_REQUEUE_SIGNAL, else USR2)
    from killing a program that does not handle it: slurmdist's job scripts ask Slurm for it, and a training
    script without `install()` would die of it two minutes early, FAILED instead of TIMEOUT, and never
    requeued. `init()` calls this. Where the signal's action is still the default (no handler of the
    program's, none of submitit's, none a C library installed), it is then logged when it comes, and the job
    runs on until Slurm ends it. SIGUSR1 is left alone: Lightning's auto-requeue installs its handler for it
    only where there is none yet, and would then never requeue."""
    in_job = "SLURM_JOB_ID" in environ or under_local_executor(environ)
    if not in_job or threading.current_thread() is not threading.main_thread():
        return
    try:
        sig = parse_signal(None, environ)
    except RequeueError:  # a bad SLURMDIST_REQUEUE_SIGNAL: install() reports it to the program that uses it
        return
    if sig != signal.SIGUSR1 and signal.getsignal(sig) == signal.SIG_DFL and not procfs.catches(sig):
        signal.signal(sig, _log_the_warning)


def _log_the_warning(signum: int, frame: Optional[FrameType]) -> None:
    log.warning("slurmdist: got %s, Slurm's warning that this job nears its time limit or is being preempted "
                "(the job's --signal). Nothing in this program saves on it: call slurmdist.requeue.install() to "
                "checkpoint and requeue then (docs/submit.md). Running on until Slurm ends the job",
                signal.Signals(signum).name)


def launcher_rank(environ: Mapping[str, str]) -> int:
    """This process's global rank as the launcher exported it (0 when there is none)."""
    from .detection import detect

    return detect(environ).rank


def _run_requeue(command: List[str]) -> None:
    try:
        proc = commands.run(command, REQUEUE_COMMAND_TIMEOUT)
    except FileNotFoundError:
        raise RequeueError(f"cannot requeue: {command[0]} is not on PATH in the job") from None
    except subprocess.TimeoutExpired:
        raise RequeueError(f"`{' '.join(command)}` did not answer within {REQUEUE_COMMAND_TIMEOUT:.0f}s") from None
    if proc.returncode != 0:
        said = proc.stderr.strip()
        if "only batch jobs" in said.lower():  # started by srun or salloc, not sbatch
            hint = ("Slurm requeues only jobs submitted with sbatch, and this one was started by srun or salloc: "
                    "rerun it to resume from the checkpoint, or submit it with sbatch")
        elif "disabled" in said.lower() or "requeue" in said.lower():
            hint = ("The cluster may forbid requeues (JobRequeue=0): submit with --requeue, or resubmit by hand to "
                    "resume from the checkpoint")
        else:
            hint = "The checkpoint is saved: resubmit the job to resume from it"
        raise RequeueError(f"`{' '.join(command)}` failed ({proc.returncode}): {said}. {hint}")


@dataclass(frozen=True)
class LocalRestarts:
    """How many times submitit's LocalExecutor restarted this job, kept beside its logs (submitit keeps no
    count). The count holds the controller's start time: a later job whose controller got the same pid (a
    container's pids repeat from run to run) in a folder without %j does not inherit it."""

    path: Path
    controller_started: str

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> Optional["LocalRestarts"]:
        path = local_restarts_file(environ)
        return None if path is None else cls(path, _process_start(environ.get("SUBMITIT_LOCAL_JOB_ID", "")))

    def count(self) -> int:
        try:
            count, _, started = self.path.read_text().strip().partition(" ")
        except OSError:  # none yet: the first run
            return 0
        return (whole_number(count) or 0) if started == self.controller_started else 0

    def record(self, count: int) -> None:
        try:
            self.path.write_text(f"{count} {self.controller_started}\n")
        except OSError as exc:  # the restart matters more than its count
            log.warning("slurmdist: cannot count this local restart in %s: %s", self.path, exc)


def _process_start(pid: str) -> str:
    """When process `pid` started (clock ticks since boot, from /proc), or '' when that cannot be read."""
    fields = procfs.process_stat(pid)
    return fields[19] if len(fields) > 19 else ""


def _restart_local_job() -> None:
    """submitit's LocalExecutor restarts the tasks when one exits with 144; its controller (our parent, or
    our task's parent for a submitted command) forwards SIGTERM to every task, which ends the others at once
    (their SIGTERM is at its default now)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    controller = os.environ.get(LOCAL_CONTROLLER_VARIABLE, "")
    try:
        os.kill(int(controller) if controller.isdigit() else os.getppid(), signal.SIGTERM)
    except OSError:  # pragma: no cover - the controller is gone; the exit status still asks for a restart
        pass
    exit_without_result(LOCAL_REQUEUE_EXIT_CODE)


def _wait_to_be_ended(timeout: float) -> None:
    """Sleep until Slurm's SIGTERM ends this process; exit on our own if it never comes."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.2)
    log.warning("slurmdist: still running %.0fs after the requeue; exiting", timeout)
    exit_without_result(ENDED_EXIT_STATUS)  # the job is queued again: this run ends without a result


JOB_QUERY_TIMEOUT = 10.0  # seconds for `scontrol show job`, asked only when a requeue depends on it


def job_fields(environ: Mapping[str, str]) -> Dict[str, str]:
    """This job's record as `scontrol show job -o` gives it (JobState, Restarts, PreemptTime, ...); empty
    outside Slurm, or when scontrol cannot tell within JOB_QUERY_TIMEOUT."""
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        return {}
    try:
        proc = commands.run(["scontrol", "show", "job", "-o", job_id], JOB_QUERY_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if proc.returncode != 0:
        return {}
    return dict(word.partition("=")[::2] for word in proc.stdout.split() if "=" in word)


def preemption_started(environ: Mapping[str, str]) -> bool:
    """Whether Slurm has begun preempting this job: its PreemptTime is set (None until then)."""
    return job_fields(environ).get("PreemptTime", "None") not in ("None", "Unknown", "")


def with_slurms_restart_count(environ: Mapping[str, str]) -> Mapping[str, str]:
    """`environ` with SLURM_RESTART_COUNT as Slurm counts this job's requeues (`Restarts`). Slurm sets the
    variable only from the first requeue on, so on a first run it is whatever the submitting shell had: a job
    submitted from a requeued job inherits that job's count. Unchanged when Slurm does not say."""
    restarts = job_fields(environ).get("Restarts", "")
    return {**environ, "SLURM_RESTART_COUNT": restarts} if whole_number(restarts) is not None else environ


def exit_without_result(status: int) -> None:
    """End this process without unwinding: nothing may report the ended run as the job's result (submitit
    would write one)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


# --- a Checkpointable-style base class for submitit -----------------------------------------------------------


class Resumable:
    """A training job that survives preemption and time limits: subclass it and implement `run`.

    `run(preemption)` trains from the checkpoint at `self.checkpoint_path` if it exists; at every step
    boundary where `preemption.requested`, rank 0 saves and every rank calls `preemption.requeue()`. Submit
    the instance itself (``submitter.submit(MyTraining(path))``): the requeued job calls it again, and it
    resumes from the file, so the object never needs re-pickling. Works the same in a plain sbatch script
    (``MyTraining(path)()``).
    """

    def __init__(self, checkpoint_path: Union[str, os.PathLike], *, signal: SignalSpec = None,
                 max_requeues: Optional[int] = None) -> None:
        if not os.fspath(checkpoint_path):
            raise RequeueError("Resumable(''): give the checkpoint's file path, such as 'runs/ckpt.pt' (the "
                               "requeued job resumes from it)")
        self.checkpoint_path = Path(checkpoint_path).absolute()
        if signal is not None:  # checked where it is written, not once the job has waited in the queue
            parse_signal(signal)
        self.signal = signal
        if max_requeues is not None:  # checked where it is written, not only once the job runs
            requeue_limit(max_requeues, {})
        self.max_requeues = max_requeues

    def run(self, preemption: Preemption, *args: Any, **kwargs: Any) -> Any:
        """Train (resuming from `self.checkpoint_path` when it exists) and return the result."""
        raise NotImplementedError(f"{type(self).__name__} must implement run(self, preemption, ...)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        preemption = install(self.signal, max_requeues=self.max_requeues)
        try:
            return self.run(preemption, *args, **kwargs)
        finally:
            preemption.uninstall()

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's hook, used only when the signal lands before `run` took it over: resubmit as is."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)

"""slurmdist.requeue: signal parsing, the requeue decision, and the real handler on a real signal."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import pytest

from slurmdist.requeue import (
    LOCAL_MAX_RESTARTS, Action, LocalRestarts, Preemption, RequeueError, Resumable, carry_on_past_the_warning, install,
    local_restarts_file, _run_requeue, parse_signal, plan, requeue_limit, restart_count,
)
from slurmdist.submit import SubmitError, Submitter
from tests.conftest import load_case


@pytest.mark.parametrize("spec, expected", [
    ("USR2", signal.SIGUSR2), ("sigusr2", signal.SIGUSR2), ("URG", signal.SIGURG), (12, signal.Signals(12)),
    (signal.SIGUSR1, signal.SIGUSR1),
])
def test_parse_signal(spec, expected):
    assert parse_signal(spec) is expected


def test_signal_defaults_to_usr2_and_reads_the_environment():
    assert parse_signal(None, {}) is signal.SIGUSR2
    assert parse_signal(None, {"SLURMDIST_REQUEUE_SIGNAL": "URG"}) is signal.SIGURG


def test_unknown_signal_is_an_error():
    with pytest.raises(RequeueError, match="not a signal"):
        parse_signal("FOO")
    with pytest.raises(RequeueError, match="not a signal"):  # int() reads the Arabic-Indic 3 as SIGQUIT
        parse_signal("\u0663")
    with pytest.raises(RequeueError, match="SLURMDIST_REQUEUE_SIGNAL='USR3' is not a signal"):
        parse_signal(None, {"SLURMDIST_REQUEUE_SIGNAL": "USR3"})


@pytest.mark.parametrize("spec", ["KILL", "SIGSTOP", 9])
def test_a_signal_that_cannot_be_caught_is_refused(spec):
    with pytest.raises(RequeueError, match="cannot be caught"):
        parse_signal(spec)


@pytest.mark.parametrize("spec, why", [
    ("CHLD", "whenever a child process ends"), ("PIPE", "writes to a pipe"), ("SEGV", "reports a crash"),
    ("ALRM", "timers"), ("TTOU", "job control"), ("INT", "Ctrl-C"), (28, "window changes size"),
    ("HUP", "closing terminal or ssh session sends \\(and init\\(\\) stops its rendezvous on it\\)"),
])
def test_a_signal_sent_without_any_warning_meant_is_refused(spec, why):
    # SIGCHLD as the warning: every DataLoader worker that ended would checkpoint and requeue the job.
    with pytest.raises(RequeueError, match=f"{why}.*use a signal that only the warning sends"):
        parse_signal(spec)


@pytest.mark.parametrize("spec", ["USR1", "USR2", "URG", "QUIT", "XCPU", "RTMIN"])
def test_signals_nothing_sends_on_its_own_are_taken(spec):
    assert parse_signal(spec).name == "SIG" + spec


@pytest.mark.parametrize("spec", ["TERM", "sigterm", 15, signal.SIGTERM])
def test_sigterm_is_refused_as_the_warning_since_scancel_sends_it_too(spec):
    # A job told to requeue on SIGTERM would requeue itself when the user cancels it.
    with pytest.raises(RequeueError, match="also what scancel, a preemption and the time limit send"):
        parse_signal(spec)
    with pytest.raises(RequeueError, match="SLURMDIST_REQUEUE_SIGNAL='TERM' is also what scancel"):
        parse_signal(None, {"SLURMDIST_REQUEUE_SIGNAL": "TERM"})


@pytest.mark.parametrize("spec", ["CONT", "SIGCONT", 18])
def test_sigcont_is_refused_as_the_warning_since_slurm_sends_it_before_sigterm(spec):
    with pytest.raises(RequeueError, match="just before the SIGTERM that ends a job"):
        parse_signal(spec)


def test_a_local_jobs_restarts_are_counted_as_a_slurm_jobs_requeues(tmp_path):
    # examples/submit_train.py reports `restarts`: 0 after a real local restart before.
    from slurmdist.requeue import LocalRestarts

    environ = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_FOLDER": str(tmp_path),
               "SUBMITIT_LOCAL_JOB_ID": str(os.getpid())}
    assert restart_count(environ) == 0
    LocalRestarts.of(environ).record(2)
    assert restart_count(environ) == 2
    assert restart_count({**environ, "SUBMITIT_EXECUTOR": "slurm", "SLURM_RESTART_COUNT": "1"}) == 1


def test_restart_count_and_limit():
    assert restart_count({}) == 0
    assert restart_count({"SLURM_RESTART_COUNT": "2"}) == 2
    assert requeue_limit(None, {}) == 10
    assert requeue_limit(None, {"SLURMDIST_MAX_REQUEUES": "3"}) == 3
    assert requeue_limit(1, {"SLURMDIST_MAX_REQUEUES": "3"}) == 1
    with pytest.raises(RequeueError, match="SLURMDIST_MAX_REQUEUES='three'"):
        requeue_limit(None, {"SLURMDIST_MAX_REQUEUES": "three"})
    # Past Python's 4300-digit int() limit: the same error, not a bare ValueError from the handler.
    with pytest.raises(RequeueError, match="SLURMDIST_MAX_REQUEUES='7777.*is not a whole number of requeues"):
        requeue_limit(None, {"SLURMDIST_MAX_REQUEUES": "7" * 5000})
    assert restart_count({"SLURM_RESTART_COUNT": "7" * 5000}) == 0  # corrupt: read as no requeue yet


@pytest.mark.parametrize("value", [-1, "3", 1.5, True])
def test_a_requeue_limit_given_in_code_is_a_whole_number_too(value):
    with pytest.raises(RequeueError, match=f"max_requeues={value!r} must be a whole number of requeues, 0 or more"):
        requeue_limit(value, {})
    with pytest.raises(RequeueError, match="max_requeues="):
        install(max_requeues=value, environ={})
    with pytest.raises(RequeueError, match="max_requeues="):
        Resumable("ckpt.pt", max_requeues=value)


@pytest.mark.parametrize("rank", [-2, "0", True])
def test_a_rank_given_to_install_is_a_global_rank(rank):
    with pytest.raises(RequeueError, match=f"rank={rank!r} must be this process's global rank"):
        install(rank=rank, environ={})


def test_plan_under_slurm_requeues_this_job():
    decision = plan({"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1"}, limit=3)
    assert decision.action is Action.SLURM_REQUEUE
    assert decision.command == ["scontrol", "requeue", "42"]


def test_plan_requeues_an_array_element_alone():
    # The element whose SLURM_JOB_ID is the array's own id (7): `scontrol requeue 7` means every element.
    for element in load_case("slurm/sbatch_array_srun"):
        decision = plan(element, limit=3)
        named = f"{element['SLURM_ARRAY_JOB_ID']}_{element['SLURM_ARRAY_TASK_ID']}"
        assert decision.command == ["scontrol", "requeue", named] and decision.job_id == named


def test_a_job_slurm_cannot_requeue_because_srun_started_it_is_told_so():
    # scontrol's own words for a job started by srun or salloc (captured on the local cluster).
    refusal = "import sys; sys.stderr.write('Only batch jobs are accepted or processed for job 5'); sys.exit(1)"
    with pytest.raises(RequeueError) as caught:
        _run_requeue([sys.executable, "-c", refusal])
    assert "Only batch jobs" in str(caught.value) and "submit it with sbatch" in str(caught.value)
    assert "JobRequeue=0" not in str(caught.value)
    disabled = "import sys; sys.stderr.write('Requested operation is disabled'); sys.exit(1)"
    with pytest.raises(RequeueError, match="JobRequeue=0"):
        _run_requeue([sys.executable, "-c", disabled])
    # Anything else (slurmctld unreachable) is not a sign of JobRequeue=0.
    unreachable = "import sys; sys.stderr.write('Unable to contact slurm controller (connect failure)'); sys.exit(1)"
    with pytest.raises(RequeueError, match="resubmit the job to resume from it") as other:
        _run_requeue([sys.executable, "-c", unreachable])
    assert "JobRequeue=0" not in str(other.value)


def test_resumable_and_submitter_refuse_what_would_fail_later():
    from slurmdist.requeue import Resumable
    from slurmdist.submit import SubmitError, Submitter

    with pytest.raises(RequeueError, match=r"Resumable\(''\): give the checkpoint's file path"):
        Resumable("")
    with pytest.raises(SubmitError, match="signal_delay=None must be a whole number >= 0"):
        Submitter(cluster="local", signal_delay=None)


def test_plan_gives_up_after_the_limit_and_outside_slurm():
    out_of_requeues = plan({"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "3"}, limit=3)
    assert out_of_requeues.action is Action.GIVE_UP and "already requeued 3 times" in out_of_requeues.reason
    assert plan({}, limit=3).action is Action.GIVE_UP
    assert "already requeued 1 time (limit 1;" in plan({"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1"}, limit=1).reason


def test_plan_under_submitit_local_restarts_through_the_controller():
    assert plan({"SUBMITIT_EXECUTOR": "local", "SLURM_JOB_ID": "7"}, limit=3).action is Action.LOCAL_RESTART


@pytest.mark.parametrize("limit, restarts, gives_up_because", [
    (3, 2, None),
    (3, 3, "already restarted 3 times (limit 3"),  # max_requeues holds locally as under Slurm
    (10, LOCAL_MAX_RESTARTS, f"restarts a job at most {LOCAL_MAX_RESTARTS} times"),  # then submitit stops
])
def test_plan_under_submitit_local_counts_its_restarts(limit, restarts, gives_up_because):
    decision = plan({"SUBMITIT_EXECUTOR": "local"}, limit=limit, local_restarts=restarts)
    if gives_up_because is None:
        assert decision.action is Action.LOCAL_RESTART
    else:
        assert decision.action is Action.GIVE_UP and gives_up_because in decision.reason


def test_a_local_job_counts_its_restarts_beside_its_logs(tmp_path):
    environ = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_FOLDER": f"{tmp_path}/%j", "SUBMITIT_LOCAL_JOB_ID": "4242"}
    assert local_restarts_file(environ) == tmp_path / "4242" / "4242_slurmdist_restarts"
    assert local_restarts_file({"SUBMITIT_EXECUTOR": "local"}) is None  # cannot count: restarts as submitit does


def test_a_local_restart_count_belongs_to_its_controller(tmp_path):
    # A folder without %j, and a later controller with the same pid (a container's pids repeat): its job
    # starts from 0, not from the count an earlier job left there.
    environ = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_FOLDER": str(tmp_path),
               "SUBMITIT_LOCAL_JOB_ID": str(os.getpid())}
    counter = LocalRestarts.of(environ)
    assert counter.count() == 0
    counter.record(2)
    assert LocalRestarts.of(environ).count() == 2
    assert LocalRestarts(counter.path, "1").count() == 0  # the same pid, started at another time


@pytest.fixture
def preemption():
    handler = install("USR2", max_requeues=2, rank=0, environ={})
    previous_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: None)  # what submitit does in a job: the handler must undo it
    try:
        yield handler
    finally:
        handler.uninstall()
        signal.signal(signal.SIGTERM, previous_term)


def test_the_signal_sets_the_flag_and_makes_sigterm_fatal_again(preemption):
    assert not preemption.requested
    os.kill(os.getpid(), signal.SIGUSR2)
    assert preemption.requested
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_sigterm_before_any_warning_asks_for_a_checkpoint_and_no_requeue(caplog):
    # A preemption (without preempt_send_user_signal), scancel, or a time limit no warning preceded.
    previous = signal.getsignal(signal.SIGTERM)
    ending = Preemption(signal.SIGUSR2, limit=1, rank=3).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert ending.requested and ending.ending
        # srun --kill-on-bad-exit sends it too, when another task failed: the warning must not blame Slurm alone.
        assert "rank 3 got SIGTERM" in caplog.text and "because another task failed" in caplog.text
        os.kill(os.getpid(), signal.SIGTERM)  # a preemption's second one (slurmstepd's, then srun's): said once
        assert caplog.text.count("rank 3 got SIGTERM") == 1 and ending.ending
        # Other ranks go on until Slurm ends them: this one may have got its SIGTERM before rank 0 saved.
        ending.requeue(environ={"SLURM_JOB_ID": "1"})
    finally:
        ending.uninstall()
    assert signal.getsignal(signal.SIGTERM) == previous


RANK_0_SAVES_ON_SIGTERM = """
import os, signal
from slurmdist.requeue import install
preemption = install("USR2", rank=0, environ={})
os.kill(os.getpid(), signal.SIGTERM)
assert preemption.requested
print("saved", flush=True)
preemption.requeue(environ={"SLURM_JOB_ID": "1"})  # must not run scontrol: Slurm is ending the job
print("still here", flush=True)
"""


def test_rank_0_ends_after_saving_on_sigterm_without_requeueing():
    environ = {**os.environ, "PATH": "/nonexistent"}  # `scontrol requeue` would fail: "not on PATH"
    done = subprocess.run([sys.executable, "-c", RANK_0_SAVES_ON_SIGTERM], env=environ, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 143, done.stderr
    assert done.stdout == "saved\n" and "not requeued by slurmdist" in done.stderr


def test_uninstall_restores_the_previous_handler():
    def previous(signum, frame):
        return None

    old = signal.signal(signal.SIGUSR2, previous)
    try:
        install("USR2", rank=0, environ={}).uninstall()
        assert signal.getsignal(signal.SIGUSR2) is previous
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_requeue_outside_slurm_says_why(preemption):
    with pytest.raises(RequeueError, match="not a Slurm job"):
        preemption.requeue(environ={})


def test_requeue_on_other_ranks_returns_at_once():
    # Outside Slurm rank 0 refuses (it would requeue the job and end otherwise); the other ranks never look.
    assert Preemption(signal.SIGUSR2, limit=1, rank=3).requeue(environ={}) is None
    with pytest.raises(RequeueError, match="not a Slurm job"):
        Preemption(signal.SIGUSR2, limit=1, rank=0).requeue(environ={})


class Counting(Resumable):
    def run(self, preemption, start):
        return (start, preemption.requested, signal.getsignal(signal.SIGUSR2) == preemption._on_signal)


def test_resumable_listens_only_while_it_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURMDIST_LAUNCHER", "single")
    before = signal.getsignal(signal.SIGUSR2)
    assert Counting(tmp_path / "ckpt.pt", signal="USR2")(5) == (5, False, True)
    assert signal.getsignal(signal.SIGUSR2) == before


@pytest.mark.parametrize("spec, says", [("FOO", "not a signal name"), ("TERM", "scancel, a preemption")])
def test_a_resumable_checks_its_signal_where_it_is_written(spec, says):
    # It used to be found only once the job ran, after its wait in the queue.
    with pytest.raises(RequeueError, match=f"requeue signal {spec!r} .*{says}"):
        Counting("ckpt.pt", signal=spec)


def test_a_resumable_told_another_signal_than_the_jobs_is_not_submitted(tmp_path):
    # submitit's handler took the job's USR2 and requeued without a checkpoint: every run began at step 0.
    submitter = Submitter(folder=tmp_path, nodes=2)
    with pytest.raises(SubmitError, match=r"Counting\(signal='URG'\) waits for SIGURG, but this job is warned with "
                                          r"SIGUSR2 \(the Submitter's default\).*Submitter signal='URG', or the "
                                          r"Resumable signal='USR2' or none"):
        submitter.submit(Counting(tmp_path / "ckpt.pt", signal="URG"), 0)
    with pytest.raises(SubmitError, match="waits for SIGUSR2, but this job is warned with SIGURG"):
        submitter.with_options(signal="URG").map_array(Counting(tmp_path / "ckpt.pt", signal=12), [0])
    assert not any(tmp_path.iterdir())  # nothing written, nothing queued


def test_the_signal_mismatch_names_the_variable_that_set_the_jobs_signal(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURMDIST_REQUEUE_SIGNAL", "URG")
    with pytest.raises(SubmitError, match=r"warned with SIGURG \(SLURMDIST_REQUEUE_SIGNAL='URG' in this process\)"):
        Submitter(folder=tmp_path).submit(Counting(tmp_path / "ckpt.pt", signal="USR2"), 0)


class SkipsSuper(Resumable):
    def __init__(self, path):  # no super().__init__(): no signal attribute
        self.path = path


def test_a_resumable_that_skipped_its_base_init_is_not_refused_for_its_signal(tmp_path):
    from slurmdist.submit import _require_the_jobs_signal, Resources

    _require_the_jobs_signal(SkipsSuper(tmp_path), Resources())  # was an AttributeError at submit()


def test_resumable_keeps_an_absolute_checkpoint_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Counting("ckpt.pt").checkpoint_path == tmp_path / "ckpt.pt"


@pytest.fixture
def default_warning_signals():
    """SIGUSR2 and SIGURG at their default actions for the test, and back as they were after it."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR2, signal.SIGURG)}
    for sig in previous:
        signal.signal(sig, signal.SIG_DFL)
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def test_init_keeps_the_warning_signal_from_killing_a_program_that_does_not_handle_it(default_warning_signals,
                                                                                        caplog):
    # The job scripts ask Slurm for SIGUSR2 before the limit: a script without slurmdist.requeue died of it.
    carry_on_past_the_warning({"SLURM_JOB_ID": "7"})
    with caplog.at_level(logging.WARNING, logger="slurmdist"):
        os.kill(os.getpid(), signal.SIGUSR2)  # the default action would end this process here
        for _ in range(100):  # Python runs the handler at its next check
            if caplog.records:
                break
    assert "got SIGUSR2, Slurm's warning" in caplog.text and "slurmdist.requeue.install()" in caplog.text
    # The signal the job scripts ask for under SLURMDIST_REQUEUE_SIGNAL.
    carry_on_past_the_warning({"SLURM_JOB_ID": "7", "SLURMDIST_REQUEUE_SIGNAL": "URG"})
    assert signal.getsignal(signal.SIGURG) is not signal.SIG_DFL


def test_a_handler_of_the_programs_own_and_processes_outside_a_job_are_left_alone(default_warning_signals):
    carry_on_past_the_warning({})  # outside a job nothing asked for the signal
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
    carry_on_past_the_warning({"SLURM_JOB_ID": "7", "SLURMDIST_REQUEUE_SIGNAL": "USR3"})  # install() says why
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL

    def own(signum, frame):
        pass

    signal.signal(signal.SIGUSR2, own)
    carry_on_past_the_warning({"SLURM_JOB_ID": "7"})
    assert signal.getsignal(signal.SIGUSR2) is own
    # SIGUSR1: Lightning installs its requeue handler only where none is.
    previous = signal.getsignal(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        carry_on_past_the_warning({"SLURM_JOB_ID": "7", "SLURMDIST_REQUEUE_SIGNAL": "USR1"})
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_handler_a_c_library_installed_is_left_alone(default_warning_signals):
    # faulthandler.register() installs a C handler (a traceback dump on demand) that Python reports as SIG_DFL.
    import faulthandler

    faulthandler.register(signal.SIGUSR2)
    try:
        carry_on_past_the_warning({"SLURM_JOB_ID": "7"})
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL  # not replaced
    finally:
        faulthandler.unregister(signal.SIGUSR2)


def test_a_submitit_local_job_gets_the_warning_carried_past_too(default_warning_signals):
    # Its controller forwards the warning to the tasks, which have no SLURM_JOB_ID.
    carry_on_past_the_warning({"SUBMITIT_EXECUTOR": "local"})
    assert signal.getsignal(signal.SIGUSR2) is not signal.SIG_DFL

"""Background threads: a bounded call hands back its result or its exception, and stops waiting in time."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from slurmdist import background


def test_a_bounded_call_returns_what_the_call_returned():
    assert background.call_with_timeout(lambda: 42, 5.0, "answer") == 42


def test_a_bounded_call_raises_what_the_call_raised():
    def fails():
        raise ValueError("no such host")

    with pytest.raises(ValueError, match="no such host"):
        background.call_with_timeout(fails, 5.0, "lookup")


def test_a_call_past_its_bound_is_left_running_and_named():
    release = threading.Event()
    with pytest.raises(TimeoutError, match="slurm.conf-read took longer than 0.2 s"):
        background.call_with_timeout(lambda: release.wait(30), 0.2, "slurm.conf-read")
    release.set()


def test_a_call_past_its_bound_is_unblocked_until_it_ends_within_the_grace():
    # A call that retries (torch's store client reconnecting): one unblock is not enough, so it is repeated,
    # and the TimeoutError comes once the call has ended, not while it still runs.
    attempts = []
    unblocked = threading.Event()
    ended = threading.Event()

    def retrying():
        for attempt in range(3):  # each attempt "connects" anew and blocks until unblocked
            attempts.append(attempt)
            unblocked.wait(30)
            unblocked.clear()
        ended.set()

    with pytest.raises(TimeoutError, match="store-connect took longer than 0.1 s"):
        background.call_with_timeout(retrying, 0.1, "store-connect", unblock=unblocked.set, grace=10)
    assert ended.is_set() and attempts == [0, 1, 2]


def test_the_grace_bounds_a_call_that_no_unblock_ends():
    release = threading.Event()
    calls = []
    with pytest.raises(TimeoutError):
        background.call_with_timeout(lambda: release.wait(30), 0.1, "stuck", unblock=lambda: calls.append(1),
                                     grace=0.3)
    release.set()
    assert 2 <= len(calls) <= 0.3 / background.UNBLOCK_EVERY + 1  # repeated, then given up at the grace


def test_a_started_function_runs_with_its_arguments():
    seen = []
    done = threading.Event()

    def record(first, second):
        seen.append((first, second, threading.current_thread() is not threading.main_thread()))
        done.set()

    background.start(record, "a", 2)
    assert done.wait(10)
    assert seen == [("a", 2, True)]


def test_ctrl_c_during_a_bounded_call_unblocks_it_before_the_interrupt_goes_on():
    # A KeyboardInterrupt out of the wait left the call (torch's store connect) running into the process's exit.
    unblocked = threading.Event()
    ended = threading.Event()

    def blocked():
        unblocked.wait(30)
        ended.set()

    timer = threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        background.call_with_timeout(blocked, 30, "store-connect", unblock=unblocked.set, grace=10)
    timer.join()
    assert ended.is_set()

"""Daemon threads that start without waiting for the scheduler, and calls bounded by one.

`threading.Thread.start()` blocks until the new thread has run its first instructions. On a node whose cores
are all busy (every rank of a job starting at once, data-loader workers, another job) that is milliseconds
per start, measured here at 2.7-4 ms with 4 busy processes on 2 cores against 40-150 µs for
`_thread.start_new_thread`, which returns at once. `init()` starts such threads on every rank before it
joins the store (the store watchdog, the bounded connect), where each millisecond delays the whole group.

The threads are daemons in effect: the interpreter does not wait for them at exit. They carry no
`threading.Thread` name.
"""

from __future__ import annotations

import _thread
import threading
import time
from typing import Any, Callable, Optional


def start(function: Callable[..., Any], *args: Any) -> None:
    """Run `function(*args)` in a new daemon thread; returns before that thread has been scheduled.
    `function` must handle its own exceptions (an escaping one is only printed)."""
    _thread.start_new_thread(function, args)


UNBLOCK_EVERY = 0.05  # seconds between two `unblock` calls of call_with_timeout


def call_with_timeout(function: Callable[[], Any], timeout: float, what: str, *,
                      unblock: Optional[Callable[[], Any]] = None, grace: float = 0.0) -> Any:
    """`function()` run in a daemon thread and waited for at most `timeout` seconds: for a call that has no
    timeout of its own (getaddrinfo, a read on a stalled file system, torch's store handshake). Its result, or
    its exception; `TimeoutError` naming `what` when it is still running (it is left to finish alone).
    `unblock`, called at the timeout, makes the call return (cuts its connection), and `grace` seconds are
    given it to: a thread that leaves C++ code (torch) after the interpreter began to exit aborts the process."""
    box: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = function()
        except BaseException as exc:  # handed back to the caller below
            box["error"] = exc
        finally:
            done.set()

    start(run)
    try:
        finished = done.wait(timeout)
    except BaseException:  # Ctrl-C (KeyboardInterrupt) during the wait: the process is on its way out too
        _unblock(done, unblock, grace)
        raise
    if not finished:
        _unblock(done, unblock, grace)
        raise TimeoutError(f"{what} took longer than {timeout:.1f} s")
    if "error" in box:
        raise box.pop("error")  # the box no longer holds it: its frames (this call's) and it are no cycle
    return box["value"]


def _unblock(done: threading.Event, unblock: Optional[Callable[[], Any]], grace: float) -> None:
    """Call `unblock` until the call it unblocks is `done`, for `grace` seconds at most: again and again, since a
    call that retries (torch's store client) opens a new connection each time."""
    end = time.monotonic() + grace
    while unblock is not None and not done.is_set() and time.monotonic() < end:
        unblock()
        done.wait(UNBLOCK_EVERY)

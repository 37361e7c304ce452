"""Hear Ctrl-C and SIGTERM while the main thread blocks inside torch.

Python runs a signal handler only between its own steps: a rank blocked in torch's store client (waiting for a
rank that never comes, for up to the whole init timeout) ignored Ctrl-C, and a SIGTERM handler that saves and
exits, until that wait ended. CPython's C-level handler also writes the signal's number to a wake-up
descriptor (`signal.set_wakeup_fd`) at once: `wakeup_pipe()` points it at a pipe whose other end a thread
reads (the store watchdog's), and `stopping()` tells which of the numbers read ask the process to stop, so that
the thread can cut the store connections: the blocked call then fails, and Python runs the handler.

Stopping signals are SIGINT, SIGTERM and SIGHUP, while Python has a handler for them (under the default action
the kernel ends the process anyway). A requeue warning (SIGUSR2) asks the job to go on, and is not one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator, Optional, Tuple

STOPPING = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


@contextlib.contextmanager
def wakeup_pipe() -> Iterator[Optional[Tuple[int, int]]]:
    """(read end, the wake-up descriptor it replaced, -1 for none) while the signal wake-up byte goes to a pipe;
    None where it cannot (not the main thread, which alone receives Python's signals). The reader closes the
    read end; on leaving, the previous descriptor is back and the write end is closed, so the reader sees the
    end of the pipe. A previous descriptor comes back with CPython's default `warn_on_full_buffer=True` (no
    call tells how it was set)."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # the C-level handler must never block on it
    previous: Optional[int] = None
    try:
        try:
            previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except (ValueError, OSError):  # an embedded interpreter without signal handling
            os.close(read_end)
            yield None
            return
        yield read_end, previous
    finally:
        if previous is not None:
            signal.set_wakeup_fd(previous)
        os.close(write_end)


def stopping(received: bytes, previous: int) -> Optional[signal.Signals]:
    """The stopping signal among the numbers `received` from the pipe, if any. They also go on to the wake-up
    descriptor the pipe replaced (an event loop's), which must still hear of every signal."""
    if previous != -1:
        with contextlib.suppress(OSError):
            os.write(previous, received)
    for number in received:
        if number in STOPPING and callable(signal.getsignal(number)):
            return signal.Signals(number)
    return None

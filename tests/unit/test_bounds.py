"""bounds: waits in slices no system call refuses."""

from __future__ import annotations

import os
import time

from slurmdist.bounds import MAX_SECONDS, readable_within


def test_a_wait_as_long_as_the_longest_timeout_allowed_works():
    # poll() takes at most 2**31-1 ms (24.8 days); a longer bound raised OverflowError, which ended the MPI_Init
    # watcher at once and left MPI_Init without its bound.
    reading, writing = os.pipe()
    try:
        os.close(writing)  # readable now: the writer is gone
        assert readable_within(reading, MAX_SECONDS)
        assert readable_within(reading, 30 * 24 * 3600)
    finally:
        os.close(reading)


def test_a_short_wait_ends_unanswered():
    reading, writing = os.pipe()
    try:
        started = time.monotonic()
        assert not readable_within(reading, 0.2)
        assert time.monotonic() - started >= 0.19
    finally:
        os.close(reading)
        os.close(writing)

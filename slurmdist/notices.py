"""Warnings shown once per process: detect() runs many times in one (init(), is_main(), every print0 and
rank-prefixed log line), and a warning about the launch is the same every time."""

from __future__ import annotations

import logging
from typing import Set

logger = logging.getLogger("slurmdist")

_shown: Set[str] = set()


def warn_once(message: str, where: str) -> None:
    """Log `message` at WARNING on slurmdist's logger the first time this process shows it. Not counted as
    shown while the logger drops it (disabled, above WARNING, or a log line asking for its rank: slurmdist.logs),
    so the first line that can show it does."""
    if message in _shown or not logger.isEnabledFor(logging.WARNING):
        return
    record = logger.makeRecord(logger.name, logging.WARNING, where, 0, message, (), None, func="detect")
    passed = logger.filter(record)  # run once: a filter may count what it lets through
    if passed and not logger.disabled:
        _shown.add(message)
        logger.callHandlers(passed if isinstance(passed, logging.LogRecord) else record)


def forget() -> None:
    """Show every warning again (tests that each expect to see one)."""
    _shown.clear()

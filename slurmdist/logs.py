"""Rank-aware printing and logging: the few lines every distributed script writes by hand.

The rank comes from `init()` when it ran, else from the launcher's variables (no torch import), so these
helpers work in a data-loading subprocess or before the group exists. They never raise on a strange
environment: a log line is not worth crashing a job for.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import sys
import threading
from typing import Any, Callable, FrozenSet, Mapping, MutableMapping, Optional, Tuple, Union

from . import process_group
from .envvars import is_whole, whole_number
from .errors import SlurmdistError

RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
SIZE_VARIABLES = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


# Set while this thread works out a rank for a log line. detect() logs itself (a warning in an salloc shell),
# and that record would come back here through a RankFilter, again and again (RecursionError), or repeat the
# warning before every line: slurmdist's own records are dropped meanwhile.
_looking_up = threading.local()


class _QuietWhileLookingUp(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_looking_up, "active", False)


_QUIET = _QuietWhileLookingUp()


def rank_and_size(environ: Optional[Mapping[str, str]] = None) -> Tuple[int, int]:
    """(rank, world size) of this process: from `init()`, else `detect()`, else the first rank variable."""
    if environ is None and process_group.is_initialized():
        env = process_group.get_env()
        return env.rank, env.world_size
    environ = os.environ if environ is None else environ
    if getattr(_looking_up, "active", False):  # a record logged by the lookup itself
        return _from_variables(environ)
    slurmdist_logger = logging.getLogger("slurmdist")
    if _QUIET not in slurmdist_logger.filters:
        slurmdist_logger.addFilter(_QUIET)
    _looking_up.active = True
    try:
        from .detection import detect

        env = detect(environ)
        return env.rank, env.world_size
    except (ImportError, SlurmdistError, ValueError):
        return _from_variables(environ)
    finally:
        _looking_up.active = False


def _from_variables(environ: Mapping[str, str]) -> Tuple[int, int]:
    return _first_number(environ, RANK_VARIABLES, 0), _first_number(environ, SIZE_VARIABLES, 1)


def _first_number(environ: Mapping[str, str], names: Tuple[str, ...], default: int) -> int:
    """The first of `names` that holds a whole number (what int() refuses is passed over), else `default`."""
    return next((n for n in (whole_number(environ.get(name, "")) for name in names) if n is not None), default)


def prefix(rank: int, world_size: int) -> str:
    return f"[rank {rank}/{world_size}]"


def print0(*args: Any, **kwargs: Any) -> None:
    """`print` on global rank 0 only (same arguments as `print`); `flush=True` unless told otherwise."""
    if rank_and_size()[0] == 0:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def level_number(value: Union[int, str], what: str = "others_level") -> int:
    """A logging level as `logging` itself takes one (`logging.WARNING`, 30 or "WARNING"), as its number.
    Checked when the filter or logger is made: compared at every record, a name would fail on the non-zero
    ranks only, at their first log line."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        number = logging.getLevelName(value.strip().upper())  # a registered name gives its number
        if isinstance(number, int):
            return number
    raise ValueError(f"{what}={value!r} is not a logging level: give one such as logging.WARNING, 30 or 'WARNING'")


def _check_override(name: str, value: Optional[int], minimum: int) -> None:
    """A rank or world size given to a filter in code: a whole number, or None for what the launch says."""
    if value is not None and not is_whole(value, minimum):
        raise ValueError(f"{name}={value!r} must be a whole number >= {minimum}, or None for what the launch says")


class RankFilter(logging.Filter):
    """Prefix records with `[rank R/W]` and, with `main_only=True`, drop non-zero ranks' records below
    `others_level` (warnings and errors from every rank still get through by default).

    Adds `record.rank`, `record.world_size` and `record.rank_prefix` for format strings. Attach it to a
    handler (`handler.addFilter(RankFilter())`); set `prefix_message=False` when the format uses
    `%(rank_prefix)s` itself. `rank` / `world_size` override what the launch says, each on its own.

    The prefix reaches only the handlers this filter is on from Python 3.12, where a filter may hand its
    handler a copy of the record. Before 3.12 the record itself is changed, so handlers that come after
    this one see the prefix too; there, prefer `%(rank_prefix)s` in the formats.
    """

    def __init__(
        self,
        *,
        main_only: bool = False,
        others_level: Union[int, str] = logging.WARNING,
        prefix_message: bool = True,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.main_only = main_only
        self.others_level = level_number(others_level)
        self.prefix_message = prefix_message
        _check_override("rank", rank, 0)
        _check_override("world_size", world_size, 1)
        if rank is not None and world_size is not None and rank >= world_size:
            raise ValueError(f"rank={rank} is not below world_size={world_size}: ranks count from 0 to world_size - 1")
        self._rank, self._world_size = rank, world_size

    # Returning a record is allowed from Python 3.12; typeshed types the older `filter` as returning bool.
    def filter(self, record: logging.LogRecord) -> Union[bool, logging.LogRecord]:  # type: ignore[override]
        rank, world_size = self._rank, self._world_size
        if rank is None or world_size is None:
            detected_rank, detected_size = rank_and_size()
            rank = detected_rank if rank is None else rank
            world_size = detected_size if world_size is None else world_size
        if self.main_only and rank != 0 and record.levelno < self.others_level:
            return False
        line_prefix = prefix(rank, world_size)
        record.rank, record.world_size, record.rank_prefix = rank, world_size, line_prefix
        if not self.prefix_message or getattr(record, "_slurmdist_prefixed", False):
            return True
        try:
            message = str(record.msg)  # what logging's getMessage() does, but here outside its error handling
        except Exception:  # left as logged: the handler reports it as a logging error, and the program goes on
            return True
        if sys.version_info >= (3, 12):  # this handler's own copy: other handlers keep the message as logged
            record = copy.copy(record)
        record.msg = f"{line_prefix} {message}"
        record._slurmdist_prefixed = True
        return record if sys.version_info >= (3, 12) else True


class RankAdapter(logging.LoggerAdapter):
    """A logger whose messages start with `[rank R/W]`; with `main_only`, non-zero ranks log only at
    `others_level` and above. Its records carry the fields a `RankFilter` adds; set `prefix_message=False`
    when the handlers' formats show `%(rank_prefix)s` already, or every line has the prefix twice."""

    def __init__(self, logger: logging.Logger, main_only: bool = False,
                 others_level: Union[int, str] = logging.WARNING, prefix_message: bool = True):
        super().__init__(logger, {})
        self.main_only = main_only
        self.others_level = level_number(others_level)
        self.prefix_message = prefix_message

    def isEnabledFor(self, level: int) -> bool:
        if self.main_only and level < self.others_level and rank_and_size()[0] != 0:
            return False
        return self.logger.isEnabledFor(level)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> Tuple[Any, MutableMapping[str, Any]]:
        rank, world_size = rank_and_size()
        line_prefix = prefix(rank, world_size)
        # The fields a RankFilter adds, for formats that name them, unless the caller's `extra` or the record
        # factory sets them already (logging refuses an `extra` key the record has); when the message carries
        # the prefix, marked as prefixed, so that a handler with a RankFilter does not prefix it again.
        given = dict(kwargs.get("extra") or {})
        taken = set(given) | _factory_fields()
        fields = {"rank": rank, "world_size": world_size, "rank_prefix": line_prefix}
        marked = {"_slurmdist_prefixed": True} if self.prefix_message else {}
        kwargs["extra"] = {**{k: v for k, v in fields.items() if k not in taken}, **given, **marked}
        return (f"{line_prefix} {msg}" if self.prefix_message else msg), kwargs


def _factory_fields() -> FrozenSet[str]:
    """The attributes the current log record factory sets (a custom one may add `rank` itself)."""
    factory = logging.getLogRecordFactory()
    try:
        return _fields_of(factory)
    except TypeError:  # an unhashable factory object: asked every time
        return _fields_of.__wrapped__(factory)


@functools.lru_cache(maxsize=8)
def _fields_of(factory: Callable[..., logging.LogRecord]) -> FrozenSet[str]:
    """Found once per factory, not by building a record for every log line."""
    return frozenset(vars(factory("slurmdist", logging.INFO, "", 0, "", (), None)))


def rank_logger(
    name: Optional[str] = None, *, main_only: bool = False, others_level: Union[int, str] = logging.WARNING,
    prefix_message: bool = True,
) -> RankAdapter:
    """`log = slurmdist.rank_logger(__name__, main_only=True)`: rank-prefixed, quiet on non-zero ranks."""
    return RankAdapter(logging.getLogger(name), main_only=main_only, others_level=others_level,
                       prefix_message=prefix_message)

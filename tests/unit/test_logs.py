"""print0 and the rank-aware logging filter/adapter, with the rank read from the launcher's variables."""

from __future__ import annotations

import logging
import os
import sys

import pytest

import slurmdist
from slurmdist.logs import RankFilter, rank_and_size, rank_logger


@pytest.fixture
def as_rank(monkeypatch):
    def set_rank(rank, world=4):
        for name in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_JOB_ID", "SLURM_STEP_ID"):
            monkeypatch.delenv(name, raising=False)
        for name, value in dict(RANK=rank, WORLD_SIZE=world, LOCAL_RANK=rank, LOCAL_WORLD_SIZE=world,
                                MASTER_ADDR="127.0.0.1", MASTER_PORT=29500).items():
            monkeypatch.setenv(name, str(value))
    return set_rank


def capture(handler_filter, emit):
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    handler.addFilter(handler_filter)
    logger = logging.getLogger("test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return [r.getMessage() for r in records]


def test_rank_from_environment(as_rank):
    as_rank(2, 8)
    assert rank_and_size() == (2, 8)
    assert rank_and_size({}) == (0, 1)
    # What int() refuses ('²', more than 4300 digits) is skipped, never raised from a log line.
    assert rank_and_size({"RANK": "\u00b2", "SLURM_PROCID": "7" * 5000, "PMI_RANK": "3"}) == (3, 1)


def test_print0_only_on_rank_0(as_rank, capsys):
    as_rank(1)
    slurmdist.print0("hidden")
    as_rank(0)
    slurmdist.print0("shown")
    assert capsys.readouterr().out == "shown\n"


def test_filter_prefixes_and_silences_other_ranks(as_rank):
    as_rank(3)
    emit = lambda log: (log.info("step %d", 5), log.warning("disk full"))  # noqa: E731
    assert capture(RankFilter(), emit) == ["[rank 3/4] step 5", "[rank 3/4] disk full"]
    assert capture(RankFilter(main_only=True), emit) == ["[rank 3/4] disk full"]
    as_rank(0)
    assert capture(RankFilter(main_only=True), emit) == ["[rank 0/4] step 5", "[rank 0/4] disk full"]


@pytest.mark.parametrize("level", ["ERROR", "error", logging.ERROR, 40])
def test_the_level_other_ranks_keep_may_be_named_as_logging_names_it(as_rank, level, caplog):
    as_rank(2)
    emit = lambda log: (log.warning("disk full"), log.error("gone"))  # noqa: E731
    assert capture(RankFilter(main_only=True, others_level=level), emit) == ["[rank 2/4] gone"]
    log = rank_logger("test_logs.named", main_only=True, others_level=level)
    with caplog.at_level(logging.DEBUG, logger="test_logs.named"):
        emit(log)
    assert [r.getMessage() for r in caplog.records if r.name == "test_logs.named"] == ["[rank 2/4] gone"]


@pytest.mark.parametrize("level", ["LOUD", "", None, 2.5, True])
def test_a_level_logging_does_not_know_is_refused_when_made_not_at_a_log_line(as_rank, level):
    as_rank(0)  # rank 0 never compares the level: the mistake must not wait for the other ranks to show
    for make in (lambda: RankFilter(main_only=True, others_level=level),
                 lambda: rank_logger("test_logs.bad", main_only=True, others_level=level)):
        with pytest.raises(ValueError, match=f"others_level={level!r} is not a logging level"):
            make()


def test_filter_prefixes_once_with_two_handlers():
    records = []
    fixed = RankFilter(rank=1, world_size=2)
    logger = logging.getLogger("test_logs.twice")
    handlers = [logging.Handler(), logging.Handler()]
    for handler in handlers:
        handler.emit = records.append
        handler.addFilter(fixed)
        logger.addHandler(handler)
    logger.warning("x")
    for handler in handlers:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == ["[rank 1/2] x", "[rank 1/2] x"]
    assert records[0].rank_prefix == "[rank 1/2]"


def test_a_message_that_cannot_be_shown_is_a_logging_error_not_a_crash(capsys):
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no str")

    logger = logging.getLogger("test_logs.unprintable")
    logger.propagate = False  # pytest's own capture handler raises logging errors instead of reporting them
    handler = logging.StreamHandler()  # writes to the stderr capsys captures; reports errors there too
    handler.addFilter(RankFilter(rank=0, world_size=2))
    logger.addHandler(handler)
    try:
        logger.warning(Unprintable())  # as without the filter: reported by logging, and the program goes on
        logger.warning("after")
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert "--- Logging error ---" in err and "RuntimeError: no str" in err
    assert err.endswith("[rank 0/2] after\n")


def test_a_fixed_rank_alone_overrides_only_the_rank(as_rank):
    as_rank(0, 4)
    assert capture(RankFilter(rank=3), lambda log: log.warning("x")) == ["[rank 3/4] x"]
    assert capture(RankFilter(world_size=16), lambda log: log.warning("x")) == ["[rank 0/16] x"]
    assert capture(RankFilter(rank=3, main_only=True), lambda log: log.info("x")) == []  # judged as rank 3


def test_the_prefix_stays_on_the_filtered_handler_where_python_allows_it():
    seen = {"filtered": [], "plain": []}
    logger = logging.getLogger("test_logs.leak")
    handlers = {name: logging.Handler() for name in seen}
    for name, handler in handlers.items():
        handler.emit = lambda record, name=name: seen[name].append(record.getMessage())
        logger.addHandler(handler)
    handlers["filtered"].addFilter(RankFilter(rank=1, world_size=2))
    try:
        logger.warning("x")
    finally:
        for handler in handlers.values():
            logger.removeHandler(handler)
    assert seen["filtered"] == ["[rank 1/2] x"]
    # Python 3.12+ hands the filtered handler a copy; before, the record itself carries the prefix on.
    assert seen["plain"] == (["x"] if sys.version_info >= (3, 12) else ["[rank 1/2] x"])


def test_rank_logger(as_rank, caplog):
    as_rank(1)
    log = rank_logger("test_logs.adapter", main_only=True)
    with caplog.at_level(logging.DEBUG, logger="test_logs.adapter"):
        log.info("quiet")
        log.error("loud")
    assert [r.getMessage() for r in caplog.records] == ["[rank 1/4] loud"]


def test_rank_logger_through_a_rank_filtered_handler_is_prefixed_once(as_rank):
    as_rank(2)
    adapter = lambda log: rank_logger(log.name).info("epoch %d", 1, extra={"epoch": 1})  # noqa: E731
    assert capture(RankFilter(), adapter) == ["[rank 2/4] epoch 1"]


def test_a_rank_logger_that_does_not_prefix_leaves_it_to_a_rank_filtered_handler(as_rank):
    # prefix_message=False (for handlers whose format shows %(rank_prefix)s) marked its records as prefixed,
    # so a handler with a plain RankFilter() printed them with no prefix at all.
    as_rank(3)
    adapter = lambda log: rank_logger(log.name, prefix_message=False).info("x")  # noqa: E731
    assert capture(RankFilter(), adapter) == ["[rank 3/4] x"]


def test_rank_logger_leaves_the_records_own_rank_fields_alone(as_rank):
    # A record factory that adds `rank` (a common pattern), or a caller's extra={"rank": ...}: logging refuses
    # an extra key the record already has, so the adapter must not pass one.
    as_rank(1)
    previous = logging.getLogRecordFactory()

    def with_rank(*args, **kwargs):
        record = previous(*args, **kwargs)
        record.rank = "from the factory"
        return record

    logging.setLogRecordFactory(with_rank)
    try:
        assert capture(RankFilter(prefix_message=False), lambda log: rank_logger(log.name).info("x")) == ["[rank 1/4] x"]
    finally:
        logging.setLogRecordFactory(previous)
    records = []
    logger = logging.getLogger("test_logs.own_rank")
    logger.addHandler(handler := logging.Handler())
    handler.emit = records.append
    try:
        rank_logger(logger.name).warning("y", extra={"rank": "the caller's"})
    finally:
        logger.removeHandler(handler)
    assert (records[0].rank, records[0].world_size, records[0].getMessage()) == ("the caller's", 4, "[rank 1/4] y")


@pytest.mark.parametrize("prefix_message, line", [
    (True, "[rank 1/4]|rank=1 [rank 1/4] hello"),
    (False, "[rank 1/4]|rank=1 hello"),  # the format shows the prefix: once, not twice
])
def test_rank_logger_records_carry_the_rank_fields_for_formats_without_a_filter(as_rank, prefix_message, line):
    as_rank(1)
    records = []
    logger = logging.getLogger("test_logs.fields")
    logger.addHandler(handler := logging.Handler())
    handler.emit = records.append
    handler.setFormatter(logging.Formatter("%(rank_prefix)s|rank=%(rank)s %(message)s"))
    try:
        rank_logger(logger.name, prefix_message=prefix_message).warning("hello")
    finally:
        logger.removeHandler(handler)
    assert handler.format(records[0]) == line


@pytest.fixture
def in_salloc_shell(case, monkeypatch):
    """A captured salloc shell: detect() warns there (not in an srun step), through slurmdist's logger."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI", "RANK", "WORLD_SIZE", "LOCAL_", "TORCHELASTIC")):
            monkeypatch.delenv(name)
    for name, value in case("slurm/salloc_N2_tpn2_shell")[0].items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("level", [logging.WARNING, logging.DEBUG])
def test_a_rank_filter_on_the_root_handler_survives_detects_own_records(in_salloc_shell, level):
    # detect() logs to "slurmdist", whose records reach the root handler, whose RankFilter asked detect()
    # again: a RecursionError out of the user's own log call.
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    handler.addFilter(RankFilter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        logging.getLogger("train").warning("epoch done")
        logging.getLogger("train").warning("saved")
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    assert [r.getMessage() for r in records] == ["[rank 0/1] epoch done", "[rank 0/1] saved"]


def test_helpers_do_not_repeat_detects_warning_before_every_line(in_salloc_shell, capsys, caplog):
    caplog.set_level(logging.WARNING)
    log = rank_logger("train")
    log.warning("one")
    log.warning("two")
    slurmdist.print0("three")
    assert [r.getMessage() for r in caplog.records] == ["[rank 0/1] one", "[rank 0/1] two"]
    assert capsys.readouterr().out == "three\n"
    slurmdist.detect()  # asked directly, detect() still says it
    assert "not in an srun step" in caplog.records[-1].getMessage()


@pytest.mark.parametrize("overrides, message", [
    ({"rank": "x"}, "rank='x' must be a whole number >= 0"),
    ({"rank": -1}, "rank=-1 must be a whole number >= 0"),
    ({"world_size": 0}, "world_size=0 must be a whole number >= 1"),
    ({"rank": 5, "world_size": 2}, "rank=5 is not below world_size=2"),
])
def test_a_rank_or_size_given_in_code_is_checked_when_the_filter_is_made(overrides, message):
    # The environment may be strange (never an error for a log line); a value written in code is a mistake.
    with pytest.raises(ValueError, match=message):
        RankFilter(**overrides)

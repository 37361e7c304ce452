"""print0 and the rank-aware logging filter/adapter, with the rank read from the launcher's variables."""

from __future__ import annotations

import logging
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

"""Finding gloo's worker threads and telling when they are idle, over task directories laid out as Linux's
/proc/self/task (the real threads are checked in tests/integration/test_lifecycle.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from slurmdist.gloo_workers import WORKER_NAME, idle, wait_until_idle, workers
from slurmdist.procfs import stat_fields

# A real stat line's head (pid, name in parentheses, state, ...), with a name that holds ") " itself.
STAT = "4242 ({name}) {state} 1 4242 4242 0 -1 4194368 0 0 0 0 3 1 0 0 20 0 6 0\n"


def thread(tasks: Path, tid: int, name: str = WORKER_NAME, state: str = "S", ran: str = "1000 20 3") -> None:
    directory = tasks / str(tid)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "comm").write_text(name + "\n")
    (directory / "stat").write_text(STAT.format(name=name, state=state))
    (directory / "schedstat").write_text(ran + "\n")


def test_the_state_is_read_after_the_name_whatever_the_name_holds():
    assert stat_fields(STAT.format(name="odd) R (name", state="S"))[0] == "S"
    assert stat_fields(STAT.format(name=WORKER_NAME, state="R"))[0] == "R"
    assert stat_fields("no name in parentheses") == []  # read as no thread, not as a state


def test_only_gloo_workers_are_found_with_their_state_and_run_counters(tmp_path):
    thread(tmp_path, 10)
    thread(tmp_path, 11, name="python", state="R")
    thread(tmp_path, 12, state="R", ran="5 6 7")
    (tmp_path / "13").mkdir()  # a thread that ended between the listing and the reads
    (tmp_path / "13" / "comm").write_text(WORKER_NAME)
    assert workers(str(tmp_path)) == {"10": ("S", "1000 20 3\n"), "12": ("R", "5 6 7\n")}


def test_no_task_directory_means_no_workers(tmp_path):
    assert workers(str(tmp_path / "absent")) == {}


def test_idle_means_asleep_in_both_looks_and_not_run_between():
    asleep = {"10": ("S", "1000 20 3\n")}
    assert idle(asleep, dict(asleep))
    assert not idle(asleep, {"10": ("S", "1200 20 4\n")})  # woke (for the GIL, say) and ran meanwhile
    assert not idle({"10": ("R", "1000 20 3\n")}, {"10": ("R", "1000 20 3\n")})  # waiting for a core
    assert not idle(asleep, {**asleep, "11": ("S", "1 1 1\n")})  # a worker that was not there before


def test_waiting_returns_at_once_without_workers(tmp_path):
    thread(tmp_path, 11, name="python", state="R")
    started = time.monotonic()
    assert wait_until_idle(str(tmp_path), bound=30.0)
    assert time.monotonic() - started < 10.0  # a bound on a hang, not a timing assertion


def test_waiting_ends_once_a_busy_worker_has_gone_to_sleep(tmp_path):
    thread(tmp_path, 10, state="R")
    asleep = threading.Event()

    def finish() -> None:
        time.sleep(0.05)
        asleep.set()  # before the write: a wait that saw the worker asleep finds this set
        thread(tmp_path, 10, state="S", ran="9000 30 9")

    finisher = threading.Thread(target=finish)
    finisher.start()
    assert wait_until_idle(str(tmp_path), bound=30.0)
    assert asleep.is_set()  # it returned after the worker went to sleep, not before
    finisher.join()


def test_a_worker_busy_past_the_bound_is_left_running(tmp_path):
    thread(tmp_path, 10, state="R")
    assert not wait_until_idle(str(tmp_path), bound=0.05, pause=0.001)

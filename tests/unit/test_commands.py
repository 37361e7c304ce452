"""slurmdist.commands.run: short external commands whose bound holds after the kill too."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from slurmdist import commands


def test_output_and_exit_status_of_a_real_command() -> None:
    done = commands.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_the_environment_given_is_the_childs_whole_environment() -> None:
    done = commands.run(["sh", "-c", 'echo "$ONLY_THIS"; echo "${HOME:-no home}"'], timeout=10,
                        env={"ONLY_THIS": "seen", "PATH": os.environ["PATH"]})
    assert done.stdout.splitlines() == ["seen", "no home"]


def test_the_child_reads_no_stdin() -> None:
    assert commands.run(["sh", "-c", "cat; echo end"], timeout=10).stdout == "end\n"


def test_a_missing_command_raises_oserror() -> None:
    with pytest.raises(FileNotFoundError):
        commands.run(["slurmdist-no-such-command"], timeout=10)


def test_an_overrunning_command_is_killed_and_reaped() -> None:
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        commands.run(["sleep", "30"], timeout=0.3)
    assert caught.value.cmd == ["sleep", "30"]
    assert not _sleepers_of_this_test("30")


def test_a_grandchild_holding_the_output_open_does_not_hold_the_caller(tmp_path) -> None:
    """The killed child's pipes stay open in its background grandchild: the wait for them is bounded too."""
    pid_file = tmp_path / "grandchild"
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            commands.run(["sh", "-c", f'sleep 20 & echo $! > "{pid_file}"; exec sleep 20'], timeout=0.5)
        assert pid_file.exists(), "the grandchild never started: the test proved nothing"
        # Still alive, so still holding the pipes: run() came back without waiting for them to close.
        os.kill(int(pid_file.read_text()), 0)
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_child_that_outlives_its_kill_is_left_behind(monkeypatch) -> None:
    """A child in uninterruptible sleep (a hung NFS mount) survives SIGKILL; no test can put one there, so the
    kill is made to miss. subprocess.run would wait for that child without end."""
    started = []
    real_popen = subprocess.Popen

    class Unkillable(real_popen):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

        def kill(self) -> None:
            pass

    monkeypatch.setattr(subprocess, "Popen", Unkillable)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            commands.run(["sleep", "20"], timeout=0.3)
        assert started[0].poll() is None, "the child was gone: the bound after the kill was not exercised"
    finally:
        for proc in started:
            real_popen.kill(proc)
            proc.wait(timeout=10)


def _sleepers_of_this_test(seconds: str) -> bool:
    """Whether a child `sleep SECONDS` of this process is still alive (a zombie counts as reaped-to-be)."""
    time.sleep(0.05)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
        except OSError:
            continue
        state, parent = fields[0], int(fields[1])
        if parent == os.getpid() and argv[:2] == [b"sleep", seconds.encode()] and state != "Z":
            return True
    return False

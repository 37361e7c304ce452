"""When `slurmdist run` hosts the rendezvous store: a pure decision over the detected launch and environment."""

from __future__ import annotations

import pytest

from slurmdist import detect
from slurmdist.rendezvous import AGENT_STORE_VARIABLE
from slurmdist.store_host import wanted
from tests.conftest import load_case, missing_prerequisite


@pytest.mark.parametrize("case, index, extra, expected", [
    ("slurm/srun_N2_tpn2", 0, {}, True),  # rank 0 hosts, the other ranks are told to join
    ("slurm/srun_N2_tpn2", 3, {}, True),
    ("slurm/srun_N2_tpn2", 0, {AGENT_STORE_VARIABLE: "True"}, False),  # an agent (torchrun's) serves one
    ("slurm/srun_N2_tpn2", 0, {AGENT_STORE_VARIABLE: "False"}, True),
])
def test_every_rank_of_a_launch_decides_alike(case, index, extra, expected):
    environ = {**load_case(case)[index], **extra}
    assert wanted(detect(environ), environ) is expected


def test_one_process_needs_no_store():
    assert wanted(detect({}), {}) is False


@pytest.mark.parametrize("shell", ["/bin/sh", "/nonexistent/sh"])  # the second: no shell, as in a distroless image
def test_the_store_host_is_started_as_nobodys_child_here_and_keeps_the_fds_it_is_given(shell, monkeypatch):
    import os
    import select
    import sys

    from slurmdist import store_host
    from slurmdist.store_host import _spawn_detached

    monkeypatch.setattr(store_host, "DETACH_SHELL", (shell, *store_host.DETACH_SHELL[1:]))
    reading, writing = os.pipe()
    try:
        report = f"import os; os.write({writing}, f'{{os.getpid()}} {{os.getppid()}}'.encode())"
        _spawn_detached([sys.executable, "-c", report], [writing])
        assert select.select([reading], [], [], 30)[0], "the spawned process never wrote to the fd it was given"
        pid, parent = map(int, os.read(reading, 100).split())
    finally:
        os.close(reading)
        os.close(writing)
    assert parent != os.getpid()  # reparented: a command exec'd here never waits for it
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_the_watch_on_the_command_takes_a_descriptor_numbered_above_1023():
    # A `slurmdist run` that inherited many open descriptors: select() cannot take one numbered 1024 or above.
    import os
    import resource
    import subprocess
    import sys
    import threading

    from slurmdist.store_host import wait_for_exit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        missing_prerequisite(f"open descriptors are limited to {hard} here; the test needs 2048")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    command = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    pidfd = os.pidfd_open(command.pid)
    high = os.dup2(pidfd, 1500)
    try:
        waiting = threading.Thread(target=wait_for_exit, args=(f"pidfd:{high}",), daemon=True)
        waiting.start()
        waiting.join(0.3)
        assert waiting.is_alive()  # the command still runs
        command.stdin.close()
        command.wait(timeout=30)
        waiting.join(30)
        assert not waiting.is_alive(), "the command exited but the watch did not notice"
    finally:
        os.close(high)
        os.close(pidfd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

"""`slurmdist run` hosts the rendezvous store on rank 0 before the command starts (torchrun's agent store)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from tests.integration.workers.launch import (
    ALLREDUCE, PYTHON, check_allreduce, finish, free_port, rank_environ, run,
)

pytestmark = pytest.mark.integration

# The command, started by `slurmdist run`: reports what it was told, then uses the store it was told to join
# after signalling its children (the store host among them) the way Slurm signals a whole task.
PROBE = r"""
import json, os, signal, socket, sys
from datetime import timedelta
import torch.distributed as dist
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
children = [int(pid) for task in os.listdir("/proc/self/task")
            for pid in open(f"/proc/self/task/{task}/children").read().split()]
for pid in children:
    for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
        os.kill(pid, sig)
report = {"agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"), "children": children}
try:
    store = dist.TCPStore(addr, port, None, False, timedelta(seconds=20))
    store.set("probe", "ok")
    report["store"] = store.get("probe").decode()
except Exception as exc:
    report["store"] = f"error: {exc}"
print(json.dumps(report), flush=True)
"""


def slurmdist_run(environ: dict, *command: str, options=(), timeout: float = 60) -> subprocess.CompletedProcess:
    return run([PYTHON, "-m", "slurmdist", "run", *options, "--", *command], environ, timeout=timeout)


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def wait_closed(port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while listening(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_rank_0_serves_a_store_that_outlives_signals_and_ends_with_the_command():
    port = free_port()
    result = slurmdist_run(rank_environ(0, 2, port), PYTHON, "-c", PROBE)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["agent_store"] == "True"
    assert len(report["children"]) == 1  # the store host, and nothing else
    assert report["store"] == "ok"  # still serving after SIGUSR2, SIGTERM and SIGINT
    assert wait_closed(port), f"the store host still listens on {port} after the command exited"


def test_other_ranks_only_join():
    port = free_port()
    result = slurmdist_run(rank_environ(1, 2, port), PYTHON, "-c", "import os; print(os.environ.get("
                           "'TORCHELASTIC_USE_AGENT_STORE'), os.getpid())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "True"
    assert not listening(port)


@pytest.mark.parametrize("options, environ", [
    (["--no-store"], {}),
    ([], {"TORCHELASTIC_USE_AGENT_STORE": "True"}),  # under torchrun, whose agent already serves one
])
def test_no_store_is_hosted_when_asked_not_to_or_when_an_agent_serves_one(options, environ):
    port = free_port()
    code = ("import os, socket, json; s = socket.socket(); "
            f"print(json.dumps([os.environ.get('TORCHELASTIC_USE_AGENT_STORE'), s.connect_ex(('127.0.0.1', {port}))]))")
    result = slurmdist_run(rank_environ(0, 2, port, **environ), PYTHON, "-c", code, options=options)
    assert result.returncode == 0, result.stderr
    agent, connect_error = json.loads(result.stdout)
    assert agent == environ.get("TORCHELASTIC_USE_AGENT_STORE")
    assert connect_error != 0  # nothing listens: rank 0's own init_process_group will host the store


def test_a_busy_master_port_fails_at_once_naming_it():
    with socket.create_server(("", 0)) as holder:
        port = holder.getsockname()[1]
        started = time.monotonic()
        result = slurmdist_run(rank_environ(0, 2, port), PYTHON, "-c", "print('must not run')")
    assert result.returncode == 2
    assert f"port {port}" in result.stderr and "MASTER_PORT" in result.stderr
    assert "Traceback" not in result.stderr and "must not run" not in result.stdout
    assert time.monotonic() - started < 30  # a bound on a hang, not a timing claim


@pytest.mark.parametrize("mode", ["plain", "slurmdist"])
def test_torchrun_style_and_slurmdist_scripts_meet_at_the_hosted_store(mode):
    # Rank 0 starts last: with torch's own env:// start the others would wait in its connect back-off.
    port = free_port()
    procs = [
        subprocess.Popen([PYTHON, "-m", "slurmdist", "run", "--", PYTHON, str(ALLREDUCE), mode],
                         env=rank_environ(rank, 4, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in (3, 2, 1, 0)
    ]
    results = finish(procs)
    for result in results:
        assert result.returncode == 0, result.stderr
    check_allreduce("".join(r.stdout for r in results), 4, launcher="plain" if mode == "plain" else "torchrun")
    assert wait_closed(port)


def test_the_store_host_reports_why_it_cannot_serve():
    # An inherited descriptor that is not a listening socket: the host says so on stderr and exits non-zero.
    result = subprocess.run([sys.executable, "-m", "slurmdist.store_host", "0", "1", "2", "1"],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "rendezvous store on port 1 could not be served" in result.stderr

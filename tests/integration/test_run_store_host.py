"""`slurmdist run` hosts the rendezvous store on rank 0 before the command starts (torchrun's agent store)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Tuple

import pytest

from tests.integration.workers.launch import (
    ALLREDUCE, PYTHON, check_allreduce, finish, free_port, rank_environ, run,
)

pytestmark = pytest.mark.integration

# The command, started by `slurmdist run`: reports what it was told, then uses the store it was told to join
# after signalling the store host the way Slurm signals every process of a task.
PROBE = r"""
import json, os, signal, socket, sys
from datetime import timedelta
import torch.distributed as dist
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
children = [int(pid) for task in os.listdir("/proc/self/task")
            for pid in open(f"/proc/self/task/{task}/children").read().split()]
def argv(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().split(b"\0")
    except OSError:  # it ended between the listing and the read
        return []
hosts = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and argv(pid)[1:5:3] == [b"-m", str(port).encode()]]
for pid in hosts:
    for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
        os.kill(pid, sig)
report = {"agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"), "children": children, "hosts": hosts,
          "elastic": dist.is_torchelastic_launched(), "run_id": os.environ.get("TORCHELASTIC_RUN_ID")}
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


PROBE_REPORT_TO_STDERR = PROBE.replace("print(json.dumps(report), flush=True)",
                                       "print(json.dumps(report), file=sys.stderr, flush=True)")


@pytest.mark.parametrize("closed", ["0<&-", "1>&-", "0<&- 1>&-"])
def test_rank_0_serves_the_store_when_the_task_starts_with_stdin_or_stdout_closed(closed):
    # The listening socket then gets fd 0 or 1, which the store host's detach step points at /dev/null.
    port = free_port()
    report = PROBE_REPORT_TO_STDERR if "1>&-" in closed else PROBE
    result = run(["/bin/sh", "-c", f'exec "$@" {closed}', "sh", PYTHON, "-m", "slurmdist", "run", "--", PYTHON, "-c",
                  report], rank_environ(0, 2, port))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout or result.stderr.splitlines()[-1])["store"] == "ok", result.stderr


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
    # A script that starts its group only under torchrun (is_torchelastic_launched()) trained alone per rank.
    assert report["elastic"] is True and report["run_id"] == f"slurmdist-nojob-{port}"
    assert len(report["hosts"]) == 1  # one store host for this port
    assert report["children"] == []  # and not the command's child: its os.wait() must not wait for it
    assert report["store"] == "ok"  # still serving after SIGUSR2, SIGTERM and SIGINT
    assert wait_closed(port), f"the store host still listens on {port} after the command exited"


def test_other_ranks_only_join_once_rank_0_listens():
    with socket.create_server(("127.0.0.1", 0)) as rank_0:  # stands in for rank 0's store host
        port = rank_0.getsockname()[1]
        code = ("import os, socket; s = socket.socket(); "
                f"print(os.environ.get('TORCHELASTIC_USE_AGENT_STORE'), s.connect_ex(('127.0.0.1', {port})))")
        result = slurmdist_run(rank_environ(1, 2, port), PYTHON, "-c", code)
    assert result.returncode == 0, result.stderr
    agent, connect_error = result.stdout.split()
    assert agent == "True" and connect_error == "0"  # the listener it connects to is rank 0's, not its own


def test_other_ranks_give_up_when_rank_0_never_listens():
    port = free_port()
    started = time.monotonic()
    result = slurmdist_run(rank_environ(1, 2, port, SLURMDIST_INIT_TIMEOUT="3"), PYTHON, "-c", "print('must not run')")
    waited = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert f"rank 1: nothing listens at the rendezvous store 127.0.0.1:{port} after 3 s" in result.stderr
    assert "Traceback" not in result.stderr and "must not run" not in result.stdout
    assert "raise SLURMDIST_INIT_TIMEOUT" in result.stderr
    # `srun slurmdist run -- hostname`: rank 0's command may be over before a later rank looks for its store.
    assert "its command already ended" in result.stderr and "use `slurmdist run --no-store`" in result.stderr
    assert 3 <= waited < 30  # it waited for the bound, and not for torch's 30 minutes


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


# Makes the store host's `import torch` take 30 s (a cold file system), and nothing else.
SLOW_TORCH_IMPORT = """
import sys, time
class SlowTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            time.sleep(30)
        return None
if b"slurmdist.store_host" in open("/proc/self/cmdline", "rb").read():
    sys.meta_path.insert(0, SlowTorch())
"""


def test_a_missing_command_on_rank_0_fails_before_it_serves_a_store():
    # Started after rank 0 listened, the other ranks' commands joined a store no rank 0 would use, and waited
    # for torch's 30 minutes. The command is looked up first: here rank 0 names it, not the port held below.
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        result = slurmdist_run(rank_environ(0, 2, port), "no-such-command-here", options=("--timeout", "5"))
        missing_path = slurmdist_run(rank_environ(0, 2, port), "/no/such/train.sh", options=("--timeout", "5"))
    assert result.returncode == 127, result.stderr
    assert "command not found: 'no-such-command-here': not on the task's PATH" in result.stderr
    assert "cannot listen" not in result.stderr
    assert missing_path.returncode == 127 and "'/no/such/train.sh': no such file (on " in missing_path.stderr


def test_a_command_that_ends_at_once_frees_the_port_without_waiting_for_torch(tmp_path):
    # `slurmdist run -- true` on rank 0: the store host is still importing torch when the command is gone.
    (tmp_path / "sitecustomize.py").write_text(SLOW_TORCH_IMPORT)
    port = free_port()
    with open(tmp_path / "stderr", "w") as stderr:  # not a pipe: the store host inherits it
        returncode = subprocess.run([PYTHON, "-m", "slurmdist", "run", "--", "true"], stderr=stderr,
                                    env=rank_environ(0, 2, port, PYTHONPATH=str(tmp_path)), timeout=60).returncode
    assert returncode == 0, (tmp_path / "stderr").read_text()
    assert wait_closed(port, timeout=15), "the store host kept the port while it imported torch"


def test_a_command_that_waits_for_all_its_children_is_not_kept_waiting_by_the_store_host():
    code = """
import os, subprocess
worker = subprocess.Popen(["true"])
reaped = []
while True:
    try:
        reaped.append(os.wait()[0])
    except ChildProcessError:
        break
print(reaped == [worker.pid])
"""
    result = slurmdist_run(rank_environ(0, 2, free_port()), PYTHON, "-c", code, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr


def test_the_command_gets_sigpipe_and_sigxfsz_back():
    # Python ignores both for itself; a shell pipeline such as `yes | head -1` must end as it does outside.
    result = slurmdist_run(rank_environ(0, 1, free_port()), "bash", "-c",
                           "yes | head -n 1 >/dev/null; grep SigIgn /proc/self/status")
    assert result.returncode == 0, result.stderr
    ignored = int(result.stdout.split()[-1], 16)
    assert not ignored & (1 << (13 - 1)) and not ignored & (1 << (25 - 1))  # SIGPIPE 13, SIGXFSZ 25


def store_host(*bounds: str) -> Tuple[subprocess.Popen, int]:
    """The store host for a command that is this test process, with its bounds as argv, and its port. The
    listener is the host's alone: a copy left open here would take connections the host gave up on, where
    torch's client waits without bound."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        os.set_inheritable(listener.fileno(), True)
        host = subprocess.Popen(
            [sys.executable, "-m", "slurmdist.store_host", str(listener.fileno()), str(port), "2",
             f"pid:{os.getpid()}", *bounds], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, close_fds=False)
    return host, port


def test_a_store_host_stuck_importing_torch_closes_the_port_and_says_so():
    # Connections wait in the listener's backlog until the host serves, and torch's client waits there without
    # bound: a host stuck before serving (importing torch on a stalled file system) must give the port up.
    host, port = store_host("60", "0.01")  # an import bound far less than importing torch takes
    try:
        _, err = host.communicate(timeout=60)
    finally:
        host.kill()
    assert host.returncode == 1
    assert f"store host for port {port} was still importing torch after 0 s" in err, err


def test_the_rendezvous_timeout_does_not_count_the_store_hosts_torch_import():
    # SLURMDIST_INIT_TIMEOUT=3 on a busy node: the import alone took longer, the host closed the port of a
    # healthy job, and its ranks sat in torch's client for 30 minutes. init() does not count imports either.
    import torch.distributed as dist
    from datetime import timedelta

    host, port = store_host("0.01")  # a rendezvous bound far less than importing torch takes
    try:
        store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))
        store.set("key", "served")
        assert store.get("key") == b"served"
        assert host.poll() is None
    finally:
        host.kill()
        host.communicate(timeout=30)


def test_the_store_host_reports_why_it_cannot_serve():
    # An inherited descriptor that is not a listening socket: the host says so on stderr and exits non-zero.
    result = subprocess.run([sys.executable, "-m", "slurmdist.store_host", "0", "1", "2", f"pid:{os.getpid()}"],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "rendezvous store on port 1 could not be served" in result.stderr


def test_under_torchrun_the_command_keeps_torchruns_run_id():
    port = free_port()
    environ = rank_environ(0, 1, port, TORCHELASTIC_RUN_ID="torchruns-own", TORCHELASTIC_USE_AGENT_STORE="True")
    result = slurmdist_run(environ, PYTHON, "-c", "import os; print(os.environ['TORCHELASTIC_RUN_ID'])")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "torchruns-own"

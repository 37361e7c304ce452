"""Every way init() can fail ends every present rank, non-zero, with a message that says what to do."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

from slurmdist.process_group import watchdog_grace
from tests.conftest import missing_prerequisite, require_module, unresolved
from tests.integration.workers.launch import (
    ALLREDUCE, PYTHON, RUN_TIMEOUT, clean_environ, finish, free_port, rank_environ, run, start_ranks, tool,
)
from tests.integration.workers.store_probe import wait_until_checked_in

pytestmark = pytest.mark.integration


def test_missing_rank_is_named_by_every_present_rank():
    port = free_port()
    results = finish(start_ranks([0, 1, 2], 4, port, SLURMDIST_INIT_TIMEOUT="10"))
    for result in results:
        assert result.returncode != 0
        assert "RendezvousError" in result.stderr
        assert "rank(s) 3 never arrived" in result.stderr
        # At the timeout: looking for ranks of this node that left (an absent one's key is not waited for).
        assert re.search(r"failed after 1[01] s \(timeout 10 s\)", result.stderr), result.stderr
        assert f"127.0.0.1:{port}" in result.stderr
        assert "world size 4" in result.stderr


LATE_RANK_0 = """
import time, slurmdist
time.sleep({delay})
for attempt in range({attempts}):  # a retry is not late: it counts from the first attempt
    try:
        slurmdist.init()
    except slurmdist.RendezvousError as error:
        print(error, flush=True)
"""


def test_a_rank_0_that_came_later_than_the_others_wait_says_so():
    # Rank 0 loading a dataset before init(): the others came, waited their timeout for its store and gave up,
    # and rank 0 then said only that they never arrived. Here they are absent; its own lateness is the clue.
    port = free_port()
    late = run([PYTHON, "-c", LATE_RANK_0.format(delay=14, attempts=1)],
               rank_environ(0, 2, port, SLURMDIST_INIT_TIMEOUT="2"))
    assert "rank(s) 1 never arrived" in late.stdout, late.stdout + late.stderr
    said = re.search(r"this rank entered the rendezvous (\d+) s after its process started, later than the 2 s",
                     late.stdout)
    assert said and int(said[1]) >= 14, late.stdout  # its 14 s of set-up, plus imports (longer on a busy machine)
    prompt = run([PYTHON, "-c", LATE_RANK_0.format(delay=0, attempts=2)],
                 rank_environ(0, 2, port, SLURMDIST_INIT_TIMEOUT="3"))
    assert prompt.stdout.count("rank(s) 1 never arrived") == 2, prompt.stdout + prompt.stderr
    assert "entered the rendezvous" not in prompt.stdout


def test_a_whole_missing_node_is_named_by_the_master_nodes_ranks():
    # Ranks 0-1 on the master's node, ranks 2-3 on a node that never starts: the master's node waits for a rank
    # of the other node to say at which address it reached the master (gloo binds the interface towards it),
    # and that wait ends at the init timeout with the missing ranks named, like any other.
    port = free_port()
    procs = []
    for rank in (0, 1):
        environ = {**rank_environ(rank, 4, port), "LOCAL_WORLD_SIZE": "2", "SLURMDIST_INIT_TIMEOUT": "10"}
        procs.append(subprocess.Popen([PYTHON, str(ALLREDUCE)], env=environ, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    started = time.monotonic()
    for result in finish(procs):
        assert result.returncode != 0
        assert "rank(s) 2-3 never arrived" in result.stderr, result.stderr
        # Bounded by the init timeout, as each rank measured it from entering init() (a wall clock from the
        # start would add imports, which a busy CI machine stretched past a tight bound).
        assert re.search(r"failed after 1[0-4] s \(timeout 10 s\)", result.stderr), result.stderr
    assert time.monotonic() - started < 90  # no hang, whatever the imports took


def test_a_frozen_store_host_ends_the_other_ranks_in_bounded_time():
    # Rank 0 (it serves the store) is frozen (SIGSTOP: Ctrl-Z, a debugger, a node swapping) after ranks 0 and 1
    # checked in; rank 2 never comes. Once rank 1's wait for rank 2 times out, torch's store client waits
    # without bound for the frozen store to acknowledge; slurmdist's watchdog cuts that connection.
    port, timeout = free_port(), 6
    rank0, rank1 = start_ranks([0, 1], 3, port, SLURMDIST_INIT_TIMEOUT=str(timeout))
    try:
        wait_until_checked_in(port, rank_environ(0, 3, port), [0, 1], RUN_TIMEOUT)
        os.kill(rank0.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        [stuck] = finish([rank1])
        took = time.monotonic() - frozen
    finally:
        os.kill(rank0.pid, signal.SIGCONT)
    assert stuck.returncode != 0
    assert f"the rendezvous store at 127.0.0.1:{port} stopped answering" in stuck.stderr, stuck.stderr
    assert "frozen (SIGSTOP" in stuck.stderr
    assert took < timeout + watchdog_grace(3) + 30, took  # a bound on a hang: the margin absorbs a busy machine
    # Continued past its deadline, rank 0 reports what it saw, not a frozen store (the store is its own).
    [woken] = finish([rank0])
    assert woken.returncode != 0
    assert "rank(s) 2 never arrived" in woken.stderr, woken.stderr
    assert "stopped answering" not in woken.stderr


LATE_UNDER_MPIRUN = """
import os, sys, time
os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"] = "1"  # as if each rank ran on a node of its own: the mpi4py path
if sys.argv[1:] == ["mpi-first"]:
    from mpi4py import MPI  # an MPI program: MPI_Init done before slurmdist's, so rank 0 waits in the broadcast
import slurmdist
if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
    time.sleep(60)  # never reaches init() within rank 0's bound
slurmdist.init()
"""


# The end of a worker whose group formed: every rank prints the all_reduce of its 1.
SUM_AND_SHUT_DOWN = """
total = torch.ones(1)
dist.all_reduce(total)
print("rank", env.rank, "sum", total.item(), flush=True)
slurmdist.shutdown()
"""


def two_under_mpirun(*argv: str, **extra: str):
    """`mpirun -np 2 ARGV` (as root where the tests run as root), finished."""
    env = clean_environ(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **extra)
    return run([tool("mpirun"), "-np", "2", "--oversubscribe", *argv], env)


@pytest.mark.parametrize("order, says", [
    ("slurmdist-first", "MPI_Init did not complete within 3 s on rank 0 (world size 2)"),
    ("mpi-first", "rank 0: rank 0's address was not shared over MPI within 3 s (world size 2): the other ranks "
                  "have not all reached"),
])
def test_mpi_init_waiting_for_a_missing_rank_is_bounded(order, says):
    # MPI_Init (mpi4py's import, to share rank 0's port) waits for every rank and holds the interpreter lock
    # meanwhile: rank 0 must still end within its timeout, saying why, and mpirun then ends the job. Where the
    # program ran MPI_Init itself, rank 0 waits in the broadcast instead, and names the others, not itself.
    started = time.monotonic()
    result = two_under_mpirun(PYTHON, "-c", LATE_UNDER_MPIRUN, order, SLURMDIST_INIT_TIMEOUT="3")
    took = time.monotonic() - started
    assert result.returncode != 0
    assert says in result.stdout + result.stderr, result.stdout + result.stderr
    if order == "mpi-first":  # the other cause that looks the same: a second program in one mpirun rank
        assert "second program started in the same mpirun rank" in result.stderr
        assert "mpirun ... slurmdist run -- bash -c" in result.stderr
    assert took < 45, took  # rank 1 alone sleeps 60 s: a bound on a hang, with room for a busy machine


RETRIED_UNDER_MPIRUN = """
import os, sys, time
os.environ.update(OMPI_COMM_WORLD_LOCAL_SIZE="1", OMPI_COMM_WORLD_LOCAL_RANK="0")  # each rank a node of its own
from mpi4py import MPI
import torch, torch.distributed as dist
import slurmdist
if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
    time.sleep(6)  # past rank 0's first bound, well within its second
try:
    env = slurmdist.init(timeout=3)
except slurmdist.RendezvousError as error:
    print("first attempt:", error, flush=True)
    env = slurmdist.init(timeout=60)
""" + SUM_AND_SHUT_DOWN


def test_a_caller_that_retries_after_the_mpi_share_timed_out_ends_normally():
    # The timeout arms an MPI_Abort at exit (MPI_Finalize would wait for the missing rank); a retry that went
    # through takes it back, so the job ends as its ranks do instead of being aborted.
    result = two_under_mpirun(PYTHON, "-c", RETRIED_UNDER_MPIRUN)
    output = result.stdout + result.stderr
    assert "first attempt:" in output and "the other ranks have not all reached" in output, output
    assert result.returncode == 0, output
    assert output.count("sum 2.0") == 2 and "MPI_ABORT" not in output, output


RESOLVED_THEN_INIT = """
import os, sys
os.environ.update(OMPI_COMM_WORLD_LOCAL_SIZE="1", OMPI_COMM_WORLD_LOCAL_RANK="0")  # each rank a node of its own
import torch, torch.distributed as dist
import slurmdist
from slurmdist.rendezvous import resolve_master
env = resolve_master(slurmdist.detect(), timeout=60)
print("rank", env.rank, "master", env.master_addr, env.master_port, flush=True)
if sys.argv[1] == "finalize":
    from mpi4py import MPI
    MPI.Finalize()
try:
    env = slurmdist.init(timeout=60)
except slurmdist.SlurmdistError as error:
    print("refused:", error, flush=True)
    sys.exit(3)
""" + SUM_AND_SHUT_DOWN


def test_resolve_master_leaves_mpi_to_the_caller_so_init_can_follow_it():
    # resolve_master() (public) finalized the MPI it started, and the init() that followed aborted inside MPI
    # with no Python error. MPI stays up now; MPI finalized by the caller is refused with a message instead.
    result = two_under_mpirun(PYTHON, "-c", RESOLVED_THEN_INIT, "keep")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert output.count("sum 2.0") == 2, output
    result = two_under_mpirun(PYTHON, "-c", RESOLVED_THEN_INIT, "finalize")
    output = result.stdout + result.stderr
    assert output.count("refused: MPI was already finalized in this process") == 2, output
    assert "MPI cannot start twice" in output and "after MPI_FINALIZE" not in output, output


def test_an_mpi4py_that_cannot_load_its_mpi_library_is_a_rendezvous_error(tmp_path):
    # mpi4py >= 4 raises RuntimeError when the MPI library it looks for is not there (an MPI module not loaded
    # in the job): train.py's `except SlurmdistError` missed it, and `slurmdist run` showed a traceback.
    mpi4py = require_module("mpi4py", "pip install -e '.[dev]'")
    if int(mpi4py.__version__.split(".")[0]) < 4:  # MPI4PY_LIBMPI is mpi4py 4's
        missing_prerequisite(f"mpi4py >= 4 (this is {mpi4py.__version__}): pip install -U mpi4py")
    missing = tmp_path / "libmpi.so.40"
    across_nodes = "OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=1"
    result = two_under_mpirun("-x", f"MPI4PY_LIBMPI={missing}", "bash", "-c",
                              f"{across_nodes} {tool('slurmdist')} run -- true; echo status $?")
    output = result.stdout + result.stderr
    assert output.count("status 2") == 2, output
    assert "mpi4py cannot load an MPI library" in output and str(missing) in output, output
    assert "MPI4PY_LIBMPI" in output and "Traceback" not in output, output


# Rank 2 checks in, starts forming the gloo group (which publishes its address), then is killed; rank 3 comes
# only after that. gloo waits 5 timeouts for a peer it was told about to connect.
DIES_IN_THE_MESH = """
import os, signal, sys, threading, time
from pathlib import Path
import slurmdist, torch
rank, marker = int(os.environ["RANK"]), Path(sys.argv[1])
def die_once_forming():
    while "GLOO_SOCKET_IFNAME" not in os.environ:  # set after check-in, just before the group forms
        time.sleep(0.01)
    time.sleep(0.5)
    marker.touch()
    os.kill(os.getpid(), signal.SIGKILL)
if rank == 2:
    threading.Thread(target=die_once_forming, daemon=True).start()
if rank == 3:
    while not marker.exists():
        time.sleep(0.05)
started = time.monotonic()
try:
    slurmdist.init("gloo")
except slurmdist.RendezvousError as exc:
    print(f"after {time.monotonic() - started:.1f} s: {exc}", flush=True)
    sys.exit(1)
"""


def test_a_rank_killed_while_the_group_forms_is_named_and_the_others_end_near_the_timeout(tmp_path):
    # gloo's own wait for that rank's connection is 5 x the timeout it is given: 30 s here, 25 min by default.
    port, timeout = free_port(), 6
    procs = [subprocess.Popen([PYTHON, "-c", DIES_IN_THE_MESH, str(tmp_path / "killed")], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=rank_environ(rank, 4, port, SLURMDIST_INIT_TIMEOUT=str(timeout)))
             for rank in range(4)]
    results = finish(procs)
    assert results[2].returncode == -signal.SIGKILL
    for rank in (0, 1, 3):
        said = results[rank].stdout
        assert results[rank].returncode == 1, results[rank].stderr
        assert "rank(s) 2 checked in from this node and have exited since" in said, said
        took = float(re.search(r"after ([\d.]+) s", said).group(1))
        # The group's wait (at most the timeout once the last address came) and rank 0's wait for the others to
        # read the verdict: well under gloo's own 30 s.
        assert took < 2 * timeout + 10, said


def test_unresolvable_master_names_the_host():
    [result] = finish(start_ranks([1], 2, free_port(), addr="no-such-node.invalid", SLURMDIST_INIT_TIMEOUT="20"))
    assert result.returncode != 0
    assert re.search(unresolved("master host 'no-such-node.invalid'"), result.stderr)


def test_busy_master_port_is_an_error_not_a_hang():
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        results = finish(start_ranks([0, 1], 2, port, SLURMDIST_INIT_TIMEOUT="5"))
    rank0, rank1 = results
    assert rank0.returncode != 0
    assert f"cannot listen on the rendezvous port {port}" in rank0.stderr
    assert rank1.returncode != 0  # it reached the squatter, not a store: bounded by the timeout
    # A socket that never answers as a store (rank 1 names it, and what to do), not a bare timeout.
    assert re.search(rf"RendezvousError: rank 1: something listens at 127\.0\.0\.1:{port} but does not answer as a "
                     r"rendezvous store \(world size 2, waited \d+ s\): another program holds MASTER_PORT",
                     rank1.stderr), rank1.stderr
    assert "set MASTER_PORT to a free port" in rank1.stderr


def answers_in_another_protocol(server: socket.socket, stop: "threading.Event") -> None:
    """A web server squatting on the master port: each connection gets an HTTP error after a moment."""
    server.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except OSError:
            continue
        with conn:
            time.sleep(0.3)
            with contextlib.suppress(OSError):
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")


def test_a_program_answering_in_another_protocol_on_the_port_ends_each_rank_with_the_error_not_an_abort():
    # torch's client retries such a listener past its own timeout; its thread, left inside torch while the rank
    # exited, aborted the process ("terminate called without an active exception", status 134) in about half
    # the runs, after the right message. The rank now cuts that connection and lets the thread end first.
    stop = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        squatter = threading.Thread(target=answers_in_another_protocol, args=(server, stop), daemon=True)
        squatter.start()
        try:
            results = finish(start_ranks([1] * 6, 2, port, SLURMDIST_INIT_TIMEOUT="3"))
        finally:
            stop.set()
            squatter.join(timeout=5)
    for result in results:
        assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
        assert "terminate called" not in result.stderr
        assert re.search(rf"RendezvousError: rank 1:? (something listens at|reached) 127\.0\.0\.1:{port}",
                         result.stderr), result.stderr[-2000:]


WAITS_FOR_A_MISSING_RANK = """
import os, signal, sys
import slurmdist
handler = os.environ["HANDLER"]
if handler == "exit":  # a handler that saves and exits, as a job's SIGTERM handler does
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
elif handler == "return":  # one that only takes note
    signal.signal(signal.SIGTERM, lambda *_: print("noted", flush=True))
slurmdist.init()
print("formed", flush=True)
"""


@pytest.mark.parametrize("rank, world, sig, handler, status, says", [
    (0, 2, signal.SIGINT, "", -signal.SIGINT, "KeyboardInterrupt"),  # Ctrl-C on the rank serving the store
    (1, 3, signal.SIGINT, "", -signal.SIGINT, "KeyboardInterrupt"),  # and on one that joined it
    (0, 2, signal.SIGTERM, "exit", 143, ""),
    (1, 3, signal.SIGTERM, "return", 1, "init() stopped waiting for the rendezvous (world size 3) when SIGTERM "
                                         "arrived: its handler returned"),
], ids=["ctrl-c rank 0", "ctrl-c rank 1", "sigterm handler exits", "sigterm handler returns"])
def test_ctrl_c_and_sigterm_end_a_rank_waiting_inside_torch_for_a_missing_one(rank, world, sig, handler, status, says,
                                                                             reliability_record):
    # The waiting rank sat in torch's store client, where Python runs no handler, until the init timeout (here
    # 120 s) ran out: Ctrl-C did nothing, and a SIGTERM handler that saves and exits ran minutes late.
    port = free_port()
    present = list(range(world - 1))  # the last rank never comes
    procs = {r: subprocess.Popen([PYTHON, "-c", WAITS_FOR_A_MISSING_RANK], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 env=rank_environ(r, world, port, SLURMDIST_INIT_TIMEOUT="120", HANDLER=handler))
             for r in present}
    try:
        wait_until_checked_in(port, rank_environ(0, world, port), present, timeout=60)
        procs[rank].send_signal(sig)
        signalled = time.monotonic()
        out, err = procs[rank].communicate(timeout=60)  # without the cut: the 120 s timeout, then this expires
        took = time.monotonic() - signalled
    finally:
        for proc in procs.values():
            proc.kill()
            proc.communicate()
    reliability_record(
        f"{sig.name} to rank {rank} while it waits inside torch for a rank that never comes",
        f"{world} ranks on one host, {world - 1} started, init timeout 120 s; "
        + {"": "no handler", "exit": "a handler that exits", "return": "a handler that returns"}[handler],
        f"{sig.name} after every present rank checked in", took,
        f"exit status {procs[rank].returncode}" + (f"; stderr says {says!r}" if says and says in err else ""),
        section="Faults in real runs")
    assert procs[rank].returncode == status, err[-3000:]
    assert says in err and "formed" not in out, err[-3000:]
    assert took < 30, took  # a bound on the old wait (120 s), not a timing claim: seconds on a busy machine


GIVES_BACK = """
import json, os, socket
import slurmdist

def callers_own():
    secret = "the caller's local"
    raise ValueError(secret)

try:
    callers_own()
except ValueError as mine:  # init() called while the caller handles an exception of its own
    try:
        slurmdist.init(timeout=3)
    except slurmdist.RendezvousError as exc:
        kept = exc  # as a caller that logs or retries later holds it
    callers_frame = mine.__traceback__.tb_next.tb_frame
with socket.socket() as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    probe.bind(("", int(os.environ["MASTER_PORT"])))  # OSError while the failed store still listens
print(json.dumps({
    "failed": "never arrived" in str(kept),
    "advice": "raise init()'s timeout" in str(kept),  # the argument set the bound, not SLURMDIST_INIT_TIMEOUT
    "gloo": os.environ.get("GLOO_SOCKET_IFNAME"),
    "callers_locals": "secret" in callers_frame.f_locals,
}))
"""


def test_a_failed_init_gives_back_rank_0s_port_and_its_gloo_interface_choice():
    # Rank 0 alone in a world of 2: it hosts the store, chooses gloo's interface, then times out. A retry
    # needs the port, and must choose the interface afresh rather than take it for the user's choice. The
    # exception the caller was handling keeps its frames' locals: those are the caller's, not slurmdist's.
    env = rank_environ(0, 2, free_port())
    result = subprocess.run([PYTHON, "-c", GIVES_BACK], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"failed": True, "advice": True, "gloo": None,
                                                           "callers_locals": True}


@pytest.mark.parametrize(
    "backend, advice",
    [("nccl", "install a CUDA"), ("mpi", "USE_MPI=1"), ("hccl", "torch-npu"), ("cpu:gloo,cuda:nccl", "CUDA")],
)
def test_missing_backend_fails_before_any_network_wait(backend, advice):
    # World size 2 with rank 0 never started: only failing before the rendezvous can end this quickly.
    env = rank_environ(1, 2, free_port(), SLURMDIST_INIT_TIMEOUT="300")
    result = subprocess.run([PYTHON, ALLREDUCE, "slurmdist", backend], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "BackendError" in result.stderr
    assert advice in result.stderr


def test_a_single_process_without_a_loopback_interface_is_told_so():
    # A network namespace of its own, whose loopback is down: gloo would fail inside torch with its own words.
    result = subprocess.run([tool("unshare"), "-n", PYTHON, "-c", "import slurmdist; slurmdist.init()"],
                            env=clean_environ(), capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "BackendError: gloo binds a network interface even for a single process" in result.stderr, result.stderr
    assert "ip link set lo up" in result.stderr

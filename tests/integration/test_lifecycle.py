"""init()/shutdown()/initialized() over a real single-process gloo group in this process, and a signal
handler that calls shutdown() while init() waits for ranks that never come."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import warnings

import pytest

import slurmdist
from slurmdist import gloo_workers, interfaces
from tests.conftest import require_module
from tests.integration.workers.launch import PYTHON, clean_environ, finish, free_port, rank_environ

pytestmark = pytest.mark.integration

torch = require_module("torch", "install torch (make venv does)")
dist = torch.distributed


@pytest.fixture
def single():
    """A clean single-process launch; whatever a test leaves initialised is torn down after it."""
    yield clean_environ()
    slurmdist.shutdown()
    if dist.is_initialized():
        dist.destroy_process_group()


def works() -> bool:
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    return tensor.item() == 1


def test_a_nested_initialized_leaves_the_outer_group_standing(single):
    env = slurmdist.init(environ=single)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reusing the group is the point: no "already called" warning
        with slurmdist.initialized(environ=single) as inner:
            assert inner is env
    assert slurmdist.is_initialized() and dist.is_initialized() and works()


def test_init_after_the_user_destroyed_the_group_forms_a_new_one(single):
    slurmdist.init(environ=single)
    dist.destroy_process_group()  # the usual last line of a torch script
    assert not slurmdist.is_initialized()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        slurmdist.init(environ=single)
    assert works()


def test_shutdown_leaves_a_group_the_user_formed_after_destroying_ours(single):
    slurmdist.init(environ=single)
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    slurmdist.shutdown()
    assert dist.is_initialized() and works()


def test_the_per_device_form_with_spaces_forms_a_group(single):
    env = slurmdist.init(backend="cuda:gloo, cpu:gloo", environ=single)
    assert env.backend == "cuda:gloo,cpu:gloo" and works()


def test_a_single_process_binds_loopback_and_gives_the_choice_back(single):
    os.environ.pop(interfaces.GLOO_INTERFACE_VARIABLE, None)
    slurmdist.init(environ=single)
    assert os.environ[interfaces.GLOO_INTERFACE_VARIABLE] == interfaces.gloo_interface(None, single_node=True)
    slurmdist.shutdown()
    assert interfaces.GLOO_INTERFACE_VARIABLE not in os.environ


def test_shutdown_interrupted_inside_torch_still_gives_the_interface_choice_back(single, monkeypatch):
    # Ctrl-C landing in destroy_process_group(): the KeyboardInterrupt goes on to the caller, and slurmdist's own
    # choice of GLOO_SOCKET_IFNAME must not stay behind for the next init() to take for the user's.
    os.environ.pop(interfaces.GLOO_INTERFACE_VARIABLE, None)
    slurmdist.init(environ=single)
    destroy = dist.destroy_process_group

    def interrupted(*args, **kwargs):
        destroy(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(dist, "destroy_process_group", interrupted)
    with pytest.raises(KeyboardInterrupt):
        slurmdist.shutdown()
    assert interfaces.GLOO_INTERFACE_VARIABLE not in os.environ and not slurmdist.is_initialized()


def test_the_gloo_workers_a_ddp_model_keeps_are_found_and_seen_asleep(single):
    # A DDP model keeps its group, and the group's worker threads, alive past destroy_process_group(). The exit
    # handler waits for them: it must find them under torch's name for them, and tell when they are idle.
    slurmdist.init(environ=single)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
    assert works()
    assert gloo_workers.workers()
    del model
    slurmdist.shutdown()
    assert gloo_workers.wait_until_idle(bound=30.0)  # False if it could not tell them asleep (30 s: a bound)
    # Asleep, waiting for work that will not come (or gone, on a torch whose DDP lets the group go)
    assert all(state == "S" for state, _ in gloo_workers.workers().values())


REINIT_WITH_THE_OLD_GROUP_HELD = """
import sys, time, torch, torch.distributed as dist, slurmdist
from torch.nn.parallel import DistributedDataParallel as DDP
env = slurmdist.init()
held = DDP(torch.nn.Linear(2, 1)) if sys.argv[1] == "ddp" else dist.new_group([0, 1])  # keeps the old group
if env.rank == 0:  # rank 1 comes back first, while the old store still listens
    time.sleep(2)
# The group ends through slurmdist, or as torch scripts end it (init() then notices it is gone)
slurmdist.shutdown() if sys.argv[2] == "shutdown" else dist.destroy_process_group()
env = slurmdist.init()
tensor = torch.ones(1)
dist.all_reduce(tensor)
print("second group", env.rank, int(tensor.item()), flush=True)
"""


@pytest.mark.parametrize("holder, ending", [("ddp", "shutdown"), ("new_group", "shutdown"), ("ddp", "destroy")])
def test_a_second_group_forms_while_something_still_holds_the_first(holder, ending):
    # A model (or a group handle) outliving shutdown() keeps the first group, and rank 0's store with it: its
    # port stayed taken, so rank 0's second init() could not serve and the others timed out. And a rank that
    # comes back first joins that old store, which stays open: rank 0 must tell it to join again.
    port = free_port()
    procs = [subprocess.Popen([PYTHON, "-c", REINIT_WITH_THE_OLD_GROUP_HELD, holder, ending], text=True,
                              env=rank_environ(rank, 2, port, SLURMDIST_INIT_TIMEOUT="30"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for rank in range(2)]
    results = finish(procs)
    for rank, result in enumerate(results):
        assert result.returncode == 0, result.stderr
        assert f"second group {rank} 2" in result.stdout


CYCLES_WITHOUT_GC = """
import gc, json, os, time, slurmdist
gc.disable()  # as training loops often do: only reference counts free what init() left
rank = int(os.environ["RANK"])
def open_sockets():
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own fd, closed by now
            pass
    return sum(link.startswith("socket:") for link in links)
counts = []
for cycle in range(3):
    if rank == 0:  # the others poll the port before rank 0 listens: the usual start
        time.sleep(0.5)
    slurmdist.init("gloo")
    slurmdist.shutdown()
    counts.append(open_sockets())
print(json.dumps(counts), flush=True)
"""


def test_init_and_shutdown_cycles_leave_no_store_connection_open_without_the_garbage_collector():
    # A connection error kept from the poll held the frames of init() (and its store client) in a cycle.
    port = free_port()
    procs = [subprocess.Popen([PYTHON, "-c", CYCLES_WITHOUT_GC], text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=rank_environ(rank, 2, port, SLURMDIST_INIT_TIMEOUT="30"))
             for rank in range(2)]
    for rank, result in enumerate(finish(procs)):
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.splitlines()[-1]) == [0, 0, 0], (rank, result.stdout)


SHUTDOWN_ON_SIGTERM = """
import signal, sys, slurmdist, torch.distributed
def stop(signum, frame):
    slurmdist.shutdown()
    print("shutdown returned", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("waiting", flush=True)
slurmdist.init(timeout=8)
"""


def test_shutdown_from_a_signal_handler_during_init_does_not_deadlock():
    # Rank 0 of 2 alone waits in init(); scancel's SIGTERM runs the handler on top of it, in the same thread,
    # as soon as init() is back in Python (at the latest when its wait for rank 1 times out after 8 s).
    proc = subprocess.Popen([PYTHON, "-c", SHUTDOWN_ON_SIGTERM], env=rank_environ(0, 2, free_port()),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "waiting\n"
    time.sleep(2)  # torch is imported: inside init(), waiting for rank 1
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)  # a deadlock never ends: the handler waits for init()'s lock
    assert proc.returncode == 143 and "shutdown returned" in out, err


ASKS_DURING_INIT = """
import threading, time, slurmdist
answers = []

def ask():
    time.sleep(1.0)  # init() is waiting for rank 1 by now
    answers.append((slurmdist.is_initialized(), slurmdist.is_main(), time.monotonic()))

asker = threading.Thread(target=ask, daemon=True)
asker.start()
try:
    slurmdist.init(timeout=6)
except slurmdist.RendezvousError:
    pass
gave_up = time.monotonic()
asker.join(60)
initialized, main, answered = answers[0]
print(initialized, main, answered < gave_up)
"""


def test_asking_from_another_thread_during_init_does_not_wait_for_the_rendezvous():
    # A logging thread (the rank prefix) or is_main() used to block on init()'s lock for the whole rendezvous.
    environ = rank_environ(0, 2, free_port())  # rank 1 never comes: init() waits its 6 s, then fails
    done = subprocess.run([PYTHON, "-c", ASKS_DURING_INIT], env=environ, capture_output=True, text=True, timeout=120)
    initialized, main, before_init_gave_up = done.stdout.split()
    assert (initialized, main) == ("False", "True"), done.stderr
    assert before_init_gave_up == "True", done.stdout  # answered while init() waited, not once it had given up


GROUP_TIMEOUT = """
import sys, torch, torch.distributed as dist, slurmdist
if sys.argv[1] == "without":  # a torch that cannot change a formed group's timeout
    del dist.distributed_c10d._set_pg_timeout
slurmdist.init("gloo", timeout=60)
print(dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).options._timeout.total_seconds())
slurmdist.shutdown()
"""


@pytest.mark.parametrize("retiming", ["with", "without"])
def test_collectives_get_their_own_timeout_not_what_the_rendezvous_had_left(retiming):
    port = free_port()
    procs = [subprocess.Popen([PYTHON, "-c", GROUP_TIMEOUT, retiming], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=rank_environ(rank, 2, port, SLURMDIST_COLLECTIVE_TIMEOUT="123"))
             for rank in (1, 0)]
    for result in finish(procs):
        assert result.returncode == 0, result.stderr
        assert float(result.stdout) == 123.0


ALONE_WITHOUT_RETIMING = """
import torch.distributed as dist, slurmdist
del dist.distributed_c10d._set_pg_timeout  # a torch that cannot change a formed group's timeout
try:
    slurmdist.init("gloo", timeout=3)
except slurmdist.RendezvousError as error:
    print(error)
"""


def test_gloo_without_retiming_still_ends_at_the_init_timeout():
    # Such a torch forms the group under the collective timeout (600 s here): rank 0, which serves the store and
    # has no watchdog, must not wait for rank 1 in the gloo mesh for that long, but give up at init's 3 s.
    environ = rank_environ(0, 2, free_port(), SLURMDIST_COLLECTIVE_TIMEOUT="600")
    done = subprocess.run([PYTHON, "-c", ALONE_WITHOUT_RETIMING], env=environ, capture_output=True, text=True,
                          timeout=120)
    assert "rank(s) 1 never arrived" in done.stdout, done.stdout + done.stderr


def test_a_group_formed_outside_slurmdist_is_adopted_when_its_shape_is_the_launchs(single):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with pytest.warns(UserWarning, match="adopting that group"):
        env = slurmdist.init(environ=single)
    assert (env.rank, env.world_size) == (0, 1) and works()
    slurmdist.shutdown()
    assert dist.is_initialized()  # not slurmdist's to destroy
    # Through initialized() too, the warning names the user's line, not slurmdist's or contextlib's.
    with pytest.warns(UserWarning, match="adopting that group") as warned:
        with slurmdist.initialized(environ=single):
            pass
    assert [w.filename for w in warned] == [__file__], [w.filename for w in warned]


def test_a_group_formed_outside_slurmdist_of_another_shape_is_refused(single):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    launch = rank_environ(0, 2, free_port())  # the launch says 2 ranks: a sampler would shard for 2
    with pytest.raises(slurmdist.SlurmdistError, match="initialised outside slurmdist as rank 0 of 1, but the launch "
                       r"\(torchrun\) says rank 0 of 2"):
        slurmdist.init(environ=launch)
    assert not slurmdist.is_initialized() and works()


def test_an_mpi_group_that_started_alone_is_refused(single, monkeypatch):
    """backend='mpi' under a launcher MPI does not know (torchrun here): MPI starts each process alone, as
    rank 0 of 1. No torch wheel has MPI built in, so the start is stood in for by what it forms: a group of one."""
    form = dist.init_process_group

    def lone_mpi_start(backend, **kwargs):
        assert backend == "mpi"
        form("gloo", store=dist.HashStore(), rank=0, world_size=1)

    monkeypatch.setattr(dist, "is_mpi_available", lambda: True)
    monkeypatch.setattr(dist, "init_process_group", lone_mpi_start)
    launch = rank_environ(1, 2, free_port())
    with pytest.raises(slurmdist.BackendError, match=r"MPI started this process as rank 0 of 1, but the launch "
                       r"\(torchrun\) says rank 1 of 2.*mpirun"):
        slurmdist.init("mpi", environ=launch)
    assert not dist.is_initialized() and not slurmdist.is_initialized()


BARRIER_ALONE = """
import time, slurmdist
env = slurmdist.init("gloo", timeout=60)
if env.rank == 1:  # never reaches the barrier; leaves once rank 0 has given up
    time.sleep(8)
else:
    try:
        slurmdist.barrier()
    except slurmdist.SlurmdistError as error:
        print(error)
"""


def test_a_barrier_a_rank_never_reaches_ends_at_the_collective_timeout_saying_so():
    port = free_port()
    procs = [subprocess.Popen([PYTHON, "-c", BARRIER_ALONE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=rank_environ(rank, 2, port, SLURMDIST_COLLECTIVE_TIMEOUT="3"))
             for rank in (1, 0)]
    rank_1, rank_0 = finish(procs)
    assert "barrier() on rank 0 of 2 failed" in rank_0.stdout, rank_0.stdout + rank_0.stderr
    # The timeout in force, not the default.
    assert "collective timeout (SLURMDIST_COLLECTIVE_TIMEOUT: 3 s)" in rank_0.stdout, rank_0.stdout
    assert "Traceback" not in rank_0.stderr


def test_a_share_devices_value_that_is_neither_yes_nor_no_is_refused_even_on_the_cpu(single):
    with pytest.raises(slurmdist.BackendError, match="SLURMDIST_SHARE_DEVICES='maybe' is neither yes nor no"):
        slurmdist.init(environ={**single, "SLURMDIST_SHARE_DEVICES": "maybe"})
    assert not slurmdist.is_initialized()

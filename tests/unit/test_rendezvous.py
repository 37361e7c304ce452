"""Addresses, timeouts and the arrival protocol, against real TCPStores in this process."""

from __future__ import annotations

import re
import socket
import sys
import threading
import time
from datetime import timedelta

import pytest

from slurmdist.detection import detect
from slurmdist.distenv import LOOPBACK, DistEnv
from slurmdist.errors import LaunchError, RendezvousError, SlurmdistError
from slurmdist.process_group import _collective_timeout
from slurmdist.launchers.slurm import hostfile_first_host
from slurmdist.bounds import Deadline, init_timeout
from slurmdist.hosts import addresses, hostfile_master, hostport, names_this_host, resolve_host, strip_brackets
from slurmdist.mpi_share import mpi_comm
from slurmdist.rendezvous import (
    OWNER_CHECK_AFTER, OWNER_KEY, STORE_CLOSING, ForeignStore, Keys, announce_closing, compress_ranks, connect, current_keys,
    describe_run, open_store, rank0_keys, resolve_master, run_prefix, same_run, state_key, store_stopped_answering,
    wait_listening,
)
from tests.conftest import load_case, missing_prerequisite, unresolved


def env_of(rank, world, port, addr="127.0.0.1", launcher="torchrun"):
    return DistEnv(launcher, rank, rank, world, world, 0, 1, addr, port, "7")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


AGENT_ENVIRON = {"TORCHELASTIC_USE_AGENT_STORE": "True"}  # every rank joins, none serves


@pytest.fixture
def agent_store():
    """A store served the way torchrun's agent (or slurmdist run's store host) serves it: (port, store)."""
    import torch.distributed as dist

    port = free_port()
    return port, dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=60), wait_for_workers=False)


def test_ipv6_is_bracketed_once():
    assert hostport("::1", 29500) == "[::1]:29500"
    assert hostport("[fe80::1%eth0]", 1) == "[fe80::1%eth0]:1"
    assert hostport("node1", 2) == "node1:2"
    assert hostport("10.0.0.1", 3) == "10.0.0.1:3"
    assert strip_brackets("[::1]") == "::1"


def test_compress_ranks():
    assert compress_ranks([3]) == "3"
    assert compress_ranks([7, 1, 2, 3, 9, 10]) == "1-3,7,9-10"
    assert compress_ranks([]) == ""


def test_init_timeout_sources():
    assert init_timeout(None, {}) == 300
    assert init_timeout(None, {"SLURMDIST_INIT_TIMEOUT": "12.5"}) == 12.5
    assert init_timeout(3, {"SLURMDIST_INIT_TIMEOUT": "12.5"}) == 3
    for bad in ("soon", "0", "-1", "nan", "inf", "1e14"):  # inf and 1e14 overflow torch's timedelta
        with pytest.raises(RendezvousError, match="SLURMDIST_INIT_TIMEOUT"):
            init_timeout(None, {"SLURMDIST_INIT_TIMEOUT": bad})
    with pytest.raises(RendezvousError, match="timeout=inf.*at most"):
        init_timeout(float("inf"), {})
    with pytest.raises(RendezvousError, match="timeout=True is not a number of seconds"):  # float(True) is 1.0
        init_timeout(True, {})
    # torch's own init_process_group takes a timedelta: so does init(), and the text variable says what it takes.
    assert init_timeout(timedelta(minutes=2), {}) == 120
    with pytest.raises(RendezvousError, match=r"'soon' is not a number of seconds; give one such as 300, .*a year"):
        init_timeout(None, {"SLURMDIST_INIT_TIMEOUT": "soon"})  # text: a timedelta is no option there
    with pytest.raises(RendezvousError, match=r"timeout=\[300\] is not a number of seconds; give one such as 300 "
                                              r"\(or a timedelta\)"):
        init_timeout([300], {})
    with pytest.raises(RendezvousError, match="timeout=datetime.timedelta.* must be a positive number of seconds"):
        init_timeout(timedelta(0), {})


def test_a_blank_timeout_variable_means_unset_as_every_slurmdist_variable_does():
    """`export SLURMDIST_INIT_TIMEOUT=` in a job script clears it there; the requeue variables read it so."""
    for blank in ("", "  "):
        assert init_timeout(None, {"SLURMDIST_INIT_TIMEOUT": blank}) == 300
        assert _collective_timeout({"SLURMDIST_COLLECTIVE_TIMEOUT": blank}) == 1800
    assert init_timeout(None, {"SLURMDIST_INIT_TIMEOUT": " 12 "}) == 12
    assert init_timeout(None, {"SLURMDIST_INIT_TIMEOUT": 12}) == 12  # a caller's dict with a number, as before
    with pytest.raises(SlurmdistError, match="SLURMDIST_COLLECTIVE_TIMEOUT='-5' must be a positive"):
        _collective_timeout({"SLURMDIST_COLLECTIVE_TIMEOUT": "-5"})


def test_a_store_host_name_that_does_not_resolve_fails_at_once_naming_it():
    # Before: the name itself was dialled at every poll (a DNS query each, outside the deadline) until the
    # deadline, which then blamed rank 0 for not listening.
    import time

    started = time.monotonic()
    with pytest.raises(RendezvousError, match=unresolved("the rendezvous store's host 'no-such-node.invalid'")):
        wait_listening("no-such-node.invalid", 29400, Deadline(60), 2)
    assert time.monotonic() - started < 30  # a bound on a hang (one bounded lookup), not a timing claim


def test_torchruns_variables_written_without_a_master_say_which_are_missing():
    # torchrun itself always exports MASTER_ADDR/PORT: this is a hand-written export (often in a job script).
    env = detect({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    with pytest.raises(RendezvousError, match="RANK=1, WORLD_SIZE=2 and LOCAL_RANK=1 are set but MASTER_ADDR and "
                                              "MASTER_PORT are not.*under srun or mpirun, unset RANK"):
        resolve_master(env, environ={})


def test_a_slurm_conf_that_never_reads_does_not_hang_the_lookup(tmp_path):
    # slurm.conf on a stalled shared file system: a FIFO with no writer blocks open() the same way.
    import os
    import time

    stalled = tmp_path / "slurm.conf"
    os.mkfifo(stalled)
    started = time.monotonic()
    with pytest.raises(RendezvousError, match=unresolved("master host 'no-such-node.invalid'")):
        resolve_host("no-such-node.invalid", {"PATH": "", "SLURM_CONF": str(stalled)}, timeout=2.0)
    assert time.monotonic() - started < 2.0 + 5.0  # a bound on a hang, with room for a busy machine


def test_a_name_server_that_never_answers_is_told_apart_from_an_unknown_name(monkeypatch):
    import threading

    answer = threading.Event()

    def silent_name_server(*args, **kwargs):
        answer.wait(30)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", silent_name_server)
    try:
        with pytest.raises(RendezvousError, match=r"the lookup of master host 'node1' took longer than 0.5 s: its name "
                                                  "server does not answer"):
            resolve_host("node1", {"PATH": "", "SLURM_CONF": "/nonexistent"}, timeout=1.0)
        with pytest.raises(RendezvousError, match="the lookup of the rendezvous store's host 'node1' took longer"):
            wait_listening("node1", 29400, Deadline(0.5), 2)
    finally:
        answer.set()


def test_resolve_host():
    assert resolve_host("localhost", {}) == "localhost"
    assert resolve_host("[::1]", {}) == "::1"
    with pytest.raises(RendezvousError, match=unresolved("master host 'no-such-node.invalid'")) as outside_slurm:
        resolve_host("no-such-node.invalid", {"PATH": ""})  # no scontrol either
    assert "Slurm" not in str(outside_slurm.value)  # a plain mpirun's MASTER_ADDR: no Slurm to blame
    with pytest.raises(RendezvousError, match="Slurm gave no usable NodeAddr for it") as in_a_job:
        resolve_host("no-such-node.invalid", {"PATH": "", "SLURM_JOB_ID": "7"})
    assert "set MASTER_ADDR" in str(in_a_job.value) and "unset it" not in str(in_a_job.value)
    # The name came from an exported MASTER_ADDR (left over, or a typo): say so, and that unsetting it is a way out.
    with pytest.raises(RendezvousError, match="it is MASTER_ADDR's value: set MASTER_ADDR to .*, or, left over from "
                                              r"elsewhere, unset it \(slurmdist then meets on the step's first node\)"):
        resolve_host("no-such-node.invalid", {"PATH": "", "SLURM_JOB_ID": "7", "MASTER_ADDR": "no-such-node.invalid"})


def test_a_slurmctld_that_never_answers_costs_one_lookup_bound_not_the_init_timeout(tmp_path, monkeypatch):
    # `slurmdist run` resolves the master before the command starts: an scontrol that hangs must fail in
    # LOOKUP_BOUND seconds naming the host, not after the whole 300 s init timeout.
    from slurmdist import rendezvous
    from slurmdist.rendezvous import resolve_master

    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\nexec sleep 600\n")
    scontrol.chmod(0o755)
    monkeypatch.setattr(rendezvous, "LOOKUP_BOUND", 1.0)
    task = {**load_case("slurm/srun_N2_tpn2")[2], "PATH": str(tmp_path), "SLURM_CONF": str(tmp_path / "none"),
            "SLURM_STEP_NODELIST": "no-such-node[1-2].invalid", "SLURM_JOB_NODELIST": "no-such-node[1-2].invalid"}
    started = time.monotonic()
    with pytest.raises(RendezvousError, match=unresolved("master host 'no-such-node1.invalid'")):
        resolve_master(detect(task), environ=task, timeout=300)
    assert time.monotonic() - started < 30  # a bound on a hang: the init timeout here is 300 s


@pytest.mark.parametrize(
    "literal, answer", [("10.0.0.1", "10.0.0.1"), ("[fd00::7]", "fd00::7"), ("fe80::1%lo", "fe80::1%lo")]
)
def test_an_ip_address_resolves_to_itself_without_a_lookup(monkeypatch, literal, answer):
    def no_lookup(*args, **kwargs):
        raise AssertionError("an IP literal needs no getaddrinfo")

    monkeypatch.setattr(socket, "getaddrinfo", no_lookup)
    assert addresses(literal) == [answer]
    assert resolve_host(literal, {"PATH": ""}) == answer


def test_waiting_for_the_store_looks_the_master_name_up_once(monkeypatch):
    port = free_port()
    lookups = []
    real_getaddrinfo = socket.getaddrinfo

    def counting(host, *args, **kwargs):
        if host in ("localhost", b"localhost"):
            lookups.append(host)
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", counting)
    listener = []
    opener = threading.Timer(0.3, lambda: listener.append(socket.create_server(("127.0.0.1", port))))
    opener.start()
    try:
        assert wait_listening("localhost", port, Deadline(10), 2) == "127.0.0.1"  # refused for 0.3 s first
    finally:
        opener.join()
        for sock in listener:
            sock.close()
    assert len(lookups) == 1


def test_joining_the_store_looks_the_master_name_up_once_in_all(monkeypatch, agent_store):
    # A master name that resolves (here only through Python's resolver, which the test answers): connect()
    # resolves it once, polls the port at the answer, and the store client dials the address that answered.
    (port, agent), lookups = agent_store, []
    real_getaddrinfo = socket.getaddrinfo

    def answering(host, *args, **kwargs):
        if host in ("masternode.test", b"masternode.test"):
            lookups.append(host)
            return real_getaddrinfo("127.0.0.1", *args, **kwargs)
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", answering)
    meeting = connect(env_of(1, 2, port, addr="masternode.test"), Deadline(30), AGENT_ENVIRON)
    assert len(lookups) == 1
    assert meeting.reach == "127.0.0.1" and meeting.env.master_addr == "masternode.test"
    assert agent.add(meeting.keys.count, 0) == 1  # checked in at the agent's store


def test_run_prefix_separates_steps_restarts_and_calls():
    env = env_of(0, 2, 1, launcher="slurm")
    a = run_prefix(env, {"SLURM_STEP_ID": "0"}, 0)
    assert a != run_prefix(env, {"SLURM_STEP_ID": "1"}, 0)
    assert a != run_prefix(env, {"SLURM_STEP_ID": "0"}, 1)
    assert a != run_prefix(env, {"SLURM_STEP_ID": "0", "TORCHELASTIC_RESTART_COUNT": "1"}, 0)


def test_run_prefix_is_the_same_on_mpirun_ranks_with_and_without_a_daemon_step():
    """mpirun in a batch script: ranks on the first node have no step id, the others the daemons' step."""
    env = env_of(0, 4, 1, launcher="openmpi")
    assert run_prefix(env, {}, 0) == run_prefix(env, {"SLURM_STEP_ID": "0"}, 0)


def meet(world, ranks, timeout, port=None, environ=None):
    """Ranks as threads; returns {rank: None or the exception} after check_in + wait_all."""
    port, outcome, meetings = port or free_port(), {}, []

    def rank_main(rank):
        try:
            meetings.append(connect(env_of(rank, world, port), Deadline(timeout), environ or {}))
            meetings[-1].wait_all()  # rank 0's store must outlive the others' reads: kept in `meetings`
            outcome[rank] = None
        except Exception as exc:  # collected and asserted on below
            outcome[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcome, port


def wait_for_arrivals(port, env, ranks, timeout=30):
    """Block until `ranks` have checked in at the store rank 0 serves on `port` (as one more client of it)."""
    import torch.distributed as dist

    end = time.monotonic() + timeout
    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=timeout))  # retries until rank 0 serves
    keys = Keys(run_prefix(env, {}, 0))
    while not store.check([keys.arrived(rank) for rank in ranks]):
        assert time.monotonic() < end, f"ranks {ranks} did not check in within {timeout} s"
        time.sleep(0.02)


def start_rank(port, rank, world, outcome, name, timeout=20):
    """One rank in a thread: connect, check in, wait for all; its outcome (None or the exception) in `outcome`."""
    kept = []

    def rank_main():
        try:
            kept.append(connect(env_of(rank, world, port), Deadline(timeout), {}))
            kept[-1].wait_all()
            outcome[name] = None
        except Exception as exc:  # asserted on by the caller
            outcome[name] = exc

    thread = threading.Thread(target=rank_main)
    thread.start()
    return thread


def test_two_processes_with_one_rank_fail_every_rank_at_once_naming_it():
    # A launcher that started RANK=1 twice (and no rank 2): not "rank 2 never arrived" after the timeout.
    port, outcome = free_port(), {}
    threads = [start_rank(port, 0, 3, outcome, "rank 0"), start_rank(port, 1, 3, outcome, "first rank 1")]
    wait_for_arrivals(port, env_of(0, 3, port), [0, 1])
    threads.append(start_rank(port, 1, 3, outcome, "second rank 1"))
    for thread in threads:
        thread.join(60)
    assert set(outcome) == {"rank 0", "first rank 1", "second rank 1"}
    for name, error in outcome.items():
        assert isinstance(error, RendezvousError), name
        assert "rank 1 checked in twice" in str(error) and "two processes have RANK=1" in str(error), name
        assert "(timeout 20 s)" in str(error) and "failed after 20 s" not in str(error), name  # not waited out
        assert "SLURMDIST_INIT_TIMEOUT" not in str(error), name  # no longer timeout would help


ONE_PROGRAM = """
import sys
from slurmdist.bounds import Deadline
from slurmdist.distenv import DistEnv
from slurmdist.rendezvous import connect
rank, port = int(sys.argv[1]), int(sys.argv[2])
env = DistEnv("torchrun", rank, rank, 2, 2, 0, 1, "127.0.0.1", port, "7")
meeting = connect(env, Deadline(20), {"TORCHELASTIC_USE_AGENT_STORE": "True"})
meeting.wait_all()
print("met at", meeting.keys.prefix, flush=True)
"""


def test_programs_run_one_after_another_at_one_agents_store_each_meet(agent_store):
    # `slurmdist run -- bash -c "python prep.py && python train.py"`: the second program's ranks find their keys
    # held by the first program's processes, which have ended. Not "checked in twice": they move on and meet.
    import subprocess

    port, store = agent_store
    prefixes = []
    for program in range(2):
        ranks = [subprocess.Popen([sys.executable, "-c", ONE_PROGRAM, str(rank), str(port)], text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for rank in range(2)]
        outputs = [rank.communicate(timeout=60) for rank in ranks]
        for rank, (out, err) in zip(ranks, outputs):
            assert rank.returncode == 0 and out.startswith("met at "), err
        assert len({out for out, _ in outputs}) == 1  # both ranks of a program met under one attempt
        prefixes.append(outputs[0][0])
    assert len(set(prefixes)) == 2 and store.check([state_key("slurmdist/7/-/-/-/0")])


def test_a_rank_told_another_world_size_fails_every_rank_naming_both():
    port, outcome = free_port(), {}
    first = start_rank(port, 0, 3, outcome, "rank 0")
    wait_for_arrivals(port, env_of(0, 3, port), [0])
    threads = [first, start_rank(port, 2, 3, outcome, "rank 2")]
    wait_for_arrivals(port, env_of(0, 3, port), [0, 2])
    threads.append(start_rank(port, 1, 2, outcome, "rank 1"))
    for thread in threads:
        thread.join(60)
    for name, error in outcome.items():
        assert isinstance(error, RendezvousError), name
        # Every rank reads it before rank 0 closes its store (the one told otherwise never counted itself in).
        assert "rank 1 was told WORLD_SIZE=2 but ranks before it were told 3" in str(error), name
        assert "SLURMDIST_INIT_TIMEOUT" not in str(error), name
    assert set(outcome) == {"rank 0", "rank 1", "rank 2"}


def test_a_rank_that_died_in_the_gloo_mesh_is_named(agent_store):
    # Ranks 0 and 1 checked in; rank 2 checked in too, then died before publishing its gloo address. The
    # others' process group times out on rank 2's key: that rank is named, not just "every rank arrived".
    import torch.distributed as dist

    port, agent = agent_store
    meetings = [connect(env_of(rank, 3, port), Deadline(20), AGENT_ENVIRON) for rank in range(3)]
    meetings[0].wait_all()
    prefixed = dist.PrefixStore(meetings[0].keys.prefix + "/pg", meetings[0].store)
    with pytest.raises(RuntimeError) as gloo_timeout:  # what gloo's connect step raises, for real
        prefixed.wait(["/cpu//0/2"], timedelta(seconds=0.2))
    with pytest.raises(RendezvousError, match=r"every rank arrived, but: .*\(rank 2 checked in but never joined "
                                              r"the gloo mesh: it exited or hung after checking in") as raised:
        meetings[1].fail(gloo_timeout.value)
    # Every rank came, and rank 2 is named: a longer timeout would not bring it back, so that is not the advice.
    assert "SLURMDIST_INIT_TIMEOUT" not in str(raised.value) and "See that rank's log" in str(raised.value)


def test_a_group_that_failed_after_every_rank_arrived_names_no_one_and_says_what_else_it_can_be(agent_store):
    # A mesh that cannot connect (gloo on an interface the others cannot reach), with no rank to blame.
    port, agent = agent_store
    meetings = [connect(env_of(rank, 2, port), Deadline(20), AGENT_ENVIRON) for rank in range(2)]
    meetings[0].wait_all()
    with pytest.raises(RendezvousError, match=r"every rank arrived, but: Connection refused") as raised:
        meetings[1].fail(RuntimeError("Connection refused"))
    assert "cannot reach each other's gloo address (GLOO_SOCKET_IFNAME" in str(raised.value)
    assert "Raise SLURMDIST_INIT_TIMEOUT only if they are slow" in str(raised.value)


def test_a_verdict_that_no_rank_reported_is_not_turned_into_every_rank_arrived(agent_store):
    # Ranks that waited in vain for the reporter (a big world, a busy store) wrote that verdict: who arrived
    # is unknown, so this rank's own failure is added to it, not presented as the one thing that went wrong.
    port, agent = agent_store
    meeting = connect(env_of(1, 2, port), Deadline(20), AGENT_ENVIRON)
    agent.set(meeting.keys.verdict, "no rank reported within 5 s")
    with pytest.raises(RendezvousError, match=r": no rank reported within 5 s; this rank: connection reset \(world"):
        meeting.fail(RuntimeError("connection reset"))


def test_the_time_a_failure_took_is_reported_even_past_the_timeout():
    deadline = Deadline(0.01)
    time.sleep(0.05)
    assert deadline.elapsed() >= 0.05 > deadline.seconds


def test_every_rank_arrives():
    outcome, _ = meet(4, [3, 2, 1, 0], timeout=30)
    assert outcome == {0: None, 1: None, 2: None, 3: None}


def test_missing_ranks_are_named_on_every_present_rank():
    outcome, port = meet(5, [0, 2, 3], timeout=1.5)
    assert set(outcome) == {0, 2, 3}
    for exc in outcome.values():
        assert isinstance(exc, RendezvousError)
        assert "3 of 5 ranks arrived; rank(s) 1,4 never arrived" in str(exc)
        assert f"127.0.0.1:{port}" in str(exc)


# Rank 0 first among the missing, maybe with a rank that checked in just after the report: '0', '0-1', '0,2'.
MISSING_FROM_0 = r"0(?:[-,][\d,-]+)?"


def test_a_store_the_others_met_at_without_rank_0_is_questioned(agent_store):
    # A leftover run's store on the port answers like ours: rank 0 could not listen and said so; the others
    # joined the stranger and waited for rank 0 there.
    port, _ = agent_store  # a store as a leftover run's rank 0 (or torchrun's agent) left it
    outcome, _ = meet(3, [1, 2], timeout=1, port=port)
    for rank, exc in outcome.items():
        # Ranks 1 and 2 wait for rank 0's state until the deadline. They used to check in and report then, and
        # named each other (and themselves) missing; the store never had rank 0's owner key: not ours.
        assert f"rank {rank}: the store at 127.0.0.1:{port} answered" in str(exc), str(exc)
        assert "rank 0 never wrote to it" in str(exc) and "Set MASTER_PORT to a free port" in str(exc)
        assert "never arrived" not in str(exc)
    # Under an agent rank 0 never listens: its absence is only that.
    import torch.distributed as dist

    port = free_port()
    agent = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=60), wait_for_workers=False)
    outcome, _ = meet(3, [1, 2], timeout=1, port=port, environ=AGENT_ENVIRON)
    for exc in outcome.values():
        assert re.search(rf"rank\(s\) {MISSING_FROM_0} never arrived", str(exc)), str(exc)
        assert "cannot listen" not in str(exc)
    del agent  # served until here


def test_a_cut_store_is_named_by_the_address_dialled_when_the_launch_gave_none():
    # srun -m arbitrary, MPI: the master address is found during the rendezvous, not given before it.
    deadline = Deadline(5)
    deadline.endpoints.add(("10.1.2.3", 10097))
    unknown = DistEnv("slurm", 1, 1, 4, 2, 0, 2, None, 10097, "7")
    said = str(store_stopped_answering(unknown, deadline))
    assert "the rendezvous store at 10.1.2.3:10097 stopped answering" in said
    assert "another program holds MASTER_PORT" in said and "set MASTER_PORT to a free port" in said


def test_a_rank_that_missed_a_failed_attempt_meets_the_retry_at_an_agents_store(agent_store):
    # torchrun's agent (or slurmdist run's store host) keeps one store across attempts. Ranks 0-1 time out
    # waiting for rank 2 and retry; rank 2 comes only then, on its first attempt. All three meet.
    port, agent = agent_store
    first, _ = meet(3, [0, 1], timeout=1, port=port, environ=AGENT_ENVIRON)
    assert set(first) == {0, 1}
    assert all("rank(s) 2 never arrived" in str(exc) for exc in first.values()), first
    retry, _ = meet(3, [0, 1, 2], timeout=30, port=port, environ=AGENT_ENVIRON)
    assert retry == {0: None, 1: None, 2: None}
    assert agent.get(state_key(run_prefix(env_of(0, 3, port), AGENT_ENVIRON, 0))) == b"1 3"  # moved on once


def test_a_rank_that_checks_in_to_a_failed_attempt_leaves_it_at_once(agent_store):
    # It read the attempt number just before the others gave up: its check-in completes the count, finds
    # their verdict and fails at once, instead of waiting its whole timeout for ranks that have moved on.
    port, agent = agent_store
    meet(2, [0], timeout=0.5, port=port, environ=AGENT_ENVIRON)
    agent.set(state_key(run_prefix(env_of(0, 2, port), AGENT_ENVIRON, 0)), "0 2")  # read before rank 0 failed
    started = time.monotonic()
    with pytest.raises(RendezvousError, match=r"rank\(s\) 1 never arrived") as raised:
        connect(env_of(1, 2, port), Deadline(30), AGENT_ENVIRON)  # gloo's ranks go from check-in to the mesh
    assert time.monotonic() - started < 15  # not the 30 s timeout
    assert "rank 1 came after the others had given up on this attempt" in str(raised.value)  # not a lost rank


@pytest.mark.parametrize("libuv", [True, False], ids=["libuv server", "classic server"])
def test_a_rank_joining_rank_0s_store_waits_for_rank_0_to_write_its_state(libuv):
    # torch's classic server (rank 0's before torch 2.8) wakes no waiter on a key written by compare_set.
    import torch.distributed as dist

    port = free_port()
    served = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=30), wait_for_workers=False,
                           use_libuv=libuv)
    joined = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=20))
    answer = []
    reader = threading.Thread(target=lambda: answer.append(rank0_keys(joined, "job", Deadline(20))))
    reader.start()
    time.sleep(0.3)  # the read waits before rank 0 is there
    started = time.monotonic()
    current_keys(served, "job", 3, served_here=True)
    reader.join(20)
    assert time.monotonic() - started < 5
    assert [(keys.attempt, keys.told, keys.prefix) for keys in answer] == [(0, 3, "job/0")]


def test_every_waiting_rank_hears_go_from_an_agent_on_torchs_classic_server():
    # An agent's store on torch before 2.4 (and rank 0's before 2.8) is the classic server.
    import torch.distributed as dist

    port = free_port()
    agent = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=60), wait_for_workers=False,
                          use_libuv=False)
    started = time.monotonic()
    outcome, _ = meet(3, [0, 1, 2], timeout=20, port=port, environ=AGENT_ENVIRON)
    assert outcome == {0: None, 1: None, 2: None}
    assert time.monotonic() - started < 10, "a rank waited out its timeout for 'go'"
    del agent


def test_a_rank_that_reached_the_store_of_a_failed_attempt_meets_rank_0_on_its_next_store():
    import torch.distributed as dist

    port = free_port()
    base = run_prefix(env_of(0, 2, port), {}, 0)
    failed = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=30), wait_for_workers=False)
    failed.set(state_key(base), "1 2")  # rank 0's attempt 0 failed; it lingers, then serves a fresh store
    outcome, meetings = {}, []  # rank 0's store must outlive rank 1's reads: kept in `meetings`

    def rank_main(rank):
        try:
            meetings.append(connect(env_of(rank, 2, port), Deadline(30), {}))
            meetings[-1].wait_all()
            outcome[rank] = None
        except Exception as exc:  # asserted on below
            outcome[rank] = exc

    late = threading.Thread(target=rank_main, args=(1,))
    late.start()
    time.sleep(1)
    assert late.is_alive()  # waiting for the failed attempt's store to close
    del failed
    first = threading.Thread(target=rank_main, args=(0,))
    first.start()
    late.join(30), first.join(30)
    assert outcome == {0: None, 1: None}
    assert {meeting.keys.attempt for meeting in meetings} == {0}  # met on rank 0's fresh store


def test_only_local_rank_0_of_another_node_says_where_it_reached_the_master(agent_store):
    # 127.0.0.2 stands for the master's node seen from another node: no loopback shortcut, so a reach.
    port, agent = agent_store
    def env(rank, local_rank):
        return DistEnv("torchrun", rank, local_rank, 4, 2, 1, 2, "127.0.0.2", port, "7")

    second = connect(env(3, 1), Deadline(20), AGENT_ENVIRON)
    assert second.reach == "127.0.0.2" and not agent.check([second.keys.reach])
    first = connect(env(2, 0), Deadline(20), AGENT_ENVIRON)
    assert agent.get(first.keys.reach) == b"127.0.0.2"


@pytest.mark.parametrize("second_node_reached_at, recorded", [
    ("127.0.0.1", "127.0.0.1"),  # every node on this machine (loopback shortcut): loopback, once all are in
    ("127.0.0.2", "127.0.0.2"),  # a node that reached the master elsewhere keeps its word
])
def test_the_last_rank_in_records_loopback_when_no_node_said_how_it_reached_the_master(
    agent_store, second_node_reached_at, recorded
):
    port, agent = agent_store

    def env(rank, addr):  # two nodes of one rank each
        return DistEnv("torchrun", rank, 0, 2, 1, rank, 2, addr, port, "7")

    second = connect(env(1, second_node_reached_at), Deadline(20), AGENT_ENVIRON)
    assert not agent.check([second.keys.reach]) or second_node_reached_at != "127.0.0.1"
    first = connect(env(0, "127.0.0.1"), Deadline(20), AGENT_ENVIRON)  # the last one in
    assert first.master_reach() == recorded


def test_a_rank_joining_a_store_whose_attempt_failed_waits_for_it_to_close_then_joins_again():
    # Rank 0 serves a fresh store for every attempt; the one it still lingers on is on its way out.
    import torch.distributed as dist

    port = free_port()
    served = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=30), wait_for_workers=False)
    served.set(state_key("job"), "1 3")
    joined = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))
    answer = []
    reader = threading.Thread(target=lambda: answer.append(rank0_keys(joined, "job", Deadline(30))))
    reader.start()
    time.sleep(0.5)
    assert reader.is_alive()  # not before the store closes
    del served
    reader.join(20)
    assert answer == [None]


def test_a_rank_waiting_at_a_store_that_stays_open_joins_again_when_rank_0_announces_it_left():
    # Something still holds rank 0's old group (a DDP model), so its store never closes: only the mark tells
    # a rank that came back from shutdown() first, and joined it, that rank 0 serves the next group elsewhere.
    import torch.distributed as dist

    port = free_port()
    served = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=30), wait_for_workers=False)
    joined = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))
    answer = []
    reader = threading.Thread(target=lambda: answer.append(rank0_keys(joined, "job/1", Deadline(30))))
    reader.start()
    time.sleep(0.3)
    assert reader.is_alive()  # waiting for rank 0's state under the next group's keys
    started = time.monotonic()
    announce_closing(served, "job/1")
    reader.join(20)
    assert answer == [None] and time.monotonic() - started < 5
    assert served.get(state_key("job/1")) == STORE_CLOSING.encode()  # the store itself still serves
    assert served.timeout == timedelta(seconds=30)  # the old group's waits keep their own bound


def slurm_step(rank, world, port, step):
    """Rank `rank` of srun step `step` of job 7 on one node, and its environ."""
    return DistEnv("slurm", rank, rank, world, world, 0, 1, "127.0.0.1", port, "7"), {"SLURM_STEP_ID": str(step)}


def test_a_rank_that_joined_another_steps_store_is_told_so_at_once():
    # Two concurrent steps given one MASTER_PORT: step 0's rank 0 serves there, step 1's cannot listen beside it,
    # and step 1's other ranks reach step 0's store, where their rank 0 never comes.
    port = free_port()
    env, environ = slurm_step(0, 2, port, 0)
    first = connect(env, Deadline(60), environ)
    env, environ = slurm_step(1, 4, port, 1)
    started = time.monotonic()
    with pytest.raises(RendezvousError) as raised:
        connect(env, Deadline(60), environ)
    assert time.monotonic() - started < OWNER_CHECK_AFTER + 10  # not the 60 s timeout
    said = str(raised.value)
    assert f"rank 1: the rendezvous store at 127.0.0.1:{port} is another run's (job 7 step 0; this is job 7 step 1" \
        in said, said
    assert f"two runs use port {port} at once" in said and "its own MASTER_PORT" in said
    del first  # served until here


def test_a_rank_at_its_own_runs_earlier_store_waits_there_past_the_owner_check():
    # After shutdown() a fast rank can reach the store rank 0 served for the group before: the same run, not
    # another's. It waits for rank 0's word there, as before the owner was written.
    import torch.distributed as dist

    port = free_port()
    served = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=30), wait_for_workers=False)
    served.set(OWNER_KEY, "slurmdist/7/0/-/-/0")
    joined = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))
    answer = []
    reader = threading.Thread(target=lambda: answer.append(rank0_keys(joined, "slurmdist/7/0/-/-/1", Deadline(30))))
    reader.start()
    reader.join(OWNER_CHECK_AFTER + 1)
    assert reader.is_alive() and answer == []  # past the owner check, still waiting
    announce_closing(served, "slurmdist/7/0/-/-/1")
    reader.join(20)
    assert answer == [None]


def test_a_rank_whose_store_closes_each_time_it_joins_gives_up_at_the_deadline_saying_so():
    # Rank 0 restarting over and over (or a program serving a store in its place that says it is closing):
    # the rank joins again and again, bounded by the init timeout, then says what it saw.
    import torch.distributed as dist

    port = free_port()
    env, environ = slurm_step(1, 2, port, 0)
    served = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=30), wait_for_workers=False)
    base = run_prefix(env, environ, 0)
    served.set(OWNER_KEY, base)
    announce_closing(served, base)  # every time this rank arrives, rank 0 has just left
    with pytest.raises(RendezvousError) as raised:
        connect(env, Deadline(1.5), environ)
    said = str(raised.value)
    assert said.startswith(f"rank 1 joined the rendezvous store at 127.0.0.1:{port} but lost it, again and again "
                           "for 1.5 s (world size 2; last: it closed before rank 0 checked in there): rank 0 keeps "
                           "restarting, or another program holds MASTER_PORT"), said
    del served


def test_runs_are_told_apart_and_named():
    assert same_run("slurmdist/7/0/-/-/0", "slurmdist/7/0/-/-/3")
    assert not same_run("slurmdist/7/0/-/-/0", "slurmdist/7/1/-/-/0")
    assert not same_run("slurmdist/7/0/-/-/0", "slurmdist/8/0/-/-/0")
    assert describe_run("slurmdist/7/1/-/-/0") == "job 7 step 1"
    assert describe_run("slurmdist/nojob/-/abc/2/0") == "no Slurm job torchrun run abc restart 2"
    assert describe_run("junk") == "'junk'"


def test_a_store_rank_0_never_wrote_to_is_no_slurmdist_rank_0s(agent_store):
    # Rank 0 writes its state, then its owner key, the moment its store listens; a frozen rank 0 freezes the
    # store's thread too, which then does not answer. A store that answered to the deadline with neither is
    # another program's: said as such, not as rank 0 missing at attempt 0.
    import torch.distributed as dist

    port, _ = agent_store
    joined = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=0.5))
    with pytest.raises(ForeignStore) as foreign:
        rank0_keys(joined, "job", Deadline(0.5))
    assert foreign.value.owner is None
    joined.set(OWNER_KEY, "job")  # the owner there, its state not (yet): rank 0 is this run's, and missing
    keys = rank0_keys(joined, "job", Deadline(0.5))
    assert (keys.attempt, keys.told) == (0, None)


def test_a_rank_whose_agent_went_away_as_it_joined_says_so():
    # The port answered the poll, then the connection was dropped: the agent exited just then.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]

        def drop_every_connection():
            while True:
                try:
                    listener.accept()[0].close()
                except OSError:
                    return

        threading.Thread(target=drop_every_connection, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(RendezvousError, match=rf"rank 1 could not join the rendezvous store its agent serves "
                                                  rf"at 127.0.0.1:{port} \(world size 2\).*has just exited"):
            connect(env_of(1, 2, port), Deadline(5), AGENT_ENVIRON)
        assert time.monotonic() - started < 15


def test_rank_0_serves_an_ipv6_master_to_ranks_that_dial_it_over_ipv6():
    # Rank 0 takes the loopback shortcut on its own node; the others dial the IPv6 master address itself.
    port = free_port()
    served, _ = open_store("127.0.0.1", port, 0, 2, Deadline(10), serve=True, master_addr="::1")
    joined, peer = open_store("::1", port, 1, 2, Deadline(10), candidates=["::1"])
    joined.set("from", "rank 1")
    assert peer == "::1" and served.get("from") == b"rank 1"


def test_a_master_with_ipv6_addresses_only_is_told_how_to_reach_rank_0_over_ipv6():
    with pytest.raises(RendezvousError, match=r"resolves to IPv6 addresses only \(::1\).*set MASTER_ADDR to rank "
                                              r"0's IPv6 address"):
        wait_listening("node1", free_port(), Deadline(0.2), 2, ["::1"])


def test_rank_0_never_started():
    outcome, port = meet(2, [1], timeout=0.5)
    assert isinstance(outcome[1], RendezvousError)
    assert f"rank 1: nothing listens at the rendezvous store 127.0.0.1:{port}" in str(outcome[1])  # in a shared log
    assert "raise SLURMDIST_INIT_TIMEOUT" in str(outcome[1])  # what set the bound here


def test_the_advice_names_the_timeout_that_was_given_not_the_variable_it_overrode():
    with pytest.raises(RendezvousError, match=r"or raise init\(\)'s timeout\)") as raised:
        wait_listening("127.0.0.1", free_port(), Deadline(0.2, "init()'s timeout"), 2)
    assert "--no-store" not in str(raised.value)  # init()'s rank 0 serves the store itself: no command to end


def test_busy_port():
    with socket.socket() as squatter:
        squatter.bind(("", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(RendezvousError, match=f"cannot listen on the rendezvous port {port}"):
            connect(env_of(0, 2, port), Deadline(5), {})


@pytest.mark.parametrize(
    "layout, says, fix",
    [
        ({"MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, "the pmi launch gives no master port", "MASTER_PORT"),
        ({"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}, "the pmi launch spans several nodes and gives no master",
         "MASTER_ADDR and MASTER_PORT"),
        ({"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1", "MASTER_PORT": "29500"},
         r"spans several nodes and gives no master address \(MASTER_PORT is set, MASTER_ADDR is not\)",
         "MASTER_ADDR (rank 0's host)"),
        ({"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1", "MASTER_ADDR": "node1"},
         r"the pmi launch gives no master port \(MASTER_ADDR is set, MASTER_PORT is not\)", "MASTER_PORT (a free port"),
    ],
)
def test_an_mpi_launch_without_mpi4py_says_what_it_lacks(monkeypatch, layout, says, fix):
    # MPICH / Intel MPI give no port even on one node, so they need mpi4py there too (Open MPI does not).
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import fails as when it is not installed
    environ = {"PMI_RANK": "1", "PMI_SIZE": "2", **layout}
    with pytest.raises(RendezvousError, match=says) as raised:
        mpi_comm(detect(environ), environ)
    assert "pip install mpi4py" in str(raised.value) and f"set {fix}" in str(raised.value)


def test_resolve_master_keeps_what_detect_gave():
    env = env_of(1, 4, 29500, addr="localhost")
    assert resolve_master(env, environ={}) == env
    assert resolve_master(env.replace(world_size=1, rank=0, local_rank=0, local_world_size=1), environ={}).master_port
    with pytest.raises(RendezvousError, match="MASTER_ADDR"):
        resolve_master(env.replace(master_addr=None), environ={})


@pytest.mark.parametrize("host,hostname,same", [
    ("node1", "node1", True),
    ("NODE1", "node1", True),
    ("node1", "node1.cluster.example", True),
    ("node1.cluster.example", "node1", True),
    ("node1.cluster.example", "node1.cluster.example", True),
    ("localhost", "anything", True),
    ("127.0.0.1", "anything", True),
    ("[::1]", "anything", True),
    ("node2", "node1", False),
    ("node10", "node1", False),
    ("node1.other.example", "node1.cluster.example", False),
    ("10.0.0.5", "node1", False),
    ("node1", "", False),
])
def test_names_this_host(host, hostname, same):
    assert names_this_host(host, hostname) is same


@pytest.mark.parametrize(
    "text, first",
    [
        ("node3\nnode1\n", "node3"),
        ("# comment line\n\n   \nnode2,node1\n", "node2"),
        ("gpu07*4,gpu08*4\n", "gpu07"),
        ("n1 # trailing comment\n", "n1"),
        ("r\\#1\n", "r#1"),  # srun reads '\#' as a literal '#'
    ],
)
def test_hostfile_first_host_reads_as_srun_does(text, first):
    assert hostfile_first_host(text, "/jobs/hosts") == first


@pytest.mark.parametrize("text, words", [("", ["names no host", "MASTER_ADDR"]), ("# only\n", ["names no host"]),
                                          (",node1\n", ["line 1", "host name"]), ("\n-x\n", ["line 2"])])
def test_a_hostfile_without_a_first_host_is_refused_naming_the_file(text, words):
    with pytest.raises(LaunchError) as caught:
        hostfile_first_host(text, "/jobs/hosts")
    assert caught.value.variable == "SLURM_HOSTFILE" and "/jobs/hosts" in str(caught.value)
    assert all(word in str(caught.value) for word in words)


def test_hostfile_master_errors_say_what_to_set(tmp_path):
    arbitrary = {"SLURM_DISTRIBUTION": "arbitrary"}
    with pytest.raises(RendezvousError, match="SLURM_HOSTFILE is not set.*MASTER_ADDR"):
        hostfile_master(arbitrary)
    missing = tmp_path / "gone"
    with pytest.raises(RendezvousError, match=f"{missing}.*cannot read.*MASTER_ADDR"):
        hostfile_master({**arbitrary, "SLURM_HOSTFILE": str(missing)})


def test_an_explicit_master_addr_wins_over_the_arbitrary_layout():
    environ = load_case("slurm/srun_arbitrary_N2_n4")[1]
    assert detect(environ).master_addr is None
    assert detect({**environ, "MASTER_ADDR": "10.1.2.3"}).master_addr == "10.1.2.3"


def test_slurmdist_run_takes_an_arbitrary_layouts_master_from_the_hostfile(tmp_path):
    # resolve_master() is what `slurmdist run` calls before exporting MASTER_ADDR to the command.
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost\nnode1\n")
    environ = {**load_case("slurm/srun_arbitrary_N2_n4")[1], "SLURM_HOSTFILE": str(hostfile)}
    env = resolve_master(detect(environ), environ=environ, timeout=10)
    assert (env.master_addr, env.master_port) == ("localhost", detect(environ).master_port)


def test_a_name_server_that_gives_up_is_told_apart_from_an_unknown_name(monkeypatch):
    def unreachable_name_server(*args, **kwargs):
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", unreachable_name_server)
    with pytest.raises(RendezvousError, match=r"the lookup of master host 'node1' failed \(Temporary failure in name "
                                              r"resolution\): its name server does not answer \(check /etc/resolv.conf"):
        resolve_host("node1", {"PATH": "", "SLURM_CONF": "/nonexistent"}, timeout=1.0)


STUCK_MPI_INIT = "import time\ntime.sleep(60)  # an MPI_Init waiting for a rank that never comes\n"
MANY_FILES_THEN_MPI = """
import os, resource
from slurmdist import mpi_share
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
opened = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # the watcher's pipe then lands above 1023
mpi_share._import_mpi(1.0, "MPI_Init bound hit\\n")
"""


def test_the_mpi_init_bound_holds_in_a_process_with_many_files_open(tmp_path):
    # select() refuses descriptors numbered 1024 or above: the watcher died silently and MPI_Init ran unbounded.
    import os
    import resource
    import signal
    import subprocess

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        missing_prerequisite(f"open descriptors are limited to {hard} here; the test needs 2048")
    (tmp_path / "mpi4py").mkdir()
    (tmp_path / "mpi4py" / "__init__.py").write_text("")
    (tmp_path / "mpi4py" / "MPI.py").write_text(STUCK_MPI_INIT)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", MANY_FILES_THEN_MPI], env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=60)
    # Ended by the watcher, saying why (the stub's MPI_Init alone sleeps 60 s, past this run's timeout).
    assert (proc.returncode, proc.stderr) == (-signal.SIGTERM, "MPI_Init bound hit\n")


def test_one_process_meets_itself_on_loopback_unless_master_addr_is_set():
    # `srun -n1 slurmdist run -- ...`: the nodelist's first name (node1) may not be in DNS, and the command's
    # env:// start would retry it until torch's 30-minute timeout.
    task = load_case("slurm/srun_n1")[0]
    assert detect(task).world_size == 1 and detect(task).master_addr not in (None, LOOPBACK)
    assert resolve_master(detect(task), environ=task, timeout=10).master_addr == LOOPBACK
    chosen = {**task, "MASTER_ADDR": "10.1.2.3"}
    assert resolve_master(detect(chosen), environ=chosen, timeout=10).master_addr == "10.1.2.3"

"""export_env(): torchrun's variables for libraries that read them, from captured launches."""

from __future__ import annotations

import os

import pytest

from slurmdist import SlurmdistError, detect, export_env, torchrun_variables
from tests.conftest import load_case


def test_an_srun_task_exports_slurms_placement_under_torchruns_names(case):
    task = {**case("slurm/srun_N2_tpn2")[3], "MASTER_ADDR": "10.0.0.7"}
    target = {"KEEP": "me"}
    before = dict(os.environ)
    written = export_env(detect(task), target)
    assert os.environ == before  # only the mapping it was given
    assert target == {"KEEP": "me", **written}
    assert {name: written[name] for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                             "GROUP_WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": task["SLURM_PROCID"], "LOCAL_RANK": task["SLURM_LOCALID"], "WORLD_SIZE": task["SLURM_STEP_NUM_TASKS"],
        "LOCAL_WORLD_SIZE": task["SLURM_NTASKS_PER_NODE"], "GROUP_RANK": task["SLURM_NODEID"],
        "GROUP_WORLD_SIZE": task["SLURM_STEP_NUM_NODES"], "MASTER_ADDR": "10.0.0.7"}
    assert 0 < int(written["MASTER_PORT"]) < 65536


def test_a_master_name_not_in_dns_is_exported_as_slurms_node_addr(case, tmp_path, monkeypatch):
    # After init(), the ranks on the master's node hold its name (they met over loopback); a library's env://
    # start dials it from every rank, and a name not in DNS failed there (torch retried until its timeout).
    conf = tmp_path / "slurm.conf"
    conf.write_text("NodeName=nosuchnode-s44 NodeAddr=127.0.0.44 CPUs=2\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setenv("PATH", "")  # no scontrol to ask: slurm.conf says it
    env = detect(case("slurm/srun_N2_tpn2")[1]).replace(master_addr="nosuchnode-s44", master_port=29544)
    assert export_env(env, {})["MASTER_ADDR"] == "127.0.0.44"
    assert export_env(env.replace(master_addr="localhost"), {})["MASTER_ADDR"] == "localhost"  # in DNS: as it is
    assert export_env(env.replace(master_addr="10.9.8.7"), {})["MASTER_ADDR"] == "10.9.8.7"  # no lookup at all


def test_a_single_process_gets_a_port_for_env_init():
    written = export_env(detect({}), {})
    assert (written["WORLD_SIZE"], written["RANK"], written["MASTER_ADDR"]) == ("1", "0", "127.0.0.1")
    assert 0 < int(written["MASTER_PORT"]) < 65536


def test_mpi_across_nodes_refuses_to_export_a_master_it_does_not_know_yet():
    # Open MPI over several nodes: rank 0's address is agreed over mpi4py inside init(), not known here. A
    # library reading the variables would fail later without them, far from the cause.
    rank = {**load_case("mpi/openmpi_np4")[1], "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    target: dict = {}
    with pytest.raises(SlurmdistError, match=r"this openmpi launch gives no MASTER_ADDR and MASTER_PORT yet .*"
                                             r"export_env\(slurmdist.init\(\)\).*resolve_master\(env\)"):
        export_env(detect(rank), target)
    assert target == {}
    # The pure mapping leaves them out, for callers that want only the ranks.
    written = torchrun_variables(detect(rank))
    assert "MASTER_ADDR" not in written and "MASTER_PORT" not in written
    assert (written["RANK"], written["WORLD_SIZE"]) == ("1", "4")
    # MPICH and the other PMI launchers give no port even on one node.
    mpich = load_case("mpi/mpich_np4")[1]
    with pytest.raises(SlurmdistError, match=r"this pmi launch gives no MASTER_PORT yet .*torchrun_variables\(env\)"):
        export_env(detect(mpich), target)
    resolved = detect(rank).replace(master_addr="10.0.0.7", master_port=29500)
    assert export_env(resolved, target)["MASTER_ADDR"] == "10.0.0.7"


def test_arguments_of_the_wrong_kind_say_what_was_expected():
    # Not "'str' object has no attribute 'get'" from deep inside.
    with pytest.raises(TypeError, match="environ='RANK=0' must be a mapping of variable names to values"):
        detect("RANK=0")
    # Values as a test writes them by mistake: not "'int' object has no attribute 'strip'" from a reader, and
    # bytes names (os.environb) not taken silently for "no launcher".
    rank = load_case("torchrun/standalone_np4")[0]
    for wrong, message in [
        ({**rank, "RANK": 1}, r"environ\['RANK'\]=1: .* not int; write RANK='1'"),
        ({**rank, "MASTER_PORT": 29500}, "not int; write MASTER_PORT='29500'"),
        ({**rank, "SLURM_JOB_ID": None}, "not NoneType; leave the name out"),
        ({b"RANK": b"1", b"WORLD_SIZE": b"2"}, r"environ\[b'RANK'\]=b'1': .* not bytes; decode them"),
        (os.environb, "not bytes; decode them"),
    ]:
        with pytest.raises(TypeError, match=message):
            detect(wrong)
    for call in (export_env, torchrun_variables):
        with pytest.raises(TypeError, match="expected the DistEnv that slurmdist.detect.. or slurmdist.init.. returned"):
            call(None)
    # Found in an API trial: AttributeErrors from inside, or a float accepted into the env.
    from slurmdist.rendezvous import resolve_master

    with pytest.raises(TypeError, match="expected the DistEnv that slurmdist.detect.. or slurmdist.init.. returned"):
        resolve_master(None)
    with pytest.raises(TypeError, match="environ=5 must be a mapping to set the variables in"):
        export_env(detect({}), 5)
    for field, value, shown in (("rank", "1", "'1'"), ("world_size", 2.0, "2.0"), ("local_rank", True, "True"),
                                ("master_port", "29500", "'29500'")):
        with pytest.raises(TypeError, match=rf"DistEnv.{field}={shown} must be an int"):
            detect({}).replace(**{field: value})
    assert detect({}).replace(master_port=None).master_port is None  # optional fields take None

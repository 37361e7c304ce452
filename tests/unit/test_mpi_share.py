"""Node numbering for MPI launches across nodes, from every rank's "HOST LOCAL_WORLD_SIZE" (by rank)."""

from __future__ import annotations

import sys

import pytest

from slurmdist import detect
from slurmdist.errors import RendezvousError
from slurmdist.mpi_share import HOST_ENTRY_SIZE, _padded, mpi_comm, number_nodes, with_node_numbers


def entries(*hosts: str, per_node: int = 2) -> list:
    return [f"{host} {per_node}" for host in hosts]


def test_nodes_are_numbered_in_the_order_of_their_lowest_rank():
    # mpirun's default (by slot) and a round-robin map (--map-by node) alike: rank 0's node is node 0.
    by_slot = entries("b", "b", "a", "a")
    assert [number_nodes(by_slot, rank) for rank in range(4)] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    by_node = entries("b", "a", "b", "a")
    assert [number_nodes(by_node, rank) for rank in range(4)] == [(0, 2), (1, 2), (0, 2), (1, 2)]


def test_uneven_nodes_count_each_their_own_ranks():
    uneven = ["n1 3", "n1 3", "n2 1", "n1 3"]
    assert [number_nodes(uneven, rank) for rank in range(4)] == [(0, 2), (0, 2), (1, 2), (0, 2)]


def test_names_that_contradict_the_launchers_counts_number_nothing():
    # Two containers with one host name, or a launch that fakes its node-local variables: no guess.
    assert number_nodes(entries("worker", "worker", "worker", "worker"), 0) == (None, None)
    assert number_nodes(["a 2", "a 1"], 0) == (None, None)  # one host, two different per-node counts
    assert number_nodes(entries("a", "a", "", ""), 0) == (None, None)  # a name too long to share


def test_a_name_too_long_for_its_slot_is_left_out_not_cut():
    assert bytes(_padded("n" * 10 + " 2", HOST_ENTRY_SIZE)).rstrip(b"\0") == b"nnnnnnnnnn 2"
    assert not any(_padded("n" * HOST_ENTRY_SIZE + " 2", HOST_ENTRY_SIZE))


def test_host_names_fill_in_only_what_the_launcher_left_out():
    from slurmdist.distenv import DistEnv

    def env(node_rank, num_nodes):
        return DistEnv("openmpi", 2, 0, 4, 2, node_rank, num_nodes, "10.0.0.1", 29500, None)

    assert with_node_numbers(env(None, None), 1, 2) == env(1, 2)  # Open MPI: neither
    assert with_node_numbers(env(1, None), 1, 2) == env(1, 2)  # PALS numbers its nodes, does not count them
    assert with_node_numbers(env(None, 2), 1, 2) == env(1, 2)  # Flux counts them
    assert with_node_numbers(env(None, 2), None, None) == env(None, 2)  # contradicting names: Flux's count stays
    assert with_node_numbers(env(None, 3), 1, 2) == env(None, 3)  # disagreeing with the launcher: no guess
    assert with_node_numbers(env(2, None), 1, 2) == env(2, None)  # PALS says node 2: kept


# What mpi4py's MPI module does on import in each case (its own messages), for a PMI launch across nodes.
NO_LIBRARY = 'raise RuntimeError("cannot load MPI library libmpi.so.40: cannot open shared object file")'
INIT_FAILED = 'raise RuntimeError("MPI_Init_thread() failed [error code: 1]")'
NOT_INITIALIZED = "Is_finalized = Is_initialized = lambda: False"  # mpi4py.rc.initialize = False


@pytest.mark.parametrize("module, says", [
    (NO_LIBRARY, "mpi4py cannot load an MPI library .*libmpi.so.40.*MPI4PY_LIBMPI"),
    (INIT_FAILED, r"MPI could not start in this process \(MPI_Init_thread\(\) failed.*--mpi=pmix"),
    (NOT_INITIALIZED, r"MPI is not initialized in this process .*mpi4py.rc.initialize = False.*MPI.Init\(\)"),
])
def test_an_mpi_that_cannot_start_is_a_rendezvous_error_saying_why(tmp_path, monkeypatch, module, says):
    # Not mpi4py's RuntimeError past `except SlurmdistError`, nor an abort from inside MPI.
    package = tmp_path / "mpi4py"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "MPI.py").write_text(module + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    environ = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
    real = mpi4py_modules()
    try:
        with pytest.raises(RendezvousError, match=says):
            mpi_comm(detect(environ), environ, timeout=30)
    finally:  # the stand-in's modules must not reach the tests after this one
        mpi4py_modules()
        sys.modules.update(real)


def mpi4py_modules() -> dict:
    """Take mpi4py's modules out of sys.modules, and return them."""
    return {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] == "mpi4py"}

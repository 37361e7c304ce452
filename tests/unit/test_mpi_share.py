"""Node numbering for MPI launches across nodes, from every rank's "HOST LOCAL_WORLD_SIZE" (by rank)."""

from __future__ import annotations

from slurmdist.mpi_share import HOST_ENTRY_SIZE, _padded, number_nodes


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

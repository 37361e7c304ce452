"""Which interface gloo binds: pure choices over address tables, and this machine's own interfaces read for real."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
from types import SimpleNamespace

import pytest

from slurmdist import detect, interfaces, process_group
from slurmdist.errors import BackendError
from tests.conftest import default_route_device, ip_command, load_case

V4 = socket.inet_pton(socket.AF_INET, "10.1.0.7")
V6 = socket.inet_pton(socket.AF_INET6, "fd00::7")
TABLE = {
    "lo": [socket.inet_pton(socket.AF_INET, "127.0.0.1"), socket.inet_pton(socket.AF_INET6, "::1")],
    "eth0": [V4],
    "ib0": [socket.inet_pton(socket.AF_INET, "10.2.0.7"), V6],
}


@pytest.mark.parametrize("address, name", [
    ("10.1.0.7", "eth0"),
    ("10.2.0.7", "ib0"),
    ("fd00::7", "ib0"),
    ("fd00:0:0::7%ib0", "ib0"),  # another spelling, with a zone
    ("127.0.0.1", "lo"),
    ("10.9.9.9", None),  # not this host's
    ("node1", None),  # a name is not an address: never looked up here
])
def test_the_interface_holding_an_address(address, name):
    pairs = [(interface, packed) for interface, addresses in TABLE.items() for packed in addresses]
    assert interfaces.interface_holding(address, pairs) == name


@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1", True), ("127.0.1.1", True), ("127.0.0.11", True), ("::1", True),
    ("10.1.0.7", False), ("fd00::7", False), ("node1", False), ("", False),
])
def test_loopback_addresses(address, loopback):
    assert interfaces.is_loopback(address) is loopback


def test_chosen_only_for_a_group_and_never_over_the_user():
    assert interfaces.wanted(4, {}, {})
    assert not interfaces.wanted(1, {}, {})
    assert not interfaces.wanted(4, {"GLOO_SOCKET_IFNAME": "ib0"}, {})
    assert not interfaces.wanted(4, {}, {"GLOO_SOCKET_IFNAME": "ib0"})
    assert interfaces.wanted(4, {"GLOO_SOCKET_IFNAME": ""}, {})  # set but empty is no choice


def test_a_user_choice_is_checked_against_this_hosts_interfaces():
    interfaces.check_user_choice("eth0", ["lo", "eth0"])
    interfaces.check_user_choice("eth0,ib0", ["lo", "eth0", "ib0"])  # gloo takes a list: one device each
    interfaces.check_user_choice("eth0,", ["lo", "eth0"])  # torch drops the empty piece after a trailing comma
    interfaces.check_user_choice("eth0:1", ["lo", "eth0"])  # an IPv4 alias label, which gloo matches
    with pytest.raises(BackendError) as caught:
        interfaces.check_user_choice("eth0,ib1", ["lo", "eth0", "ib0"])
    message = str(caught.value)
    assert "GLOO_SOCKET_IFNAME='eth0,ib1'" in message and "'ib1'" in message
    assert "eth0, ib0, lo" in message  # what it could have been
    assert "unset GLOO_SOCKET_IFNAME" in message


# --- this machine, for real: the kernel's routes and interfaces (loopback exists on every Linux host) ---


def test_the_local_cluster_nodes_reach_each_other_over_loopback():
    # scripts/local-cluster gives node N the NodeAddr 127.0.0.(10+N): the route to it leaves through lo.
    assert interfaces.source_address("127.0.0.11") == "127.0.0.1"
    assert interfaces.interface_towards("127.0.0.11") == "lo"
    assert interfaces.interface_towards("::1") == "lo"


def test_one_node_binds_loopback_and_several_need_an_address():
    assert interfaces.gloo_interface(None, single_node=True) == "lo"
    assert interfaces.gloo_interface(None, single_node=False) is None  # unknown: gloo keeps its own choice
    assert interfaces.gloo_interface("127.0.0.12", single_node=False) == "lo"


def test_a_renamed_loopback_interface_is_found_by_its_route(monkeypatch):
    # No interface called lo holds 127.0.0.1 (a renamed loopback): the route to 127.0.0.1 says which does.
    monkeypatch.setattr(interfaces, "LOOPBACK_INTERFACE", "no-such-interface")
    asked = []
    real_towards = interfaces.interface_towards
    monkeypatch.setattr(interfaces, "interface_towards", lambda where: asked.append(where) or real_towards(where))
    assert interfaces.gloo_interface(None, single_node=True) == "lo"
    assert asked == ["127.0.0.1"]


def test_one_node_asks_for_lo_alone(monkeypatch):
    monkeypatch.setattr(interfaces, "interface_towards", lambda where: pytest.fail("the route was asked"))
    assert interfaces.loopback_interface() == "lo"


@pytest.mark.parametrize("reach, chosen", [
    ("fe80::1", None),  # a link-local master: its zone is this node's business, the interface cannot be told
    ("127.0.0.11", "lo"),  # the local cluster's node 1
])
def test_init_warns_on_a_multi_node_group_when_it_cannot_tell_gloos_interface(reach, chosen, caplog, monkeypatch):
    # gloo then binds what the node's name resolves to (127.0.1.1 on Debian), which other nodes cannot reach.
    task = load_case("slurm/srun_N2_tpn2")[2]  # rank 2, on the second node
    meeting = SimpleNamespace(env=detect(task), master_reach=lambda: reach)
    monkeypatch.setenv(interfaces.GLOO_INTERFACE_VARIABLE, "unset below, restored after the test")
    monkeypatch.delenv(interfaces.GLOO_INTERFACE_VARIABLE)
    monkeypatch.setitem(process_group._state, "interface", None)
    with caplog.at_level(logging.WARNING, logger="slurmdist"):
        process_group._choose_gloo_interface(meeting, task)
    assert os.environ.get(interfaces.GLOO_INTERFACE_VARIABLE) == chosen
    warned = [r.getMessage() for r in caplog.records if "no interface towards the master" in r.getMessage()]
    if chosen is None:  # says which rank, which address, and what to set
        assert len(warned) == 1 and all(part in warned[0] for part in ("rank 2 ", f"({reach})", "GLOO_SOCKET_IFNAME"))
    else:
        assert warned == []


@pytest.mark.parametrize("master, own_name, expected", [
    ("127.0.0.11", False, "lo"),  # Slurm's NodeAddr for the master node: trusted, other nodes use it too
    ("node1", False, None),  # never a name: the CLI passes the address the name resolved to
    (None, False, None),
])
def test_slurmdist_run_across_nodes(master, own_name, expected):
    assert interfaces.gloo_interface_for_command(master, single_node=False, own_name=own_name) == expected


def test_slurmdist_run_on_a_master_whose_name_is_loopback_binds_the_default_routes_interface():
    # Debian's `127.0.1.1 node1` in /etc/hosts: gloo's own choice would be 127.0.1.1, which no other node
    # reaches. iproute2 says which device the default route leaves through (none: gloo keeps its choice).
    expected = default_route_device()
    assert interfaces.gloo_interface_for_command("127.0.1.1", single_node=False, own_name=True) == expected


def test_slurmdist_run_on_one_node_binds_loopback():
    assert interfaces.gloo_interface_for_command("127.0.1.1", single_node=True, own_name=True) == "lo"


def _ip_addr() -> list:
    """`ip -j addr` (iproute2): the reference this module's ioctl and /proc reading must agree with."""
    return json.loads(subprocess.run([ip_command(), "-j", "addr"], capture_output=True, text=True, check=True,
                                     timeout=10).stdout)


def test_every_interface_address_is_read_as_iproute2_reports_it():
    table = {}
    for name, packed in [*interfaces.ipv4_addresses(), *interfaces.ipv6_addresses()]:
        table.setdefault(name, []).append(packed)
    for link in _ip_addr():
        name = link["ifname"]
        ipv4 = [a["local"] for a in link.get("addr_info", []) if a["family"] == "inet"]
        ipv6 = [a["local"] for a in link.get("addr_info", []) if a["family"] == "inet6"]
        if ipv4:  # the interface's first IPv4 address: the one gloo binds when given the name
            assert interfaces.ip_of(ipv4[0]).packed in table[name]
            assert interfaces.interface_with(ipv4[0]) == name
        for address in ipv6:
            assert interfaces.ip_of(address).packed in table[name]
            assert interfaces.interface_with(address) == name
        for address in ipv4[:1] + ipv6:
            if not address.startswith("fe80"):  # link-local needs a zone to route to
                assert interfaces.interface_towards(address) == name, address
    assert "lo" in table

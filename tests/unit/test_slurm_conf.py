"""NodeAddr from slurm.conf text: only plain, unambiguous answers; everything else defers to scontrol."""

from __future__ import annotations

import pytest

from slurmdist.hosts import resolve_host
from slurmdist.slurm_conf import node_addr, read_node_addr

CONF = """\
# cluster
ClusterName=demo
NodeName=DEFAULT CPUs=8 State=UNKNOWN
NodeName=node[1-2] NodeHostname=node[1-2] NodeAddr=10.1.0.[11-12] CPUs=8   # two at once
nodename=gpu[01-03] \\
    nodeaddr=10.2.0.1,10.2.0.2,10.2.0.3 Gres=gpu:4
NodeName=cloud[1-4] State=CLOUD
NodeName=odd[1-2] NodeAddr=10.3.0.1
PartitionName=all Nodes=ALL Default=YES
"""


@pytest.mark.parametrize("node, addr", [
    ("node1", "10.1.0.11"),
    ("node2", "10.1.0.12"),
    ("gpu02", "10.2.0.2"),  # lower-case keys, a continuation line, a comma list
    ("cloud3", None),  # no NodeAddr: set at run time, scontrol knows
    ("odd2", None),  # one address for two names is not a plain answer
    ("node3", None),
    ("DEFAULT", None),
])
def test_node_addr(node, addr):
    assert node_addr(CONF, node) == addr


@pytest.mark.parametrize("text", [
    'NodeName=n[1-2] NodeAddr="10.0.0.[1-2]"\n',  # a quoted value, as slurmctld accepts it
    "NodeName = n[1-2]  NodeAddr = 10.0.0.[1-2]\n",  # spaces around '='
    "NodeName=n[1-2] NodeAddr=10.0.0.\\\n[1-2]\n",  # a continuation joins with no space
    "NodeName=n[1-2] Feature=a\\#b NodeAddr=10.0.0.[1-2] # an escaped '#' is no comment\n",
])
def test_slurms_own_key_value_rules(text):
    assert node_addr(text, "n2") == "10.0.0.2"


def test_a_commented_out_node_line_says_nothing():
    assert node_addr("#NodeName=n1 NodeAddr=10.0.0.1\nNodeName=n1 Feature=x # NodeAddr=10.0.0.2\n", "n1") is None


def test_a_malformed_node_line_defers_to_scontrol():
    assert node_addr("NodeName=n[1-x] NodeAddr=10.0.0.[1-2]\n", "n1") is None


def test_read_node_addr_follows_slurm_conf(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text(CONF)
    assert read_node_addr("node2", {"SLURM_CONF": str(conf)}) == "10.1.0.12"
    assert read_node_addr("node2", {"SLURM_CONF": str(tmp_path / "missing.conf")}) is None


def test_an_unresolvable_master_takes_its_address_from_slurm_conf_without_scontrol(tmp_path):
    conf = tmp_path / "slurm.conf"
    # .invalid never resolves (RFC 6761); no scontrol on PATH: the file alone answers.
    conf.write_text("NodeName=nosuchnode[1-2].invalid NodeAddr=127.0.0.[11-12]\n")
    environ = {"SLURM_CONF": str(conf), "PATH": ""}
    assert resolve_host("nosuchnode2.invalid", environ) == "127.0.0.12"

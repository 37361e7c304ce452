"""The hostlist benchmark compares like with like: its chart, its memo handling and its output checks."""

from __future__ import annotations

from benchmarks import hostlists
from benchmarks.timing import Failure, Stats
from slurmdist import hostlist


def test_the_chart_keeps_peers_whose_label_says_more_than_their_name():
    # Three bracket groups: the peers' labels say their order differs from scontrol's. The chart drew no bar
    # for them, on the one case where a peer was faster.
    results = {"three groups": {"slurmdist": Stats((2.0, 2.0)),
                                "submitit (same hosts, not in scontrol's order)": Stats((1.0, 1.0)),
                                "python-hostlist": Failure("cannot expand it")},
               "10k range": {"slurmdist": Stats((1.0,)), "submitit": Stats((3.0,))}}
    values = hostlists.chart_values(results, ["slurmdist", "submitit", "python-hostlist"])
    assert values == {"slurmdist": [2.0, 1.0], "submitit": [1.0, 3.0], "python-hostlist": [None, None]}


def test_slurmdist_is_timed_with_its_memo_emptied_and_once_more_warm_apart():
    text = "n[00001-02000]"
    hostlist.expand(text)
    assert hostlist._TABLES  # the memo the peers have no counterpart of
    runners, left_out = hostlists.runners_for(text, hostlists.expanders(), None, warm=True)
    assert left_out == {}
    assert hostlists.OURS_WARM in runners and hostlists.OURS in runners
    emptied = []
    original = hostlist.expand

    def watched(text: str):
        emptied.append(not hostlist._TABLES)
        return original(text)

    runners, _ = hostlists.checked_runners(text, original(text), {hostlists.OURS: watched})
    runners[hostlists.OURS]()
    assert emptied == [False, True]  # the output check ran warm; the timed call found the memo empty


def test_a_tool_expanding_to_other_hosts_is_reported_not_timed():
    runners, left_out = hostlists.checked_runners("n[1-3]", ["n1", "n2", "n3"], {
        "right": lambda text: ["n1", "n2", "n3"], "reordered": lambda text: ["n3", "n1", "n2"],
        "wrong": lambda text: ["n1", "n2"], "broken": lambda text: [][1]})
    assert set(runners) == {"right", "reordered (same hosts, not in scontrol's order)"}
    assert left_out["wrong"].reason == "different hosts (2 vs 3)"
    assert left_out["broken"].reason.startswith("cannot expand it (IndexError")

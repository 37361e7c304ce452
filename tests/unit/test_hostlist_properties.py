"""Property-based tests for slurmdist.hostlist.

The default profile stays within a few seconds; HYPOTHESIS_PROFILE=slow runs many more examples.
"""

from __future__ import annotations

import os
from typing import List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from slurmdist import hostlist
from slurmdist.errors import HostlistError
from slurmdist.hostlist import compress, count, expand, first

# Profiles are applied per test (not loaded globally) so that this file never changes other tests' settings.
settings.register_profile("hostlist-default", max_examples=150, deadline=None)
try:
    settings.get_profile("slow")
except InvalidArgument:
    settings.register_profile(
        "slow", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "hostlist-default"))

NAME_CHARS = st.sampled_from("abcnodegpu-._0123456789")
prefixes = st.text(NAME_CHARS, max_size=6)


@st.composite
def hosts(draw: st.DrawFn) -> List[str]:
    """Host lists like real nodelists: shared prefixes, padded numbers, runs, duplicates, any order."""
    pool = draw(st.lists(prefixes, min_size=1, max_size=4))
    out: List[str] = []
    for _ in range(draw(st.integers(0, 12))):
        prefix = draw(st.sampled_from(pool))
        kind = draw(st.sampled_from(["number", "run", "plain", "repeat"]))
        if kind == "plain" or (kind == "repeat" and not out):
            out.append(prefix or "x")
        elif kind == "repeat":
            out.append(draw(st.sampled_from(out)))
        else:
            start = draw(st.integers(0, 1200))
            width = draw(st.integers(0, 5))
            length = 1 if kind == "number" else draw(st.integers(2, 15))
            out.extend(f"{prefix}{n:0{width}d}" for n in range(start, start + length))
    if draw(st.booleans()):
        out = draw(st.permutations(out))
    return out


@PROFILE
@given(hosts())
def test_expand_inverts_compress(hosts_: List[str]) -> None:
    text = compress(hosts_)
    assert expand(text) == hosts_
    assert count(text) == len(hosts_)


@PROFILE
@given(st.lists(st.text(st.characters(blacklist_characters=",[] \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0"),
                        min_size=1, max_size=12), max_size=8))
def test_compress_round_trips_odd_names(hosts_: List[str]) -> None:
    try:
        text = compress(hosts_)
    except HostlistError:
        return  # whitespace of some other kind: refused, never mangled
    assert expand(text) == hosts_


# Strings built from the grammar's own alphabet reach far more interesting cases than st.text() alone.
GRAMMAR = st.text(st.sampled_from("n0123456789[],- -x\t"), max_size=30)
ANY_TEXT = st.one_of(st.text(max_size=40), GRAMMAR)


@PROFILE
@given(ANY_TEXT)
def test_only_hostlist_errors_escape(text: str) -> None:
    for function in (expand, count, first):
        try:
            function(text)
        except HostlistError:
            pass


@PROFILE
@given(ANY_TEXT)
def test_first_and_count_agree_with_expand(text: str) -> None:
    try:
        hosts_ = expand(text)
    except HostlistError:
        try:
            count(text)
        except HostlistError:
            return
        raise AssertionError(f"count accepted {text!r} that expand rejects")
    assert count(text) == len(hosts_)
    if hosts_:
        assert first(text) == hosts_[0]


@st.composite
def valid_lists(draw: st.DrawFn) -> str:
    """Well-formed expressions with several groups, suffixes, padding and odd separators."""
    items = []
    for _ in range(draw(st.integers(1, 4))):
        item = draw(prefixes)
        for _ in range(draw(st.integers(0, 3))):
            ranges = []
            for _ in range(draw(st.integers(1, 3))):
                low = draw(st.integers(0, 130))
                width = draw(st.integers(1, 4))
                high = low + draw(st.integers(0, 12))
                ranges.append(f"{low:0{width}d}" + (f"-{high}" if draw(st.booleans()) else ""))
            item += "[" + ",".join(ranges) + "]" + draw(st.text(NAME_CHARS, max_size=2))
        items.append(item or "h")
    return draw(st.sampled_from([",", " ", ",,", "\n"])).join(items)


@PROFILE
@given(valid_lists())
def test_valid_lists_expand_consistently(text: str) -> None:
    hosts_ = expand(text)
    assert count(text) == len(hosts_)
    assert first(text) == hosts_[0]
    assert expand(compress(hosts_)) == hosts_


def _outcome(function, text: str):
    try:
        return function(text)
    except HostlistError as error:
        return HostlistError, str(error)


# One-item lists, the shape Slurm gives a job, in valid and broken forms: the regex-free path's domain.
LONE_ITEMS = st.one_of(
    valid_lists(),
    st.text(st.sampled_from("n0123456789[]-,x"), max_size=20),
)


@PROFILE
@given(st.one_of(ANY_TEXT, LONE_ITEMS))
def test_the_regex_free_path_answers_as_the_grammar_does(text: str) -> None:
    fast = [_outcome(function, text) for function in (count, first)]
    original = hostlist._lone_item
    hostlist._lone_item = lambda text: None  # every list through the compiled grammar
    try:
        slow = [_outcome(function, text) for function in (count, first)]
    finally:
        hostlist._lone_item = original
    assert fast == slow


@pytest.mark.parametrize("nodelist", ["node1", "node[1-2]", "gpu[001-016,020]", "r01n[001-128]-ib"])
def test_a_jobs_own_nodelist_compiles_no_pattern(nodelist: str) -> None:
    # Every rank reads its nodelist inside init(); compiling the grammar would cost each of them ~1.5 ms.
    hostlist._re.cache_clear()
    count(nodelist), first(nodelist)
    assert hostlist._re.cache_info().currsize == 0


@PROFILE
@given(st.text(st.sampled_from("ab1[]-, 0\t"), min_size=1, max_size=14))
def test_the_single_item_shortcut_agrees_with_the_list_grammar(text):
    # A lone bracketed item is recognised with string methods so that a first expansion does not compile the
    # list pattern; wherever the shortcut says so, the grammar reads that text as that one item too.
    import re

    if hostlist._one_bracketed_item(text):
        assert re.fullmatch(hostlist._GRAMMAR["list"], text)
        assert [m.group() for m in re.finditer(hostlist._GRAMMAR["items"], text)] == [text]

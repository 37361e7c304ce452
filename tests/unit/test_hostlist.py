"""Concrete cases for slurmdist.hostlist, most checked against scontrol 22.05 (see the integration test)."""

from __future__ import annotations

import pytest

from slurmdist.errors import HostlistError
from slurmdist.hostlist import DEFAULT_LIMIT, MAX_NAME_LENGTH, compress, count, expand, first

GOOD = [
    ("", []),
    ("a", ["a"]),
    ("a,b", ["a", "b"]),
    ("a,,b", ["a", "b"]),
    (",a,", ["a"]),
    (",,,", []),
    ("a b\tc\nd", ["a", "b", "c", "d"]),
    ("a , b", ["a", "b"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("n[01-3]", ["n01", "n02", "n03"]),
    ("n[1-03]", ["n1", "n2", "n3"]),
    ("n[098-102]", ["n098", "n099", "n100", "n101", "n102"]),
    ("n[1,02,003]", ["n1", "n02", "n003"]),
    ("n[9-010]", ["n9", "n10"]),
    ("n[99-101]", ["n99", "n100", "n101"]),
    ("n[0]", ["n0"]),
    ("n[00-01]", ["n00", "n01"]),
    ("n[5,1-2]", ["n5", "n1", "n2"]),
    ("n[1,1]", ["n1", "n1"]),
    ("n[1-2,2-3]", ["n1", "n2", "n2", "n3"]),
    ("[1-2]", ["1", "2"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    ("n[1-2][3-4]", ["n13", "n14", "n23", "n24"]),
    # Three groups: the last varies fastest, then the first, then the middle one (scontrol's order).
    ("x[1-2]y[3-4]z[5-6]", ["x1y3z5", "x1y3z6", "x2y3z5", "x2y3z6", "x1y4z5", "x1y4z6", "x2y4z5", "x2y4z6"]),
    ("n[1-2]x[3]", ["n1x3", "n2x3"]),
    ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),
    ("x[1-2]y[3]z", ["x1y3z", "x2y3z"]),
    ("n[1-2],m", ["n1", "n2", "m"]),
    ("n[1-2],n[1-2]", ["n1", "n2", "n1", "n2"]),
    ("a;b,n1-3,x.y_z", ["a;b", "n1-3", "x.y_z"]),
    ("n[4294967295-4294967296]", ["n4294967295", "n4294967296"]),
    ("n[18446744073709551614-18446744073709551615]", ["n18446744073709551614", "n18446744073709551615"]),
    ("n[0000000000000000000001-2]", ["n0000000000000000000001", "n0000000000000000000002"]),
    ("r[01-02]n[1,3]", ["r01n1", "r01n3", "r02n1", "r02n3"]),
    ("n[8-12,0095-0101]", ["n8", "n9", "n10", "n11", "n12"] + [f"n{i:04d}" for i in range(95, 102)]),
    ("n[1-2]\r\nm[3-4]\r\n", ["n1", "n2", "m3", "m4"]),  # a file with CRLF line ends
    ("a\rb", ["a", "b"]),
]


@pytest.mark.parametrize("text, hosts", GOOD)
def test_expand(text: str, hosts: list) -> None:
    assert expand(text) == hosts
    assert count(text) == len(hosts)
    if hosts:
        assert first(text) == hosts[0]


# (input, words the message must contain)
BAD = [
    ("n[3-1]", ["descending", "'3-1'", "position 2", "write '1-3'"]),
    ("n[1,5-2]", ["descending", "'5-2'", "position 4"]),
    ("n[]", ["empty range"]),
    ("[]", ["empty range"]),
    ("n[,1]", ["empty range"]),
    ("n[1,]", ["empty range", "position 4"]),
    ("n[1,,2]", ["empty range"]),
    ("n[1-3", ["unterminated", "position 1"]),
    ("n[", ["unterminated"]),
    ("a,b[1-2", ["unterminated", "position 3"]),
    ("n]", ["stray ']'", "position 1"]),
    ("a,b]", ["stray ']'", "position 3"]),
    ("n[1-3]]", ["stray ']'", "position 6"]),
    ("n[[1]]", ["do not nest", "position 2"]),
    ("n[a]", ["'a'", "digits"]),
    ("n[1a]", ["'1a'"]),
    ("n[1-a]", ["'1-a'"]),
    ("n[1--3]", ["'1--3'"]),
    ("n[1-2-3]", ["'1-2-3'"]),
    ("n[-3]", ["no lower bound"]),
    ("n[1-]", ["no upper bound", "give both"]),
    ("n[+1]", ["'+1'"]),
    ("n[ 1-2]", ["' 1-2'"]),
    ("n[1-2 ]", ["'1-2 '"]),
    ("n[\u0661]", ["digits"]),
    ("n[18446744073709551616]", ["larger than 2**64-1"]),
    ("n[1-99999999999999999999]", ["larger than 2**64-1"]),
    ("a" * (MAX_NAME_LENGTH + 1), ["longer than"]),
    ("n[1-2]" + "x" * MAX_NAME_LENGTH, ["longer than"]),
    ("n[" + "0" * 5000 + "1]", ["longer than"]),
    ("a[1]" * 150, ["longer than"]),
]
# Errors past the first range of the first item: first() does not read that far (see its docstring).
# Each with the first host, read by hand.
LATER = {"n[1,5-2]": "n1", "a,b[1-2": "a", "a,b]": "a"}


@pytest.mark.parametrize("text, words", BAD)
@pytest.mark.parametrize("function", [expand, count, first])
def test_malformed_lists_raise_naming_input(function, text: str, words: list) -> None:
    if function is first and text in LATER:
        assert first(text) == LATER[text]
        return
    with pytest.raises(HostlistError) as caught:
        function(text)
    message = str(caught.value)
    assert repr(text[:40])[1:-1] in message
    for word in words:
        assert word in message
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("text", ["ok,n[3-1]", "ok n]", "ok,m[1-"])
def test_expand_and_count_validate_the_whole_list_but_first_only_the_first_item(text: str) -> None:
    with pytest.raises(HostlistError):
        expand(text)
    with pytest.raises(HostlistError):
        count(text)
    assert first(text) == "ok"


def test_huge_input_is_truncated_in_the_message() -> None:
    text = ",".join(f"n{i}" for i in range(10000)) + ",x]"
    with pytest.raises(HostlistError) as caught:
        expand(text)
    message = str(caught.value)
    assert len(message) < 400
    assert "characters" in message and "stray ']'" in message and "x]" in message


@pytest.mark.parametrize("text", ["", " ", ",,", "\n"])
def test_first_of_an_empty_list_raises(text: str) -> None:
    with pytest.raises(HostlistError, match="names no host, so it has no first one: give a list such as node"):
        first(text)
    assert expand(text) == [] and count(text) == 0


def test_limit_caps_hosts_before_building_them() -> None:
    assert len(expand("n[1-10]", limit=10)) == 10
    for text in ["n[1-11]", "n[1-5],n[1-6]", "a,b,c,d,e,f,g,h,i,j,k", "r[1-4]n[1-3]", "n[1-9],a,b"]:
        with pytest.raises(HostlistError, match="more than 10 hosts"):
            expand(text, limit=10)
    with pytest.raises(HostlistError, match=f"more than {DEFAULT_LIMIT} hosts, more than a job's nodelist holds"):
        expand("n[0-18446744073709551615]")  # only the default says so: a limit the caller chose may be small
    with pytest.raises(HostlistError, match="more than"):
        expand("a[0-99999]b[0-99999]c[0-99999]")


@pytest.mark.parametrize("limit", [0, -1, True, 2.5, None, "10"])
def test_a_limit_that_is_not_a_count_of_hosts_is_refused(limit: object) -> None:
    with pytest.raises(HostlistError, match=f"limit={limit!r} must be a whole number of hosts, 1 or more"):
        expand("n[1-2]", limit=limit)  # type: ignore[arg-type]


def test_count_and_first_need_no_expansion() -> None:
    assert count("n[0-18446744073709551615]") == 2**64
    assert count("a[0-99999]b[0-99999]c[0-99999]") == 10**15
    assert first("n[0-18446744073709551615],m") == "n0"
    assert first("r[07-99]n[0003-5000]-ib,x") == "r07n0003-ib"


def test_single_range_beyond_slurms_64k_is_accepted() -> None:
    hosts = expand("n[1-100000]")
    assert len(hosts) == 100000 and hosts[-1] == "n100000"


COMPRESS = [
    ([], ""),
    (["a"], "a"),
    (["n1"], "n1"),
    (["n1", "n2", "n3", "n5"], "n[1-3,5]"),
    (["n3", "n1", "n2"], "n[3,1-2]"),
    (["n3", "n2", "n1"], "n[3,2,1]"),
    (["n1", "n2", "n2", "n3"], "n[1-2,2-3]"),
    (["n9", "n10"], "n[9-10]"),
    (["n09", "n10"], "n[09-10]"),
    (["n08", "n9"], "n[08,9]"),
    (["n1", "n01"], "n[1,01]"),
    (["n1", "n2", "n01", "n02"], "n[1-2,01-02]"),
    (["n099", "n100", "n101"], "n[099-101]"),
    (["n1", "m1", "n2"], "n1,m1,n2"),
    (["a", "b1", "b2"], "a,b[1-2]"),
    (["1", "2", "3"], "[1-3]"),
    (["a1b", "a2b"], "a1b,a2b"),
    (["x1y2", "x1y3"], "x1y[2-3]"),
    (["n0", "n00", "n000"], "n[0,00,000]"),
    (["n1", "n2", "a", "n3"], "n[1-2],a,n3"),
    (["n99999999999999999999", "n99999999999999999998"], "n99999999999999999999,n99999999999999999998"),
]


@pytest.mark.parametrize("hosts, text", COMPRESS)
def test_compress(hosts: list, text: str) -> None:
    assert compress(hosts) == text
    assert expand(text) == hosts


def test_compress_takes_any_iterable() -> None:
    assert compress(f"n{i}" for i in range(1, 5)) == "n[1-4]"


@pytest.mark.parametrize("host", ["", "a,b", "a[1]", "a]", "a b", "a\tb", "a\nb", "x" * (MAX_NAME_LENGTH + 1)])
def test_compress_rejects_names_it_cannot_round_trip(host: str) -> None:
    with pytest.raises(HostlistError, match="cannot put host name"):
        compress(["n1", host])


@pytest.mark.parametrize("text", ["node1", "n1,n2", b"n1"])
def test_compress_refuses_one_string_which_it_would_read_letter_by_letter(text) -> None:
    with pytest.raises(HostlistError, match="takes a list of host names, not one string.*expand"):
        compress(text)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [None, 5])
def test_compress_refuses_what_is_no_list_of_names(value) -> None:
    with pytest.raises(HostlistError, match=f"takes a list of host names, got {type(value).__name__} {value}$"):
        compress(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("function", [expand, count, first])
@pytest.mark.parametrize("value, hint", [(["n1", "n2"], "compress\\(\\) it or join it"), (b"n[1-2]", "decode it first"),
                                         (5, "got int 5$"), (None, "got NoneType None$")])
def test_the_readers_take_one_string_and_say_so(function, value, hint) -> None:
    # Not an AttributeError or TypeError from deep inside.
    with pytest.raises(HostlistError, match=f"^{function.__name__}\\(\\) takes a hostlist string .*{hint}"):
        function(value)


def test_compress_rejects_non_strings() -> None:
    with pytest.raises(HostlistError, match="not a string"):
        compress(["n1", 2])  # type: ignore[list-item]


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 7])
def test_the_memo_of_formatted_numbers_grows_in_place_and_pads_like_format(width, monkeypatch):
    # Built from thousands and three-digit tails past 999, and extended (not rebuilt) as larger numbers come.
    from slurmdist import hostlist

    monkeypatch.setattr(hostlist, "_TABLES", {})
    for high in (5, 63, 64, 999, 1000, 1023, 4100, 3000, hostlist._TABLE_LIMIT - 1):
        table = hostlist._table(width, high)
        assert table == [f"{i:0{width}d}" for i in range(len(table))] and len(table) > high
    assert expand(f"n[{'0' * (width - 1)}1-{'0' * max(0, width - 4)}1500]")[998:1001] == [
        f"n{i:0{width}d}" for i in (999, 1000, 1001)]


@pytest.mark.parametrize("text, one_item", [
    ("r[01-64]n[001-128]", True), ("c[1-4]r[01-16]n[001-128]", True), ("nid[1,3-5]x", True), ("[1-2]", True),
    ("a,b[1]", False), ("a[1]]", False), ("a[[1]]", False), ("a[1", False), (" a[1]", False), ("a[1]\tb", False),
])
def test_a_lone_bracketed_item_is_told_without_the_list_pattern(text, one_item):
    from slurmdist import hostlist

    assert hostlist._one_bracketed_item(text) is one_item
    if one_item:  # and expands as the grammar would
        assert expand(text) == expand(f"{text},")[:len(expand(text))]


class OtherInteger:
    """An integer type that is not int, as numpy.int64 is: it says so through __index__."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_a_limit_of_another_integer_type_is_taken() -> None:
    assert expand("n[1-3]", limit=OtherInteger(3)) == ["n1", "n2", "n3"]  # type: ignore[arg-type]
    with pytest.raises(HostlistError, match="more than 2 hosts"):
        expand("n[1-3]", limit=OtherInteger(2))  # type: ignore[arg-type]

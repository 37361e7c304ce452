"""Slurm hostlist expressions: ``expand``, ``compress``, ``first``, ``count``.

Slurm hands every job its nodes as a compressed expression (``SLURM_JOB_NODELIST=gpu[01-16,20]``).
The rendezvous needs the first host and the readers need the node count, so this module parses the
grammar exactly as ``scontrol show hostnames`` does, in pure Python, without calling Slurm (which may not be
installed where the job runs, e.g. inside a container).

Grammar (checked against Slurm 22.05's scontrol):

- items are separated by commas, spaces or tabs, and here also by line ends (Slurm takes a newline or a carriage
  return as part of a name; here they let a list be read from a file); empty items are ignored (``a,,b`` is ``a b``);
- an item is a name with zero or more bracket groups ``[r1,r2,...]``; each range is ``N`` or ``LO-HI`` with
  ASCII digits and ``LO <= HI``; numbers are zero-padded to the width of their lower bound as written
  (``n[098-102]``, ``n[1,02,003]``, ``n[01-3]`` gives ``n01 n02 n03``, ``n[9-010]`` gives ``n9 n10``);
- several groups expand as a cartesian product, the last group varying fastest (``a[1-2]b[3-4]`` gives
  ``a1b3 a1b4 a2b3 a2b4``), then the first, the second and so on (``x[1-2]y[3-4]z[5-6]`` gives ``x1y3z5
  x1y3z6 x2y3z5 x2y3z6 x1y4z5 ...``); text after the last group is kept (``gpu[1-2]-ib``: Slurm >= 23.02.5);
- order and duplicates are kept.

Where scontrol 22.05 accepts something that is almost certainly a typo, this module is stricter and raises
:class:`HostlistError`: a ``]`` outside brackets (scontrol keeps ``n]`` as a host name), an unterminated
``[`` (22.05 prints garbage, 23.02 rejects it), an empty upper bound ``n[1-]``, signs or spaces inside
brackets (``n[+1]``, ``n[ 1]``: strtoul accepts them and miscounts the width), numbers above 2**64-1
(Slurm silently saturates them) and host names longer than :data:`MAX_NAME_LENGTH`. It is more lenient in
two places: Slurm refuses a single range of more than 65536 hosts, here only the total is capped (``limit``);
and line ends separate items here, where Slurm keeps them in a name (no Slurm nodelist holds one).
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
from typing import Dict, Iterable, Iterator, List, NoReturn, Optional, Tuple

from slurmdist.envvars import whole_number
from slurmdist.errors import QUOTE_MAX, HostlistError, quoted

__all__ = ["DEFAULT_LIMIT", "MAX_NAME_LENGTH", "compress", "count", "expand", "first"]

#: Default cap on the number of hosts one expression may expand to (bounds memory: about 60 MB of 10-character
#: names, 300 MB of the longest). Far above any job's nodes: the largest machines have some 160,000.
DEFAULT_LIMIT = 1 << 20
# Hosts a list of several items may build before it is counted whole (see expand).
_COUNT_WHOLE_AFTER = 1 << 16
#: Longest host name accepted (DNS names stop at 253); with ``limit`` it bounds expansion memory.
MAX_NAME_LENGTH = 255
#: Slurm keeps range bounds in an unsigned long and saturates anything larger.
_MAX_NUMBER = (1 << 64) - 1
_MAX_DIGITS = len(str(_MAX_NUMBER))

#: What separates items: Slurm's comma, space and tab, and line ends (a list read from a file, CRLF too).
_SEPARATORS = ", \t\r\n"
_SEP = f"[{_SEPARATORS}]"
_PLAIN = rf"[^{_SEPARATORS}\[\]]"
_ITEM = rf"{_PLAIN}*(?:\[[^\[\]]*\]{_PLAIN}*)*"
_GRAMMAR = {
    # Unambiguous (items are non-empty and cannot start with a separator), so matching stays linear even
    # when it fails on a long input.
    "list": rf"{_SEP}*(?:(?={_PLAIN}|\[){_ITEM}(?:{_SEP}+(?={_PLAIN}|\[){_ITEM})*{_SEP}*)?",
    "items": rf"(?={_PLAIN}|\[){_ITEM}",
    "first": rf"{_SEP}*((?={_PLAIN}|\[){_ITEM})(?:{_SEP}|\Z)",
    "separators": rf"{_SEP}+",
    "brackets": r"[\[\]]",
    "body": r"[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*",
    "range": r"([0-9]+)(?:-([0-9]+))?",
    "trailing digits": r"[0-9]*\Z",
    "ambiguous": r"[,\[\]\s]",
}


@functools.lru_cache(maxsize=None)
def _re(name: str) -> "re.Pattern[str]":
    """A pattern of the grammar, compiled on first use: compiling them all takes about 1.5 ms, which every
    rank would pay inside init() although a job's own nodelist takes the regex-free path (_lone_item)."""
    return re.compile(_GRAMMAR[name])


# (low, high, width): one range of a bracket group.
Range = Tuple[int, int, int]


# ---------------------------------------------------------------------------------------------- errors


def _fail(text: str, pos: int, what: str) -> NoReturn:
    """Raise a HostlistError quoting the input and pointing at the offending position."""
    where = f"at position {pos}"
    if len(text) > QUOTE_MAX:
        where += f" (near {text[max(0, pos - 20):pos + 20]!r})"
    raise HostlistError(f"invalid Slurm hostlist {quoted(text)}: {what} {where}")


def _diagnose_brackets(text: str) -> NoReturn:
    """Explain why the bracket structure of ``text`` is wrong (called once the fast check failed)."""
    opened: Optional[int] = None
    for match in _re("brackets").finditer(text):
        pos = match.start()
        if match.group() == "[":
            if opened is not None:
                _fail(text, pos, f"'[' inside the bracket opened at position {opened} (brackets do not nest)")
            opened = pos
        elif opened is None:
            _fail(text, pos, "stray ']' with no matching '['")
        else:
            opened = None
    if opened is not None:
        _fail(text, opened, "unterminated '[' (missing ']')")
    raise AssertionError(f"bracket structure of {text!r} looked wrong but is not")  # pragma: no cover


def _diagnose_body(text: str, pos: int, body: str) -> NoReturn:
    """Explain why the inside of a bracket group (starting at ``pos``) is not a list of ranges."""
    for piece in body.split(","):
        if not piece:
            _fail(text, pos, "empty range inside brackets")
        low, dash, high = piece.partition("-")
        if not low:
            _fail(text, pos, f"range {piece!r} has no lower bound")
        if dash and not high:
            _fail(text, pos, f"range {piece!r} has no upper bound: give both ('1-8') or one number")
        if not _re("range").fullmatch(piece):
            _fail(text, pos, f"range {piece!r} may contain only the digits 0-9 and one '-'")
        pos += len(piece) + 1
    raise AssertionError(f"bracket body {body!r} looked wrong but is not")  # pragma: no cover


# ---------------------------------------------------------------------------------------------- parsing


def _number(digits: str) -> Optional[int]:
    """A bound as an int, None beyond Slurm's unsigned long (leading zeros stripped so int() stays linear)."""
    value = whole_number(digits, _MAX_DIGITS)
    return None if value is None or value > _MAX_NUMBER else value


def _range_pos(pos: int, body: str, index: int) -> int:
    """Offset in the input of range number ``index`` of a bracket body starting at ``pos`` (error path)."""
    return pos + sum(len(piece) + 1 for piece in body.split(",")[:index])


def _parse_group(text: str, pos: int, body: str) -> Tuple[List[Range], int, int]:
    """Ranges of one bracket group at ``pos``, how many numbers it yields and its widest number."""
    if not _re("body").fullmatch(body):
        _diagnose_body(text, pos, body)
    ranges: List[Range] = []
    total = 0
    widest = 0
    for index, (low_digits, high_digits) in enumerate(_re("range").findall(body)):
        width = len(low_digits)
        if width > MAX_NAME_LENGTH:
            _fail(text, _range_pos(pos, body, index), f"number is longer than {MAX_NAME_LENGTH} characters")
        low = _number(low_digits)
        high = _number(high_digits) if high_digits else low
        if low is None or high is None:
            too_big = low_digits if low is None else high_digits
            _fail(text, _range_pos(pos, body, index), f"number {too_big[:40]!r} is larger than 2**64-1, "
                  "which no Slurm node number is: check the list for digits run together")
        if high < low:
            _fail(text, _range_pos(pos, body, index), f"descending range '{low_digits}-{high_digits}': "
                  f"Slurm ranges go up, write '{high_digits}-{low_digits}'")
        ranges.append((low, high, width))
        total += high - low + 1
        widest = max(widest, width, len(str(high)))
    return ranges, total, widest


class _Item:
    """One bracketed item: literal texts around its groups, the groups, and its host count."""

    __slots__ = ("literals", "groups", "size")

    def __init__(self, literals: List[str], groups: List[List[Range]], size: int) -> None:
        self.literals = literals
        self.groups = groups
        self.size = size


def _parse_item(text: str, start: int, item: str) -> _Item:
    """Parse an item known to have balanced, unnested brackets; ``start`` is its offset in ``text``."""
    parts = item.split("[")
    literals = [parts[0]]
    groups: List[List[Range]] = []
    size = 1
    length = len(parts[0])
    pos = start + len(parts[0]) + 1
    for part in parts[1:]:
        body, _, literal = part.partition("]")
        ranges, numbers, widest = _parse_group(text, pos, body)
        groups.append(ranges)
        literals.append(literal)
        size *= numbers
        length += widest + len(literal)
        if length > MAX_NAME_LENGTH:
            _fail(text, start, f"host names would be longer than {MAX_NAME_LENGTH} characters")
        pos += len(part) + 1
    return _Item(literals, groups, size)


def _check_plain(text: str, start: int, name: str) -> None:
    """A name without brackets is a host as is, unless it is absurdly long."""
    if len(name) > MAX_NAME_LENGTH:
        _fail(text, start, f"host name is longer than {MAX_NAME_LENGTH} characters")


def _items(text: str) -> Iterator[Tuple[int, str]]:
    """(offset, item) for every non-empty item, after checking the bracket structure of the whole text."""
    if text and _one_bracketed_item(text):
        yield 0, text
        return
    if not _re("list").fullmatch(text):
        _diagnose_brackets(text)
    for match in _re("items").finditer(text):
        yield match.start(), match.group()


def _spaced(text: str) -> bool:
    """Whether any separator other than a comma (`_SEPARATORS` but the first) is in `text` (the fast paths split
    on commas alone). Written out rather than looped: it runs on every nodelist detect() reads."""
    return " " in text or "\t" in text or "\n" in text or "\r" in text


def _one_bracketed_item(text: str) -> bool:
    """Whether the whole text is one item with closed, unnested brackets and no separator outside them
    (`r[01-64]n[001-128]`): what the list pattern would say of it, found with string methods, so a process's
    first expansion of such a list does not compile that pattern (about 1 ms, more than the expansion)."""
    position = 0
    while True:
        opening = text.find("[", position)
        outside = text[position:] if opening < 0 else text[position:opening]
        if "]" in outside or any(separator in outside for separator in _SEPARATORS):
            return False
        if opening < 0:
            return True
        closing = text.find("]", opening + 1)
        if closing < 0 or "[" in text[opening + 1:closing]:
            return False
        position = closing + 1


def _too_many(text: str, limit: int) -> NoReturn:
    beyond_jobs = ", more than a job's nodelist holds" if limit >= DEFAULT_LIMIT else ""
    raise HostlistError(
        f"Slurm hostlist {quoted(text)} expands to more than {limit} hosts{beyond_jobs}; if that many are "
        "really meant, pass a larger limit= to expand(), or --limit N to `slurmdist hostlist`"
    )


# ---------------------------------------------------------------------------------------------- expansion


def _numbers(low: int, high: int, width: int, before: str = "", after: str = "") -> List[str]:
    """``before + zero-padded number + after`` for low..high.

    Works per decade so that padding is a constant string: an f-string of an int is ~2x faster than any
    per-number padding (format spec, zfill or %-formatting).
    """
    digits = len(str(low))
    if digits == len(str(high)):
        head = before + "0" * (width - digits)
        return [f"{head}{i}{after}" for i in range(low, high + 1)]
    out: List[str] = []
    while low <= high:
        stop = min(high, 10 ** digits - 1)
        head = before + "0" * (width - digits) if width > digits else before
        if after:
            out += [f"{head}{i}{after}" for i in range(low, stop + 1)]
        else:
            out += [f"{head}{i}" for i in range(low, stop + 1)]
        low = stop + 1
        digits += 1
    return out


def _table(width: int, high: int) -> List[str]:
    """Zero-padded numbers 0..high of one width, memoised: a slice of a ready list costs nothing per host.

    Most nodelists are many short ranges of small numbers, where building each number again dominates.
    Only numbers below _TABLE_LIMIT of widths up to _TABLE_WIDTH are kept, so the memo stays under a few MB.
    """
    table = _TABLES.setdefault(width, [])
    if len(table) <= high:  # grown by doubling and extended in place: each number is formatted once
        table += _formatted(width, len(table), min(_TABLE_LIMIT, max(64, 1 << high.bit_length())))
    return table


def _formatted(width: int, start: int, stop: int) -> List[str]:
    """start..stop-1 zero-padded to ``width``. Most processes expand one nodelist, so the memo is usually
    built during that call: from 1000 up, each number is its thousands and a three-digit tail joined in C (as
    in _range_chunks), 3-4x faster than formatting every number, which the peers do."""
    numbers = [f"{i:0{width}d}" for i in range(start, min(stop, _BLOCK))]
    if stop <= _BLOCK:
        return numbers
    tails = _tails()
    low, pad = max(start, _BLOCK), width - _BLOCK_DIGITS
    chunks = [_chunk(str(block).zfill(pad), tails[max(low - block * _BLOCK, 0):stop - block * _BLOCK], "")
              for block in range(low // _BLOCK, (stop - 1) // _BLOCK + 1)]
    return numbers + ",".join(chunks).split(",")


def _tails() -> List[str]:
    """"000".."999", formatted once: the last three digits of every number from 1000 up (see _formatted and
    _range_chunks)."""
    if not _TAILS:
        _TAILS.extend(f"{i:0{_BLOCK_DIGITS}d}" for i in range(_BLOCK))
    return _TAILS


def _padded(low: int, high: int, width: int) -> List[str]:
    """The numbers low..high as Slurm prints them with a lower bound ``width`` digits wide."""
    if high < _TABLE_LIMIT and width <= _TABLE_WIDTH:
        return _table(width, high)[low:high + 1]
    return _numbers(low, high, width)


def _range_chunks(prefix: str, low: int, high: int, width: int, after: str) -> List[str]:
    """The hosts ``prefix + number + after`` for low..high, as comma-joined chunks (see _chunk).

    A number from 1000 up is its thousands, padded to ``width - 3``, followed by three digits from a memo,
    so a range is a few chunks of one head each and ready-made tails: nothing is formatted per host, which
    makes large ranges and large numbers 3-4x faster than formatting each number.
    """
    if high < _TABLE_LIMIT and width <= _TABLE_WIDTH:
        return [_chunk(prefix, _table(width, high)[low:high + 1], after)]
    chunks: List[str] = []
    if low < _BLOCK:
        chunks.append(_chunk(prefix, _numbers(low, min(high, _BLOCK - 1), width), after))
        low = _BLOCK
    tails = _tails()
    pad = width - _BLOCK_DIGITS
    for block in range(low // _BLOCK, high // _BLOCK + 1):
        start = low - block * _BLOCK if block == low // _BLOCK else 0
        stop = high - block * _BLOCK + 1 if block == high // _BLOCK else _BLOCK
        chunks.append(_chunk(prefix + str(block).zfill(pad), tails[start:stop], after))
    return chunks


def _chunk(head: str, numbers: List[str], after: str) -> str:
    """``head + number + after`` for every number, comma-separated, copying each piece once."""
    return head + (after + "," + head).join(numbers) + after


def _join_split(heads: List[str], numbers: List[str], after: str) -> List[str]:
    """Every ``head + number + after``, head varying slowest.

    Host names never contain commas, so the product is built as one string and split in C, which
    allocates the strings faster than concatenating them one at a time.
    """
    return ",".join([_chunk(head, numbers, after) for head in heads]).split(",")


def _expand_item(item: _Item) -> List[str]:
    """All hosts of one bracketed item in Slurm's order: the last group varies fastest, then the first, the
    second, and so on (`x[1-2]y[3-4]z[5-6]`: x1y3z5 x1y3z6 x2y3z5 x2y3z6 x1y4z5 ...). Slurm expands the
    last group of the text before it, and that text again from its own first group."""
    numbers = [[name for low, high, width in ranges for name in _padded(low, high, width)] for ranges in item.groups]
    if len(numbers) > 2:
        return _expand_in_slurms_order(item.literals, numbers)
    heads = [item.literals[0]]
    for group, after in zip(numbers, item.literals[1:]):
        heads = _join_split(heads, group, after)
    return heads


def _expand_in_slurms_order(literals: List[str], numbers: List[List[str]]) -> List[str]:
    """Three groups or more (no cluster names its nodes so): the middle groups vary slowest, the last fastest.
    Every head (all groups but the last, in that order) is built once, and the last group joined to it in C."""
    *leading, last = numbers
    heads = []
    for picked in itertools.product(*reversed(leading)):  # the first group fastest of these
        values = picked[::-1]  # back in the text's order
        heads.append(literals[0] + "".join(value + text for value, text in zip(values, literals[1:-1])))
    return _join_split(heads, last, literals[-1])


# Bounds of at most this many digits fit an unsigned long, so the fast paths need no magnitude check.
_SAFE_DIGITS = _MAX_DIGITS - 1
# Longest name the fast paths can build is prefix + suffix + _SAFE_DIGITS.
_SAFE_AFFIX = MAX_NAME_LENGTH - _SAFE_DIGITS
# Memo of formatted numbers (see _table): numbers below the limit, widths up to _TABLE_WIDTH.
_TABLE_LIMIT = 1 << 14
_TABLE_WIDTH = 6
_TABLES: Dict[int, List[str]] = {}
_TAILS: List[str] = []  # "000".."999" (see _tails)
# Long ranges are built per block of 1000 numbers sharing their leading digits (see _range_hosts).
_BLOCK_DIGITS = 3
_BLOCK = 10 ** _BLOCK_DIGITS


def _fast_bounds(low_digits: str, high_digits: str) -> Optional[Tuple[int, int]]:
    """(low, high) of an ordinary range, None when it needs the careful path."""
    if len(low_digits) > _SAFE_DIGITS or len(high_digits) > _SAFE_DIGITS:
        return None
    low = int(low_digits)
    high = int(high_digits) if high_digits else low
    return None if high < low else (low, high)


def _expand_one_group(prefix: str, body: str, after: str, left: int) -> Optional[List[str]]:
    """Hosts of ``prefix[body]after`` in one pass, or None when the item needs the careful path.

    The common nodelist shape; fusing parse and generation halves the per-range cost. Anything unusual
    (bad syntax, long numbers, descending or oversized ranges) returns None so that ``_parse_item`` can
    raise the precise error.
    """
    if len(prefix) + len(after) > _SAFE_AFFIX or not _re("body").fullmatch(body):
        return None
    chunks: List[str] = []
    total = 0
    for piece in body.split(","):
        low_digits, _, high_digits = piece.partition("-")
        if not high_digits:
            if len(low_digits) > _SAFE_DIGITS:
                return None
            chunks.append(prefix + low_digits + after)  # a single number is printed exactly as written
            total += 1
            continue
        bounds = _fast_bounds(low_digits, high_digits)
        if bounds is None:
            return None
        total += bounds[1] - bounds[0] + 1
        if total > left:
            return None
        chunks += _range_chunks(prefix, bounds[0], bounds[1], len(low_digits), after)
    if total > left:
        return None
    return ",".join(chunks).split(",")


def _count_one_group(body: str) -> Optional[int]:
    """Host count of one bracket group, or None when it needs the careful path (see _expand_one_group)."""
    if not _re("body").fullmatch(body):
        return None
    total = 0
    for piece in body.split(","):
        low_digits, _, high_digits = piece.partition("-")
        bounds = _fast_bounds(low_digits, high_digits)
        if bounds is None:
            return None
        total += bounds[1] - bounds[0] + 1
    return total


def _expand_plain(text: str, limit: int) -> List[str]:
    """Fast path for a list without brackets: just split it."""
    if _spaced(text):
        parts = _re("separators").split(text)
    else:
        parts = text.split(",")
    hosts = [p for p in parts if p]
    if len(hosts) > limit:
        _too_many(text, limit)
    if hosts and max(map(len, hosts)) > MAX_NAME_LENGTH:
        name = next(h for h in hosts if len(h) > MAX_NAME_LENGTH)
        _check_plain(text, text.find(name), name)
    return hosts


def _checked_limit(limit: object) -> int:
    """`limit` as a count of hosts, 1 or more: an int, or a whole number of another integer type (numpy's);
    bool, float or None refused (each would be compared as a number, and wrongly)."""
    whole = None
    if not isinstance(limit, bool):
        try:
            whole = operator.index(limit)  # type: ignore[arg-type]
        except TypeError:
            pass
    if whole is None or whole < 1:
        raise HostlistError(f"limit={limit!r} must be a whole number of hosts, 1 or more")
    return whole


def expand(text: str, *, limit: int = DEFAULT_LIMIT) -> List[str]:
    """Every host of a Slurm hostlist, in Slurm's order, duplicates kept (like ``scontrol show hostnames``).

    Raises HostlistError for a malformed list or one with more than ``limit`` hosts. The count is checked
    before hosts are built: an item is measured before it is built, and a list of several items is counted
    whole once it grows past a few thousand hosts, so a hostile list cannot exhaust memory.
    """
    _check_text(text, "expand")
    if type(limit) is not int or limit < 1:  # the usual case stays these two checks
        limit = _checked_limit(limit)
    if "[" not in text and "]" not in text:
        return _expand_plain(text, limit)
    hosts: List[str] = []
    left = limit
    # Hosts that may be built before the whole list is counted (None: counted, or a single item). Small
    # lists never pay for the count; a large one pays once, which costs less than building it.
    uncounted: Optional[int] = _COUNT_WHOLE_AFTER if limit > _COUNT_WHOLE_AFTER and _several_items(text) else None
    for start, item in _items(text):
        room = left if uncounted is None else min(left, uncounted)
        built = _build_item(text, start, item, room)
        if built is None and uncounted is not None and room < left:
            if count(text) > limit:
                _too_many(text, limit)
            uncounted = None
            built = _build_item(text, start, item, left)
        if built is None:
            _too_many(text, limit)
        left -= len(built)
        if uncounted is not None:
            uncounted -= len(built)
        hosts = _concat(hosts, built)
    return hosts


def _build_item(text: str, start: int, item: str, room: int) -> Optional[List[str]]:
    """The hosts of one item, or None when it has more than ``room``; a malformed item raises."""
    if "[" not in item:
        _check_plain(text, start, item)
        return [item] if room >= 1 else None
    prefix, _, rest = item.partition("[")
    body, _, after = rest.partition("]")
    if "[" not in after:
        fast = _expand_one_group(prefix, body, after, room)
        if fast is not None:
            return fast
    parsed = _parse_item(text, start, item)
    return None if parsed.size > room else _expand_item(parsed)


def _several_items(text: str) -> bool:
    """More than one item (a separator outside brackets is the only way); cheap, no parsing."""
    stripped = text.strip()
    return any(separator in stripped for separator in _SEPARATORS)


def _concat(hosts: List[str], more: List[str]) -> List[str]:
    """``hosts + more`` in place; most lists are one item, whose fresh list is returned without a copy."""
    if not hosts:
        return more
    hosts += more
    return hosts


def _ascii_digits(text: str) -> bool:
    return text.isdigit() and text.isascii()


def _range_digits(piece: str) -> Optional[Tuple[str, str]]:
    """(low, high) digits of a range written ``N`` (high is '') or ``LO-HI``; None unless ASCII digits."""
    low_digits, dash, high_digits = piece.partition("-")
    if _ascii_digits(low_digits) and (not dash or _ascii_digits(high_digits)):
        return low_digits, high_digits
    return None


def _lone_item(text: str) -> Optional[Tuple[str, Optional[List[Tuple[str, str]]], str]]:
    """(prefix, the ranges' digits or None, suffix) when the whole list is one ordinary item -- ``name`` or
    ``prefix[ranges]suffix`` with no separator outside the brackets, as Slurm writes a one-group nodelist --
    else None. Read with string methods only, so a job's own nodelist never compiles the grammar."""
    if _spaced(text):
        return None
    prefix, bracket, rest = text.partition("[")
    if not bracket:
        return None if not text or "," in text or "]" in text else (text, None, "")
    body, closed, after = rest.partition("]")
    if not closed or "," in prefix or "]" in prefix or "[" in body or any(c in after for c in "[],"):
        return None
    if len(prefix) + len(after) > _SAFE_AFFIX:
        return None
    ranges = [_range_digits(piece) for piece in body.split(",")]
    return (prefix, ranges, after) if all(ranges) else None  # type: ignore[return-value]


def count(text: str) -> int:
    """How many hosts ``expand(text)`` gives, validating the whole list without building any host.

    Cheap enough to check a job's nodelist against its node count; no ``limit`` since nothing is built.
    """
    _check_text(text, "count")
    lone = _lone_item(text)
    if lone is not None:
        prefix, ranges, _ = lone
        if ranges is None:
            _check_plain(text, 0, prefix)
            return 1
        # Short numbers in order count here; anything else goes to the grammar, which explains it.
        bounds = [_fast_bounds(*digits) for digits in ranges]
        if all(bounds):
            return sum(high - low + 1 for low, high in bounds)  # type: ignore[misc]
    if "[" not in text and "]" not in text:
        total = 0
        for match in _re("items").finditer(text):
            _check_plain(text, match.start(), match.group())
            total += 1
        return total
    total = 0
    for start, item in _items(text):
        if "[" in item:
            prefix, _, rest = item.partition("[")
            body, _, after = rest.partition("]")
            fast = None
            if "[" not in after and len(prefix) + len(after) <= _SAFE_AFFIX:
                fast = _count_one_group(body)
            total += _parse_item(text, start, item).size if fast is None else fast
        else:
            _check_plain(text, start, item)
            total += 1
    return total


def first(text: str) -> str:
    """The first host of a hostlist without expanding it (the rendezvous host of a job).

    Only the first item is read: its syntax is checked completely (brackets, digits, empty ranges) and the
    range each bracket group starts with is checked for order and size; later ranges and items are not
    looked at, so this stays in microseconds on a list of a thousand fragments.
    """
    _check_text(text, "first")
    lone = _lone_item(text)
    if lone is not None:
        prefix, ranges, after = lone
        if ranges is None:
            _check_plain(text, 0, prefix)
            return prefix
        low_digits, high_digits = ranges[0]
        if _fast_bounds(low_digits, high_digits) is not None:
            return prefix + low_digits + after  # a bound is printed as written
    match = _re("first").match(text)
    if match is None:
        if not text.strip(_SEPARATORS):
            raise HostlistError(f"Slurm hostlist {quoted(text)} names no host, so it has no first one: give a list "
                                "such as node[1-4] (outside a job, $SLURM_JOB_NODELIST is empty)")
        # The scan stops at the first bracket error, which lies in or right after the first item.
        _diagnose_brackets(text)
    start, item = match.start(1), match.group(1)
    if "[" not in item:
        _check_plain(text, start, item)
        return item
    parts = item.split("[")
    pieces = [parts[0]]
    length = len(parts[0])
    pos = start + len(parts[0]) + 1
    for part in parts[1:]:
        body, _, literal = part.partition("]")
        if not _re("body").fullmatch(body):
            _diagnose_body(text, pos, body)
        head = body.split(",", 1)[0]
        _parse_group(text, pos, head)
        pieces += (head.partition("-")[0], literal)
        length += len(pieces[-2]) + len(literal)
        if length > MAX_NAME_LENGTH:
            _fail(text, start, f"host name is longer than {MAX_NAME_LENGTH} characters")
        pos += len(part) + 1
    return "".join(pieces)



# ---------------------------------------------------------------------------------------------- compress


def _split_name(name: str, trailing_digits: "re.Pattern[str]") -> Tuple[str, str]:
    """(prefix, trailing digits) of a host name; digits are empty when Slurm could not range them."""
    digits = trailing_digits.search(name).group()  # type: ignore[union-attr]
    if not digits or _number(digits) is None:
        return name, ""
    return name[: len(name) - len(digits)], digits


def _check_text(text: object, function: str) -> None:
    """A hostlist is one string: anything else would fail deep inside with an AttributeError or TypeError."""
    if not isinstance(text, str):
        hint = ("; decode it first" if isinstance(text, (bytes, bytearray)) else
                "; for a list of host names, compress() it or join it with ','" if isinstance(text, Iterable) else "")
        raise HostlistError(f"{function}() takes a hostlist string such as 'node[1-4]', got {type(text).__name__} "
                            f"{text!r:.60}{hint}")


def _check_host(host: str, ambiguous: "re.Pattern[str]") -> None:
    """Refuse names that ``expand`` would not give back as one host."""
    if not isinstance(host, str):
        raise HostlistError(f"host name {host!r} is not a string")
    if not host or len(host) > MAX_NAME_LENGTH or ambiguous.search(host):
        raise HostlistError(
            f"cannot put host name {quoted(host)} in a Slurm hostlist: names must be 1-{MAX_NAME_LENGTH} "
            "characters without commas, brackets or whitespace"
        )


def _ranges_text(numbers: List[str]) -> str:
    """``1-3,5`` for the digit strings of consecutive hosts sharing a prefix (runs merged, order kept)."""
    out: List[str] = []
    run_start = numbers[0]
    width = len(run_start)
    last = int(run_start)
    run_end = None
    for digits in numbers[1:]:
        value = int(digits)
        if value == last + 1 and digits == str(value).zfill(width):
            run_end = digits
        else:
            out.append(run_start if run_end is None else f"{run_start}-{run_end}")
            run_start, run_end, width = digits, None, len(digits)
        last = value
    out.append(run_start if run_end is None else f"{run_start}-{run_end}")
    return ",".join(out)


def compress(hosts: Iterable[str]) -> str:
    """The shortest Slurm hostlist that ``expand`` turns back into exactly ``hosts`` (order, duplicates).

    Like ``scontrol show hostlist``: adjacent hosts with the same prefix share brackets and consecutive
    numbers of the same width become ranges; nothing is sorted, so the order survives the round trip.
    """
    if isinstance(hosts, (str, bytes)):  # iterating would compress its characters ('n,o,d,e,1')
        raise HostlistError(f"compress() takes a list of host names, not one string ({quoted(str(hosts))}); for a "
                            "hostlist string, expand() it first")
    if not isinstance(hosts, Iterable):
        raise HostlistError(f"compress() takes a list of host names, got {type(hosts).__name__} {hosts!r:.60}")
    items: List[str] = []
    prefix: Optional[str] = None
    numbers: List[str] = []
    trailing_digits, ambiguous = _re("trailing digits"), _re("ambiguous")  # once, not per host
    for host in hosts:
        _check_host(host, ambiguous)
        head, digits = _split_name(host, trailing_digits)
        if digits and head == prefix:
            numbers.append(digits)
            continue
        _flush(items, prefix, numbers)
        if digits:
            prefix, numbers = head, [digits]
        else:
            prefix, numbers = None, []
            items.append(host)
    _flush(items, prefix, numbers)
    return ",".join(items)


def _flush(items: List[str], prefix: Optional[str], numbers: List[str]) -> None:
    """Append the pending run of same-prefix hosts to ``items``."""
    if prefix is None or not numbers:
        return
    if len(numbers) == 1:
        items.append(prefix + numbers[0])
    else:
        items.append(f"{prefix}[{_ranges_text(numbers)}]")

"""A node's NodeAddr from the slurm.conf that slurmd itself reads, without asking slurmctld.

When node names are not in DNS, every rank on the other nodes needs the master node's address. Asking
`scontrol show node` costs each of them an RPC to slurmctld (10-20 ms, and thousands at once on a big job);
the configuration file on the node usually holds the same answer. Only a plain, unambiguous answer is taken:
a `NodeName=` line naming the node with an explicit `NodeAddr=` of matching length. Anything else (no file,
`Include`d node lines, cloud or dynamic nodes whose address is set at run time) returns None, and the
caller asks scontrol.
"""

from __future__ import annotations

import re
from typing import Dict, Iterator, Mapping, Optional

from .errors import HostlistError

DEFAULT_PATH = "/etc/slurm/slurm.conf"
MAX_BYTES = 8 << 20  # a slurm.conf is kilobytes; never read an arbitrary huge file whole


_COMMENT = re.compile(r"(?<!\\)#.*")  # a '#' starts a comment unless escaped ('\#')
_ESCAPE = re.compile(r"\\(.)")
# Slurm's own key=value rule (parse_config.c): spaces may surround '=', a value may be "double quoted".
_OPTION = re.compile(r'(?:^|\s)([A-Za-z][\w.]*)\s*=\s*(?:"([^"]*)"|(\S+))')


def logical_lines(text: str) -> Iterator[str]:
    """Lines as Slurm reads them: comments dropped, a trailing backslash joining the next line (with no
    space between), then backslash escapes removed."""
    pending = ""
    for raw in text.splitlines():
        # The regular expressions only where they can change something: most lines have no '#' and no '\\'.
        line = (_COMMENT.sub("", raw) if "#" in raw else raw).rstrip()
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1]
            continue
        yield _unescape(pending + line)
        pending = ""
    if pending:
        yield _unescape(pending)


def _unescape(line: str) -> str:
    return _ESCAPE.sub(r"\1", line) if "\\" in line else line


def options(line: str) -> Dict[str, str]:
    """`Key=Value` options of one line, keys lower-cased (slurm.conf keys are case-insensitive), quotes
    around a value dropped."""
    return {match.group(1).lower(): match.group(2) if match.group(2) is not None else match.group(3)
            for match in _OPTION.finditer(line)}


def node_addr(text: str, node: str) -> Optional[str]:
    """NodeAddr of `node` in slurm.conf `text`, or None when the file does not say it plainly."""
    from . import hostlist

    for line in logical_lines(text):
        if "nodename" not in line.lower():  # most lines: no need to split them into options
            continue
        fields = options(line)
        names_text = fields.get("nodename")
        if not names_text or names_text.upper() == "DEFAULT":
            continue
        try:
            names = hostlist.expand(names_text)
            if node not in names:
                continue
            addrs = hostlist.expand(fields["nodeaddr"]) if "nodeaddr" in fields else []
        except HostlistError:
            return None
        return addrs[names.index(node)] if len(addrs) == len(names) else None
    return None


def read_node_addr(node: str, environ: Mapping[str, str]) -> Optional[str]:
    """`node_addr` over the file at SLURM_CONF (configless nodes point it at slurmd's copy), else the
    default path; None when it cannot be read."""
    path = environ.get("SLURM_CONF") or DEFAULT_PATH
    try:
        with open(path, encoding="utf-8", errors="replace") as conf:
            text = conf.read(MAX_BYTES)
    except OSError:
        return None
    return node_addr(text, node)

"""Markdown for docs/benchmarks.md: tables of median/min/max with ratios, goals, and the page around them.

Each benchmark's section sits between `<!-- section:NAME -->` markers, so `--only NAME` replaces that section
and keeps the others from the previous full run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from .timing import Failure, Outcome, Stats

ORDER = ("hostlist", "startup", "bootstrap", "scaling")


@dataclass
class Goal:
    """One claim from the issue and what this run measured for it."""

    claim: str
    measured: str
    met: Optional[bool]  # None: could not be measured


@dataclass
class Section:
    """What one benchmark contributes to the page."""

    name: str
    title: str
    lines: List[str] = field(default_factory=list)
    goals: List[Goal] = field(default_factory=list)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def markdown(self) -> str:
        out = [f"## {self.title}", ""]
        if self.goals:
            out += table(["goal", "measured", "met"], [[g.claim, g.measured, _verdict(g.met)] for g in self.goals])
            out.append("")
        out += self.lines
        return "\n".join(out).rstrip() + "\n"


def _verdict(met: Optional[bool]) -> str:
    return "not measured" if met is None else ("**yes**" if met else "**NO**")


def seconds(value: float) -> str:
    """A duration with a unit that keeps three significant digits (rounded first: 0.9996 s is "1 s", not
    "1e+03 ms")."""
    if value < 0:
        return "-" + seconds(-value)
    if value >= 999.5:  # .3g would write 1e+03
        return f"{value:.0f} s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if float(f"{value:.3g}") >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def ratio(peer: float, ours: float) -> str:
    """How many times longer the peer took than slurmdist (above 1: slurmdist is faster)."""
    return f"{peer / ours:.2f}x" if ours > 0 else "n/a"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out


def timing_rows(
    outcomes: Mapping[str, Outcome], reference: str, label: Sequence[str] = (), ratio_title: str = "vs slurmdist"
) -> List[List[str]]:
    """Rows `label..., tool, median, min, max, runs, ratio` for one case; the ratio is each tool's median over
    the reference tool's median (the reference row shows 1.00x)."""
    ref = outcomes.get(reference)
    rows = []
    for tool, outcome in outcomes.items():
        if isinstance(outcome, Failure):
            rows.append([*label, tool, f"failed: {outcome.reason}", "", "", "", ""])
            continue
        rel = ratio(outcome.median, ref.median) if isinstance(ref, Stats) else "n/a"
        name = f"**{tool}**" if tool == reference else tool
        rows.append([*label, name, seconds(outcome.median), seconds(outcome.min), seconds(outcome.max),
                     str(outcome.runs), rel])
    return rows


TIMING_HEADER = ["tool", "median", "min", "max", "runs", "time / slurmdist's"]


def image(section: Section, path: Optional[Path], alt: str) -> None:
    """Link a plot written next to the page (img/NAME.png), or say why there is none."""
    if path is None:
        section.add(f"_(plot {alt!r} not drawn: matplotlib is not installed)_", "")
    else:
        section.add(f"![{alt}](img/{path.name})", "")


def write_page(path: Path, header: str, footer: str, sections: Sequence[Section]) -> None:
    """Write the page, keeping sections of earlier runs that this run did not redo."""
    blocks: Dict[str, str] = _old_blocks(path)
    for section in sections:
        blocks[section.name] = section.markdown()
    body = [header.rstrip() + "\n"]
    for name in [*ORDER, *sorted(set(blocks) - set(ORDER))]:
        if name in blocks:
            body.append(f"<!-- section:{name} -->\n{blocks[name].rstrip()}\n<!-- /section:{name} -->\n")
    body.append(footer.rstrip() + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(body), encoding="utf-8")


def _old_blocks(path: Path) -> Dict[str, str]:
    if not path.exists():
        return {}
    text = path.read_text(encoding="utf-8")
    found = re.finditer(r"<!-- section:(\w+) -->\n(.*?)\n<!-- /section:\1 -->", text, re.S)
    return {match.group(1): match.group(2) + "\n" for match in found}

"""PNG plots for the page. matplotlib is optional: without it the page says which plot is missing."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Tuple

Series = Mapping[str, Tuple[Sequence[float], Sequence[float]]]  # label -> (x values, y values)

# slurmdist always in the same colour, peers in muted ones, so every plot reads the same way.
# Twelve, so that no two of the bootstrap plot's ten launches share one.
_COLOURS = ["#1f77b4", "#d62728", "#7f7f7f", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
            "#17becf", "#393b79", "#000000"]


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _colours(labels: Sequence[str]) -> Dict[str, str]:
    ordered = sorted(labels, key=lambda label: not label.startswith("slurmdist"))
    return {label: _COLOURS[i % len(_COLOURS)] for i, label in enumerate(ordered)}


def lines(path: Path, series: Series, *, title: str, xlabel: str, ylabel: str, loglog: bool = True,
          reference_slope: Optional[str] = None) -> Optional[Path]:
    """One line per label; log-log by default so that a straight line of slope 1 means linear.
    `reference_slope` draws a dotted slope-1 line through that label's first point."""
    plt = _pyplot()
    if plt is None:
        return None
    colours = _colours(list(series))
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label, color=colours[label], linewidth=2 if label.startswith("slurmdist") else 1.3)
    if reference_slope and reference_slope in series and series[reference_slope][0]:
        xs, ys = series[reference_slope]
        ax.plot([xs[0], xs[-1]], [ys[0], ys[0] * xs[-1] / xs[0]], linestyle=":", color="black", label="linear (slope 1)")
    if loglog:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def bars(path: Path, groups: Sequence[str], values: Mapping[str, Sequence[Optional[float]]], *, title: str,
         ylabel: str, log: bool = False) -> Optional[Path]:
    """Grouped bars: one group per case, one bar per tool (None: the tool could not do that case)."""
    plt = _pyplot()
    if plt is None:
        return None
    colours = _colours(list(values))
    # Many tools: the legend goes beside the axes, where it cannot cover a group of bars.
    beside = len(values) > 6
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) + 2) + (3.5 if beside else 0), 4.2), dpi=110)
    width = 0.8 / max(1, len(values))
    for i, (label, ys) in enumerate(values.items()):
        xs = [g + i * width for g in range(len(groups))]
        heights = [y if y is not None else 0.0 for y in ys]
        ax.bar(xs, heights, width=width, label=label, color=colours[label])
        for x, y in zip(xs, ys):  # a bar of height 0 is invisible, on a log axis above all: say so
            if y is None:
                ax.annotate("n/a", (x, 0.02), xycoords=("data", "axes fraction"), ha="center", va="bottom",
                            rotation=90, fontsize=7, color=colours[label])
    ax.set_xticks([g + width * (len(values) - 1) / 2 for g in range(len(groups))])
    ax.set_xticklabels(groups, fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.set(title=title, ylabel=ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    if beside:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=8)
    return _save(plt, fig, path)


def _save(plt, fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})  # no version stamp: reruns only change when numbers do
    plt.close(fig)
    return path

"""`python -m benchmarks [--quick] [--only NAMES] [--ranks 4,8] [--use-allocation] [--out DIR]`.

Runs the chosen benchmarks one after the other and writes DIR/benchmarks.md (default: docs/) with plots in
DIR/img/. A benchmark that fails is reported as failed in the page and the others still run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import List, Optional, Sequence

from . import machine, report
from .context import Context

MODULES = {"hostlist": "hostlists", "startup": "startup", "bootstrap": "bootstrap", "scaling": "scaling"}
TITLES = {"hostlist": "Hostlists", "startup": "Start-up cost", "bootstrap": "Bootstrap latency", "scaling": "Scaling"}
TEXT = Path(__file__).resolve().parent / "text"
DESCRIPTION = ("Measure slurmdist against its peers (torchrun, python-hostlist, submitit, scontrol) in one run and "
               "write DIR/benchmarks.md with plots in DIR/img/. DIR defaults to the repository's docs/, the "
               "committed page: give --out for a trial run, --quick above all.")


def parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=DESCRIPTION)
    parser.add_argument("--quick", action="store_true", help="fewer runs and sizes (a few minutes)")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated subset of: {','.join(MODULES)} (default: all; with --use-allocation, "
                             "bootstrap)")
    parser.add_argument("--ranks", default=None,
                        help="bootstrap world sizes, comma-separated (default: 4,8; --quick: 4)")
    parser.add_argument("--use-allocation", action="store_true",
                        help="bootstrap inside the current Slurm allocation (a GPU cluster) instead of the local "
                             "test cluster: srun with slurmdist vs torchrun on every node")
    parser.add_argument("--out", type=Path, default=machine.REPO / "docs", metavar="DIR",
                        help="directory for benchmarks.md and img/ (default: the repository's docs/)")
    args = parser.parse_args(argv)
    if args.only is None:  # inside an allocation, only the bootstrap runs: the others need this machine alone
        args.only = "bootstrap" if args.use_allocation else ",".join(MODULES)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in MODULES]
    if unknown or not chosen:
        parser.error(f"--only takes names from {','.join(MODULES)}; got {args.only!r}")
    args.only = chosen
    try:
        args.ranks = tuple(int(r) for r in args.ranks.split(",")) if args.ranks else None
    except ValueError:
        parser.error(f"--ranks takes comma-separated integers; got {args.ranks!r}")
    if args.ranks is not None and min(args.ranks) < 2:
        parser.error("--ranks takes world sizes of 2 or more (a rendezvous needs two ranks); got "
                     f"{','.join(map(str, args.ranks))}")
    for given, option, needs in ((args.ranks, "--ranks", "bootstrap"),
                                 (args.use_allocation, "--use-allocation", "bootstrap")):
        if given and needs not in chosen:
            parser.error(f"{option} applies to the {needs} benchmark, which --only {','.join(chosen)} leaves out")
    if args.use_allocation and "scaling" in chosen:  # it starts the local test cluster, inside the allocation
        parser.error("--use-allocation runs the bootstrap benchmark only: leave scaling out of --only")
    if args.use_allocation and "SLURM_JOB_ID" not in os.environ:
        parser.error("--use-allocation runs inside a Slurm allocation (salloc/sbatch): SLURM_JOB_ID is not set")
    try:  # before anything runs: the page is written last, after every benchmark
        (args.out / "img").mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=args.out):
            pass
    except OSError as error:
        parser.error(f"--out {str(args.out)!r}: cannot write there ({error.strerror or error})")
    return args


def run_one(name: str, ctx: Context) -> report.Section:
    """One benchmark's section; a crash becomes a section that says so."""
    started = time.monotonic()
    try:
        module = importlib.import_module(f".{MODULES[name]}", __package__)
        section = module.run(ctx)
    except Exception as exc:
        ctx.say(f"!! {name} failed: {type(exc).__name__}: {exc}")
        section = report.Section(name, TITLES[name])
        section.add(f"**This benchmark failed** in this run: `{type(exc).__name__}: {str(exc)[:300]}`", "", "```",
                    *traceback.format_exc().strip().splitlines()[-12:], "```")
    elapsed = time.monotonic() - started
    section.add("", f"_({name}: {elapsed:.0f} s of wall time{' with --quick' if ctx.quick else ''})_")
    ctx.say(f"   {name} done in {elapsed:.1f} s")
    return section


def header(info: dict) -> str:
    rows = [[key, value] for key, value in info.items()]
    return "\n".join([(TEXT / "intro.md").read_text(encoding="utf-8").rstrip(), "",
                      "Last run (each section below names its own run, machine and load):", "",
                      *report.table(["", ""], rows), ""])


def compile_slurmdist() -> None:
    """Byte-compile slurmdist as installing its wheel would. An editable install under
    PYTHONDONTWRITEBYTECODE (as on this machine) would otherwise recompile every module in every rank,
    and charge that to init(); torch and the peers are measured from their installed, compiled files."""
    import compileall

    import slurmdist

    compileall.compile_dir(str(Path(slurmdist.__file__).parent), quiet=1)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(argv)
    # `timeout`, `kill` and a closed terminal stop a run with a signal, which skips the exit hooks that stop the
    # local cluster it started: end through SystemExit instead, so they run.
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, lambda signum, frame: sys.exit(128 + signum))
    compile_slurmdist()
    info = machine.describe()
    ctx = Context(quick=args.quick, img_dir=args.out / "img", machine=machine.summary(info), ranks=args.ranks,
                  use_allocation=args.use_allocation)
    ctx.say(f"benchmarks: {', '.join(args.only)}{' (quick)' if args.quick else ''} on {ctx.machine}")
    sections: List[report.Section] = [run_one(name, ctx) for name in args.only]
    page = args.out / "benchmarks.md"
    report.write_page(page, header(info), (TEXT / "gpu-cluster.md").read_text(encoding="utf-8"), sections)
    ctx.say(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

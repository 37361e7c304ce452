"""Every `slurmdist` subcommand, given nonsense, exits 2 with a usage line or an error naming the argument,
and never prints a traceback. Two levels:

- real processes (`python -m slurmdist ...`) for a fixed list of nonsense per subcommand;
- hypothesis over generated argument lists, in-process: parsing ends in a Namespace, `--help`, or exit 2,
  and every pure validation step after it (hostlist, sbatch rendering, submit's resources, env) raises
  nothing but a SlurmdistError. Nothing is submitted, executed or written.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
from typing import Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmdist import cli
from slurmdist.errors import SlurmdistError

RELIABILITY_SECTION = "Bad input: the command line"

SLOW = os.environ.get("HYPOTHESIS_PROFILE") == "slow"
FUZZ = settings(max_examples=20_000 if SLOW else 300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

# (argv, what stderr must contain besides "error:"). "usage:" marks argparse's own refusals.
NONSENSE: Dict[str, List[Tuple[List[str], str]]] = {
    "(none)": [([], "usage:"), (["bogus"], "usage:"), (["--nodes", "2"], "usage:"), (["-x"], "usage:")],
    "env": [(["env", "--format"], "usage:"), (["env", "--format", "xml"], "usage:"), (["env", "extra"], "usage:"),
            (["env", "--rank", "3"], "usage:")],
    "run": [(["run"], "needs a command"), (["run", "--bogus"], "usage:"), (["run", "--timeout", "soon", "--", "true"],
            "usage:"), (["run", "--timeout", "-5", "--", "true"], "--timeout"),
            (["run", "--timeout", "nan", "--", "true"], "--timeout"), (["run", "--", "", "train.py"], "name is empty")],
    "hostlist": [(["hostlist"], "usage:"), (["hostlist", "count"], "usage:"), (["hostlist", "shrink", "a"], "usage:"),
                 (["hostlist", "expand", "n["], "unterminated"), (["hostlist", "expand", "n[3-1]"], "descending"),
                 (["hostlist", "first", ""], "names no host"), (["hostlist", "compress", "a]"], "stray"),
                 (["hostlist", "expand", "n[0-18446744073709551615]"], "more than")],
    "sbatch": [(["sbatch"], "needs a command"), (["sbatch", "--nodes", "two", "--", "a"], "usage:"),
               (["sbatch", "--nodes", "-1", "--", "a"], "--nodes"), (["sbatch", "--time", "1:00;id", "--", "a"], "--time"),
               (["sbatch", "--launcher", "ssh", "--", "a"], "usage:"), (["sbatch", "--job-name", "a\nb", "--", "a"],
               "--job-name"), (["sbatch", "--workers-per-node", "0", "--", "a"], "--workers-per-node"),
               (["sbatch", "--signal", "USR2@x", "--", "a"], "--signal"), (["sbatch", "--", ""], "empty")],
    "submit": [(["submit"], "needs a command"), (["submit", "--nodes", "x", "--", "true"], "usage:"),
               (["submit", "--nodes", "-3", "--", "true"], "--nodes"),
               (["submit", "--time", "soon", "--", "true"], "--time"),
               (["submit", "--mem", "lots", "--", "true"], "--mem"), (["submit", "--signal", "NOPE", "--", "true"], "--signal"),
               (["submit", "--sbatch", "=", "--", "true"], "--sbatch"),
               (["submit", "--cluster", "pbs", "--", "true"], "usage:"),
               (["submit", "--gpus-per-node", "2", "--tasks-per-node", "3", "--", "true"], "--tasks-per-node"),
               (["submit", "--", ""], "empty")],
}


def run_cli(argv: List[str]) -> subprocess.CompletedProcess:
    # No launcher or Slurm variables: `env` must see a plain process, submit must not find a cluster.
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "OMPI_", "PMI_", "SUBMITIT"))}
    return subprocess.run([sys.executable, "-m", "slurmdist", *argv], capture_output=True, text=True,
                          timeout=60, env=environ, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", sorted(NONSENSE))
def test_nonsense_exits_2_with_a_message_and_no_traceback(command, reliability_record):
    results = []
    slowest = 0.0
    for argv, expected in NONSENSE[command]:
        started = time.monotonic()
        done = run_cli(argv)
        slowest = max(slowest, time.monotonic() - started)
        results.append((argv, expected, done))
    good = [done.returncode == 2 and "error:" in done.stderr and expected in done.stderr
            and "Traceback" not in done.stderr + done.stdout and done.stdout == "" for _, expected, done in results]
    reliability_record(
        f"`slurmdist {command}` with nonsense arguments",
        "; ".join(" ".join(repr(a) if not a or " " in a or "\n" in a else a for a in argv) or "(nothing)"
                  for argv, _, _ in results),
        "bad arguments", slowest,
        f"{sum(good)}/{len(good)} exit 2 with a usage line or an error naming the argument, no traceback",
    )
    for (argv, expected, done), ok in zip(results, good):
        assert ok, f"{argv}: rc={done.returncode}\nstdout={done.stdout}\nstderr={done.stderr}"


# --- generated argument lists, in-process ---------------------------------------------------------------------

OPTIONS = {
    "env": ["--format"],
    "run": ["--timeout", "--"],
    "hostlist": ["expand", "compress", "first", "count"],
    "sbatch": ["--nodes", "-N", "--gpus-per-node", "-G", "--tasks-per-node", "--workers-per-node", "-c", "--time",
               "--partition", "--account", "--job-name", "--output", "--launcher", "--device", "--signal",
               "--no-requeue", "--share-devices", "--"],
    "submit": ["--nodes", "--gpus-per-node", "--tasks-per-node", "--cpus-per-task", "--time", "--partition",
               "--account", "--mem", "--sbatch", "--setup", "--name", "--signal", "--signal-delay", "--cluster",
               "--wait", "--timeout", "--"],
}
JUNK = ["", "-", "--", "-1", "0", "1", "2", "99999999999999999999", "1.5", "nan", "inf", "-inf", "abc", "text",
        "gpu", "cpu", "srun", "torchrun", "json", "1:00:00", "2-00:00:00", "USR2@120", "n[1-4]", "n[", "]",
        "$(touch canary)", "`id`", "a;b", "a\nb", "'", '"', "\x00", "\u0661", "%j", "--help", "-h", "--bogus"]
tokens = st.one_of(st.sampled_from(JUNK), st.text(max_size=8))


@st.composite
def argument_lists(draw: st.DrawFn) -> List[str]:
    command = draw(st.sampled_from(sorted(OPTIONS)))
    words = [command]
    for _ in range(draw(st.integers(0, 6))):
        words.append(draw(st.one_of(st.sampled_from(OPTIONS[command]), tokens)))
    return words


def validate_parsed(args) -> None:
    """The side-effect-free part of each handler: everything up to (not including) the real action."""
    from slurmdist import sbatch_render, submit, submit_cli

    name = args.handler.__module__ + "." + args.handler.__name__
    if name.endswith("cli._hostlist") or name.endswith("cli._env"):
        args.handler(args)  # pure: parses, prints, or reads this (clean) environment
    elif name.endswith("sbatch_render._sbatch"):
        sbatch_render.render(sbatch_render.spec_from_args(args))
    elif name.endswith("submit_cli.run"):
        submit_cli.command_of(args)
        options = submit_cli.submitter_options(args)
        options.pop("folder"), options.pop("cluster")
        submit.Resources(**options)
    elif name.endswith("cli._run"):
        pass  # exec's the command: parsing is all that can be checked without running anything


def test_generated_arguments_only_exit_2_or_raise_slurmdist_errors(reliability_record, monkeypatch):
    for key in [k for k in os.environ if k.startswith(("SLURM", "OMPI_", "PMI_", "SUBMITIT", "RANK", "WORLD_SIZE"))]:
        monkeypatch.delenv(key)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # `hostlist expand -` reads it: empty, as from /dev/null
    outcomes = {"parsed and valid": 0, "argparse exit 2": 0, "help (exit 0)": 0, "SlurmdistError (exit 2)": 0}

    @FUZZ
    @given(argument_lists())
    def check(argv: List[str]) -> None:
        parser = cli.build_parser()
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                args = parser.parse_args(argv)
            except SystemExit as leaving:
                assert leaving.code in (0, 2), (argv, leaving.code)
                assert "Traceback" not in err.getvalue()
                assert leaving.code == 0 or "usage:" in err.getvalue()
                outcomes["help (exit 0)" if leaving.code == 0 else "argparse exit 2"] += 1
                return
            try:
                validate_parsed(args)
            except SlurmdistError as error:
                assert str(error).strip()
                outcomes["SlurmdistError (exit 2)"] += 1
                return
        outcomes["parsed and valid"] += 1

    started = time.monotonic()
    check()
    total = sum(outcomes.values())
    reliability_record(
        "generated argument lists for every subcommand",
        f"{total} argument lists (option names mixed with empty, negative, huge, non-numeric, shell "
        "metacharacter, NUL and unicode values)", "bad arguments", (time.monotonic() - started) / max(total, 1),
        ", ".join(f"{count} {what}" for what, count in outcomes.items()) + "; nothing else raised",
    )
    assert outcomes["argparse exit 2"] and outcomes["SlurmdistError (exit 2)"]

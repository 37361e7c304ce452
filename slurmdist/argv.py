"""The command after `--` on slurmdist's command line (`run`, `submit`, `sbatch`), checked the same way."""

from __future__ import annotations

import argparse
import shlex
from typing import Any, Callable, List, Sequence

from .errors import SlurmdistError


def command_words(words: Sequence[str], who: str, usage: str,
                  error: Callable[[str], SlurmdistError] = SlurmdistError, program_first: bool = True) -> List[str]:
    """`words` without a leading `--`. Refused when there is no command, or when its name is empty: an unset
    or empty "$PYTHON" in a job script would otherwise fail far away (execve's error, a job that dies at start).
    `program_first`: also when it starts with an option (`-m pkg`), which the task would try to exec (where a
    launcher takes options there, torchrun's `-m`, the caller checks instead)."""
    command = list(words)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise error(f"{who} needs a command: `{usage}`")
    if not command[0].strip():
        raise error(f"{who} -- {shlex.join(command)}: the command's name is empty: a shell variable such as "
                    "\"$PYTHON\" that is unset or empty (in the job script, or this shell)? Give the program to run first")
    if program_first and command[0].startswith("-"):
        raise error(f"{who} -- {shlex.join(command)}: the command starts with an option, not a program: name the "
                    f"program first, e.g. `-- python {shlex.join(command)}`")
    return command


class _Refused(argparse.Action):
    """An option slurmdist does not take, refused with what to give instead (its `const`)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Any = None) -> None:
        raise argparse.ArgumentError(self, self.const)


def refuse_job_wide_counts(parser: Any) -> None:
    """Refuse sbatch's job-wide `--ntasks`/`-n` and `--gpus` by name, saying what slurmdist asks for instead: a
    plain "unrecognized arguments" would not say why sbatch's own spelling is wrong here."""
    parser.add_argument("--ntasks", "-n", action=_Refused, help=argparse.SUPPRESS,
                        const="slurmdist asks for the job's shape as nodes x tasks per node: give --tasks-per-node N "
                              "with --nodes M (M x N tasks in all)")
    parser.add_argument("--gpus", action=_Refused, help=argparse.SUPPRESS,
                        const="sbatch's --gpus counts the whole job's GPUs; slurmdist asks for them per node (one task "
                              "each): give --gpus-per-node N with --nodes M (M x N GPUs in all)")

"""The command after `--` on slurmdist's command line (`run`, `submit`, `sbatch`), checked the same way."""

from __future__ import annotations

import shlex
from typing import Callable, List, Sequence

from .errors import SlurmdistError


def command_words(words: Sequence[str], who: str, usage: str,
                  error: Callable[[str], SlurmdistError] = SlurmdistError) -> List[str]:
    """`words` without a leading `--`. Refused when there is no command, or when its name is empty: an unset
    or empty "$PYTHON" in a job script would otherwise fail far away (execve's error, a job that dies at start)."""
    command = list(words)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise error(f"{who} needs a command: `{usage}`")
    if not command[0].strip():
        raise error(f"{who} -- {shlex.join(command)}: the command's name is empty: a shell variable such as "
                    "\"$PYTHON\" that is unset or empty (in the job script, or this shell)? Give the program to run first")
    return command

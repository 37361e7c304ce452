"""What every benchmark gets from the runner: quick or full, where plots go, the machine, a console."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple


@dataclass(frozen=True)
class Context:
    quick: bool
    img_dir: Path
    machine: str  # one-line summary (machine.summary)
    ranks: Optional[Tuple[int, ...]] = None  # bootstrap sizes asked for with --ranks
    use_allocation: bool = False  # run inside the current Slurm allocation instead of the local cluster

    def say(self, message: str) -> None:
        """Progress on the console: what is compared, how many runs, on which machine."""
        print(message, file=sys.stdout, flush=True)

    def runs(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def header(self, what: str, runs: str) -> str:
        """The line each benchmark prints first and puts at the top of its section."""
        line = f"{what}; {runs}; measured on {self.machine}{' (--quick)' if self.quick else ''}."
        self.say(f"== {line}")
        return line

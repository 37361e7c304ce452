"""Canaries on the real cluster: job names, commands and arguments full of shell syntax are data, never code.

Unit tests (tests/unit/test_sbatch_render.py, test_submit*.py) run rendered scripts against stub launchers;
here the jobs are really submitted: `slurmdist sbatch ... | sbatch` and `slurmdist submit --wait`. Every
nasty word would create a canary file if any shell evaluated it; the job records the argv it received, which
must be the words exactly as typed, and the canary must never appear.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import List

import pytest

from tests.integration.cluster import PYTHON


pytestmark = pytest.mark.integration
RELIABILITY_SECTION = "Bad input: shell injection through job names, commands and arguments"

TIMEOUT = 120
# Prints its argv as JSON into the file named by its first argument (appending: one line per task).
ECHO_ARGV = "import json, sys; open(sys.argv[1], 'a').write(json.dumps(sys.argv[2:]) + '\\n')"
NASTY = [
    "$(touch {canary})", "`touch {canary}`", "'; touch {canary}; echo '", '"; touch {canary}; echo "',
    "x\ntouch {canary}", "a;touch {canary}", "${{IFS}}touch${{IFS}}{canary}", "--flag=$(touch {canary})",
    "|touch {canary}", "&& touch {canary}", "it's", "",
]


def nasty_words(canary: Path) -> List[str]:
    return [word.format(canary=canary) for word in NASTY]


def slurmdist_cli(cluster, *args, timeout: float = TIMEOUT, check: bool = False, **kw):
    return cluster.run([PYTHON, "-m", "slurmdist", *args], timeout=timeout, check=check, **kw)


def wait_for_job(cluster, job_id: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while cluster.run(["squeue", "-h", "-j", job_id], check=False, timeout=30).stdout.strip():
        assert time.monotonic() < deadline, f"job {job_id} still queued or running after {timeout} s"
        time.sleep(0.3)


def argv_records(path: Path) -> List[List[str]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_sbatch_rendered_job_passes_every_word_literally(slurm_cluster, tmp_path, reliability_record):
    canary, record = tmp_path / "canary", tmp_path / "argv.jsonl"
    words = nasty_words(canary)
    started = time.monotonic()
    script = slurmdist_cli(slurm_cluster, "sbatch", "-N2", "--tasks-per-node", "1", "--device", "cpu",
                           "--time", "5", "--output", f"{tmp_path}/%j.out", "--", PYTHON, "-c", ECHO_ARGV,
                           record, *words, check=True).stdout
    submitted = slurm_cluster.run(["sbatch", "--parsable", "--wait"], input=script, timeout=TIMEOUT, check=False)
    calls = argv_records(record)
    reliability_record(
        "`slurmdist sbatch` script submitted with nasty command words",
        f"{len(words)} words: $(), backticks, quotes, ;, |, &&, newline, ${{IFS}}, empty", "shell injection",
        time.monotonic() - started,
        f"job exit {submitted.returncode}; {len(calls)} tasks got the words literally: "
        f"{all(c == words for c in calls)}; canary created: {canary.exists()}",
    )
    assert not canary.exists()
    assert submitted.returncode == 0, submitted.stderr
    assert calls == [words, words]


@pytest.mark.parametrize("name", ["x$(touch {canary})", "x`touch {canary}`", "x\ntouch {canary}", "a;touch {canary}"])
def test_sbatch_refuses_nasty_job_names(slurm_cluster, tmp_path, name, reliability_record):
    canary = tmp_path / "canary"
    done = slurmdist_cli(slurm_cluster, "sbatch", "--job-name", name.format(canary=canary), "--", "true")
    reliability_record(f"`slurmdist sbatch --job-name {name!r}`", "job name", "shell injection", None,
                       f"exit {done.returncode}: {done.stderr.strip().replace(str(canary), '{canary}')[:100]}; "
                       f"canary created: {canary.exists()}")
    assert done.returncode == 2 and "--job-name" in done.stderr and done.stdout == ""
    assert not canary.exists()


SUBMIT_NAMES = ["x\ntouch {canary} #", "x$(touch {canary})", "x`touch {canary}`", "a'; touch {canary}; echo '"]


@pytest.mark.parametrize("name", SUBMIT_NAMES)
def test_submit_job_names_and_arguments_never_run(slurm_cluster, tmp_path, name, reliability_record):
    """`slurmdist submit` through submitit: the name goes into an #SBATCH line, the words into a pickle."""
    canary, record = tmp_path / "canary", tmp_path / "argv.jsonl"
    words = nasty_words(canary)
    started = time.monotonic()
    done = slurmdist_cli(slurm_cluster, "submit", "--nodes", "2", "--time", "5", "--name", name.format(canary=canary),
                         "--folder", tmp_path / "%j", "--wait", "--timeout", str(TIMEOUT), "--",
                         PYTHON, "-c", ECHO_ARGV, record, *words, timeout=TIMEOUT + 30)
    job = re.search(r"submitted job (\d+)", done.stdout)
    if job:
        wait_for_job(slurm_cluster, job.group(1))  # a broken script may still be running: let it finish
    calls = argv_records(record)
    refused = done.returncode == 2 and "Traceback" not in done.stderr
    reliability_record(
        f"`slurmdist submit --name {name!r}` with nasty command words", f"job name + {len(words)} command words",
        "shell injection", time.monotonic() - started,
        ("refused before running (exit 2): " + done.stderr.strip().replace(str(canary), "{canary}")[:90]) if refused else
        f"job exit {done.returncode}; tasks got the words literally: {bool(calls) and all(c == words for c in calls)}"
        + f"; canary created: {canary.exists()}",
    )
    assert not canary.exists(), "a job name ran as shell code in the batch script"
    if "\n" in name:  # the one name that cannot be an #SBATCH line: refused, saying why
        assert refused and "must be one non-empty line of text" in done.stderr, done.stdout + done.stderr
    else:  # the others are names like any: the job runs, and every task gets the words as typed
        assert done.returncode == 0 and calls == [words, words], done.stdout + done.stderr

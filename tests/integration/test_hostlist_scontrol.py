"""slurmdist.hostlist against the real `scontrol show hostnames` / `scontrol show hostlist`.

scontrol needs no daemon, only a slurm.conf naming a cluster and a controller. It exits 0 even when it
rejects a list (the complaint goes to stderr), so rejection is read from its output.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional

import pytest

from slurmdist.errors import HostlistError
from tests.conftest import missing_prerequisite
from slurmdist.hostlist import compress, count, expand

pytestmark = pytest.mark.integration

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "hostlists" / "corpus.txt"
BODY = re.compile(r"[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*")
SINGLE_RANGE_MAX = 65536  # Slurm's MAX_RANGE; slurmdist caps the total host count instead


def corpus() -> List[str]:
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def scontrol_env(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if shutil.which("scontrol") is None:
        missing_prerequisite("scontrol is not installed: install slurm-client (scripts/install-system-deps)")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\n")
    return dict(os.environ, SLURM_CONF=str(conf))


def scontrol(env: dict, what: str, text: str) -> Optional[List[str]]:
    """scontrol's answer as lines, or None when it rejected the list."""
    done = subprocess.run(
        ["scontrol", "show", what, text], env=env, capture_output=True, text=True, timeout=30
    )
    if done.returncode != 0 and "Invalid hostlist" not in done.stdout + done.stderr:
        pytest.fail(f"scontrol failed on {text!r}: {done.stderr}")
    if "Invalid hostlist" in done.stdout + done.stderr:
        return None
    return done.stdout.splitlines()


def uses_suffix(text: str) -> bool:
    """Text after the last bracket of an item: accepted only by Slurm >= 23.02.5."""
    return any(re.search(r"\][^\[\]]+$", item) for item in re.split(r"[, \t\n](?![^\[]*\])", text))


def with_suffixes(env: dict, text: str) -> List[str]:
    """What Slurm >= 23.02.5 gives for `text`: per item, this scontrol's hosts of the item cut after its last
    bracket, each followed by the text that came after that bracket."""
    hosts: List[str] = []
    for item in re.findall(r"(?:[^, \t\n\[]|\[[^\]]*\])+", text):
        head, bracket, suffix = item.rpartition("]")
        answer = scontrol(env, "hostnames", head + bracket if bracket else item)
        assert answer is not None, f"scontrol rejects {head + bracket!r}, the part of {item!r} before its suffix"
        hosts += [host + suffix for host in answer] if bracket else answer
    return hosts


def stricter_reason(text: str) -> Optional[str]:
    """Why slurmdist rejects a list that scontrol 22.05 accepts (documented in slurmdist.hostlist)."""
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
            if depth > 1:
                return "nested bracket"
        elif char == "]":
            depth -= 1
            if depth < 0:
                return "stray ]"
    if depth:
        return "unterminated ["
    for body in re.findall(r"\[([^\[\]]*)\]", text):
        if not BODY.fullmatch(body):
            return "not digits-and-ranges inside brackets"
        if any(int(number) >= 2**64 for number in re.findall(r"[0-9]+", body)):
            return "number above 2**64-1"
    return None


def oversized_range(text: str) -> bool:
    return any(int(hi) - int(lo) + 1 > SINGLE_RANGE_MAX for lo, hi in re.findall(r"([0-9]+)-([0-9]+)", text))


@pytest.mark.parametrize("text", corpus())
def test_expand_matches_scontrol(scontrol_env: dict, text: str) -> None:
    theirs = scontrol(scontrol_env, "hostnames", text)
    if theirs is None:
        if uses_suffix(text) and stricter_reason(text) is None:
            # Slurm >= 23.02.5 accepts text after the last bracket; this older scontrol still answers for
            # each item without it, so the newer answer is built from its own.
            assert expand(text) == with_suffixes(scontrol_env, text)
            return
        if oversized_range(text) and stricter_reason(text) is None:
            # Documented deviation: one range may exceed Slurm's 64K, only the total is capped.
            assert count(text) == len(expand(text))
            return
        with pytest.raises(HostlistError):
            expand(text)
        return
    try:
        ours = expand(text)
    except HostlistError as error:
        assert stricter_reason(text), f"scontrol accepts {text!r} but slurmdist raised {error}"
        assert repr(text[:20])[1:-1] in str(error)
        return
    assert ours == theirs
    assert count(text) == len(theirs)


def test_corpus_is_big_and_covers_rejections(scontrol_env: dict) -> None:
    lines = corpus()
    assert len(lines) >= 300
    rejected = [line for line in lines[:120] if scontrol(scontrol_env, "hostnames", line) is None]
    assert len(rejected) >= 15


def random_hosts(rng: random.Random) -> List[str]:
    prefixes = ["n", "node", "gpu-", "r1n", "", "a.b"]
    hosts = []
    for _ in range(rng.randint(1, 40)):
        number = rng.choice([rng.randint(0, 12), rng.randint(0, 120), rng.randint(90, 1100)])
        width = rng.choice([0, 0, 2, 3, 4])
        hosts.append(rng.choice(prefixes[:3]) + f"{number:0{width}d}")
        if rng.random() < 0.5:  # runs of consecutive numbers, as real nodelists have
            for step in range(1, rng.randint(2, 8)):
                hosts.append(hosts[-1].rstrip("0123456789") + f"{number + step:0{width}d}")
        if rng.random() < 0.1:
            hosts.append(rng.choice(["login", "x1y", "a-b"]))
    return hosts


@pytest.mark.parametrize("seed", range(40))
def test_compress_matches_scontrol_hostlist(scontrol_env: dict, seed: int) -> None:
    rng = random.Random(seed)
    hosts = random_hosts(rng)
    if seed % 2:
        hosts = sorted(set(hosts))
    theirs = scontrol(scontrol_env, "hostlist", ",".join(hosts))
    assert theirs is not None
    assert compress(hosts) == theirs[0]
    assert expand(compress(hosts)) == hosts

"""Shared test helpers: captured launcher environments live in tests/fixtures/<launcher>/<case>/*.env."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Optional

import pytest

from tests.reliability import reliability_record  # noqa: F401  (a fixture, for every test that records a case)

FIXTURES = Path(__file__).parent / "fixtures"

# A shell without job control starts background commands (`make test &`, `nohup make test`) with SIGINT
# ignored, and every process the suite starts would inherit that: the tests of Ctrl-C and of the local
# controller's SIGINT would then wait on processes that cannot hear it. The suite runs as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def unresolved(what: str) -> str:
    """A pattern for the error that says `what` (e.g. "master host 'x.invalid'") did not resolve. This sandbox's
    DNS server leaves about 3 queries in 100 unanswered; such a lookup runs out of time, and the error then
    says so instead of claiming the name is unknown. Both name `what`."""
    return rf"(?:{re.escape(what)} does not resolve|the lookup of {re.escape(what)} (?:took longer|failed))"


@pytest.fixture(autouse=True)
def fresh_warnings():
    """Each test sees slurmdist's once-per-process warnings as a new process would: once."""
    from slurmdist import notices

    notices.forget()
    yield
    notices.forget()


def in_ci() -> bool:
    """CI=true (GitHub, GitLab), CI=1 or yes (others): anything but unset, empty, false, 0 or no."""
    return os.environ.get("CI", "").strip().lower() not in ("", "false", "0", "no")


def missing_prerequisite(message: str) -> None:
    """Skip, or fail under CI=true: a CI run must never pass by skipping what it was meant to test."""
    if in_ci():
        pytest.fail(f"prerequisite missing in CI: {message}", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def require_module(name: str, install: str) -> ModuleType:
    """`importorskip` that fails under CI=true; `install` says how to get the module."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing_prerequisite(f"{name} is not importable ({exc}): {install}")
        raise  # not reached: missing_prerequisite raises


def ip_command() -> str:
    """iproute2's `ip`, the reference the interface code is checked against."""
    found = shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip") if os.path.exists(p)), None)
    if found is None:
        missing_prerequisite("iproute2's `ip` is not installed: scripts/install-system-deps installs it")
    return str(found)


def default_route_device() -> Optional[str]:
    """The device this host's default route leaves through, as `ip route get` says; None without one."""
    route = subprocess.run([ip_command(), "route", "get", "192.0.2.1"], capture_output=True, text=True, timeout=10)
    words = route.stdout.split()
    return words[words.index("dev") + 1] if route.returncode == 0 and "dev" in words else None


def load_env(path: Path) -> Dict[str, str]:
    """One captured process environment (`KEY=VALUE` lines)."""
    env: Dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def load_case(case: str) -> List[Dict[str, str]]:
    """Every process of one captured launch, e.g. ``load_case("slurm/srun_N2_tpn2")``, in file-name order."""
    paths = sorted((FIXTURES / case).glob("*.env"), key=lambda p: (len(p.name), p.name))
    if not paths:
        raise FileNotFoundError(f"no captured environments under {FIXTURES / case}")
    return [load_env(path) for path in paths]


@pytest.fixture
def case():
    return load_case

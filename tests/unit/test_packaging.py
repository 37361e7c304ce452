"""What users install: the wheel carries every module and the PEP 561 marker, and the hints it marks as
checked pass mypy (configured in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import require_module

REPO = Path(__file__).resolve().parents[2]


def test_the_package_type_checks(tmp_path):
    require_module("mypy", "pip install -e '.[dev]'")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("Success: no issues found"), proc.stdout


def test_the_wheel_holds_every_module_and_the_typed_marker(tmp_path):
    require_module("setuptools", "pip install setuptools")
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources it builds.
    source = tmp_path / "source"
    shutil.copytree(REPO / "slurmdist", source / "slurmdist", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "--wheel-dir", str(tmp_path / "wheels"), str(source)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [wheel] = (tmp_path / "wheels").glob("slurmdist-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {p.relative_to(REPO).as_posix() for p in (REPO / "slurmdist").rglob("*.py")}
    assert sources <= names, sorted(sources - names)
    assert "slurmdist/py.typed" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "slurmdist = slurmdist.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_dir_lists_the_public_api_whether_loaded_or_not_and_no_import_helpers():
    import slurmdist

    listed = set(dir(slurmdist))
    assert set(slurmdist.__all__) <= listed  # lazy names too, before first use (tab completion)
    assert not listed & {"importlib", "TYPE_CHECKING", "annotations", "errors"}
    for name in slurmdist.__all__:
        assert getattr(slurmdist, name) is not None


SHUTDOWN_WHILE_LOADING = """
import signal, sys
import slurmdist
# The first lookup of slurmdist.init loads the module that forms groups; a handler's shutdown() that runs
# meanwhile found it half-loaded and raised out of init() in the main thread.
def stop(signum, frame):
    slurmdist.shutdown()
    print("handler ran", flush=True)
signal.signal(signal.SIGUSR1, stop)
import importlib.abc, os
class SignalWhileLoading(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "slurmdist.rendezvous":  # imported by process_group before it defines shutdown()
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGUSR1)
        return None
sys.meta_path.insert(0, SignalWhileLoading())
init = slurmdist.init
print("loaded", callable(init), flush=True)
"""


def test_shutdown_from_a_signal_handler_while_init_first_loads_does_nothing():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SHUTDOWN_WHILE_LOADING], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["handler", "ran", "loaded", "True"], done.stdout + done.stderr

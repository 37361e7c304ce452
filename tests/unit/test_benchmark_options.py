"""The benchmarks' command line refuses what it cannot run before anything starts, and its report words what
the run measured."""

from __future__ import annotations

import pytest

from benchmarks import __main__ as bench
from benchmarks import bootstrap
from benchmarks.report import seconds


@pytest.mark.parametrize("argv, said", [
    (["--ranks", "0"], "--ranks takes world sizes of 2 or more (a rendezvous needs two ranks); got 0"),
    (["--ranks", "1,4"], "got 1,4"),
    (["--ranks", "a"], "--ranks takes comma-separated integers"),
    (["--only", "hostlist", "--ranks", "4"], "--ranks applies to the bootstrap benchmark, which --only hostlist"),
    (["--only", "hostlist", "--use-allocation"], "--use-allocation applies to the bootstrap benchmark"),
    (["--only", "bootstrap,scaling", "--use-allocation"], "--use-allocation runs the bootstrap benchmark only"),
    (["--out", "/proc/no/such"], "--out '/proc/no/such': cannot write there"),
])
def test_options_it_cannot_run_are_refused_before_anything_starts(argv, said, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # --use-allocation's own precondition, met here
    if "--out" not in argv:
        argv = [*argv, "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as usage:
        bench.parse(argv)
    assert usage.value.code == 2
    assert said in capsys.readouterr().err


def test_use_allocation_alone_runs_the_bootstrap(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert bench.parse(["--use-allocation", "--out", str(tmp_path)]).only == ["bootstrap"]
    monkeypatch.delenv("SLURM_JOB_ID")
    assert bench.parse(["--out", str(tmp_path)]).only == list(bench.MODULES)


def test_a_writable_out_is_accepted_and_made(tmp_path):
    args = bench.parse(["--quick", "--only", "bootstrap", "--ranks", "2,4", "--out", str(tmp_path / "new")])
    assert args.ranks == (2, 4) and (tmp_path / "new" / "img").is_dir()


@pytest.mark.parametrize("value, shown", [
    (0.9996, "1 s"), (9.9996e-4, "1 ms"), (9.9996e-7, "1 µs"), (1.5, "1.5 s"), (0.0123, "12.3 ms"),
    (999.7, "1000 s"), (1808.2, "1808 s"), (-2e-3, "-2 ms"), (3e-10, "0.3 ns"),
])
def test_durations_keep_their_unit_at_its_boundary(value, shown):
    assert seconds(value) == shown


def test_the_explanation_speaks_of_the_launches_and_sizes_that_ran(monkeypatch):
    monkeypatch.setattr(bootstrap.os, "cpu_count", lambda: 2)
    local = bootstrap.explanation([4, 8], list(bootstrap.LAUNCHES))
    text = "\n".join(local)
    assert "Here 4-8 ranks share 2 cores, so each millisecond of CPU one rank spends costs every rank up to 4 ms" \
        in text
    assert "- **by hand, no library**" in text and "mpirun is Open MPI" in text
    # Inside an allocation only two launches run, on a machine with cores to spare: no word about the rest.
    monkeypatch.setattr(bootstrap.os, "cpu_count", lambda: 64)
    gpu = "\n".join(bootstrap.explanation([8, 16], list(bootstrap.ALLOCATION_LAUNCHES)))
    assert "by hand" not in gpu and "by-hand" not in gpu and "mpirun" not in gpu and "share 64 cores" not in gpu
    assert "- **per rank**" in gpu and "what separates `slurmdist.init()` from torchrun per rank" in gpu

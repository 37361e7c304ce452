"""The `slurmdist` command line: output formats, `run`, and exit status 2 on errors (never a traceback)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from typing import Iterator

import pytest

from slurmdist import detect
from tests.conftest import default_route_device, load_case

LAUNCHER_PREFIXES = ("SLURM", "OMPI_", "PMI", "MPI_LOCAL", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC",
                     "SUBMITIT", "FLUX_", "JSM_", "PALS_", "MV2_", "GROUP_")


def clean_environ(**extra: str) -> dict:
    """This process's environment without any launcher variables (the test may itself run under one)."""
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    return {**base, **extra}


def slurmdist(*args: str, environ: dict, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurmdist", *args], env=environ, capture_output=True,
                          text=True, timeout=timeout)


@contextlib.contextmanager
def rank_0_listening(task: dict) -> Iterator[None]:
    """What rank 0's `slurmdist run` does for a non-zero rank of `task`: listen on the master port (on every
    IPv4 address, loopback ones included), before which that rank does not start its command."""
    with socket.create_server(("", detect(task).master_port)):
        yield


def placement_from_slurm(task: dict) -> dict:
    """torchrun's variables for an srun task of the srun_N2_tpn2 capture, read straight from Slurm's."""
    return {"RANK": task["SLURM_PROCID"], "LOCAL_RANK": task["SLURM_LOCALID"],
            "WORLD_SIZE": task["SLURM_STEP_NUM_TASKS"], "LOCAL_WORLD_SIZE": task["SLURM_NTASKS_PER_NODE"],
            "GROUP_RANK": task["SLURM_NODEID"], "GROUP_WORLD_SIZE": task["SLURM_STEP_NUM_NODES"]}


def exported_by_eval(environ: dict) -> dict:
    script = 'eval "$(python -m slurmdist env --format shell)" && env'
    result = subprocess.run(["bash", "-c", script.replace("python", sys.executable)],
                            env=environ, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)


def test_env_shell_format_evaluates_to_torchruns_variables():
    # MASTER_ADDR given: node1 of the captured job is not this machine (on the local cluster the name would be
    # replaced by Slurm's NodeAddr, as `slurmdist run` does).
    task = {**load_case("slurm/srun_N2_tpn2")[2], "MASTER_ADDR": "localhost"}
    exported = exported_by_eval(clean_environ(**task))
    expected = {**placement_from_slurm(task), "MASTER_ADDR": "localhost"}
    assert {name: exported[name] for name in expected} == expected
    assert 0 < int(exported["MASTER_PORT"]) < 65536


def test_env_shell_format_gives_a_single_process_a_port():
    # init_process_group's env:// needs MASTER_PORT even for one process; detect() leaves it open there.
    exported = exported_by_eval(clean_environ())
    assert exported["WORLD_SIZE"] == "1" and exported["MASTER_ADDR"] == "127.0.0.1"
    assert 0 < int(exported["MASTER_PORT"]) < 65536


def test_env_shell_format_that_fails_stops_the_eval_and_what_follows_it():
    # `eval "$(slurmdist env --format shell)" && ./train.sh`: eval of no output succeeds, and train.sh ran.
    script = f'eval "$({sys.executable} -m slurmdist env --format shell)" && echo train.sh ran'
    result = subprocess.run(["bash", "-c", script], env=clean_environ(RANK="1"), capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 1 and "train.sh ran" not in result.stdout, result.stdout
    assert "RANK" in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("options, stopped", [
    ("--format shel", True), ("--format shell --bogus", True), ("--format=sh", True),
    ("--format json --bogus", False),  # nobody evals JSON: its stdout stays empty
])
def test_a_mistyped_env_command_line_stops_the_eval_too(options, stopped):
    # argparse's usage error came before slurmdist's own handling: nothing on stdout, eval "" succeeded.
    script = f'eval "$({sys.executable} -m slurmdist env {options})" && echo train.sh ran'
    result = subprocess.run(["bash", "-c", script], env=clean_environ(), capture_output=True, text=True, timeout=30)
    assert result.returncode == (1 if stopped else 0), result
    assert ("train.sh ran" in result.stdout) != stopped
    assert "usage:" in result.stderr


def test_version_prints_the_installed_distributions_version():
    from importlib.metadata import version

    import slurmdist as package

    result = slurmdist("--version", environ=clean_environ())
    assert (result.returncode, result.stdout.strip()) == (0, f"slurmdist {version('slurmdist')}"), result
    assert package.__version__ == version("slurmdist")  # the module's own copy kept in step with pyproject's


def test_env_json_and_text_formats():
    task = load_case("slurm/srun_N2_tpn2")[1]
    result = slurmdist("env", "--format", "json", environ=clean_environ(**task))
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    expected = placement_from_slurm(task)
    assert (shown["rank"], shown["local_rank"], shown["world_size"], shown["local_world_size"],
            shown["node_rank"], shown["num_nodes"]) == tuple(int(expected[name]) for name in expected)
    assert (shown["launcher"], shown["master_addr"], shown["job_id"]) == ("slurm", "node1", task["SLURM_JOB_ID"])
    text = slurmdist("env", environ=clean_environ(**task)).stdout
    rows = dict(line.split(None, 1) for line in text.splitlines() if line.strip())
    assert (rows["rank"], rows["local_rank"], rows["world_size"], rows["local_world_size"], rows["node_rank"],
            rows["num_nodes"]) == tuple(expected.values())
    assert (rows["launcher"], rows["master_addr"], rows["job_id"]) == ("slurm", "node1", task["SLURM_JOB_ID"])


def test_errors_exit_2_with_the_variable_named_and_no_traceback():
    (batch,) = load_case("slurm/sbatch_N2_tpn2_batchstep")
    result = slurmdist("env", environ=clean_environ(**batch))
    assert result.returncode == 2
    assert "srun" in result.stderr and "Traceback" not in result.stderr
    result = slurmdist("env", environ=clean_environ(SLURM_JOB_ID="1", SLURM_STEP_ID="0", SLURM_PROCID="x"))
    assert result.returncode == 2 and "SLURM_PROCID='x'" in result.stderr


@pytest.mark.parametrize("args", [[], ["env", "--format", "yaml"], ["bogus"], ["run"], ["hostlist", "expand"],
                                  ["hostlist", "expand", "n[3-1]"], ["hostlist", "sideways", "n1"]])
def test_nonsense_arguments_exit_2_with_usage_not_a_traceback(args):
    result = slurmdist(*args, environ=clean_environ())
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.strip()


@pytest.mark.parametrize("command", ["env", "run", "hostlist", "sbatch", "submit"])
def test_an_unknown_option_is_reported_with_the_subcommands_usage(command, capsys):
    from slurmdist.cli import main

    with pytest.raises(SystemExit) as ended:
        main([command, "--bogus", "--", "true"] if command != "hostlist" else [command, "expand", "n1", "--bogus"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: slurmdist {command} " in err  # its options, not `slurmdist [-h] [--version] COMMAND`
    assert f"slurmdist {command}: error: unrecognized arguments: --bogus" in err


def test_run_execs_the_command_with_torchruns_variables():
    # MASTER_ADDR given: node1 of the captured job is not this machine (the integration tests run `slurmdist
    # run` on the local cluster, where the name is looked up and replaced by Slurm's NodeAddr).
    task = {**load_case("slurm/srun_N2_tpn2")[3], "MASTER_ADDR": "localhost"}
    probe = "import os, json; print(json.dumps({k: os.environ[k] for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', " \
            "'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'TORCHELASTIC_USE_AGENT_STORE')}))"
    with rank_0_listening(task):
        result = slurmdist("run", "--", sys.executable, "-c", probe, environ=clean_environ(**task))
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    env = detect(task)
    assert seen == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                    "MASTER_ADDR": "localhost", "MASTER_PORT": str(env.master_port),
                    "TORCHELASTIC_USE_AGENT_STORE": "True"}  # rank 0's `slurmdist run` serves the store


@pytest.mark.parametrize("extra, interface", [
    ({"MASTER_ADDR": "127.0.0.11"}, "lo"),  # an address (a NodeAddr): gloo binds the interface towards it
    # This host's own name, resolving to loopback, in a 2-node job: gloo's own choice would bind loopback.
    ({"MASTER_ADDR": "localhost"}, "default route"),
    ({"MASTER_ADDR": "127.0.0.11", "GLOO_SOCKET_IFNAME": "ib7"}, "ib7"),  # the user's choice, untouched
])
def test_run_points_gloo_at_the_interface_towards_the_master(extra, interface):
    task = {**load_case("slurm/srun_N2_tpn2")[3], **extra}
    probe = "import os; print(os.environ.get('GLOO_SOCKET_IFNAME'))"
    environ = {k: v for k, v in clean_environ(**task).items() if k != "GLOO_SOCKET_IFNAME" or k in extra}
    with rank_0_listening(task):
        result = slurmdist("run", "--", sys.executable, "-c", probe, environ=environ)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(default_route_device() if interface == "default route" else interface)


def test_run_binds_a_single_process_gloo_to_loopback_as_init_does():
    probe = "import os; print(os.environ.get('GLOO_SOCKET_IFNAME'))"
    environ = {k: v for k, v in clean_environ().items() if k != "GLOO_SOCKET_IFNAME"}
    result = slurmdist("run", "--", sys.executable, "-c", probe, environ=environ)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "lo"


def test_run_reports_a_missing_command():
    task = {**load_case("slurm/srun_N2_tpn2")[0], "MASTER_ADDR": "localhost"}
    result = slurmdist("run", "--", "no-such-command-xyz", environ=clean_environ(**task))
    assert result.returncode == 127 and "no-such-command-xyz" in result.stderr


def test_run_refuses_a_command_that_starts_with_an_option():
    result = slurmdist("run", "--", "-m", "pkg", environ=clean_environ())
    assert result.returncode == 2 and "slurmdist run -- -m pkg: the command starts with an option, not a program: " \
        "name the program first, e.g. `-- python -m pkg`" in result.stderr, result.stderr


def test_run_looks_up_the_command_as_exec_would_before_anything_starts(tmp_path):
    # Checked before rank 0 serves the store, so it must agree with exec: a #! interpreter that is gone (a
    # console script of a deleted venv), a directory or non-executable file of that name on PATH (exec: EACCES,
    # a shell's 126), and an empty PATH entry, which is the current directory.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stale = bin_dir / "train"
    stale.write_text("#!/no/such/venv/bin/python\n")
    stale.chmod(0o755)
    (bin_dir / "prep").mkdir()
    (tmp_path / "here.sh").write_text("#!/bin/sh\necho ran here\n")
    (tmp_path / "here.sh").chmod(0o755)
    path = f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"

    def run(command: str, search: str = path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "slurmdist", "run", "--", command], cwd=tmp_path, timeout=60,
                              env=clean_environ(PATH=search), capture_output=True, text=True)

    gone = run("train")
    assert gone.returncode == 127 and "its #! line names the interpreter '/no/such/venv/bin/python', which does " \
        "not exist" in gone.stderr, gone.stderr
    assert f"(on {os.uname().nodename}, in {tmp_path})" in gone.stderr, gone.stderr
    assert run("prep").returncode == 126 and "command is not executable: 'prep'" in run("prep").stderr
    (bin_dir / "interpreter").write_text("")  # there, but not executable: exec says EACCES, a shell 126
    stale.write_text(f"#!{bin_dir / 'interpreter'}\n")
    blocked = run("train")
    assert blocked.returncode == 126 and "which is not executable" in blocked.stderr, blocked.stderr
    found_here = run("here.sh", f"{bin_dir}{os.pathsep}{os.pathsep}/usr/bin{os.pathsep}/bin")
    assert (found_here.returncode, found_here.stdout) == (0, "ran here\n"), found_here.stderr


@pytest.mark.parametrize("first_line, taken", [("#!/bin/sh", "'/bin/sh\\r' for the interpreter"),
                                               ("#!/usr/bin/env sh", "'sh\\r' for the last argument")])
def test_run_names_windows_line_ends_in_a_scripts_first_line(tmp_path, first_line, taken):
    # Saved on Windows: exec fails with ENOENT, which read "command not found" for a script that is there.
    script = tmp_path / "train.sh"
    script.write_bytes(f"{first_line}\r\necho hi\r\n".encode())
    script.chmod(0o755)
    result = slurmdist("run", "--", str(script), environ=clean_environ())
    assert result.returncode == 127 and "ends in a carriage return (the file has Windows line ends)" in result.stderr
    assert f"the kernel takes {taken}" in result.stderr and f"dos2unix {script}" in result.stderr, result.stderr
    # Every rank of a step prints it: the node and directory tell them apart, as for a command not found.
    assert f"(on {os.uname().nodename}, in {os.getcwd()})" in result.stderr, result.stderr


def test_run_reports_a_command_the_kernel_cannot_execute(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("echo no interpreter line\n")
    script.chmod(0o755)
    result = slurmdist("run", "--", str(script), environ=clean_environ())
    # Found before anything starts (rank 0 served the store first), saying what a shell would have done.
    assert result.returncode == 126 and "a text file without a #! first line" in result.stderr, result.stderr
    assert f"(bash {script})" in result.stderr and "Traceback" not in result.stderr
    assert f"(on {os.uname().nodename}, in {os.getcwd()})" in result.stderr, result.stderr
    binary = tmp_path / "program"
    binary.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(64))  # a program exec cannot load: exec's own words
    binary.chmod(0o755)
    broken = slurmdist("run", "--", str(binary), environ=clean_environ())
    assert broken.returncode == 126 and "Exec format error" in broken.stderr, broken.stderr


def test_hostlist_subcommand():
    environ = clean_environ()
    assert slurmdist("hostlist", "expand", "n[1-3]", environ=environ).stdout.split() == ["n1", "n2", "n3"]
    assert slurmdist("hostlist", "first", "n[07-09],m1", environ=environ).stdout.strip() == "n07"
    assert slurmdist("hostlist", "count", "n[1-100]", environ=environ).stdout.strip() == "100"
    assert slurmdist("hostlist", "compress", "n1,n2,n3", environ=environ).stdout.strip() == "n[1-3]"
    for action in ("expand", "compress", "count", "first"):  # "$SLURM_JOB_NODELIST" outside a job
        refused = slurmdist("hostlist", action, "", environ=environ)
        assert refused.returncode == 2 and refused.stdout == ""
        assert f"hostlist {action}: the hostlist '' names no host" in refused.stderr and "node[1-4]" in refused.stderr
    # Past the limit: an error that says how to raise it, and --limit does.
    refused = slurmdist("hostlist", "expand", "--limit", "2", "n[1-3]", environ=environ)
    assert refused.returncode == 2 and "more than 2 hosts" in refused.stderr and "--limit N" in refused.stderr
    assert slurmdist("hostlist", "expand", "--limit", "3", "n[1-3]", environ=environ).stdout.split() == ["n1", "n2", "n3"]


@pytest.mark.parametrize("action", ["expand", "compress", "count", "first"])
@pytest.mark.parametrize("halves, wrong", [(("n[1-2", "5]"), "'n[1-2'"), (("n[1", "2]x"), "'n[1'"),
                                           (("node[1-4]", "gpu[3-1]"), "'gpu[3-1]'")])
def test_hostlist_arguments_are_separate_lists_each_checked_whole(action, halves, wrong):
    # Joined with commas, the two broken halves made one valid list (n1 n2 n5); `first` checked only the first
    # item, so a corrupt second list passed. Each argument is checked on its own, and the error quotes it.
    refused = slurmdist("hostlist", action, *halves, environ=clean_environ())
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout
    assert f"invalid Slurm hostlist {wrong}" in refused.stderr, refused.stderr


def test_hostlist_arguments_add_up():
    environ = clean_environ()
    assert slurmdist("hostlist", "expand", "n[1-2]", "", "m1", environ=environ).stdout.split() == ["n1", "n2", "m1"]
    assert slurmdist("hostlist", "count", "n[1-2]", "m[1-3]", environ=environ).stdout == "5\n"
    assert slurmdist("hostlist", "first", "", "m[4-5]", environ=environ).stdout == "m4\n"
    assert slurmdist("hostlist", "compress", "n[1-2]", "n3", environ=environ).stdout == "n[1-3]\n"
    # The limit bounds the hosts of all lists together.
    refused = slurmdist("hostlist", "expand", "--limit", "3", "n[1-2]", "m[1-2]", environ=environ)
    assert refused.returncode == 2 and "more than 3 hosts together" in refused.stderr, refused.stderr
    too_large = slurmdist("hostlist", "expand", "--limit", "9" * 23, "n1", environ=environ)
    assert too_large.returncode == 2 and "is too large for a number of hosts" in too_large.stderr


def test_hostlist_reads_standard_input_for_a_dash():
    def hostlist(*args: str, stdin: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "slurmdist", "hostlist", *args], input=stdin, timeout=30,
                              env=clean_environ(), capture_output=True, text=True)

    # `scontrol show hostnames | slurmdist hostlist compress -`: one host per line, or spaces and commas.
    assert hostlist("compress", "-", stdin="n1\nn2\nn3\n n7 n8,n9\n").stdout == "n[1-3,7-9]\n"
    assert hostlist("expand", "-", "m1", stdin="n[1-2]\n").stdout.split() == ["n1", "n2", "m1"]
    assert hostlist("compress", "-", stdin="n1\r\nn2\r\n").stdout == "n[1-2]\n"  # CRLF line ends
    # An error quotes the text as it came, not as rejoined from its words.
    refused = hostlist("expand", "-", stdin="n[1, 2]\n")
    assert refused.returncode == 2 and "'n[1, 2]\\n'" in refused.stderr and "' 2'" in refused.stderr, refused.stderr
    assert hostlist("count", "-", stdin="").stdout == "0\n"  # as `wc -l` counts an empty pipe
    assert hostlist("expand", "-", stdin="").stdout == ""  # no host, no line
    assert hostlist("compress", "-", stdin="").stdout == ""  # nor a blank one
    first = hostlist("first", "-", stdin="")  # an empty list has no first host
    assert first.returncode == 2 and "names no host" in first.stderr and first.stdout == ""
    big = ",".join(f"h{n}x" for n in range(40000))  # beyond what one command-line argument may hold (128 KiB)
    assert hostlist("count", "-", stdin=big).stdout == "40000\n"
    closed = subprocess.run(["bash", "-c", f"{sys.executable} -m slurmdist hostlist expand - <&-"], timeout=30,
                            env=clean_environ(), capture_output=True, text=True)
    assert closed.returncode == 2 and "standard input, which is closed" in closed.stderr, closed.stderr
    # Standard input open for writing only: a read error (as EIO from a terminal gone away), not a write error.
    unreadable = subprocess.run(["bash", "-c", f"{sys.executable} -m slurmdist hostlist expand - 0>/dev/null"],
                                timeout=30, env=clean_environ(), capture_output=True, text=True)
    assert unreadable.returncode == 2, unreadable.stderr
    assert "cannot read the hosts from standard input: Bad file descriptor" in unreadable.stderr


def test_a_reader_that_stops_early_ends_the_command_without_a_traceback():
    # `slurmdist hostlist expand 'n[1-200000]' | head -1`: more than a pipe holds, and head leaves after a line.
    proc = subprocess.Popen([sys.executable, "-m", "slurmdist", "hostlist", "expand", "n[1-200000]"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"n1\n"
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert err == b"" and proc.returncode == 141


@pytest.mark.parametrize("args", [("hostlist", "expand", "n[1-3]"), ("env", "--format", "json"), ("--version",),
                                  ("--help",), ("env", "--help"), ("submit", "--help")])
def test_a_failed_write_is_one_line_of_error_not_a_traceback(args):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "slurmdist", *args], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=30, env=clean_environ())
    assert (proc.returncode, proc.stderr) == (1, "slurmdist: error: write error: No space left on device\n")


@pytest.mark.parametrize("args", [("hostlist", "expand", "n[1-3]"), ("env", "--format", "json"),
                                  ("sbatch", "--", "true"), ("--version",), ("run", "--help")])
def test_a_closed_stdout_is_one_line_of_error_before_any_work(args):
    # `slurmdist ... >&-`: Python then has no sys.stdout at all.
    proc = subprocess.run([sys.executable, "-m", "slurmdist", *args], stdout=None, stderr=subprocess.PIPE,
                          text=True, timeout=30, env=clean_environ(), preexec_fn=lambda: os.close(1))
    assert proc.returncode == 1
    assert proc.stderr.startswith("slurmdist: error: standard output is closed") and "Traceback" not in proc.stderr


def test_import_slurmdist_imports_no_heavy_modules():
    code = ("import sys, slurmdist; slurmdist.detect({}); "
            "heavy = [m for m in ('torch', 'mpi4py', 'submitit', 'numpy') if m in sys.modules]; print(heavy)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.stdout.strip() == "[]", result.stderr


def test_env_text_says_where_an_unknown_master_comes_from():
    task = load_case("slurm/srun_arbitrary_N2_n4")[1]
    text = slurmdist("env", environ=clean_environ(**task)).stdout
    assert "master_addr       - (srun -m arbitrary: init() reads it from SLURM_HOSTFILE)" in text
    two_nodes = {**load_case("mpi/openmpi_np4")[1], "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                 "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    text = slurmdist("env", environ=clean_environ(**two_nodes)).stdout
    assert "master_addr       - (init() agrees on it over MPI)" in text
    by_hand = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}  # no MPI to agree over
    text = slurmdist("env", environ=clean_environ(**by_hand)).stdout
    assert "master_addr       - (not set: init() needs MASTER_ADDR and MASTER_PORT)" in text

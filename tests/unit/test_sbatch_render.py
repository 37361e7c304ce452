"""`slurmdist sbatch`: rendered scripts ask for what was given, and nothing a user types ever runs as code.

The canary tests execute the rendered script with bash, with `srun`/`mpirun`/`torchrun`/`scontrol` replaced
by stubs that record their argv: the command must arrive word for word, and no canary file may appear.
"""

from __future__ import annotations

import os
import sys
import re
import signal
import stat
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import List

import pytest

from slurmdist import cli
from slurmdist.sbatch_render import JobSpec, SbatchError, render, setup_syntax_problem, validate

REPO = Path(__file__).resolve().parents[2]

# Each must stay one literal argument. If any were executed, it would create CANARY.
NASTY = [
    "$(touch {canary})",
    "`touch {canary}`",
    "'; touch {canary}; echo '",
    '"; touch {canary}; echo "',
    "x\ntouch {canary}",
    "a;touch {canary}",
    "${{IFS}}touch${{IFS}}{canary}",
    "--flag=$(touch {canary})",
    "it's",
    "",
]


def nasty_words(canary: Path) -> List[str]:
    return [word.format(canary=canary) for word in NASTY]


def stub_bin(directory: Path, record: Path) -> Path:
    """Stubs for the launchers: each appends its name and argv (NUL-separated) to `record`."""
    directory.mkdir()
    for name in ("srun", "mpirun", "torchrun"):
        path = directory / name
        path.write_text(f'#!/bin/bash\nprintf "%s\\0" {name} "$@" >> "{record}"\nprintf "\\n\\0" >> "{record}"\n'
                        f'echo "{name} ${{SRUN_CPUS_PER_TASK-unset}}" >> "{record}.cpus"\n'
                        f'echo "$PWD" >> "{record}.pwd"\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    scontrol = directory / "scontrol"  # `show hostnames` and `show node` for the torchrun head address
    scontrol.write_text('#!/bin/bash\nif [[ $* == *hostnames* ]]; then echo node1;'
                        ' elif [[ -n ${STUB_SHOW_NODE_FAILS:-} ]]; then echo "Socket timed out" >&2; exit 1;'
                        ' else echo "NodeName=node1 NodeAddr=10.0.0.1 State=IDLE"; fi\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IXUSR)
    return directory


def run_script(script: str, tmp_path: Path, **slurm: str) -> List[List[str]]:
    """Run `script` with bash as a Slurm batch step would; return each stub call's argv. `slurm` overrides
    (or, given as "", removes) the job's variables."""
    record = tmp_path / "calls"
    bin_dir = stub_bin(tmp_path / "bin", record)
    path = tmp_path / "job.sh"
    path.write_text(script)
    (tmp_path / "examples").mkdir(exist_ok=True)  # the submit directory is a checkout, as the shipped scripts check
    (tmp_path / "examples" / "train.py").touch()
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": "42", "SLURM_NNODES": "2", "SLURM_NTASKS": "8", "SLURM_CPUS_PER_TASK": "4",
        "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_SUBMIT_DIR": str(tmp_path), "SLURMD_NODENAME": "node1",
        "SLURM_NODEID": "0",
    }
    env.update(slurm)
    env = {key: value for key, value in env.items() if value != ""}
    done = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    calls = record.read_text().split("\n\0") if record.exists() else []
    return [call.split("\0")[:-1] for call in calls if call]


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_command_words_arrive_literally_and_never_execute(tmp_path, launcher):
    canary = tmp_path / "canary"
    words = ["python", "train.py", *nasty_words(canary)]
    calls = run_script(render(JobSpec(command=tuple(words), nodes=2, gpus_per_node=4, launcher=launcher)), tmp_path)
    assert not canary.exists()
    assert len(calls) == 1
    assert calls[0][0] == launcher
    assert calls[0][-len(words):] == words


def test_torchrun_passes_the_script_and_its_arguments_through_the_per_node_shell(tmp_path):
    canary = tmp_path / "canary"
    words = ["train.py", *nasty_words(canary)]
    spec = JobSpec(command=tuple(words), nodes=2, gpus_per_node=4, launcher="torchrun")
    # srun's stub records its argv; run the `bash -c` it was given the way srun would on node 0.
    [call] = run_script(render(spec), tmp_path)
    assert call[:3] == ["srun", "--kill-on-bad-exit=1", "bash"]
    inner = subprocess.run(call[2:], env={**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
                                          "SLURMD_NODENAME": "node1", "SLURM_NODEID": "0"},
                           capture_output=True, text=True, timeout=30)
    assert inner.returncode == 0, inner.stderr
    torchrun_call = (tmp_path / "calls").read_text().split("\n\0")[1].split("\0")[:-1]
    assert not canary.exists()
    assert torchrun_call[-len(words):] == words
    assert "--nnodes=2" in torchrun_call and "--nproc-per-node=4" in torchrun_call
    assert "--rdzv-endpoint=10.0.0.1:20042" in torchrun_call  # NodeAddr of the first node, port from job id
    assert "--rdzv-conf=is_host=1" in torchrun_call and "--local-addr=10.0.0.1" in torchrun_call


def test_setup_lines_run_before_the_launch_and_the_tasks_inherit_them(tmp_path):
    # `module load`, a venv's activate: where jobs are submitted with --export=NONE, the job sets itself up.
    setup = ("export SRUN_CPUS_PER_TASK=7", 'echo "${NOT_SET_ANYWHERE}" > /dev/null')  # site scripts read unset vars
    run_script(render(JobSpec(command=("python", "train.py"), nodes=2, gpus_per_node=4, setup=setup)), tmp_path)
    assert (tmp_path / "calls.cpus").read_text() == "srun 7\n"


@pytest.mark.parametrize("line", ["", "  ", "module load a\nmodule load b"])
def test_a_setup_value_must_be_one_shell_line(line):
    with pytest.raises(SbatchError, match="one non-empty shell line per --setup"):
        render(JobSpec(command=("python", "train.py"), setup=(line,)))


@pytest.mark.parametrize("command", ["sbatch", "submit"])
@pytest.mark.parametrize("setup, message", [
    (["echo \"unterminated"], r"not valid shell at --setup 'echo \"unterminated': unexpected EOF"),
    (["module load x", "}"], r"not valid shell at --setup '}': syntax error near unexpected token"),
    (["if [[ -n ${X:-} ]]; then", "module load x"], r"not valid shell: syntax error"),
    # It parses under bash -n (a heredoc left open is only a warning to bash), then takes in the script's next
    # lines: the open heredoc swallowed the launch and the job ended COMPLETED without training.
    (["cat > cfg.txt <<EOF", "lr: 0.1", " EOF"], r"open a heredoc at --setup 'cat > cfg.txt <<EOF' that they "
                                                 r"never close.*launch included.*'EOF' alone, not indented"),
])
def test_setup_lines_that_are_not_shell_are_refused_before_the_job_exists(capsys, tmp_path, monkeypatch, command,
                                                                         setup, message):
    # Rendered, such a script exited 0 and `bash -n` then blamed a line of the script the setup broke; submitted,
    # the job failed only after its wait in the queue.
    monkeypatch.chdir(tmp_path)  # a local job the check let through writes its folder and files here
    args = [word for line in setup for word in ("--setup", line)]
    assert cli.main([command, *args, "--device" if command == "sbatch" else "--cluster",
                     "cpu" if command == "sbatch" else "local", "--", "python", "train.py"]) == 2
    said = capsys.readouterr()
    assert re.search(message, said.err), said.err
    assert said.out == ""


@pytest.mark.parametrize("lines", [
    ["if [[ -n ${SLURM_JOB_ID:-} ]]; then", "module load cuda", "fi", "source ~/venv/bin/activate"],
    ["# module load cuda (not on this cluster)"],  # a comment alone: in a { } group, bash refused it
    ["shopt -s extglob", "rm -f @(a|b).tmp"],  # parsed after the shopt ran, as a script's lines are
    ["export A=1 \\", "  B=2", "echo a\\\\"],  # a continued line, an escaped backslash at the end
    ["module load x  # was: \\"],  # a backslash in a comment
    ["module load x \\"],  # continued onto the empty line written after the setup lines: it ends there
])
def test_setup_lines_that_parse_together_pass(capsys, lines):
    assert cli.main(["sbatch", "--device", "cpu", *[w for line in lines for w in ("--setup", line)], "--",
                     "python", "train.py"]) == 0
    assert f"\n{lines[-1]}\n" in capsys.readouterr().out  # as typed, not indented
    assert setup_syntax_problem(lines) is None  # what slurmdist submit checks its --setup lines with


def test_a_heredoc_in_setup_lines_ends_where_the_user_ended_it(tmp_path):
    # Indented inside a { } group, its end marker was not at the start of a line: the rendered script did
    # not parse, though each line had passed the check.
    # A setup line that moves, or names a variable as the script's own might be named, does not move the launch
    # out of the submit directory, where the command's relative paths point.
    lines = ("cat > made.txt <<EOF", "written by setup", "EOF", "job_dir=/", "cd / \\")  # \ joins no script line
    calls = run_script(render(JobSpec(command=("python", "t.py"), device="cpu", setup=lines)), tmp_path)
    assert calls and (tmp_path / "made.txt").read_text() == "written by setup\n"
    assert (tmp_path / "calls.pwd").read_text() == f"{tmp_path}\n"


@pytest.mark.parametrize("script", ["rendered", "shipped"])
def test_torchrun_scripts_fall_back_to_the_head_nodes_name_when_scontrol_cannot_say(tmp_path, script):
    # A busy slurmctld (`show node` timing out) must not end the job under `set -e` before the fallback.
    text = (render(JobSpec(command=("train.py",), nodes=2, gpus_per_node=4, launcher="torchrun")) if script == "rendered"
            else (REPO / "sbatch" / "train_torchrun.sh").read_text())
    [call] = run_script(text, tmp_path, STUB_SHOW_NODE_FAILS="1", SLURM_JOB_NAME="torchrun")
    assert call[:3] == ["srun", "--kill-on-bad-exit=1", "bash"]
    assert "--rdzv-endpoint=node1:20042" in call[4]


@pytest.mark.parametrize("gpus", [{"SLURM_GPUS_PER_NODE": "0"}, {"SLURM_GPUS_ON_NODE": "0"}])
def test_the_torchrun_script_takes_no_gpus_for_a_cpu_job_not_for_zero_workers(tmp_path, gpus):
    # `sbatch --gpus-per-node=0 sbatch/train_torchrun.sh` stopped with "NPROC_PER_NODE must be a number, got '0'",
    # and NPROC_PER_NODE=2 with "the job has 0 GPU(s) per node".
    text = (REPO / "sbatch" / "train_torchrun.sh").read_text()
    [call] = run_script(text, tmp_path, SLURM_JOB_NAME="torchrun", **gpus)
    assert "--nproc-per-node=4 " in call[4]  # the documented default
    (tmp_path / "two").mkdir()
    [call] = run_script(text, tmp_path / "two", SLURM_JOB_NAME="torchrun", NPROC_PER_NODE="2", **gpus)
    assert "--nproc-per-node=2 " in call[4]


@pytest.mark.parametrize("option,value", [
    ("job_name", "a;touch x"), ("job_name", "name\n#SBATCH --wrap=id"), ("job_name", "$(id)"), ("job_name", "a b"),
    ("job_name", "`id`"), ("job_name", "'q'"), ("partition", "gpu;id"), ("account", "acc\nid"),
    ("time", "1:00:00; id"), ("time", "$(id)"), ("output", "logs/%j.out\nid"), ("output", "a b.out"),
    ("signal", "USR2@120 --wrap=id"),
    # Digits of other scripts: Python's \d matches them, sbatch refuses them.
    ("time", "\u0663:00:00"), ("signal", "USR2@\u0663"),
])
def test_sbatch_line_values_outside_the_safe_pattern_are_refused(option, value):
    with pytest.raises(SbatchError, match=option.replace("_", "-")):
        validate(JobSpec(command=("python", "train.py"), **{option: value}))


def test_cli_refuses_with_status_2_and_no_traceback(capsys, tmp_path):
    canary = tmp_path / "canary"
    status = cli.main(["sbatch", "--job-name", f"x$(touch {canary})", "--", "python", "train.py"])
    captured = capsys.readouterr()
    assert status == 2
    assert "--job-name" in captured.err and "Traceback" not in captured.err
    assert captured.out == "" and not canary.exists()


@pytest.mark.parametrize("args,message", [
    ([], "needs a command"),
    (["--", "", "t.py"], "the command's name is empty"),  # an unset "$PYTHON"
    (["--nodes", "0", "--", "python", "t.py"], "--nodes must be at least 1"),
    (["--launcher", "torchrun", "--", "python", "t.py"], "starts Python itself"),
    (["--launcher", "torchrun", "--tasks-per-node", "4", "--", "t.py"], "one srun task per node"),
    (["--signal", "B:USR2@120", "--", "python", "t.py"], "B: sends it to the batch shell only"),
    # The script tells the command to save when the signal comes: one no task can catch, or no signal at all.
    (["--signal", "KILL@60", "--", "python", "t.py"], "--signal 'KILL@60' cannot be caught"),
    (["--signal", "R:9", "--", "python", "t.py"], "--signal 'R:9' cannot be caught"),
    (["--signal", "FOO@60", "--", "python", "t.py"], "--signal 'FOO@60' is not a signal name or number"),
    # Quoted as typed, not as the script would spell it.
    (["--signal", "usr2@x", "--", "python", "t.py"], "--signal 'usr2@x' is not allowed in an #SBATCH line"),
    (["--signal", "usr9", "--", "python", "t.py"], "--signal 'usr9' is not a signal name or number"),
    (["--launcher", "torchrun", "--signal", "USR2@60", "--", "t.py"], "torchrun does not pass it on"),
    (["--launcher", "mpirun", "--signal", "USR2@60", "--", "python", "t.py"], "mpirun does not pass it on"),
    (["--workers-per-node", "2", "--", "python", "t.py"], "--workers-per-node is for --launcher torchrun"),
    (["-G", "4", "--device", "cpu", "--", "python", "t.py"], "--gpus-per-node 4 with --device cpu"),
    (["--launcher", "torchrun", "--workers-per-node", "0", "--", "t.py"], "--workers-per-node must be at least 1"),
    (["-G", "4", "--tasks-per-node", "8", "--", "python", "t.py"],
     "--tasks-per-node 8 with --gpus-per-node 4: 8 ranks per node on 4 GPUs"),
    (["-G", "4", "--launcher", "mpirun", "--tasks-per-node", "6", "--", "python", "t.py"], "6 ranks per node on 4 GPUs"),
    (["-G", "4", "--launcher", "torchrun", "--workers-per-node", "8", "--", "t.py"],
     "--workers-per-node 8 with --gpus-per-node 4"),
    (["-G", "8", "--device", "npu", "--tasks-per-node", "16", "--", "python", "t.py"], "16 ranks per node on 8 NPUs"),
    # A warning that reaches the job as it starts (Slurm may send it a minute early): requeued again and again.
    (["--time", "2", "--", "python", "t.py"],
     r"the default --signal USR2@120 leaves no time to train within --time 2 \(2 min\): .* at least 4 min, or the delay after @ to at most 59 s"),
    (["--time", "1", "--signal", "USR2", "--", "python", "t.py"], "--signal 'USR2' leaves no time .* at least 3 min(?!,)"),
    # Slurm rounds a limit up to whole minutes: 00:02:01 is 3 min, so USR2@120 comes 60 s in, at the start.
    (["--time", "00:02:01", "--", "python", "t.py"], r"leaves no time to train within --time 00:02:01 \(3 min\)"),
    (["--time", "3-00:00:00", "--signal", "USR2@65536", "--", "python", "t.py"], "more than Slurm's --signal accepts"),
    (["--signal", "USR2@0", "--", "python", "t.py"], "--signal 'USR2@0' would mean no warning at all"),
    (["--time", "0", "--signal", "USR2@100000", "--", "python", "t.py"], "more than Slurm's --signal accepts"),
    (["--time", "infinite", "--signal", "USR2@100000", "--", "python", "t.py"], "more than Slurm's --signal accepts"),
    (["--time", "forever", "--", "python", "t.py"], r"--time 'forever' is not a time limit Slurm takes: .* or infinite"),
    (["--write", "", "--", "python", "t.py"], "--write '' names no file"),
    # Past what any limit holds: named as the option, not as submit's time=.
    (["--time", "9" * 20, "--", "python", "t.py"], "error: --time '9{20}' is not a time limit Slurm takes"),
])
def test_cli_usage_errors(capsys, args, message):
    assert cli.main(["sbatch", *args]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_the_launch_runs_where_sbatch_started_the_script_after_setup_lines_that_cd(tmp_path):
    # sbatch --chdir=DIR starts the script in DIR, not SLURM_SUBMIT_DIR; a --setup line may cd elsewhere.
    script = render(JobSpec(command=("python", "train.py"), device="cpu", setup=("cd /",)))
    run_script(script, tmp_path, SLURM_SUBMIT_DIR=str(tmp_path / "submitted-from-here"))
    assert (tmp_path / "calls.pwd").read_text().splitlines() == [str(tmp_path)]


def test_sbatch_ntasks_is_refused_not_read_as_tasks_per_node(capsys):
    # argparse took `--ntasks 8` for an abbreviation of --ntasks-per-node: 8 tasks on every node.
    for argv in (["sbatch", "--device", "cpu", "--ntasks", "8", "--", "python", "t.py"],
                 ["submit", "-N", "4", "-n", "8", "--", "true"]):
        with pytest.raises(SystemExit) as refused:  # argparse's usage error
            cli.main(argv)
        assert refused.value.code == 2
        assert "give --tasks-per-node N with --nodes M" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    # sbatch's --gpus is the job's total; it was read as an abbreviation of --gpus-per-node: N x the GPUs.
    (["sbatch", "-N", "2", "--gpus", "8", "--", "python", "t.py"], "give --gpus-per-node N with --nodes M"),
    (["submit", "--cluster", "local", "--gpus", "8", "--", "true"], "sbatch's --gpus counts the whole job's GPUs"),
    # Any other prefix of an option is not that option either (sbatch's --cpus-per-gpu is not --cpus-per-task).
    (["sbatch", "--device", "cpu", "--cpus", "4", "--", "python", "t.py"], "unrecognized arguments: --cpus"),
    (["sbatch", "--device", "cpu", "--tasks", "3", "--", "python", "t.py"], "unrecognized arguments: --tasks"),
    (["hostlist", "expand", "n[1-3]", "--lim", "2"], "unrecognized arguments: --lim"),
])
def test_sbatchs_job_wide_gpus_and_abbreviated_options_are_refused(capsys, argv, says):
    with pytest.raises(SystemExit) as refused:
        cli.main(argv)
    assert refused.value.code == 2 and says in capsys.readouterr().err


def test_sbatchs_own_spelling_of_tasks_per_node_is_taken(capsys):
    # `--ntasks-per-node` is what sbatch users type; it was "unrecognized arguments".
    assert cli.main(["sbatch", "--device", "cpu", "--ntasks-per-node", "3", "--", "python", "train.py"]) == 0
    assert "#SBATCH --ntasks-per-node=3\n" in capsys.readouterr().out


def test_rendered_options_follow_the_request(capsys):
    assert cli.main(["sbatch", "-N", "2", "-G", "4", "-c", "8", "-t", "2:00:00", "-p", "gpu", "-A", "proj",
                     "-J", "big-run", "--", "python", "train.py", "--lr", "0.1"]) == 0
    script = capsys.readouterr().out
    for line in ("--job-name=big-run", "--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4",
                 "--cpus-per-task=8", "--time=2:00:00", "--partition=gpu", "--account=proj",
                 "--signal=USR2@120", "--requeue", "--open-mode=append"):
        assert f"#SBATCH {line}\n" in script
    assert "export SRUN_CPUS_PER_TASK=" in script
    assert script.rstrip().endswith("srun --kill-on-bad-exit=1 python train.py --lr 0.1")


def test_gpus_asked_for_through_sbatch_options_are_not_warned_about(capsys):
    # `--sbatch gres=gpu:a100:4` (a typed GPU) asks for GPUs: the "asks Slurm for no GPUs" warning was wrong.
    for option in ("gres=gpu:a100:4", "gpus=8", "gpus-per-task=1"):
        assert cli.main(["sbatch", "--sbatch", option, "--", "python", "train.py"]) == 0
        said = capsys.readouterr()
        assert f"#SBATCH --{option}\n" in said.out and "asks Slurm for no GPUs" not in said.err


@pytest.mark.parametrize("option", ["gres=nvme:1", "gres=gpu:0", "gpus=0", "tres-per-task=cpu:4"])
def test_sbatch_options_that_ask_for_no_gpu_still_get_the_warning(capsys, option):
    # Any gres= silenced it, so a GPU job asking for a scratch disk trained on the CPU without a word.
    assert cli.main(["sbatch", "--sbatch", option, "--", "python", "train.py"]) == 0
    assert "asks Slurm for no GPUs" in capsys.readouterr().err


def test_npus_asked_for_through_gres_are_not_warned_about(capsys):
    assert cli.main(["sbatch", "--device", "npu", "--sbatch", "gres=npu:8", "--", "python", "train.py"]) == 0
    assert "asks Slurm for no NPUs" not in capsys.readouterr().err
    assert cli.main(["sbatch", "--device", "npu", "--sbatch", "gres=gpu:8", "--", "python", "train.py"]) == 0
    assert "asks Slurm for no NPUs" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    # sbatch kept --gpus-per-node and ignored the gres: the tasks saw 2 GPUs (a trial on the local cluster).
    (["-G", "2", "--sbatch", "gres=gpu:4"], r"--sbatch gres=gpu:4 asks for GPUs again beside -G 2, .*constraint=TYPE"),
    (["-G", "2", "--sbatch", "gres=nvme:1,gpu:a100:1"], r"gres=nvme:1,gpu:a100:1 asks for GPUs again"),
    # sbatch refuses it beside the --ntasks-per-node the script writes: the job never started.
    (["-G", "2", "--sbatch", "ntasks-per-gpu=2"], r"sbatch refuses --ntasks-per-gpu .*--share-devices"),
])
def test_sbatch_options_that_clash_with_the_scripts_own_are_refused(capsys, args, message):
    assert cli.main(["sbatch", *args, "--", "python", "train.py"]) == 2
    said = capsys.readouterr()
    assert re.search(message, said.err) and said.out == ""


def test_a_gres_of_another_kind_beside_gpus_reaches_the_script(capsys):
    assert cli.main(["sbatch", "-G", "2", "--sbatch", "gres=nvme:1", "--", "python", "train.py"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --gres=nvme:1\n" in script and "#SBATCH --gpus-per-node=2\n" in script


def test_memory_and_any_other_sbatch_option_reach_the_script(capsys):
    # Sites that need --mem, --qos or --constraint used to edit the rendered script by hand.
    assert cli.main(["sbatch", "--device", "cpu", "--mem", "32G", "--sbatch", "constraint=a100&nvlink",
                     "--sbatch", "qos=high", "--sbatch", "exclusive", "--sbatch", "mail_type=END",
                     "--", "python", "train.py"]) == 0
    script = capsys.readouterr().out
    for line in ("--mem=32G", "--constraint=a100&nvlink", "--qos=high", "--exclusive", "--mail-type=END"):
        assert f"#SBATCH {line}\n" in script
    assert "--mem" not in render(JobSpec(command=("python", "t.py")))


@pytest.mark.parametrize("args, message", [
    (["--mem", "32"], r"--mem '32' is not a memory size with its unit.*megabytes"),
    (["--mem", "1.5G"], r"--mem '1.5G' is not a memory size"),
    (["--sbatch", "time=10"], r"--sbatch 'time=10': the script writes --time itself; use --time"),
    (["--sbatch", "job_name=x"], r"writes --job-name itself; use --job-name"),
    (["--sbatch", "C=a100"], r"long name \(constraint for -C"),
    (["--sbatch", "part=debug"], r"writes --partition itself \(sbatch reads part as --partition\)"),
    # sbatch's other name for --ntasks-per-node, and its start: 3 ranks per node past the GPU check.
    (["--sbatch", "tasks-per-node=3"], r"writes --ntasks-per-node itself \(sbatch reads tasks-per-node as "
                                       r"--ntasks-per-node\); use --tasks-per-node"),
    (["--sbatch", "tasks=3"], r"writes --ntasks-per-node itself \(sbatch reads tasks as --ntasks-per-node\)"),
    (["--sbatch", "comment=two words"], r"one word without spaces"),
    (["--sbatch", "comment=x\n#SBATCH --nodes=99"], r"one word without spaces"),
    (["--sbatch", "=x"], r"expected KEY=VALUE"),
])
def test_bad_memory_and_sbatch_options_are_refused_naming_them(capsys, args, message):
    assert cli.main(["sbatch", "--device", "cpu", *args, "--", "python", "train.py"]) == 2
    said = capsys.readouterr()
    assert re.search(message, said.err) and said.out == ""


@pytest.mark.parametrize("output, warning", [
    ("logs/%x-%j.out", "the log folder 'logs' of --output 'logs/%x-%j.out' does not exist here; .*mkdir -p logs$"),
    ("%x-%j.out", None), ("made/%j.out", None), ("made/%u-%3t.out", None), ("made/%%x.out", None),
    # Slurm fills %x in before the job starts, and creates no folder: the job name's must exist (checked on
    # the local cluster: with it the log is there, without it there is none).
    ("%x/%j.out", "the log folder 'train' .*mkdir -p train$"), ("made/%x/%j.out", None),
    ("logs/%x/%j.out", "the log folder 'logs/train'"), ("made/train/%j.out", None),
    # A folder per job: nobody can create it in time.
    ("made/%j/out.txt", r"folder part of --output 'made/%j/out.txt' holds %j, .*--output made/%x-%j.out$"),
    ("made/%5a/out.txt", "holds %5a, "),
    # A folder for the log: Slurm cannot open it as a file, and the job fails without a log.
    ("made", r"--output 'made' is a folder here: .*--output made/%x-%j.out$"), ("logs/", "is a folder here"),
])
def test_an_output_slurm_writes_no_log_for_is_warned_about(capsys, tmp_path, monkeypatch, output, warning):
    # Slurm opens the log before the script runs: in a missing folder it writes none, and says nothing.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "made" / "train").mkdir(parents=True)
    assert cli.main(["sbatch", "--output", output, "--", "python", "train.py"]) == 0
    captured = capsys.readouterr()
    assert f"#SBATCH --output={output}\n" in captured.out
    if warning is None:
        assert "--output" not in captured.err, captured.err
    else:
        assert re.search(warning, captured.err.strip().splitlines()[-1]), captured.err


def test_a_user_name_this_process_cannot_know_is_not_taken_for_a_missing_folder(capsys, tmp_path, monkeypatch):
    # A uid with no passwd entry and no USER: "%u" stays as it is, and "mkdir -p logs/%u" would be wrong advice.
    import getpass

    def no_user() -> str:
        raise KeyError("getpwuid(): uid not found: 4242")

    monkeypatch.setattr(getpass, "getuser", no_user)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    assert cli.main(["sbatch", "--output", "logs/%u/%j.out", "--", "python", "train.py"]) == 0
    assert "--output" not in capsys.readouterr().err


def test_a_relative_output_counts_from_the_jobs_chdir(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    other = tmp_path / "other"
    other.mkdir()
    args = ["sbatch", "--output", "logs/%x-%j.out", "--sbatch", f"chdir={other}", "--", "python", "train.py"]
    assert cli.main(args) == 0
    assert f"does not exist in --sbatch chdir={other}; " in capsys.readouterr().err
    (other / "logs").mkdir()
    (tmp_path / "logs").rmdir()
    assert cli.main(args) == 0
    assert "--output" not in capsys.readouterr().err


@pytest.mark.parametrize("options, warned", [
    (["--launcher", "torchrun", "-G", "4"], True),  # 4 workers on the task's 1 CPU
    (["--launcher", "torchrun", "-G", "4", "-c", "32"], False),
    (["--launcher", "torchrun", "-G", "1"], False),  # one worker: the task's CPU is its own
    (["--launcher", "torchrun", "-G", "4", "--sbatch", "cpus-per-gpu=8"], False),  # CPUs asked for another way
    (["--launcher", "torchrun", "-G", "4", "--sbatch", "exclusive"], False),
    (["-G", "4"], False),  # srun: a task per GPU, each with its own CPU
])
def test_torchrun_workers_without_cores_for_them_are_warned_about(capsys, options, warned):
    assert cli.main(["sbatch", *options, "--", "train.py"] if "torchrun" in options else
                    ["sbatch", *options, "--", "python", "train.py"]) == 0
    err = capsys.readouterr().err
    assert ("--launcher torchrun without --cpus-per-task: each node's one task holds all 4 torchrun workers"
            in err) == warned, err
    assert ("--cpus-per-task 16 for 4 each" in err) == warned


def test_a_job_that_requeues_appends_to_its_log_and_one_that_does_not_says_so():
    # Slurm truncates --output when a requeued run starts: the earlier run's lines (its traceback) would be gone.
    assert "#SBATCH --open-mode=append\n" in render(JobSpec(command=("python", "t.py")))
    # --no-requeue is written out: leaving out --requeue alone would still let Slurm's JobRequeue=1 (its default)
    # requeue the job on preemption, truncating the log that --open-mode=append no longer protects.
    kept_out = render(JobSpec(command=("python", "t.py"), requeue=False))
    assert "open-mode" not in kept_out and "#SBATCH --requeue" not in kept_out
    assert "#SBATCH --no-requeue\n" in kept_out
    for script in sorted((REPO / "sbatch").glob("*.sh")):  # each is requeued on preemption, and keeps its log
        text = script.read_text()
        assert "#SBATCH --requeue" in text and "#SBATCH --open-mode=append" in text, script.name


@pytest.mark.parametrize("device, unit", [("gpu", "GPU"), ("npu", "NPU"), ("cpu", "rank")])
def test_the_launch_comment_names_what_each_task_drives(device, unit):
    script = render(JobSpec(command=("python", "t.py"), device=device, gpus_per_node=0 if device == "cpu" else 4))
    assert f"# One task per {unit}: " in script


def test_the_warning_signal_is_spelled_as_slurm_does_and_explained_at_the_top():
    script = render(JobSpec(command=("python", "t.py"), time="30", signal="usr2@300"))
    assert "#SBATCH --signal=USR2@300\n" in script
    head = script.split("#SBATCH", 1)[0]
    assert "every task gets SIGUSR2 300 s before the time limit" in head and "it kills any other" in head
    for spelled in ("SIGUSR2@300", "12@300", "R:usr2@300"):  # not SIGSIGUSR2, nor SIG12
        script = render(JobSpec(command=("python", "t.py"), time="30", signal=spelled))
        assert "every task gets SIGUSR2 300 s" in script
        assert re.search(r"^#SBATCH --signal=(R:)?USR2@300$", script, re.MULTILINE), script
    # sbatch refuses PWR by name (an invalid --signal specification) and takes its number.
    script = render(JobSpec(command=("python", "t.py"), time="30", signal="pwr@300"))
    assert f"#SBATCH --signal={int(signal.SIGPWR)}@300\n" in script and "every task gets SIGPWR" in script
    # signal='' (the CLI's --signal ''): no warning signal asked for, none listened for, nothing said of one.
    without = render(JobSpec(command=("python", "t.py"), signal=""))
    assert "--signal" not in without and "SLURMDIST_REQUEUE_SIGNAL" not in without
    assert "before the time limit" not in without.split("#SBATCH", 1)[0]
    for unlimited in ("0", "00", "0:00", "00:00:00", "0-0", "0-00:00:00"):  # Slurm's "no limit", however written
        assert f"#SBATCH --time={unlimited}\n" in render(JobSpec(command=("python", "t.py"), time=unlimited))


@pytest.mark.parametrize("warning, expected", [("usr1@60", signal.SIGUSR1), ("pwr@90", signal.SIGPWR),
                                               (None, signal.SIGUSR2)])
def test_the_tasks_requeue_handler_listens_for_the_signal_the_script_asks_slurm_for(tmp_path, warning, expected):
    # With --signal USR1 and no export, requeue.install() listened for USR2, and Slurm's USR1 killed the task.
    script = render(JobSpec(command=("python", "t.py"), time="30", signal=warning, device="cpu"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"  # a task: which signal would slurmdist.requeue.install() catch here?
    srun.write_text(f"#!/bin/bash\nexec {sys.executable} -c 'from slurmdist.requeue import parse_signal; "
                    f"print(parse_signal().name)' > {tmp_path / 'heard'}\n")
    srun.chmod(0o755)
    (tmp_path / "job.sh").write_text(script)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "42", "SLURM_NNODES": "1",
           "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "node1", "SLURM_SUBMIT_DIR": str(tmp_path),
           "SLURMDIST_REQUEUE_SIGNAL": "USR2", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "heard").read_text().strip() == expected.name


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_a_command_that_starts_with_an_option_is_refused_where_the_launcher_would_take_it(launcher):
    # `srun --kill-on-bad-exit=1 -m pkg`: srun read -m as its --distribution; the job failed after its queue wait.
    with pytest.raises(SbatchError, match=rf"the command starts with '-m', which {launcher} would read as an option "
                                          r"of its own.*`-- python -m pkg a 'b c'`"):
        render(JobSpec(command=("-m", "pkg", "a", "b c"), device="cpu", launcher=launcher))
    # torchrun takes -m itself: its workers run python -m pkg.
    assert "torchrun -m pkg a\n" in render(JobSpec(command=("-m", "pkg", "a"), gpus_per_node=1, launcher="torchrun"))


def test_npu_jobs_ask_for_other_generic_resources_on_the_same_gres_line():
    # sbatch keeps only the last --gres it is given: a second line dropped the NPUs (the job ran with gpu:1 alone).
    npu = render(JobSpec(command=("python", "t.py"), gpus_per_node=2, device="npu",
                         extra=(("gres", "gpu:1,tmp:10"), ("gres_flags", "enforce-binding"))))
    assert [line for line in npu.splitlines() if line.startswith("#SBATCH --gres")] == [
        "#SBATCH --gres=npu:2,gpu:1,tmp:10", "#SBATCH --gres-flags=enforce-binding"]
    with pytest.raises(SbatchError, match=r"--sbatch gres=npu:4 asks for NPUs again beside -G 2 --device npu.*once"):
        render(JobSpec(command=("python", "t.py"), gpus_per_node=2, device="npu", extra=(("gres", "npu:4"),)))
    with pytest.raises(SbatchError, match=r"--sbatch gpus=8 beside -G 2: sbatch's --gpus is the job's total"):
        render(JobSpec(command=("python", "t.py"), gpus_per_node=2, extra=(("gpus", "8"),)))
    assert "#SBATCH --gpus=8\n" in render(JobSpec(command=("python", "t.py"), extra=(("gpus", "8"),)))  # alone: kept
    gpu = render(JobSpec(command=("python", "t.py"), gpus_per_node=2, extra=(("gres", "tmp:10"),)))
    assert "#SBATCH --gpus-per-node=2\n" in gpu and "#SBATCH --gres=tmp:10\n" in gpu  # two options, both kept


def test_npu_cpu_and_torchrun_layouts():
    npu = render(JobSpec(command=("python", "t.py"), nodes=2, gpus_per_node=8, device="npu"))
    assert "#SBATCH --gres=npu:8\n" in npu and "--ntasks-per-node=8\n" in npu and "gpus-per-node" not in npu
    cpu = render(JobSpec(command=("python", "t.py"), nodes=3, tasks_per_node=2, device="cpu"))
    assert "--ntasks-per-node=2\n" in cpu and "gres" not in cpu and "gpus" not in cpu
    torchrun = render(JobSpec(command=("t.py",), nodes=2, gpus_per_node=4, launcher="torchrun"))
    assert "--ntasks-per-node=1\n" in torchrun and "--signal" not in torchrun  # torchrun's agent dies of it


@pytest.mark.parametrize("launcher, ranks_option", [
    ("srun", "tasks_per_node"), ("mpirun", "tasks_per_node"), ("torchrun", "workers_per_node"),
])
def test_more_ranks_than_gpus_only_when_asked_to_share(tmp_path, launcher, ranks_option):
    command = ("t.py",) if launcher == "torchrun" else ("python", "t.py")
    spec = JobSpec(command=command, nodes=2, gpus_per_node=2, launcher=launcher, **{ranks_option: 4})
    with pytest.raises(SbatchError, match="--share-devices"):
        render(spec)
    script = render(replace(spec, share_devices=True))
    assert "\nexport SLURMDIST_SHARE_DEVICES=1\n" in script
    assert "#SBATCH --gpus-per-node=2\n" in script
    run_script(script, tmp_path)  # the script still runs its launcher
    if launcher == "torchrun":
        assert "--nproc-per-node=4" in script
    else:
        assert "#SBATCH --ntasks-per-node=4\n" in script


def test_fewer_ranks_than_gpus_and_cpu_jobs_need_no_sharing():
    assert "SHARE" not in render(JobSpec(command=("python", "t.py"), gpus_per_node=4, tasks_per_node=1))
    assert "SHARE" not in render(JobSpec(command=("python", "t.py"), device="cpu", tasks_per_node=16))


@pytest.mark.parametrize("args, unit, warned", [
    (["--tasks-per-node", "2"], "rank", "--device gpu without --gpus-per-node asks Slurm for no GPUs"),
    (["--device", "npu"], "rank", "--device npu without --gpus-per-node asks Slurm for no NPUs"),
    (["-G", "2"], "GPU", None),
    (["--device", "cpu", "--tasks-per-node", "4"], "rank", None),
])
def test_a_gpu_job_that_asks_for_no_gpus_is_warned_about(capsys, args, unit, warned):
    # The default device is gpu and -G 0: such a job gets no GPU, and trains on the CPU without a word.
    assert cli.main(["sbatch", *args, "--", "python", "train.py"]) == 0
    said = capsys.readouterr()
    assert f"# One task per {unit}: " in said.out
    if warned is None:
        assert "warning" not in said.err
    else:
        assert warned in said.err and "Give -G N" in said.err
        # The option to put on sbatch's own command line instead asks for that device (no GPUs for NPUs).
        assert ("--gres=npu:N on the sbatch" if "npu" in args else "--gpus-per-node=N on the sbatch") in said.err


@pytest.mark.parametrize("limit", ["0", "infinite", "UNLIMITED"])
def test_no_time_limit_in_each_of_slurms_spellings(capsys, limit):
    assert cli.main(["sbatch", "--time", limit, "--", "python", "train.py"]) == 0
    script = capsys.readouterr().out
    assert f"#SBATCH --time={limit}\n" in script and "#SBATCH --signal=USR2@120\n" in script


def test_write_to_dash_is_stdout(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sbatch", "--write", "-", "--", "python", "train.py"]) == 0
    assert capsys.readouterr().out.startswith("#!/bin/bash\n") and not (tmp_path / "-").exists()


def test_write_to_a_file(tmp_path, capsys):
    target = tmp_path / "job.sh"
    assert cli.main(["sbatch", "--write", str(target), "--", "python", "train.py"]) == 0
    assert target.read_text().startswith("#!/bin/bash\n")
    assert "sbatch" in capsys.readouterr().err
    assert cli.main(["sbatch", "--write", str(tmp_path / "missing" / "job.sh"), "--", "python", "t.py"]) == 2


@pytest.mark.parametrize("cpus, seen", [("4", "4"), ("", "unset")])
def test_srun_gets_the_jobs_cpus_per_task_only_when_the_job_set_it(tmp_path, cpus, seen):
    # Without -c, srun gives the step every CPU of the allocation; a default of 1 would pin each task to a core.
    run_script(render(JobSpec(command=("python", "t.py"), nodes=2, gpus_per_node=4)), tmp_path,
               SLURM_CPUS_PER_TASK=cpus)
    assert (tmp_path / "calls.cpus").read_text() == f"srun {seen}\n"


def test_mpirun_keeps_its_daemons_cpus_and_takes_ranks_per_node_from_the_allocation(tmp_path):
    # mpirun starts its daemons with srun, one per node: SRUN_CPUS_PER_TASK would shrink them to one task's CPUs.
    script = render(JobSpec(command=("python", "t.py"), nodes=2, gpus_per_node=4, launcher="mpirun"))
    assert "SRUN_CPUS_PER_TASK" not in script
    [call] = run_script(script, tmp_path, SLURM_NTASKS_PER_NODE="2")  # `sbatch --ntasks-per-node=2 job.sh`
    assert call[call.index("--map-by") + 1] == "ppr:2:node"
    (tmp_path / "default").mkdir()
    [call] = run_script(script, tmp_path / "default")  # `salloc -N2 -n6`: 5 and 1, no per-node count
    assert call[call.index("--map-by") + 1] == "slot"  # was ppr:4:node, which cannot place 6 ranks on 5 + 1 slots

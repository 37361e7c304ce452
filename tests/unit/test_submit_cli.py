"""`slurmdist submit` argument handling: options -> Submitter arguments, errors as exit status 2."""

from __future__ import annotations

import io

import pytest

from slurmdist.cli import build_parser, main
from slurmdist.submit_cli import LogTail, command_of, parse_sbatch_options, submitter_options


def parse(*argv):
    return build_parser().parse_args(["submit", *argv])


def test_options_become_submitter_arguments():
    args = parse("--nodes", "2", "--gpus-per-node", "4", "--time", "1:00:00", "-p", "gpu", "--sbatch",
                 "constraint=a100", "--sbatch", "exclusive", "--setup", "module load cuda", "--signal", "URG",
                 "--", "python", "train.py", "--steps", "5")
    options = submitter_options(args)
    assert {k: options[k] for k in ("nodes", "gpus_per_node", "time", "partition", "signal", "setup")} == {
        "nodes": 2, "gpus_per_node": 4, "time": "1:00:00", "partition": "gpu", "signal": "URG",
        "setup": ["module load cuda"]}
    assert options["sbatch"] == {"constraint": "a100", "exclusive": True}
    assert command_of(args) == ["python", "train.py", "--steps", "5"]


def test_the_short_options_are_slurmdist_sbatchs_and_sbatchs_own():
    options = submitter_options(parse("-N", "2", "-G", "4", "-c", "8", "-t", "30", "-p", "gpu", "-A", "proj",
                                      "-J", "run", "--", "true"))
    assert {k: options[k] for k in ("nodes", "gpus_per_node", "cpus_per_task", "time", "partition", "account",
                                    "name")} == {
        "nodes": 2, "gpus_per_node": 4, "cpus_per_task": 8, "time": "30", "partition": "gpu", "account": "proj",
        "name": "run"}


def test_the_job_name_option_is_spelled_as_in_slurmdist_sbatch_and_sbatch_too():
    # `slurmdist sbatch --job-name x` worked and `slurmdist submit --job-name x` was "unrecognized arguments".
    assert submitter_options(parse("--job-name", "run", "--", "true"))["name"] == "run"
    assert submitter_options(parse("--name", "run", "--", "true"))["name"] == "run"


def test_the_command_keeps_its_own_options_and_odd_characters():
    args = parse("--wait", "--", "python", "-c", "print('$(rm -rf /)'); x = 1 > 0", "--nodes", "3")
    assert command_of(args) == ["python", "-c", "print('$(rm -rf /)'); x = 1 > 0", "--nodes", "3"]
    assert args.nodes == 1 and args.wait


def test_memory_with_a_unit_passes_as_typed():
    assert submitter_options(parse("--mem", "32G", "--", "true"))["mem"] == "32G"
    assert submitter_options(parse("--", "true"))["mem"] is None
    # 0 is sbatch's "all of the node's memory", unit or not, as docs/submit.md says and mem="0" takes.
    assert submitter_options(parse("--mem", "0", "--", "true"))["mem"] == "0"


def test_sbatch_needs_a_key():
    with pytest.raises(Exception, match="KEY=VALUE"):
        parse_sbatch_options(["=x"])


@pytest.mark.parametrize("argv, message", [
    (["submit"], "needs a command"),
    (["submit", "--", "", "train.py"], "slurmdist submit -- '' train.py: the command's name is empty"),
    (["submit", "--cluster", "local", "--", "-m", "pkg"],
     "slurmdist submit -- -m pkg: the command starts with an option, not a program: name the program first, "
     "e.g. `-- python -m pkg`"),
    # Submitter's errors in the options' terms, not its keywords (nodes=0)
    (["submit", "--nodes", "0", "--", "true"], "--nodes 0 must be a whole number >= 1"),
    (["submit", "--time", "soon", "--", "true"], "--time 'soon' is not a Slurm time"),
    (["submit", "--signal", "NOPE", "--", "true"], "--signal 'NOPE' is not a signal name"),
    # sbatch's spellings of "no limit" and of the signal with its delay, told in slurmdist submit's terms
    *[(["submit", "--time", no_limit, "--", "true"], f"--time '{no_limit}' means no time limit to Slurm, but a job "
       "slurmdist submits needs one: the requeue warning comes --signal-delay before it")
      for no_limit in ("0", "UNLIMITED", "infinite")],
    (["submit", "--signal", "USR2@60", "--", "true"], "--signal 'USR2@60' is sbatch's SIG@SECONDS form; give the "
     "signal alone (USR2) and the seconds before the time limit apart: --signal-delay SECONDS where slurmdist "
     "submits the job"),
    (["submit", "--signal", "", "--", "true"], "--signal '' names no signal: leave it out for the default, USR2"),
    (["submit", "--mem", "32", "--", "true"], "--mem 32 has no unit: sbatch reads a bare number as megabytes"),
    (["submit", "--mem", "1.5G", "--", "true"], "--mem '1.5G' is not a Slurm memory size: give a whole number and its "
     "unit, such as 32G"),
    # ... but what the user typed in quotes stays as typed, and prose keeps its words
    (["submit", "--sbatch", "cpus_per_task=4", "--", "true"], "sbatch option 'cpus_per_task' is set by slurmdist"),
    (["submit", "--sbatch", "no_requeue=1", "--", "true"], "preemption and the requeue signal rely on it"),
    (["submit", "--sbatch", "output=/tmp/x", "--", "true"], "set by slurmdist; instead use --folder DIR"),
    (["submit", "--sbatch", "time=10", "--", "true"], "'time' is set by slurmdist; instead use --time MINUTES"),
    (["submit", "--sbatch", "signal=USR1", "--", "true"], "instead use --signal NAME and --signal-delay SECONDS"),
    (["submit", "--gpus-per-node", "4", "--tasks-per-node", "2", "--", "true"], "one task per GPU"),
    (["submit", "--gpus-per-node", "4", "--ntasks-per-node", "2", "--", "true"], "one task per GPU"),  # sbatch's name
    (["submit", "--time", "3", "--", "true"],
     "--signal-delay 120 s leaves no time to train within --time '3' (3 min)"),
    (["submit", "--time", "3", "--", "true"], "Set --time to at least 4 min, or --signal-delay to at most 119 s"),
    *[(["submit", "--cluster", "local", "--wait", "--timeout", bad, "--", "true"], "--timeout=")
      for bad in ("-5", "0", "nan", "inf")],  # refused before anything is submitted
])
def test_bad_requests_exit_2_with_a_message(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_log_tail_prints_new_complete_lines_without_submitit_noise(tmp_path):
    log = tmp_path / "0_log.out"
    out = io.StringIO()
    tail = LogTail(log, out)
    tail.flush()  # no file yet
    log.write_text("submitit INFO - Starting\nstep 10/40\nstep 2")
    tail.flush()
    with log.open("a") as stream:
        stream.write("0/40\ndone\n")
    tail.flush()
    assert out.getvalue() == "step 10/40\nstep 20/40\ndone\n"
    # Output that ended without a newline: submitit's next line is glued to it, and only the output is shown.
    with log.open("a") as stream:
        stream.write("x" "submitit INFO (2026-11-30 06:40:00,123) - Job completed successfully\n")
    tail.flush()
    assert out.getvalue().endswith("done\nx\n")
    # Output that only mentions such a line keeps it.
    with log.open("a") as stream:
        stream.write("grep found 'submitit INFO (2026-11-30 06:40:00,123)' in the log\n")
    tail.flush()
    assert out.getvalue().endswith("x\ngrep found 'submitit INFO (2026-11-30 06:40:00,123)' in the log\n")


@pytest.mark.parametrize("option, instead", [
    (["--output", "x.log"], "sbatch's --output is slurmdist submit's to set; instead: --folder DIR"),
    (["-o", "x.log"], "sbatch's --output is slurmdist submit's to set; instead: --folder DIR"),
    (["--error=x.err"], "sbatch's --error is slurmdist submit's to set; instead: --folder DIR"),
    (["--open-mode", "append"], "instead: no option: the logs are appended to"),
    (["-ologs/x.log"], "sbatch's --output is slurmdist submit's to set"),  # glued, as sbatch takes it
    (["--no-requeue"], "slurmdist submit always submits with --requeue"),
    (["--o", "x"], "any other sbatch option goes through --sbatch"),  # ambiguous to sbatch too: no guess
    (["--exclusive"], "any other sbatch option goes through --sbatch with its long name: --sbatch exclusive"),
])
def test_an_sbatch_option_submit_sets_itself_is_told_what_to_use_instead(option, instead, capsys):
    # "goes through --sbatch" was a dead end for these: --sbatch output=... is refused too.
    from slurmdist.cli import main

    with pytest.raises(SystemExit) as usage:
        main(["submit", "--cluster", "local", *option, "--", "true"])
    assert usage.value.code == 2
    assert instead in capsys.readouterr().err


def test_timeout_without_wait_is_refused_before_submitting(capsys):
    from slurmdist.cli import main

    assert main(["submit", "--cluster", "local", "--timeout", "60", "--", "true"]) == 2
    assert "--timeout 60 applies only with --wait" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["sbatch", "submit"])
def test_an_sbatch_option_slurmdist_has_no_flag_for_is_told_where_it_goes(command, capsys):
    with pytest.raises(SystemExit) as usage:
        main([command, "--exclusive", "--", "python", "train.py"])
    err = capsys.readouterr().err
    assert usage.value.code == 2
    assert ("unrecognized arguments: --exclusive; any other sbatch option goes through --sbatch with its long "
            "name: --sbatch exclusive") in err, err
    with pytest.raises(SystemExit):  # a command without --sbatch keeps argparse's own words
        main(["env", "--exclusive"])
    assert "--sbatch" not in capsys.readouterr().err

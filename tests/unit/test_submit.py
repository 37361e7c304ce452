"""slurmdist.submit's pure parts: option validation, the mapping to submitit's parameters, the rendered
sbatch script (through submitit's own renderer), states, and the cheap import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slurmdist.submit import (
    FINISHED_STATES, Resources, SubmitError, choose_cluster, local_parameters, parse_mem, parse_state,
    parse_time, slurm_parameters,
)


@pytest.mark.parametrize("value, minutes", [
    (30, 30), (0.5, 1), (90.2, 91), ("45", 45), ("10:30", 11), ("1:30:00", 90), ("2-00:00:00", 2880),
    ("1-12", 2160), ("1-00:30", 1470),
])
def test_parse_time_gives_whole_minutes(value, minutes):
    assert parse_time(value) == minutes


@pytest.mark.parametrize("value", [0, -5, "", "1:2:3:4", "abc", "1-x", True, float("inf")])
def test_parse_time_rejects_what_is_not_a_duration(value):
    with pytest.raises(SubmitError, match="time="):
        parse_time(value)


@pytest.mark.parametrize("value, text", [(32, "32G"), (1.5, "1536M"), ("500m", "500M"), ("64GB", "64GB")])
def test_parse_mem(value, text):
    assert parse_mem(value) == text


@pytest.mark.parametrize("value", [0, "lots", "32G; rm -rf /", False])
def test_parse_mem_rejects_garbage(value):
    with pytest.raises(SubmitError, match="mem="):
        parse_mem(value)


def test_gpus_set_one_task_per_gpu():
    resources = Resources(nodes=2, gpus_per_node=4)
    assert (resources.ntasks_per_node, resources.world_size) == (4, 8)
    params = slurm_parameters(resources)
    assert (params["nodes"], params["ntasks_per_node"], params["gpus_per_node"]) == (2, 4, 4)


def test_cpu_jobs_give_tasks_per_node():
    params = slurm_parameters(Resources(nodes=2, tasks_per_node=3, cpus_per_task=2, time="0:30:00",
                                        partition="cpu", account="proj", mem=16))
    assert {k: params[k] for k in ("ntasks_per_node", "cpus_per_task", "time", "partition", "account", "mem")} == \
        {"ntasks_per_node": 3, "cpus_per_task": 2, "time": 30, "partition": "cpu", "account": "proj", "mem": "16G"}
    assert "gpus_per_node" not in params


def test_jobs_are_requeueable_and_warned_with_usr2_by_default():
    params = slurm_parameters(Resources())
    assert params["additional_parameters"]["signal"] == "USR2@120"
    assert params["additional_parameters"]["requeue"] is True
    assert "export SLURMDIST_REQUEUE_SIGNAL=USR2" in params["setup"]
    assert "export SUBMITIT_PREEMPT_SIGNAL=USR2" in params["setup"]
    assert "--kill-on-bad-exit=1" in params["srun_args"]


def test_signal_is_configurable():
    params = slurm_parameters(Resources(signal="SIGTERM", signal_delay=300))
    assert params["additional_parameters"]["signal"] == "TERM@300"
    assert params["signal_delay_s"] == 300


@pytest.mark.parametrize("changes, message", [
    ({"nodes": 0}, "nodes=0"),
    ({"nodes": 1.5}, "nodes=1.5"),
    ({"gpus_per_node": 4, "tasks_per_node": 2}, "one task per GPU"),
    ({"setup": "module load cuda"}, "list of shell lines"),
    ({"signal": "NOPE"}, "not a signal"),
    ({"sbatch": {"output": "x"}}, "set by slurmdist"),
    ({"sbatch": {"ntasks_per_node": 3}}, "set by slurmdist"),
    ({"sbatch": {"bad key\n#SBATCH --x": "1"}}, "not an option name"),
    ({"sbatch": {"comment": "two\nlines"}}, "one line"),
])
def test_resources_are_validated(changes, message):
    with pytest.raises(SubmitError, match=message):
        Resources(**changes)


def test_the_rendered_batch_script_quotes_every_value():
    """What sbatch reads, rendered by submitit itself from our parameters: nothing can break out."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = slurm_parameters(Resources(nodes=2, tasks_per_node=2, partition="gpu",
                                        sbatch={"comment": "x; touch /tmp/pwned", "exclusive": True}))
    script = _make_sbatch_string(command="python -m submitit.core._submit logs", folder="logs/%j", **params)
    lines = script.splitlines()
    assert "#SBATCH --comment='x; touch /tmp/pwned'" in lines
    assert "#SBATCH --exclusive" in lines and "#SBATCH --requeue" in lines
    assert "#SBATCH --signal=USR2@120" in lines and "#SBATCH --ntasks-per-node=2" in lines
    assert lines.index("export SLURMDIST_REQUEUE_SIGNAL=USR2") < next(
        i for i, line in enumerate(lines) if line.startswith("srun "))


def test_local_runs_every_task_on_this_machine():
    params = local_parameters(Resources(nodes=2, gpus_per_node=2, time=10))
    assert (params["tasks_per_node"], params["gpus_per_node"], params["timeout_min"]) == (4, 4, 10)


def test_choose_cluster():
    assert choose_cluster("auto", which=lambda tool: f"/usr/bin/{tool}") == "slurm"
    assert choose_cluster("auto", which=lambda tool: None) == "local"
    assert choose_cluster("local", which=lambda tool: f"/usr/bin/{tool}") == "local"
    with pytest.raises(SubmitError, match="sbatch/srun are not on PATH"):
        choose_cluster("slurm", which=lambda tool: None)
    with pytest.raises(SubmitError, match="cluster="):
        choose_cluster("pbs")


@pytest.mark.parametrize("output, state", [
    ("RUNNING\n", "RUNNING"), ("CANCELLED by 0\n", "CANCELLED"), ("COMPLETED\nCOMPLETED\n", "COMPLETED"),
    ("FAILED+\n", "FAILED"), ("\n", "UNKNOWN"),
])
def test_parse_state(output, state):
    assert parse_state(output) == state


def test_requeued_and_pending_jobs_are_not_finished():
    assert {"PENDING", "RUNNING", "REQUEUED", "COMPLETING", "UNKNOWN"}.isdisjoint(FINISHED_STATES)
    assert {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"} <= FINISHED_STATES


def test_importing_submit_imports_neither_submitit_nor_torch():
    code = ("import sys, slurmdist, slurmdist.submit, slurmdist.requeue, slurmdist.submit_cli; "
            "print(sorted(m for m in ('submitit', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("field", ["name", "partition", "account"])
@pytest.mark.parametrize("value", ["two\nlines", "carriage\rreturn", "", "nul\0byte"])
def test_names_that_would_break_an_sbatch_line_are_refused(field, value):
    from slurmdist.submit import Resources, SubmitError

    with pytest.raises(SubmitError, match=field):
        Resources(**{field: value})

"""scripts/local-cluster brings up a real multi-node Slurm cluster: lifecycle, layout, fake GPUs, isolation."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.integration.cluster import LOCAL_CLUSTER

pytestmark = pytest.mark.integration


def state_of(cluster) -> str:
    return (cluster.dir / "cluster.state").read_text()


def test_status_shows_idle_nodes(slurm_cluster):
    out = slurm_cluster.script("status").stdout
    assert "debug*" in out
    assert "urgent" in out  # the partition whose jobs preempt debug's
    assert "node[1-2]" in out
    assert "idle" in out


def test_start_on_a_running_cluster_is_a_no_op(slurm_cluster):
    before = state_of(slurm_cluster)
    proc = slurm_cluster.script("start")
    assert "already running" in proc.stderr
    assert f"export SLURM_CONF='{slurm_cluster.env['SLURM_CONF']}'" in proc.stdout
    assert state_of(slurm_cluster) == before  # same daemons, same ports
    assert "warning" not in proc.stderr


def test_start_on_a_running_cluster_of_another_shape_says_so(slurm_cluster):
    proc = slurm_cluster.script("start", "--nodes", "3")
    assert "already running" in proc.stderr
    assert "not the cluster asked for: --nodes 3 (it has 2)" in proc.stderr and "stop --dir" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["frobnicate"], "unknown command 'frobnicate'"),
    ([], "a command is needed"),
    (["start", "--nodes"], "--nodes needs a value"),
    (["start", "--nodes", "--gpus", "2"], "--nodes needs a value"),
    (["start", "--dir", "/tmp/" + "x" * 90], "too long for munge's socket"),
])
def test_bad_arguments_are_named_at_once(args, message):
    proc = subprocess.run([LOCAL_CLUSTER, *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert "line " not in proc.stderr  # not bash's own message


def test_env_prints_what_clients_need(slurm_cluster):
    out = slurm_cluster.script("env").stdout
    assert f"export SLURM_CONF='{slurm_cluster.dir}/etc/slurm.conf'" in out
    assert "export TMPDIR=" in out


def test_srun_spans_two_nodes_with_their_own_hostnames(slurm_cluster):
    out = slurm_cluster.run(["srun", "-N2", "--ntasks-per-node=2", "hostname"]).stdout
    assert sorted(out.split()) == ["node1", "node1", "node2", "node2"]


def test_slurmctld_listens_on_loopback_only(slurm_cluster):
    pid = (slurm_cluster.dir / "run" / "slurmctld.pid").read_text().strip()
    sockets = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True, timeout=30, check=True).stdout
    addresses = [line.split()[3] for line in sockets.splitlines() if f"pid={pid}," in line]
    assert addresses and all(address.startswith("127.0.0.1:") for address in addresses), addresses


def test_nodes_accept_more_cpus_than_the_machine_has(slurm_cluster):
    slurm_cluster.run(["srun", "-N2", "--ntasks-per-node=4", "--cpus-per-task=2", "true"])


def test_impossible_request_is_rejected_not_left_pending(slurm_cluster):
    proc = slurm_cluster.run(
        ["srun", "-N2", "--ntasks-per-node=5", "--cpus-per-task=2", "true"], check=False
    )
    assert proc.returncode != 0
    assert "More processors requested than permitted" in proc.stderr


def test_gpu_job_sees_cuda_visible_devices(slurm_cluster):
    out = slurm_cluster.run(["srun", "-n1", "--gpus=2", "printenv", "CUDA_VISIBLE_DEVICES"]).stdout
    assert out.split() == ["0,1"]


def test_gpus_per_task_gives_each_task_its_own_gpu(slurm_cluster):
    out = slurm_cluster.run(
        ["srun", "-N2", "--ntasks-per-node=2", "--gpus-per-task=1", "sh", "-c",
         'echo "$(hostname) $SLURM_LOCALID $CUDA_VISIBLE_DEVICES"'],
    ).stdout
    assert sorted(out.splitlines()) == ["node1 0 0", "node1 1 1", "node2 0 0", "node2 1 1"]


def test_pmi2_is_available_but_not_the_default(slurm_cluster):
    with_pmi = slurm_cluster.run(["srun", "--mpi=pmi2", "-n2", "printenv", "PMI_SIZE"]).stdout
    assert with_pmi.split() == ["2", "2"]
    plain = slurm_cluster.run(["srun", "-n1", "printenv", "PMI_SIZE"], check=False)
    assert plain.stdout == ""


def test_two_clusters_run_at_the_same_time(slurm_cluster, local_cluster):
    other = local_cluster("--nodes", "3", "--gpus", "0")
    assert other.env["SLURM_CONF"] != slurm_cluster.env["SLURM_CONF"]
    out = other.run(["srun", "-N3", "hostname"]).stdout
    assert sorted(out.split()) == ["node1", "node2", "node3"]
    out = slurm_cluster.run(["srun", "-N2", "hostname"]).stdout
    assert sorted(out.split()) == ["node1", "node2"]
    other.stop()
    slurm_cluster.script("status")  # stopping one leaves the other alone


def test_stop_then_start_again(local_cluster):
    cluster = local_cluster("--nodes", "1")
    cluster.stop()
    assert cluster.script("status", check=False).returncode != 0
    assert cluster.script("env", check=False).returncode != 0
    cluster.stop()  # stopping a stopped cluster is fine
    cluster.script("start")
    cluster.run(["srun", "-n1", "true"])


def daemon_pids(cluster) -> list:
    state = dict(line.split("=", 1) for line in state_of(cluster).splitlines())
    return [int(pid) for key in ("MUNGED_PID", "CTLD_PID", "NODE_PIDS") for pid in state[key].strip("'").split()]


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited daemon whose parent has not reaped it yet still has a /proc entry)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_cluster_stops_itself_when_its_owner_dies(local_cluster):
    # What a test session killed from outside would leave: its fixtures' stop never runs.
    owner = subprocess.Popen(["sleep", "600"])
    try:
        cluster = local_cluster("--nodes", "1", "--gpus", "0", owner=owner.pid)
        daemons = daemon_pids(cluster)
        assert len(daemons) == 3 and all(map(running, daemons))
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 40  # the watchdog polls every 2 s; stopping takes a few seconds
    while (cluster.dir / "cluster.state").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not (cluster.dir / "cluster.state").exists(), (cluster.dir / "log" / "watchdog.log").read_text()
    assert not [pid for pid in daemons if running(pid)]
    assert "stopped" in (cluster.dir / "log" / "watchdog.log").read_text()


# The requeue signals every process of the first run, one after the other: when `sleep` dies first, the shell
# went on to the next line before its own signal came, and wrote a result for the first run ("restarts=").
# The first run must therefore never reach the echo.
REQUEUE_ONCE = """#!/bin/sh
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
    scontrol requeue "$SLURM_JOB_ID"
    sleep 60
    exit 1
fi
echo "restarts=$SLURM_RESTART_COUNT" > "$1"
"""


def test_a_job_can_be_requeued(slurm_cluster, tmp_path):
    script, result = tmp_path / "requeue_once.sh", tmp_path / "result"
    script.write_text(REQUEUE_ONCE)
    slurm_cluster.run(["sbatch", "--requeue", "-o", "/dev/null", script, result])
    deadline = time.monotonic() + 90  # requeue + cred_expire (10 s) + a scheduler pass
    while "\n" not in (result.read_text() if result.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert result.exists(), slurm_cluster.run(["squeue", "-o", "%i %T %r"]).stdout
    assert result.read_text().strip() == "restarts=1"

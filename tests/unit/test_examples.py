"""examples/train.py in one process: the pieces that make every launcher agree (sample order, checkpoints).

The multi-process runs (srun, sbatch, mpirun, torchrun, ...) are in tests/integration/test_launcher_matrix.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import require_module

torch = require_module("torch", "install torch (make venv does)")

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_", "SUBMITIT_", "MV2_", "PALS_", "FLUX_")
LAUNCHER_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                  "GROUP_RANK", "SLURMDIST_LAUNCHER")


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("example_train", TRAIN)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture
def single(monkeypatch):
    """This process as a plain `python train.py`, whatever launched pytest."""
    for name in list(os.environ):
        if name.startswith(LAUNCHER_PREFIXES) or name in LAUNCHER_NAMES:
            monkeypatch.delenv(name)


def run(train, tmp_path: Path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert train.main(["--steps", "6", "--log-every", "3", "--out", str(out), *args]) == 0
    return json.loads(out.read_text())


def test_result_json_has_world_size_loss_and_checksum(train, single, tmp_path):
    result = run(train, tmp_path, "plain")
    assert result["world_size"] == 1
    assert result["loss"] > 0
    assert len(result["checksum"]) == 64 and int(result["checksum"], 16) >= 0
    assert run(train, tmp_path, "again") == result  # deterministic


def test_resuming_from_a_checkpoint_gives_the_same_parameters(train, single, tmp_path):
    straight = run(train, tmp_path, "straight")
    checkpoint = tmp_path / "ckpt.pt"
    first = run(train, tmp_path, "first", "--steps", "4", "--checkpoint", str(checkpoint))
    assert first["steps"] == 4 and checkpoint.exists()
    resumed = run(train, tmp_path, "resumed", "--checkpoint", str(checkpoint))
    assert resumed["steps"] == 6
    assert resumed["checksum"] == straight["checksum"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left behind


def test_step_seconds_slows_the_run_down_and_changes_nothing_it_computes(train, single, tmp_path):
    fast = run(train, tmp_path, "fast")
    started = time.monotonic()
    slow = run(train, tmp_path, "slow", "--step-seconds", "0.05")
    assert time.monotonic() - started >= 6 * 0.05  # a lower bound the sleeps guarantee, not a speed
    assert slow == fast


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_step_seconds_must_be_a_number_of_seconds(train, capsys, value):
    with pytest.raises(SystemExit):
        train.parse_args(["--step-seconds", value])
    assert f"--step-seconds must be a number of seconds, 0 or more, not {float(value)}" in capsys.readouterr().err


def test_a_checkpoint_from_another_run_is_refused(train, single, tmp_path):
    checkpoint = tmp_path / "ckpt.pt"
    run(train, tmp_path, "seed0", "--checkpoint", str(checkpoint))
    with pytest.raises(SystemExit, match="different run"):
        run(train, tmp_path, "seed1", "--seed", "1", "--checkpoint", str(checkpoint))


@pytest.mark.parametrize("world_size", [2, 3, 4, 6, 8])
def test_every_world_size_sees_the_same_global_batches(train, world_size):
    """Rank r's local batch i, over all ranks, is exactly the one-process batch i: same samples, same loss."""
    data = train.make_data(0, 48 * 3)
    single_rank = train.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0, drop_last=True)
    ranks = [train.DistributedSampler(data, num_replicas=world_size, rank=r, shuffle=True, seed=0, drop_last=True)
             for r in range(world_size)]
    for step in range(7):  # crosses an epoch boundary: 3 steps per epoch
        whole = train.step_indices(single_rank, step, 48)
        parts = [train.step_indices(sampler, step, 48 // world_size) for sampler in ranks]
        assert sorted(i for part in parts for i in part) == sorted(whole)


def test_batch_size_must_split_evenly(train, single, tmp_path):
    env = train.slurmdist.DistEnv(launcher="single", rank=0, local_rank=0, world_size=5, local_world_size=5,
                                  node_rank=0, num_nodes=1, master_addr=None, master_port=None, job_id=None)
    with pytest.raises(SystemExit, match="does not split evenly across 5 ranks"):
        train.train(train.parse_args(["--batch-size", "48"]), env, train.CheckpointRequest())


def test_the_warning_signal_requests_a_checkpoint_and_does_not_kill(train):
    request = train.CheckpointRequest()
    previous = signal.getsignal(train.CHECKPOINT_SIGNAL)
    try:
        request.install()
        os.kill(os.getpid(), train.CHECKPOINT_SIGNAL)
        assert request.requested
    finally:
        signal.signal(train.CHECKPOINT_SIGNAL, previous)


def test_a_warning_that_cannot_requeue_saves_and_stops_with_one_line_and_status_75(train, single, tmp_path, capsys):
    # Not a Slurm job (or one submitted without --requeue): the checkpoint is saved, every rank stops at one step.
    checkpoint = tmp_path / "c.pt"
    handlers = {sig: signal.getsignal(sig) for sig in (train.CHECKPOINT_SIGNAL, signal.SIGTERM)}
    warning = threading.Timer(1.0, os.kill, (os.getpid(), train.CHECKPOINT_SIGNAL))
    try:
        warning.start()
        status = train.main(["--requeue", "--checkpoint", str(checkpoint), "--steps", "400", "--step-seconds", "0.02"])
    finally:
        warning.cancel()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    captured = capsys.readouterr()
    assert status == train.NOT_REQUEUED_EXIT_STATUS == 75
    assert "train.py: checkpoint saved; not requeued: this is not a Slurm job (SLURM_JOB_ID is unset)" in captured.err
    assert "Traceback" not in captured.err
    stopped_at = int(re.search(r"not requeued: stopped at step (\d+), checkpoint ", captured.out).group(1))
    assert 0 < stopped_at < 400 and train.load_checkpoint(checkpoint)["step"] == stopped_at


def test_a_requeue_signal_no_process_can_catch_is_one_line_not_a_traceback():
    environ = {name: value for name, value in os.environ.items()
               if not name.startswith(LAUNCHER_PREFIXES) and name not in LAUNCHER_NAMES}
    done = subprocess.run([sys.executable, str(TRAIN), "--steps", "1"], capture_output=True, text=True, timeout=120,
                          env={**environ, "SLURMDIST_REQUEUE_SIGNAL": "KILL"})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("train.py: SLURMDIST_REQUEUE_SIGNAL='KILL' cannot be caught"), done.stderr


def test_atomic_write_keeps_the_old_file_when_writing_fails(train, tmp_path):
    target = tmp_path / "result.json"
    target.write_text("old")

    def fail(stream):
        stream.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        train.write_atomically(target, fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_atomic_write_honours_the_umask_and_clears_what_killed_saves_left(train, tmp_path):
    target = tmp_path / "checkpoint.pt"
    (tmp_path / ".checkpoint.pt.1234.deadbeef").write_bytes(b"half of a save SIGKILL ended")
    (tmp_path / ".other.pt.1234.deadbeef").write_bytes(b"another file's")
    (tmp_path / ".checkpoint.pt.1.1234.deadbeef").write_bytes(b"checkpoint.pt.1's save, under way")
    old = os.umask(0o027)
    try:
        train.write_atomically(target, lambda stream: stream.write(b"new"))
    finally:
        os.umask(old)
    assert target.read_bytes() == b"new"
    assert target.stat().st_mode & 0o777 == 0o640  # 0666 less the umask, as any file the job writes
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".checkpoint.pt.1.1234.deadbeef", ".other.pt.1234.deadbeef", "checkpoint.pt"]


def test_a_batch_script_without_srun_is_told_so_with_requeue_too(train, single, monkeypatch, capsys, tmp_path):
    # requeue.install() reads the launch (its rank) before init() does: the same message, no traceback.
    for name, value in {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_NNODES": "2", "SLURM_PROCID": "0"}.items():
        monkeypatch.setenv(name, value)
    status = train.main(["--requeue", "--checkpoint", str(tmp_path / "c.pt"), "--steps", "1"])
    err = capsys.readouterr().err
    assert status == 2 and "train.py: This process is the batch script of Slurm job 7" in err
    assert "Traceback" not in err


def test_requeue_needs_a_checkpoint_to_resume_from(train, capsys):
    with pytest.raises(SystemExit):
        train.parse_args(["--requeue"])
    assert "--requeue needs --checkpoint" in capsys.readouterr().err


def test_with_requeue_the_saved_warning_requeues_and_sigterm_before_it_still_stops(train, monkeypatch):
    # Rank 0 clears `requested` after saving: that is when the job is requeued. SIGTERM before any warning
    # (scancel, a preemption) is a stop, as without --requeue.
    requeued = []
    preemption = train.slurmdist.requeue.Preemption(signal.SIGUSR2, 10, 0)
    monkeypatch.setattr(preemption, "requeue", lambda: requeued.append(preemption.ending))
    request = train.RequeueAfterSave(preemption)
    request.requested = False  # a periodic save: no warning yet, so no requeue
    assert requeued == [] and not request.stopping
    preemption.received_at = 1.0  # the warning arrived
    assert request.requested and not request.stopping
    request.requested = False  # saved
    assert requeued == [False]
    try:
        preemption.install()
        os.kill(os.getpid(), signal.SIGTERM)  # no warning before it: stop
        assert request.stopping
    finally:
        preemption.uninstall()


@pytest.mark.parametrize("args, message", [
    (["--nodes", "0"], "submit_train.py: nodes=0 must be a whole number >= 1"),
    (["--cluster", "local", "--time", "soon"], "submit_train.py: time='soon' is not a Slurm time: use minutes or "
     "HH:MM:SS or D-HH:MM:SS"),
])
def test_submit_train_reports_a_bad_request_in_one_line(args, message, tmp_path):
    done = subprocess.run([sys.executable, str(TRAIN.with_name("submit_train.py")), "--checkpoint",
                           str(tmp_path / "c.pt"), *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.strip() == message, done.stderr


@pytest.mark.parametrize("status, why", [(143, "SIGTERM came without a warning first"),
                                         (75, "the warning came but the job could not be requeued")])
def test_submit_train_says_why_training_stopped_early_not_a_tuple(train, status, why):
    spec = importlib.util.spec_from_file_location("example_submit_train", TRAIN.with_name("submit_train.py"))
    submit_train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(submit_train)
    said = submit_train.stopped_because(train, train.Stopped(42, status), "runs/c.pt")
    assert said.startswith(f"training stopped at step 42: {why}") and "runs/c.pt was saved" in said


# train.py run as a script, with `signum` sent to it the moment it starts importing torch (a warning that
# lands during start-up, as with a short --time or a preemption right after the job starts).
SIGNAL_WHILE_TORCH_IMPORTS = """
import importlib.abc, os, runpy, signal, sys
train, signum = sys.argv[1], int(sys.argv[2])
class SignalAtTorchImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signum)
        return None
sys.meta_path.insert(0, SignalAtTorchImport())
sys.argv = [train, *sys.argv[3:]]
runpy.run_path(train, run_name="__main__")
"""


@pytest.mark.parametrize("signum, status, says, requeue_signal", [
    (signal.SIGUSR2, 0, "step 3/3", None),  # saved at the next step, then trained on
    (signal.SIGTERM, 143, "SIGTERM: stopped at step 1", None),  # saved at the first step, then stopped
    # `slurmdist sbatch --signal PWR@90` exports the signal it asks Slurm for: train.py listened for USR2 only,
    # and SIGPWR killed it.
    (signal.SIGPWR, 0, "step 3/3", "PWR"),
])
def test_a_signal_during_the_torch_import_is_held_for_the_handlers(tmp_path, signum, status, says, requeue_signal):
    # The handlers are installed in main(), after `import torch` (seconds): a warning then killed the task.
    environ = {name: value for name, value in os.environ.items()
               if not (name.startswith(LAUNCHER_PREFIXES) or name in LAUNCHER_NAMES)}
    environ.pop("SLURMDIST_REQUEUE_SIGNAL", None)
    if requeue_signal:
        environ["SLURMDIST_REQUEUE_SIGNAL"] = requeue_signal
    checkpoint = tmp_path / "ckpt.pt"
    done = subprocess.run([sys.executable, "-c", SIGNAL_WHILE_TORCH_IMPORTS, str(TRAIN), str(int(signum)),
                           "--steps", "3", "--log-every", "1", "--checkpoint", str(checkpoint)],
                          capture_output=True, text=True, timeout=120, env=environ)
    assert done.returncode == status, done.stdout + done.stderr
    assert says in done.stdout and checkpoint.exists(), done.stdout + done.stderr

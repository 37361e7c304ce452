"""Faults injected into real runs on the local Slurm cluster: every surviving rank must exit non-zero within
the configured timeout plus a margin, saying what happened; nothing may hang.

Each case launches `workers/fault_worker.py` with srun (gloo, real process groups); the victim rank fails in
the chosen way and the others report their exit time and message (see the worker). Timeouts are short
here (`SLURMDIST_INIT_TIMEOUT`, `SLURMDIST_COLLECTIVE_TIMEOUT`) so a case costs seconds, not minutes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from slurmdist.hosts import free_port
from slurmdist.process_group import watchdog_grace
from slurmdist.rendezvous import OWNER_CHECK_AFTER
from tests.conftest import unresolved
from tests.integration.cluster import PYTHON, REPO, TRAIN_PY, train_reference

pytestmark = pytest.mark.integration
RELIABILITY_SECTION = "Faults in real runs"

WORKERS = Path(__file__).resolve().parent / "workers"
FAULT_WORKER = WORKERS / "fault_worker.py"
INIT_TIMEOUT = 6.0
COLLECTIVE_TIMEOUT = 6.0
# Torch imports alone take seconds per process on a busy 2-core machine: the margin absorbs that, the bound
# still catches a hang (the defaults are 300 s and 1800 s).
MARGIN = 30.0
RUN_TIMEOUT = 180


def timeouts(**extra: str) -> Dict[str, str]:
    return {"SLURMDIST_INIT_TIMEOUT": str(INIT_TIMEOUT), "SLURMDIST_COLLECTIVE_TIMEOUT": str(COLLECTIVE_TIMEOUT),
            **extra}


def reports(out: Path, world: int) -> Dict[int, dict]:
    found = {}
    for rank in range(world):
        path = out / f"rank{rank}.json"
        if path.exists():
            found[rank] = json.loads(path.read_text())
    return found


def fault_time(out: Path) -> Optional[float]:
    path = out / "fault.json"
    return json.loads(path.read_text())["time"] if path.exists() else None


def srun_faulty(cluster, out: Path, *worker_args: str, nodes: int = 2, tasks: int = 2, env=None):
    started = time.time()
    proc = cluster.run(["srun", f"-N{nodes}", f"--ntasks-per-node={tasks}", "--kill-on-bad-exit=0", PYTHON,
                        FAULT_WORKER, out, *worker_args], timeout=RUN_TIMEOUT, check=False,
                       env=env or timeouts())
    return started, proc


def summarize(found: Dict[int, dict], survivors: List[int]) -> str:
    errors = {found[r].get("error", found[r]["outcome"]) for r in survivors if r in found}
    message = next((found[r]["message"] for r in survivors if found.get(r, {}).get("message")), "")
    return f"ranks {survivors} exit 1 with {'/'.join(sorted(errors))}: \"{message[:160]}\""


CASES = {
    # name: (worker args, victim, survivors' bound, expected message fragments (any of))
    "a rank never starts": (["--fault", "never-start", "--victim", "3"], 3, INIT_TIMEOUT,
                            ["rank(s) 3 never arrived"]),
    "a rank dies after init, during training": (["--fault", "die", "--victim", "2"], 2, COLLECTIVE_TIMEOUT,
                                                ["Connection closed by peer", "Connection reset", "timed out",
                                                 "Timed out"]),
    "a rank hangs in training (alive, silent)": (["--fault", "hang", "--victim", "1"], 1, COLLECTIVE_TIMEOUT,
                                                 ["Timed out", "timed out", "Timeout"]),
    "rank 0 (store host) dies during training": (["--fault", "die", "--victim", "0"], 0, COLLECTIVE_TIMEOUT,
                                                 ["Connection closed by peer", "Connection reset", "timed out",
                                                  "Timed out"]),
    "rank 0 (store host) dies during the rendezvous": (
        ["--fault", "die-in-rendezvous", "--victim", "0", "--at", "2", "--late", "3"], 0,
        INIT_TIMEOUT, ["lost the rendezvous store", "nothing listens"]),
    # torch's store client waits for a frozen store without bound; init()'s watchdog cuts it watchdog_grace(4)
    # after the timeout. A rank that joins after the freeze meets a store that does not answer its handshake.
    "rank 0 (store host) frozen during the rendezvous (SIGSTOP)": (
        ["--fault", "freeze-in-rendezvous", "--victim", "0", "--late", "3"], 0,
        INIT_TIMEOUT + watchdog_grace(4), ["stopped answering", "does not answer as a rendezvous store"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_surviving_ranks_exit_non_zero_in_bounded_time(slurm_cluster, tmp_path, case, reliability_record):
    worker_args, victim, bound, fragments = CASES[case]
    out = tmp_path / "out"
    started, proc = srun_faulty(slurm_cluster, out, *worker_args)
    found = reports(out, 4)
    survivors = [r for r in range(4) if r != victim]
    fault = fault_time(out) or started
    ends = [found[r]["end"] for r in survivors if r in found]
    detect = max(ends) - fault if len(ends) == len(survivors) else None
    reliability_record(
        case, f"srun -N2 --ntasks-per-node=2, gloo, init timeout {INIT_TIMEOUT:.0f} s, collective timeout "
        f"{COLLECTIVE_TIMEOUT:.0f} s", " ".join(worker_args), detect, summarize(found, survivors),
    )
    assert sorted(found) == sorted(set(survivors) | ({victim} & set(found))), proc.stderr
    for rank in survivors:
        assert found[rank]["outcome"] == "error", (rank, found[rank], proc.stderr)
        assert any(f in found[rank]["message"] for f in fragments), (rank, found[rank]["message"])
    assert proc.returncode != 0
    assert detect is not None and detect < bound + MARGIN, (detect, found)


# --- ports: taken, unresolvable master, concurrent steps and jobs -------------------------------------------

# Run inside `salloc`: squat on the port slurmdist derives for step 0 of this job (a leftover process on the
# master node), then start the step.
SQUAT_THEN_SRUN = """
import os, socket, subprocess, sys
from slurmdist.ports import step_port
port = step_port(os.environ["SLURM_JOB_ID"], "0")
squatter = socket.socket()
squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
squatter.bind(("0.0.0.0", port))
squatter.listen()
print("squatting on", port, flush=True)
sys.exit(subprocess.run(["srun", "--kill-on-bad-exit=0", *sys.argv[1:]], timeout=150).returncode)
"""

# Run inside `salloc -N2 -n4`: two steps of two tasks at once (--exact: each takes only its own CPUs).
TWO_STEPS = """
import subprocess, sys
steps = [subprocess.Popen(["srun", "--exact", "-N2", "-n2", *sys.argv[1:-1], f"{sys.argv[-1]}/step{i}"])
         for i in range(2)]
sys.exit(max(step.wait(timeout=150) for step in steps))
"""


def test_master_port_taken_on_the_master_node(slurm_cluster, tmp_path, reliability_record):
    out = tmp_path / "out"
    started = time.time()
    proc = slurm_cluster.run(["salloc", "-N2", "--ntasks-per-node=2", PYTHON, "-c", SQUAT_THEN_SRUN, PYTHON,
                              FAULT_WORKER, out], timeout=RUN_TIMEOUT, check=False, env=timeouts())
    found = reports(out, 4)
    ends = [r["end"] for r in found.values() if "end" in r]
    detect = max(ends) - started if len(ends) == 4 else None
    reliability_record("the master port is taken (leftover process on the master node)",
                       "salloc -N2 -n4; a socket listens on the step's derived port; srun", "port squatted",
                       detect, summarize(found, list(range(4))))
    assert sorted(found) == [0, 1, 2, 3], proc.stdout + proc.stderr
    assert all(r["outcome"] == "error" for r in found.values())
    assert "cannot listen on the rendezvous port" in found[0]["message"]
    assert proc.returncode != 0 and detect < INIT_TIMEOUT + MARGIN


def test_master_port_taken_under_slurmdist_run(slurm_cluster, tmp_path, reliability_record):
    # Rank 0's `slurmdist run` cannot serve the store: it stops before the command; the other ranks' init()
    # meets a listener that never answers as a store and gives up at its timeout.
    out = tmp_path / "out"
    started = time.time()
    command = [PYTHON, "-m", "slurmdist", "run", "--", PYTHON, FAULT_WORKER, out]
    proc = slurm_cluster.run(["salloc", "-N2", "--ntasks-per-node=2", PYTHON, "-c", SQUAT_THEN_SRUN, *command],
                             timeout=RUN_TIMEOUT, check=False, env=timeouts())
    found = reports(out, 4)
    ends = [r["end"] for r in found.values() if "end" in r]
    detect = max(ends) - started if len(ends) == 3 else None
    said = proc.stdout + proc.stderr
    refused = re.search(r"slurmdist run on rank 0 cannot listen on the rendezvous port \d+", said)
    reliability_record("the master port is taken, under `srun slurmdist run`",
                       "salloc -N2 -n4; a socket listens on the step's derived port; srun slurmdist run",
                       "port squatted", detect,
                       f"rank 0 exits 2 before the command: \"{refused.group(0) if refused else 'no message'}\"; "
                       + summarize(found, [1, 2, 3]))
    assert refused, said
    assert sorted(found) == [1, 2, 3], said
    assert all(r["outcome"] == "error" for r in found.values())
    # The listener is the squatter, not a store host: each rank's error also names that cause and its fix.
    assert all("set MASTER_PORT to a free port" in r["message"] for r in found.values()), found
    assert proc.returncode != 0 and detect < INIT_TIMEOUT + MARGIN


def test_rank_0_that_never_starts_under_slurmdist_run(slurm_cluster, reliability_record):
    # Task 0 exits before its `slurmdist run`: no store host ever listens. The other ranks must not start the
    # command (whose torch client would wait 30 min for rank 0), but end at the init timeout, naming the store.
    skip_rank_0 = (f'[ "$SLURM_PROCID" = 0 ] && exit 0; exec {PYTHON} -m slurmdist run -- {PYTHON} -c '
                   '"print(\'command started\')"')
    started = time.time()
    proc = slurm_cluster.run(["srun", "-N2", "--ntasks-per-node=2", "--kill-on-bad-exit=0", "bash", "-c", skip_rank_0],
                             timeout=RUN_TIMEOUT, check=False, env=timeouts())
    took = time.time() - started
    refusals = re.findall(r"nothing listens at the rendezvous store \S+ after 6 s", proc.stderr)
    reliability_record("rank 0 never starts, under `srun slurmdist run`",
                       f"srun -N2 --ntasks-per-node=2 slurmdist run, init timeout {INIT_TIMEOUT:.0f} s",
                       "task 0 exits before slurmdist run", took,
                       f"srun exits {proc.returncode}; {len(refusals)} of 3 ranks exit 2 before the command: "
                       f"\"{refusals[0] if refusals else 'no message'}\"")
    assert len(refusals) == 3, proc.stderr
    assert "command started" not in proc.stdout and "Traceback" not in proc.stderr
    assert proc.returncode != 0 and took < INIT_TIMEOUT + MARGIN


def test_master_name_that_does_not_resolve(slurm_cluster, tmp_path, reliability_record):
    out = tmp_path / "out"
    started, proc = srun_faulty(slurm_cluster, out, env=timeouts(MASTER_ADDR="no-such-node.invalid"))
    found = reports(out, 4)
    ends = [r["end"] for r in found.values() if "end" in r]
    detect = max(ends) - started if len(ends) == 4 else None
    reliability_record("the master name does not resolve (DNS nor Slurm)",
                       "srun -N2 -n4 with MASTER_ADDR=no-such-node.invalid", "unresolvable master", detect,
                       summarize(found, list(range(4))))
    assert sorted(found) == [0, 1, 2, 3]
    for record in found.values():
        assert record["outcome"] == "error" and re.search(unresolved("master host 'no-such-node.invalid'"),
                                                          record["message"])
    assert detect < INIT_TIMEOUT + MARGIN


def ports_used(out: Path) -> List[int]:
    return sorted({r["master_port"] for path in out.rglob("rank*.json")
                   for r in [json.loads(path.read_text())] if r.get("outcome") == "ok"})


def test_two_srun_steps_at_once_in_one_allocation(slurm_cluster, tmp_path, reliability_record):
    out = tmp_path / "out"
    started = time.time()
    proc = slurm_cluster.run(["salloc", "-N2", "-n4", PYTHON, "-c", TWO_STEPS, PYTHON, FAULT_WORKER, "--steps",
                              "10", out], timeout=RUN_TIMEOUT, check=False, env=timeouts())
    steps = [reports(out / f"step{i}", 2) for i in range(2)]
    ok = [sum(r.get("outcome") == "ok" for r in step.values()) for step in steps]
    reliability_record("two srun steps at once in one allocation", "salloc -N2 -n4; 2 x srun --exact -N2 -n2",
                       "concurrent steps", time.time() - started,
                       f"exit {proc.returncode}; ranks ok per step {ok}; master ports {ports_used(out)}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ok == [2, 2] and len(ports_used(out)) == 2


# Run inside `salloc -N2 -n4` with MASTER_PORT exported, as a job script that exports one for every step: step 0
# runs, then step 1 starts beside it on the same port.
SHARED_PORT_STEPS = """
import os, subprocess, sys, time
from pathlib import Path
*worker, out = sys.argv[1:]
out = Path(out)
first = subprocess.Popen(["srun", "--overlap", "-N2", "-n2", *worker, "--steps", "400", str(out / "step0")])
end = time.monotonic() + 120
while not (out / "step0" / "ready0").exists() and time.monotonic() < end:  # step 0's rank 0 serves its store
    time.sleep(0.1)
(out / "step1-started").write_text(str(time.time()))
second = subprocess.run(["srun", "--overlap", "-N2", "-n2", "--kill-on-bad-exit=0", *worker, str(out / "step1")],
                        timeout=150)
first.wait(timeout=150)
sys.exit(second.returncode)
"""


def test_two_steps_at_once_given_one_master_port(slurm_cluster, tmp_path, reliability_record):
    # Step 1's rank 0 cannot listen beside step 0's; its rank 1 reaches step 0's store and is told whose it is
    # within seconds, not at its timeout. Step 0 trains on undisturbed.
    out = tmp_path / "out"
    init_timeout = 60
    env = timeouts(MASTER_PORT=str(free_port()), SLURMDIST_INIT_TIMEOUT=str(init_timeout))
    proc = slurm_cluster.run(["salloc", "-N2", "-n4", PYTHON, "-c", SHARED_PORT_STEPS, PYTHON, FAULT_WORKER, out],
                             timeout=RUN_TIMEOUT, check=False, env=env)
    said = proc.stdout + proc.stderr
    first, second = reports(out / "step0", 2), reports(out / "step1", 2)
    started = float((out / "step1-started").read_text())
    detect = max(r["end"] for r in second.values()) - started if sorted(second) == [0, 1] else None
    reliability_record("two srun steps at once given one exported MASTER_PORT",
                       "salloc -N2 -n4; 2 x srun --overlap -N2 -n2, the second while the first trains",
                       "shared MASTER_PORT", detect,
                       f"step 0 ranks ok: {sum(r['outcome'] == 'ok' for r in first.values())}; step 1 "
                       + summarize(second, [0, 1]) + " / rank 1: "
                       f"\"{second.get(1, {}).get('message', '')[:120]}\"")
    assert [r["outcome"] for r in first.values()] == ["ok", "ok"], said
    assert sorted(second) == [0, 1] and all(r["outcome"] == "error" for r in second.values()), said
    assert "cannot listen on the rendezvous port" in second[0]["message"]
    assert re.search(r"rank 1: the rendezvous store at \S+ is another run's \(job \d+ step 0; this is job \d+ step 1",
                     second[1]["message"]), second[1]["message"]
    assert detect is not None and detect < OWNER_CHECK_AFTER + MARGIN < init_timeout


def test_two_jobs_share_a_node(slurm_cluster, tmp_path, reliability_record):
    started = time.time()
    env = client_env(slurm_cluster, timeouts())
    jobs = [subprocess.Popen(["srun", "-N1", "-n2", "-w", "node1", PYTHON, str(FAULT_WORKER), "--steps", "10",
                              str(tmp_path / f"job{i}")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for i in range(2)]
    codes = []
    for job in jobs:
        try:
            job.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            job.kill()
            job.communicate()
        codes.append(job.returncode)
    ok = [sum(r.get("outcome") == "ok" for r in reports(tmp_path / f"job{i}", 2).values()) for i in range(2)]
    reliability_record("two jobs share a node", "2 x srun -N1 -n2 -w node1 at once (OverSubscribe)",
                       "concurrent jobs", time.time() - started,
                       f"exit codes {codes}; ranks ok per job {ok}; master ports {ports_used(tmp_path)}")
    assert codes == [0, 0] and ok == [2, 2] and len(ports_used(tmp_path)) == 2


def client_env(cluster, extra: Dict[str, str]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(cluster.env)
    env.update(extra)
    return env


# --- preemption, SIGTERM, node loss ---------------------------------------------------------------------------

FAULT_TRAIN = WORKERS / "fault_train.py"
STEPS = 600


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.1)


def text_of(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(scope="module")
def uninterrupted(slurm_cluster, tmp_path_factory) -> dict:
    """train.py's result for STEPS steps on 2 nodes x 1 task, never interrupted."""
    return train_reference(slurm_cluster, tmp_path_factory, 2, 1, STEPS, RUN_TIMEOUT)


def test_requeue_signal_checkpoints_requeues_and_resumes_bit_identically(slurm_cluster, tmp_path, uninterrupted,
                                                                         reliability_record):
    out, checkpoint, log = tmp_path / "result.json", tmp_path / "ckpt.pt", tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH -N2 --ntasks-per-node=1 --requeue --open-mode=append --output={log}\n"
                      f"srun --kill-on-bad-exit=1 {PYTHON} {FAULT_TRAIN} {STEPS} {checkpoint} {out}\n")
    job = slurm_cluster.run(["sbatch", "--parsable", script]).stdout.strip()
    wait_until(lambda: f"step 20/{STEPS}" in text_of(log), RUN_TIMEOUT, "training")
    signalled = time.time()
    slurm_cluster.run(["scancel", "--signal=USR2", job])
    wait_until(lambda: checkpoint.exists() and checkpoint.stat().st_mtime >= signalled - 1, 60, "checkpoint")
    saved = time.time() - signalled
    wait_until(out.exists, RUN_TIMEOUT + 60, "the requeued job's result")
    result = json.loads(out.read_text())
    reliability_record(
        "preemption: requeue signal during training", f"sbatch --requeue, srun -N2 x 1 task, {STEPS} steps, "
        "examples/submit_train.py's Train in the step", "scancel --signal=USR2 (what --signal=USR2@N sends)", saved,
        f"checkpoint at step {result['resumed_from_step']} {saved:.1f} s after the signal; requeued "
        f"{result['restarts']}x, resumed and finished in {time.time() - signalled:.0f} s; final checksum "
        f"{'equals' if result['checksum'] == uninterrupted['checksum'] else 'DIFFERS FROM'} the uninterrupted run's",
    )
    assert result["restarts"] == 1 and 0 < result["resumed_from_step"] < STEPS
    assert result["checksum"] == uninterrupted["checksum"]


def task_pid(job: str, rank: int) -> int:
    """The pid of the job's training process of `rank` (train.py, by its SLURM_PROCID), on this machine."""
    for entry in Path("/proc").iterdir():
        try:
            environ = dict(item.partition("=")[::2] for item in
                           (entry / "environ").read_bytes().decode(errors="replace").split("\0") if item)
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if (environ.get("SLURM_JOB_ID") == job and environ.get("SLURM_PROCID") == str(rank)
                and b"train.py" in cmdline and b"python" in cmdline.split(b"\0")[0]):
            return int(entry.name)
    raise AssertionError(f"no train.py of rank {rank} in job {job}")


@pytest.mark.parametrize("interruption", ["warning", "warning on one rank", "preemption"])
def test_the_job_script_saves_is_requeued_and_resumes(slurm_cluster, tmp_path, uninterrupted, reliability_record,
                                                      interruption):
    """sbatch/train_2n4g.sh as users submit it (scaled to this machine). Its --signal warning before the time
    limit makes train.py --requeue save and requeue the job; a preemption (a job in the local cluster's
    higher-tier "urgent" partition) sends SIGTERM with no warning: train.py saves and stops, and Slurm requeues
    the job. Either way it resumes under the same job id."""
    train_dir, log = tmp_path / "run", tmp_path / "job.out"
    env = {"TRAIN_DIR": str(train_dir), "TRAIN_STEPS": str(STEPS), "PYTHON": PYTHON, "OMP_NUM_THREADS": "1"}
    job = slurm_cluster.run(
        ["sbatch", "--parsable", f"--output={log}", "--open-mode=append", "--ntasks-per-node=1",
         "--gpus-per-node=1", "--cpus-per-task=1", REPO / "sbatch" / "train_2n4g.sh"], env=env, cwd=REPO,
    ).stdout.strip()
    wait_until(lambda: f"step 20/{STEPS}" in text_of(log), RUN_TIMEOUT, "training")
    signalled = time.time()
    if interruption == "warning":
        slurm_cluster.run(["scancel", "--signal=USR2", job])
        fault = "scancel --signal=USR2 (what its --signal=USR2@120 sends)"
    elif interruption == "warning on one rank":  # rank 1's alone: rank 0 must still save and requeue
        os.kill(task_pid(job, rank=1), signal.SIGUSR2)
        fault = "SIGUSR2 to rank 1 alone (Slurm signals each rank at its own moment)"
    else:
        slurm_cluster.run(["sbatch", "--partition=urgent", "--nodes=2", "--exclusive",
                           f"--output={tmp_path / 'urgent.out'}", "--wrap=sleep 1"])
        fault = "preempted by a job in a higher-tier partition (SIGTERM, no warning)"
    result_file = train_dir / "result.json"
    wait_until(result_file.exists, RUN_TIMEOUT + 60, "the requeued job's result")
    resumed = re.search(r"resumed from \S+ at step (\d+)", text_of(log))
    restarts = re.search(r"\bRestarts=(\d+)", slurm_cluster.run(["scontrol", "-o", "show", "job", job]).stdout)
    result = json.loads(result_file.read_text())
    reliability_record(
        f"{'preemption' if interruption == 'preemption' else 'time-limit ' + interruption} in sbatch/train_2n4g.sh",
        f"sbatch train_2n4g.sh, 2 nodes x 1 task, {STEPS} steps", fault, time.time() - signalled,
        f"requeued {restarts.group(1) if restarts else '?'}x, resumed at step "
        f"{resumed.group(1) if resumed else '?'}; final checksum "
        f"{'equals' if result['checksum'] == uninterrupted['checksum'] else 'DIFFERS FROM'} the uninterrupted run's",
    )
    assert resumed and 20 <= int(resumed.group(1)) < STEPS, text_of(log)  # saved when interrupted
    assert restarts and restarts.group(1) == "1"
    assert result["checksum"] == uninterrupted["checksum"]
    if interruption == "preemption":
        assert "got SIGTERM" in text_of(log) and "DUE TO PREEMPTION" in text_of(log)


def test_sigterm_never_leaves_a_corrupt_checkpoint(slurm_cluster, tmp_path, uninterrupted, reliability_record):
    """SIGTERM (scancel, time limit) mid-training, twice: each time train.py saves a checkpoint at a step
    all ranks agree on and exits 143; the checkpoint loads, and the run resumed from it ends bit-identical
    to one never interrupted."""
    import torch

    checkpoint, out = tmp_path / "ckpt.pt", tmp_path / "result.json"
    name = f"sigterm-{os.getpid()}-{time.time_ns()}"
    command = ["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "-J", name, PYTHON, TRAIN_PY, "--steps",
               str(STEPS), "--checkpoint", str(checkpoint), "--out", str(out)]
    env = client_env(slurm_cluster, {})
    exits, loaded = [], []
    for attempt in range(2):
        log = tmp_path / f"attempt{attempt}.log"
        with open(log, "w") as stream:
            run = subprocess.Popen(command, env=env, stdout=stream, stderr=subprocess.STDOUT, text=True)
        try:
            wait_until(lambda: re.search(r"step \d+/", text_of(log)) or run.poll() is not None, RUN_TIMEOUT,
                       "training")
            signalled = time.monotonic()
            slurm_cluster.run(["scancel", "--signal=TERM", "--name", name])
            run.wait(timeout=60)
            exits.append((run.returncode, time.monotonic() - signalled))
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        loaded.append(int(torch.load(checkpoint, weights_only=True)["step"]))  # raises if torn
    finished = slurm_cluster.run(command, timeout=RUN_TIMEOUT, check=False)
    result = json.loads(out.read_text()) if out.exists() else {}
    strays = [p.name for p in tmp_path.glob(".ckpt.pt.*")]
    reliability_record(
        "SIGTERM during training (scancel / time limit)", "srun -N2 x 1 task, examples/train.py "
        "--checkpoint, signalled twice, then rerun", "scancel --signal=TERM",
        max(seconds for _, seconds in exits),
        f"exits {[code for code, _ in exits]}; the checkpoint written on SIGTERM loaded both times (steps "
        f"{loaded}); temp files left: {len(strays)}; resumed to the end, checksum "
        f"{'equals' if result.get('checksum') == uninterrupted['checksum'] else 'DIFFERS FROM'} the "
        "uninterrupted run's",
    )
    assert all(code == 143 and seconds < 30 for code, seconds in exits), exits
    assert 0 < loaded[0] < loaded[1] < STEPS, loaded
    assert not strays, strays
    assert finished.returncode == 0, finished.stderr
    assert result["checksum"] == uninterrupted["checksum"]


def test_node_loss_fails_the_job_promptly(local_cluster, tmp_path, reliability_record):
    """Every process of node2 (slurmd, slurmstepd, the tasks) is killed mid-job, as when a node dies."""
    cluster = local_cluster()
    out = tmp_path / "out"
    run = subprocess.Popen(["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", PYTHON, str(FAULT_WORKER),
                            "--steps", "3000",
                            str(out)], env=client_env(cluster, timeouts()), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (out / "ready0").exists() and (out / "ready1").exists() or run.poll() is not None,
                   RUN_TIMEOUT, "both ranks ready")
        killed = kill_node(cluster.dir, "node2")
        lost = time.time()
        try:
            stdout, stderr = run.communicate(timeout=COLLECTIVE_TIMEOUT + 90)
        except subprocess.TimeoutExpired:
            run.kill()
            stdout, stderr = run.communicate()
            stderr += "\n(srun still running 90 s after the node died: killed by the test)"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    srun_seconds = time.time() - lost
    survivor = reports(out, 2).get(0, {})
    detect = survivor["end"] - lost if "end" in survivor else None
    srun_said = " / ".join(line for line in stderr.splitlines() if "srun" in line or "error" in line.lower())
    reliability_record(
        "a node goes away mid-job", "srun -N2 x 1 task --kill-on-bad-exit=1 (gloo all_reduce loop), fresh cluster",
        f"SIGKILL to every process of node2 ({killed} processes: slurmd, slurmstepd, task)", detect,
        f"rank 0 (node1): {survivor.get('error', survivor.get('outcome'))}: "
        f"\"{survivor.get('message', '')[:100]}\"; srun returned after {srun_seconds:.0f} s, exit "
        f"{run.returncode}: \"{srun_said[:200]}\"",
    )
    assert run.returncode != 0
    # srun's own wait for the dead node is Slurm's: until the node is marked DOWN (SlurmdTimeout, 20 s on the
    # local cluster), never for ever.
    assert "killed by the test" not in stderr, stderr[-2000:]
    # The surviving rank is slurmdist's part.
    assert survivor.get("outcome") == "error"
    assert detect is not None and detect < COLLECTIVE_TIMEOUT + MARGIN


def kill_node(cluster_dir: Path, node: str) -> int:
    """SIGKILL every process in `node`'s UTS namespace (found from its slurmd); how many there were."""
    pid = int((cluster_dir / "run" / f"slurmd-{node}.pid").read_text())
    namespace = os.readlink(f"/proc/{pid}/ns/uts")
    victims = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "uts") == namespace:
                    victims.append(int(entry.name))
            except OSError:
                continue
    for victim in victims:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(victims)

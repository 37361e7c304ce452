#!/bin/bash

# Parameters
#SBATCH --J=foo
#SBATCH --error=/work/main/slurmdist-logs/%j/%j_0_log.err
#SBATCH --job-name=slurmdist
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --open-mode=append
#SBATCH --output=/work/main/slurmdist-logs/%j/%j_0_log.out
#SBATCH --requeue
#SBATCH --signal=USR2@120
#SBATCH --time=60
#SBATCH --wckey=submitit

# setup
export SLURMDIST_REQUEUE_SIGNAL=USR2
export SUBMITIT_PREEMPT_SIGNAL=USR2

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /work/main/slurmdist-logs/%j/%j_%t_log.out --error /work/main/slurmdist-logs/%j/%j_%t_log.err --kill-on-bad-exit=1 /work/main/.venv/bin/python -u -m submitit.core._submit /work/main/slurmdist-logs/%j

#!/bin/bash
# Train examples/train.py on 2 nodes x 4 GPUs: one srun task per GPU, 8 ranks, nccl (gloo on CPU-only nodes).
#
#   sbatch sbatch/train_2n4g.sh                      # from the repository root
#   sbatch --partition=gpu --account=myproj sbatch/train_2n4g.sh
#   TRAIN_STEPS=20 sbatch --cpus-per-task=2 sbatch/train_2n4g.sh   # command-line options beat #SBATCH lines
#
# Logs: <job name>-<job id>.out in the submit directory. Result and checkpoint: runs/<job name>-<job id>/.
#
#SBATCH --job-name=train_2n4g     # shown by squeue; %x in file names below
#SBATCH --nodes=2                 # two machines
#SBATCH --ntasks-per-node=4       # one task (one Python process) per GPU
#SBATCH --gpus-per-node=4         # Slurm sets CUDA_VISIBLE_DEVICES for the four GPUs of each node
#SBATCH --cpus-per-task=8         # data-loading cores per rank: about (cores per node) / (GPUs per node)
#SBATCH --time=00:30:00           # hh:mm:ss; the warning below requeues the job before the limit
#SBATCH --signal=USR2@120         # SIGUSR2 to every task 120 s before the limit: train.py saves, requeues
#SBATCH --requeue                 # after a node failure or preemption, run again (and resume)
#SBATCH --output=%x-%j.out        # %x = job name, %j = job id; the directory must already exist
#SBATCH --open-mode=append        # a requeued run adds to the log (Slurm would start it afresh)

# Stop at the first failing command, on unset variables and on failures inside pipes.
set -euo pipefail

# Slurm >= 22.05: srun no longer inherits --cpus-per-task from the allocation; hand it on when the job
# set it. (Without -c, srun already gives the step every CPU of the allocation: forcing 1 would pin
# each task to one core.)
if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK; fi

# Submitted with --export=NONE (or NIL), srun would start the tasks with no environment at all, not even what
# lines added here set up (module load, a venv's activate): hand this script's environment on.
case ${SLURM_EXPORT_ENV:-} in [Nn][Oo][Nn][Ee] | [Nn][Ii][Ll]) export SLURM_EXPORT_ENV=ALL ;; esac

# Run by sbatch (or inside salloc), not on its own: what follows reads the job's variables.
[[ -n ${SLURM_JOB_ID:-} ]] || {
    echo "train_2n4g.sh: submit it with sbatch (sbatch sbatch/train_2n4g.sh); run as a plain script it is in no job" >&2
    exit 2
}
# sbatch starts the script in the submit directory (or --chdir's), which holds the paths below: say so
# when it does not, not "can't open file" once per task.
[[ -f examples/train.py ]] || {
    echo "train_2n4g.sh: run sbatch from the repository root, or give it --chdir=ROOT (there is no examples/train.py in $PWD)" >&2
    exit 2
}

# Knobs from the environment (sbatch exports the caller's environment by default).
PYTHON=${PYTHON:-python}                                    # the interpreter with torch and slurmdist
TRAIN_STEPS=${TRAIN_STEPS:-200}                             # optimizer steps in total
TRAIN_DIR=${TRAIN_DIR:-runs/${SLURM_JOB_NAME}-${SLURM_JOB_ID}}  # same job id after a requeue: resumes
mkdir -p "$TRAIN_DIR"

# These expand once, here in the batch script, on the first node: the same values for every task.
# (salloc without a task count sets no SLURM_NTASKS: srun then starts one task per node.)
echo "job $SLURM_JOB_ID: $SLURM_NNODES nodes ($SLURM_JOB_NODELIST), ${SLURM_NTASKS:-$SLURM_NNODES} tasks, dir $TRAIN_DIR"

# One srun step starts all 8 tasks; slurmdist.init() reads each task's SLURM_PROCID/SLURM_LOCALID.
# --kill-on-bad-exit: one crashed rank ends the step instead of leaving the others waiting in a collective.
srun --kill-on-bad-exit=1 "$PYTHON" examples/train.py \
    --steps "$TRAIN_STEPS" \
    --checkpoint "$TRAIN_DIR/checkpoint.pt" \
    --requeue \
    --checkpoint-every 50 \
    --out "$TRAIN_DIR/result.json"

echo "result: $TRAIN_DIR/result.json"

#!/bin/bash
# A learning-rate sweep as a job array: each array element is its own 1-node x 4-GPU DDP job.
#
#   sbatch sbatch/sweep_array.sh                    # all four learning rates, at most two at a time
#   sbatch --array=0,2 sbatch/sweep_array.sh        # only some of them
#
# Results: runs/sweep-<array job id>/lr-<lr>/result.json, one per element; logs: sweep-<array job id>_<index>.out
#
#SBATCH --job-name=sweep          # %x in file names below
#SBATCH --array=0-3%2             # indices into LRS below; %2 = at most two elements run at once
#SBATCH --nodes=1                 # each element: one machine...
#SBATCH --ntasks-per-node=4       # ...one task per GPU
#SBATCH --gpus-per-node=4         # Slurm sets CUDA_VISIBLE_DEVICES for the four GPUs
#SBATCH --cpus-per-task=8         # cores per rank
#SBATCH --time=00:30:00           # per element, hh:mm:ss
#SBATCH --signal=USR2@120         # SIGUSR2 to every task 120 s before the limit: train.py saves, requeues
#SBATCH --requeue                 # a requeued element resumes from its own checkpoint
#SBATCH --output=%x-%A_%a.out     # %A = array job id, %a = array index (each element logs to its own file)
#SBATCH --open-mode=append        # a requeued element adds to its log (Slurm would start it afresh)

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
    echo "sweep_array.sh: submit it with sbatch (sbatch sbatch/sweep_array.sh); run as a plain script it is in no job" >&2
    exit 2
}
# sbatch starts the script in the submit directory (or --chdir's), which holds the paths below: say so
# when it does not, not "can't open file" once per task.
[[ -f examples/train.py ]] || {
    echo "sweep_array.sh: run sbatch from the repository root, or give it --chdir=ROOT (there is no examples/train.py in $PWD)" >&2
    exit 2
}

LRS=(0.01 0.02 0.05 0.1)          # one learning rate per array index
index=${SLURM_ARRAY_TASK_ID:-0}   # the element's index (0 when the script is run outside an array)
if ((index >= ${#LRS[@]})); then
    echo "array index $index has no learning rate: LRS has ${#LRS[@]} entries" >&2
    exit 2
fi
lr=${LRS[index]}

PYTHON=${PYTHON:-python}
TRAIN_STEPS=${TRAIN_STEPS:-200}
# Every element of the array shares SLURM_ARRAY_JOB_ID; each has its own SLURM_JOB_ID (and so its own
# rendezvous port), so elements on the same node do not collide.
TRAIN_DIR=${TRAIN_DIR:-runs/${SLURM_JOB_NAME}-${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}}/lr-$lr
mkdir -p "$TRAIN_DIR"
echo "array element $index (job $SLURM_JOB_ID on $SLURM_JOB_NODELIST): lr=$lr, dir $TRAIN_DIR"

srun --kill-on-bad-exit=1 "$PYTHON" examples/train.py \
    --lr "$lr" \
    --steps "$TRAIN_STEPS" \
    --checkpoint "$TRAIN_DIR/checkpoint.pt" \
    --requeue \
    --out "$TRAIN_DIR/result.json"

echo "result: $TRAIN_DIR/result.json"

#!/bin/bash
# Train examples/train.py on Ascend NPUs: 2 nodes x 8 NPUs, one srun task per NPU, hccl.
# Needs torch_npu (it registers the npu device and the hccl backend) and the CANN toolkit on every node.
#
#   sbatch sbatch/train_npu.sh
#
#SBATCH --job-name=train_npu      # shown by squeue; %x in file names below
#SBATCH --nodes=2                 # two machines
#SBATCH --ntasks-per-node=8       # one task per NPU (Atlas 800 training servers have 8)
#SBATCH --gres=npu:8              # the GRES name your site gave its NPUs: check `scontrol show node`
#SBATCH --cpus-per-task=24        # cores per rank: about (cores per node) / 8
#SBATCH --time=00:30:00           # hh:mm:ss
#SBATCH --signal=USR2@120         # SIGUSR2 to every task 120 s before the limit: train.py saves, requeues
#SBATCH --requeue                 # after a node failure or preemption, run again (and resume)
#SBATCH --output=%x-%j.out        # %x = job name, %j = job id; the directory must already exist
#SBATCH --open-mode=append        # a requeued run adds to the log (Slurm would start it afresh)

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
    echo "train_npu.sh: submit it with sbatch (sbatch sbatch/train_npu.sh); run as a plain script it is in no job" >&2
    exit 2
}
# sbatch starts the script in the submit directory (or --chdir's), which holds the paths below: say so
# when it does not, not "can't open file" once per task.
[[ -f examples/train.py ]] || {
    echo "train_npu.sh: run sbatch from the repository root, or give it --chdir=ROOT (there is no examples/train.py in $PWD)" >&2
    exit 2
}

# CANN's environment (library paths for torch_npu and hccl). The path is the toolkit's default; set
# ASCEND_TOOLKIT_ENV if your site installed it elsewhere. set_env.sh reads unset variables: relax -u for it.
ASCEND_TOOLKIT_ENV=${ASCEND_TOOLKIT_ENV:-/usr/local/Ascend/ascend-toolkit/set_env.sh}
if [[ -f $ASCEND_TOOLKIT_ENV ]]; then
    set +u
    # shellcheck source=/dev/null
    source "$ASCEND_TOOLKIT_ENV"
    set -u
fi

# hccl's own timeouts (seconds): connecting to the other NPUs, and one collective. Bounded, never forever.
export HCCL_CONNECT_TIMEOUT=${HCCL_CONNECT_TIMEOUT:-600}
export HCCL_EXEC_TIMEOUT=${HCCL_EXEC_TIMEOUT:-1800}
# On nodes with several networks hccl takes the first interface by name (not lo or docker's), which may not
# reach the other nodes: name the one they share, e.g. export HCCL_SOCKET_IFNAME=ib0 (or set HCCL_IF_IP).

PYTHON=${PYTHON:-python}
TRAIN_STEPS=${TRAIN_STEPS:-200}
TRAIN_DIR=${TRAIN_DIR:-runs/${SLURM_JOB_NAME}-${SLURM_JOB_ID}}
mkdir -p "$TRAIN_DIR"
echo "job $SLURM_JOB_ID: $SLURM_NNODES nodes ($SLURM_JOB_NODELIST), ${SLURM_NTASKS:-$SLURM_NNODES} tasks on NPUs"

# --backend hccl: fail at once with a clear message if torch_npu is missing, instead of training on CPU.
# slurmdist picks the NPU by SLURM_LOCALID among the NPUs the task sees (after ASCEND_RT_VISIBLE_DEVICES).
srun --kill-on-bad-exit=1 "$PYTHON" examples/train.py \
    --backend hccl \
    --steps "$TRAIN_STEPS" \
    --checkpoint "$TRAIN_DIR/checkpoint.pt" \
    --requeue \
    --checkpoint-every 50 \
    --out "$TRAIN_DIR/result.json"

echo "result: $TRAIN_DIR/result.json"

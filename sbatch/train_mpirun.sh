#!/bin/bash
# Train examples/train.py with mpirun inside the allocation: 2 nodes x 4 GPUs, one MPI rank per GPU.
# For sites whose MPI is the launcher of habit. mpirun reads the allocation itself (node list, tasks per node)
# and starts its daemons with srun; slurmdist.init() reads the MPI rank variables, so train.py is unchanged.
# Written for Open MPI's mpirun; for MPICH / Intel MPI use `mpirun -np N -ppn 4` instead of --map-by.
#
#   sbatch sbatch/train_mpirun.sh
#   TRAIN_STEPS=20 sbatch --cpus-per-task=2 sbatch/train_mpirun.sh
#
#SBATCH --job-name=train_mpirun   # shown by squeue; %x in file names below
#SBATCH --nodes=2                 # two machines
#SBATCH --ntasks-per-node=4       # MPI slots per node: one rank per GPU
#SBATCH --gpus-per-node=4         # every rank on a node sees the node's four GPUs; slurmdist picks by local rank
#SBATCH --cpus-per-task=8         # cores per rank
#SBATCH --time=00:30:00           # hh:mm:ss
#SBATCH --requeue                 # after a node failure or preemption, run again (and resume)
#SBATCH --output=%x-%j.out        # %x = job name, %j = job id; the directory must already exist
#SBATCH --open-mode=append        # a requeued run adds to the log (Slurm would start it afresh)
# No --signal here: mpirun does not hand SIGUSR2 on to its ranks, and dies of it.

set -euo pipefail

# Submitted with --export=NONE (or NIL), the srun that starts mpirun's daemons would start them with no
# environment at all, not even what lines added here set up (module load, a venv's activate): hand this
# script's environment on.
case ${SLURM_EXPORT_ENV:-} in [Nn][Oo][Nn][Ee] | [Nn][Ii][Ll]) export SLURM_EXPORT_ENV=ALL ;; esac

# Run by sbatch (or inside salloc), not on its own: what follows reads the job's variables.
[[ -n ${SLURM_JOB_ID:-} ]] || {
    echo "train_mpirun.sh: submit it with sbatch (sbatch sbatch/train_mpirun.sh); run as a plain script it is in no job" >&2
    exit 2
}
# sbatch starts the script in the submit directory (or --chdir's), which holds the paths below: say so
# when it does not, not "can't open file" once per task.
[[ -f examples/train.py ]] || {
    echo "train_mpirun.sh: run sbatch from the repository root, or give it --chdir=ROOT (there is no examples/train.py in $PWD)" >&2
    exit 2
}
# mpirun -np below takes the allocation's task count, which salloc leaves unset when asked for none.
[[ -n ${SLURM_NTASKS:-} ]] || {
    echo "train_mpirun.sh: this allocation has no task count (SLURM_NTASKS is unset: salloc without -n or --ntasks-per-node); ask for one rank per GPU, e.g. salloc -N2 --ntasks-per-node=4 --gpus-per-node=4" >&2
    exit 2
}

# If your site loads MPI as a module, do it here, e.g.: module load openmpi
PYTHON=${PYTHON:-python}
TRAIN_STEPS=${TRAIN_STEPS:-200}
TRAIN_DIR=${TRAIN_DIR:-runs/${SLURM_JOB_NAME}-${SLURM_JOB_ID}}
mkdir -p "$TRAIN_DIR"

# Open MPI's libfabric transport is slow to start and unused by torch (gloo/nccl do the talking); MPI here only
# starts the processes. Comment out to keep your site's transports.
export OMPI_MCA_btl=${OMPI_MCA_btl:-^ofi}
# Open MPI refuses to start as root unless told that it is meant: jobs that run as root (containers, this
# project's local cluster) say so.
if ((EUID == 0)); then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

# These expand once, here in the batch script: job-wide values. Inside the ranks SLURM_PROCID is the srun task
# id of mpirun's daemon (one per node), not the MPI rank: slurmdist reads OMPI_COMM_WORLD_RANK instead.
echo "job $SLURM_JOB_ID: mpirun on $SLURM_NNODES nodes ($SLURM_JOB_NODELIST), $SLURM_NTASKS ranks"

# -np: every slot of the allocation. --map-by ppr:N:node: N ranks per node (--ntasks-per-node), filled node by
# node (rank order follows nodes); without a per-node count (salloc -N2 -n6: 5 and 1), the allocation's own
# slots, node by node. --bind-to none: leave the cores Slurm gave the job to torch's own threads.
map_by=${SLURM_NTASKS_PER_NODE:+ppr:$SLURM_NTASKS_PER_NODE:node}
started="$TRAIN_DIR/.mpirun-started-${SLURM_JOB_ID}"
touch "$started"
mpirun -np "$SLURM_NTASKS" \
    --map-by "${map_by:-slot}" \
    --bind-to none \
    "$PYTHON" examples/train.py \
    --steps "$TRAIN_STEPS" \
    --checkpoint "$TRAIN_DIR/checkpoint.pt" \
    --out "$TRAIN_DIR/result.json"

# Open MPI can end with status 0 when a signal it does not pass on (scancel --signal) killed a remote daemon:
# no new result is no success.
if [[ ! "$TRAIN_DIR/result.json" -nt "$started" ]]; then
    echo "train_mpirun.sh: mpirun ended, but wrote no new $TRAIN_DIR/result.json: the run stopped early (see above)" >&2
    rm -f "$started"
    exit 1
fi
rm -f "$started"
echo "result: $TRAIN_DIR/result.json"

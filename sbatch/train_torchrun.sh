#!/bin/bash
# Train examples/train.py with torchrun: ONE srun task per node, and torchrun inside it starts one worker per
# GPU. Use it when your code relies on torchrun (elastic restarts, --max-restarts); otherwise train_2n4g.sh
# is simpler and starts faster. slurmdist.init() reads torchrun's variables first, so train.py is unchanged.
#
#   sbatch sbatch/train_torchrun.sh
#   TRAIN_STEPS=20 NPROC_PER_NODE=2 sbatch --cpus-per-task=2 --gpus-per-node=2 sbatch/train_torchrun.sh
#
#SBATCH --job-name=train_torchrun # shown by squeue; %x in file names below
#SBATCH --nodes=2                 # two machines
#SBATCH --ntasks-per-node=1       # one torchrun agent per node; it forks the per-GPU workers itself
#SBATCH --gpus-per-node=4         # all four GPUs of a node go to its single task (and so to torchrun)
#SBATCH --cpus-per-task=32        # the task holds the cores of all its workers: about all the node's cores
#SBATCH --time=00:30:00           # hh:mm:ss
#SBATCH --requeue                 # after a node failure or preemption, run again (and resume)
#SBATCH --output=%x-%j.out        # %x = job name, %j = job id; the directory must already exist
#SBATCH --open-mode=append        # a requeued run adds to the log (Slurm would start it afresh)
# No --signal here: torchrun's agent does not hand SIGUSR2 on to its workers, and dies of it.

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
    echo "train_torchrun.sh: submit it with sbatch (sbatch sbatch/train_torchrun.sh); run as a plain script it is in no job" >&2
    exit 2
}
# sbatch starts the script in the submit directory (or --chdir's), which holds the paths below: say so
# when it does not, not "can't open file" once per task.
[[ -f examples/train.py ]] || {
    echo "train_torchrun.sh: run sbatch from the repository root, or give it --chdir=ROOT (there is no examples/train.py in $PWD)" >&2
    exit 2
}

PYTHON=${PYTHON:-python}
TRAIN_STEPS=${TRAIN_STEPS:-200}
TRAIN_DIR=${TRAIN_DIR:-runs/${SLURM_JOB_NAME}-${SLURM_JOB_ID}}
# The node's GPUs: the batch step has SLURM_GPUS_ON_NODE; an salloc shell only --gpus-per-node's own variable.
gpus_per_node=${SLURM_GPUS_PER_NODE:-}
node_gpus=${SLURM_GPUS_ON_NODE:-${gpus_per_node##*:}}  # "a100:4" -> 4
[[ $node_gpus == 0 ]] && node_gpus=""  # --gpus-per-node=0: a CPU job, no GPU count to follow or to share
NPROC_PER_NODE=${NPROC_PER_NODE:-${node_gpus:-4}}  # workers per node: one per GPU
[[ $NPROC_PER_NODE =~ ^[1-9][0-9]*$ ]] || { echo "NPROC_PER_NODE must be a number, got '$NPROC_PER_NODE'" >&2; exit 2; }
# More workers than the node's GPUs would stack them: slurmdist.init() refuses that in every worker, later,
# unless SLURMDIST_SHARE_DEVICES says they may share (over gloo).
share=${SLURMDIST_SHARE_DEVICES:-0}
if [[ $node_gpus =~ ^[0-9]+$ && ! ${share,,} =~ ^(1|true|yes|on)$ ]] && ((NPROC_PER_NODE > node_gpus)); then
    echo "train_torchrun.sh: NPROC_PER_NODE=$NPROC_PER_NODE workers per node, but the job has $node_gpus GPU(s) per node (--gpus-per-node); export SLURMDIST_SHARE_DEVICES=1 if they are meant to share them" >&2
    exit 2
fi
# One srun task per node: each is a torchrun agent, and two on a node would both host its rendezvous port.
[[ ${SLURM_TASKS_PER_NODE:-1} =~ ^1(\(x[0-9]+\))?$ ]] || {
    echo "train_torchrun.sh: one task per node (--ntasks-per-node=1), got SLURM_TASKS_PER_NODE=$SLURM_TASKS_PER_NODE: torchrun starts the workers, NPROC_PER_NODE of them" >&2
    exit 2
}
mkdir -p "$TRAIN_DIR"

# The c10d rendezvous is hosted by the agent on the job's first node. Use Slurm's NodeAddr for it: the node
# name does not always resolve on the other nodes (NodeAddr is what slurmd itself is reached at).
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)  # sed reads on: no SIGPIPE on a long list
head_addr=$(scontrol -o show node "$head_node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2) || true  # else the name
head_addr=${head_addr:-$head_node}
# A port per job (not torchrun's fixed 29400), so two jobs sharing a node do not collide; below 32768, where
# the kernel never hands out client ports.
rdzv_port=$((20000 + SLURM_JOB_ID % 10000))
echo "job $SLURM_JOB_ID: torchrun on $SLURM_NNODES nodes x $NPROC_PER_NODE workers, rendezvous $head_addr:$rdzv_port"

# Everything in double quotes expands NOW, in the batch script, once: the same value on every node (job-wide
# numbers and the head address). What is escaped (\$SLURM_NODEID, \$SLURMD_NODENAME, \$(...)) expands LATER,
# inside each srun task, where it describes that task's own node:
# - is_host: node 0 hosts the rendezvous store, the others connect to it (no race to bind the port);
# - --local-addr: the address torchrun advertises to the other nodes, else this node's name, which may not
#   resolve elsewhere.
# Paths and other free text travel as arguments ("\$0", "\$@"), never pasted into the command string.
srun --kill-on-bad-exit=1 bash -c "
    addr=\$(scontrol -o show node \"\$SLURMD_NODENAME\" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
    exec \"\$0\" -m torch.distributed.run \
        --nnodes=$SLURM_NNODES \
        --nproc-per-node=$NPROC_PER_NODE \
        --rdzv-backend=c10d \
        --rdzv-endpoint=$head_addr:$rdzv_port \
        --rdzv-id=$SLURM_JOB_ID \
        --rdzv-conf=is_host=\$((SLURM_NODEID == 0)) \
        --local-addr=\"\${addr:-\$SLURMD_NODENAME}\" \
        examples/train.py \"\$@\"" \
    "$PYTHON" \
    --steps "$TRAIN_STEPS" \
    --checkpoint "$TRAIN_DIR/checkpoint.pt" \
    --out "$TRAIN_DIR/result.json"

echo "result: $TRAIN_DIR/result.json"

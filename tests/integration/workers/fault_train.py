"""examples/submit_train.py's `Train` (examples/train.py + slurmdist.requeue) run directly in an srun step of
a plain sbatch job, as its docstring promises works: `python fault_train.py STEPS CHECKPOINT OUT`.

On the requeue signal rank 0 checkpoints at the next step boundary and requeues the job; the requeued job
runs this again, which resumes from the checkpoint. Rank 0 writes the final result (train.py's, plus
`restarts` and `resumed_from_step`) to OUT.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

from exiting import exit_with  # a sibling module: the worker runs as a script from this directory

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "submit_train.py"


def main() -> int:
    steps, checkpoint, out = sys.argv[1:4]
    spec = importlib.util.spec_from_file_location("submit_train", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["submit_train"] = module
    spec.loader.exec_module(module)
    result = module.Train(["--steps", steps, "--log-every", "20"], checkpoint)()
    if os.environ.get("SLURM_PROCID") == "0":
        Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    exit_with(main())

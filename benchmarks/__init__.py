"""slurmdist's claims measured against what users would pick instead, side by side in one run.

`python -m benchmarks` (or `make bench`) runs every benchmark and writes docs/benchmarks.md and docs/img/*.png.
Machines are noisy (here: other developers' tests share two cores), so every figure that matters is a ratio
between tools measured interleaved in the same run, never an absolute time compared across runs.
"""

# Two commands: `make demo` (a local 2-node Slurm cluster, then sbatch sbatch/train_2n4g.sh end to end) and
# `make test` (the whole suite). Both install what they need: pip packages into $(VENV), Debian packages
# (munge, slurmctld, slurmd, slurm-client) when run as root.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build here; on a GPU cluster use the site's torch, e.g. `make demo TORCH=torch`. Where the pip
# index serves CUDA wheels for a plain `torch==...` (PyPI on Linux), add
# TORCH_INDEX=https://download.pytorch.org/whl/cpu for the CPU build.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
PYTEST_ARGS ?=
# Test processes (pytest-xdist). Integration tests wait on Slurm, sockets and timeouts, and one worker's wait
# is the other's CPU: with two, the suite takes 8-15 minutes on 2 cores. A third gains nothing there (each
# process that imports torch costs 3 s of CPU). Reference runs are shared between workers. 0: one process.
TEST_WORKERS ?= 2

.PHONY: venv system-deps demo-deps test test-unit demo bench reliability clean stop-cluster

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@# A venv that failed half-way (no ensurepip: Debian's python3-venv missing) has a python but no pip.
	$(PY) -m pip --version >/dev/null 2>&1 || { rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	$(PY) -c "import torch" 2>/dev/null || \
		$(PY) -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev,bench]"
	touch $@

system-deps:
	scripts/install-system-deps

demo-deps:
	scripts/install-system-deps --demo

# System packages first: they include python3-venv, which the venv needs.
test: system-deps venv
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

demo: demo-deps venv
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" scripts/demo

# Rewrites docs/reliability.md from a real run of the fuzzing and fault-injection tests.
# HYPOTHESIS_PROFILE=slow for the 100k-case fuzzing profile.
reliability: system-deps venv
	SLURMDIST_WRITE_RELIABILITY=1 PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest \
		tests/unit/test_detect_properties.py tests/unit/test_cli_nonsense.py \
		tests/integration/test_injection.py tests/integration/test_faults.py \
		"tests/integration/test_init_failures.py::test_ctrl_c_and_sigterm_end_a_rank_waiting_inside_torch_for_a_missing_one" \
		$(PYTEST_ARGS)

bench: system-deps venv
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m benchmarks

stop-cluster:
	scripts/local-cluster stop

clean: stop-cluster
	rm -rf $(VENV) .cluster .pytest_cache .hypothesis  # not runs/: the jobs' checkpoints and results

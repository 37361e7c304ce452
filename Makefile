# Two commands: `make demo` (a local 2-node Slurm cluster, then sbatch sbatch/train_2n4g.sh end to end) and
# `make test` (the whole suite). Both install what they need: pip packages into $(VENV), Debian packages
# (munge, slurmctld, slurmd, slurm-client) when run as root.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build here; on a GPU cluster use the site's torch, e.g. `make demo TORCH=torch`.
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: venv system-deps test test-unit demo bench reliability clean stop-cluster

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev,bench]"
	touch $@

system-deps:
	scripts/install-system-deps

test: venv system-deps
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

demo: venv system-deps
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" scripts/demo

# Rewrites docs/reliability.md from a real run of the fuzzing and fault-injection tests.
# HYPOTHESIS_PROFILE=slow for the 100k-case fuzzing profile.
reliability: venv system-deps
	SLURMDIST_WRITE_RELIABILITY=1 PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest \
		tests/unit/test_detect_properties.py tests/unit/test_cli_nonsense.py \
		tests/integration/test_injection.py tests/integration/test_faults.py $(PYTEST_ARGS)

bench: venv system-deps
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m benchmarks

stop-cluster:
	scripts/local-cluster stop

clean: stop-cluster
	rm -rf $(VENV) .cluster runs .pytest_cache .hypothesis

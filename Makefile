# Two entry points for a newcomer: `make train` and `make test`. Both create .venv and install what they need.
# `make test-fast` leaves out the end-to-end runs, `make lint` formats-checks and lints (DEVELOPERS.md).
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup train test test-fast lint
setup: $(VENV)/.installed

# torch is pinned to the CPU build first (an unpinned torch pulls a multi-GB CUDA build).
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $@

train: setup
	$(VENV)/bin/asyncrl train $(ARGS)

# Two pytest-xdist workers, one per core; a worker that runs out of tests takes some of the other's (worksteal: the
# slow tests come first, and plain load scheduling would queue them all on the first worker); the 20 slowest tests
# are listed at the end (DEVELOPERS.md: Tests).
PYTEST := $(PY) -m pytest -q -n 2 --dist worksteal --durations=20

test: setup
	$(PYTEST) $(ARGS)

# Everything but the end-to-end runs (marked slow).
test-fast: setup
	$(PYTEST) -m "not slow" $(ARGS)

# The formatter and the linter (ruff, configured in pyproject.toml): the code is formatted and passes the checks.
lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

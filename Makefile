# Two entry points (see README): `make lab` and `make test`. Both create .venv on first use.
# `make lab` installs what a learner needs (.[lab]: the package, the widgets, JupyterLab);
# `make test` and the other developer targets install the whole toolchain (.[dev]). Each has its
# own stamp, so each is idempotent: a second run installs nothing unless pyproject.toml or
# constraints.txt changed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --constraint constraints.txt
STAMP := $(VENV)/.installed
LAB_STAMP := $(VENV)/.installed-lab

.PHONY: install lab lint test test-fast test-gpu docs bench badges clean

# torch goes in first, pinned by constraints.txt, so that no later resolution pulls another (CUDA) build.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) "torch==2.13.0"
	$(PIP) -e ".[dev]"
	touch $(STAMP)

$(LAB_STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) "torch==2.13.0"
	$(PIP) -e ".[lab]"
	touch $(LAB_STAMP)

install: $(STAMP)

# JupyterLab refuses to start as root unless told; containers and CI machines often are root.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: $(LAB_STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=tutorials $(ALLOW_ROOT)

# ruff's rules (pyflakes, bugbear with zip(strict=), import order, pyupgrade, unused noqa; docs/getting-started.md,
# "Lint and types") and the formatter, configured in pyproject.toml [tool.ruff];
# the type checker over the whole package, configured in [tool.mypy] (its version pinned in constraints.txt)
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

test: lint
	$(PY) -m pytest

# The quick loop while developing (README, "While you work"): ruff, then every unit test and doctest without the
# tests marked slow (-m "not slow": the tutorials under nbval, the Sphinx build, the browser, the distributed and
# benchmark tests, the exercise solutions; conftest.py and pyproject.toml say which). No mypy (`make lint`).
# `make test` stays the whole suite, and what CI runs.
test-fast: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -m "not slow" -n auto

# The GPU test path (docs/guarantees.md): samplers, modes, the DP step, the sensitivity grid, the accountant,
# the widgets' state and mixed precision with CUDA as the default device, the distributed tests (NCCL where two
# GPUs exist; the gloo ranks and their references on the CPU), and the tutorials under nbval. Without a CUDA GPU every test is skipped, with one line saying so.
# The CPU wheel pinned by constraints.txt sees no GPU: install a CUDA build of torch 2.13 first.
# tools/gpu-session reads GPU_TESTS from this file (a lent GPU machine may have no make).
GPU_TESTS := tests/grad_sample/samplers tests/test_modes.py tests/grad_sample/_engine/test_grad_sample_module.py tests/grad_sample/_engine/test_provenance.py \
	tests/grad_sample/ghost/test_ghost.py tests/grad_sample/_engine/test_mixed_precision.py tests/test_device_option.py \
	tests/privacy tests/audit/test_grid.py tests/widgets tests/layers tests/distributed tutorials
test-gpu: $(STAMP)
	$(PY) -m pytest --device cuda $(GPU_TESTS)

# The same build runs once in `make test` (tests/test_docs.py), into a temporary folder.
docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -c docs -b html . docs/_build/html

badges: $(STAMP)
	$(PY) -m dpnotebook.binder --update README.md tutorials

bench: $(STAMP)
	$(PY) -m dpnotebook.benchmarks --quick --json bench-results.json
	$(PY) -m dpnotebook.benchmarks.memory

clean:
	rm -rf $(VENV) build *.egg-info

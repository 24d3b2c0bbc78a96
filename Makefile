# Two commands on a fresh machine: `make demo` trains on the bundled offline data, `make test` runs the tests.
# Both create .venv and install what is missing first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch is installed first so nothing pulls the CUDA wheels; on a GPU machine use
# `make install TORCH_SPEC=torch` (or install torch yourself first).
TORCH_SPEC ?= torch==2.13.0
# The tested versions of everything else (constraints.txt); `CONSTRAINTS=` takes the newest allowed instead.
CONSTRAINTS ?= constraints.txt
DEMO_DIR ?= runs/demo
# Two pytest workers (pytest-xdist), each taking whole files, the slowest ones first (tests/conftest.py):
# a launch leaves a core idle while its launcher starts and its main process evaluates alone.
# `make test TEST_WORKERS=` runs in one process.
TEST_WORKERS ?= -n 2 --dist loadfile --no-loadscope-reorder
# `make test-fast`: tests/unit alone (no process started, no training loop run), two workers taking test by test.
TEST_FAST_WORKERS ?= -n 2
# The SLURM tests start their own two-node cluster (tests/slurm_cluster.py) where SLURM is installed, and skip
# elsewhere: `sudo python3 tests/slurm_cluster.py install` on Debian or Ubuntu.
DEMO_V2_DIR ?= runs/demo-v2


.PHONY: install demo demo-v2 test test-fast lint bench-data clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e ".[dev]"
	@# DeepSpeed JIT-compiles its ops at first use (CPUAdam for ZeRO offload, the shared-memory
	@# collectives on CPU): about a minute each. Building them here keeps that stall out of the first
	@# run and the tests; a machine without a compiler only pays it later. With the venv's ninja, as
	@# the tests use: another ninja version would read its build log as stale and rebuild.
	@# A build lock left by a killed build is removed first (qa_train/strategy/op_builds.py).
	-PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m qa_train.strategy.op_builds 2>&1 | grep -v WARNING || true
	touch $@

demo: install
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m qa_train --offline_demo --output_dir $(DEMO_DIR) --overwrite_output_dir

# SQuAD v2.0: the bundled v2 demo (answerable and unanswerable questions), the same tiny BERT and settings.
demo-v2: install
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m qa_train --offline_demo --version_2_with_negative \
		--train_file qa_train/assets/demo-v2/train.json --validation_file qa_train/assets/demo-v2/dev.json \
		--output_dir $(DEMO_V2_DIR) --overwrite_output_dir

# The whole suite: tests/unit and tests/integration (pyproject's testpaths).
test: install
	@# Byte-compiled once here: under PYTHONDONTWRITEBYTECODE each of the suite's hundreds of processes
	@# would compile qa_train's modules again.
	$(PY) -m compileall -q qa_train tests
	$(PY) -m pytest -q --durations=25 $(TEST_WORKERS)

test-fast: install
	$(PY) -m pytest -q tests/unit $(TEST_FAST_WORKERS)

# ruff's lint and format rules and mypy's type check of qa_train (pyproject.toml), as CI runs them before the
# tests. .pre-commit-config.yaml runs the same on each commit.
lint: install
	$(VENV)/bin/ruff check qa_train tests tools
	$(VENV)/bin/ruff format --check qa_train tests tools
	$(VENV)/bin/mypy

bench-data: install
	$(PY) tools/bench_data.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache

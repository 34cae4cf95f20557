# Two commands for a fresh machine (Python 3.11+, Java 17+):
#   make demo   set up .venv and run the main job on the shipped ml-latest-small
#   make test   set up .venv and run the whole test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch: TORCH=cpu (the CPU build, ~200 MB of wheels), TORCH=cuda (PyPI's default Linux build with
# its CUDA libraries, several GB), or auto (the default): cuda where nvidia-smi sees a GPU, else cpu.
TORCH ?= auto
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# the installer: auto (uv, falling back to pip), uv or pip
INSTALLER ?= auto
# pip's index settings, given to uv (which does not read PIP_* variables)
UV_FLAGS := $(foreach l,$(PIP_FIND_LINKS),--find-links $(l)) \
	$(if $(PIP_INDEX_URL),--default-index $(PIP_INDEX_URL)) \
	$(foreach u,$(PIP_EXTRA_INDEX_URL),--extra-index-url $(u))
VAR ?= var
PYTEST_ARGS ?=

.PHONY: demo test test-fast venv java-check clean help stack status stop

help:
	@echo "make demo   - set up $(VENV) and run the main job on data/ml-latest-small"
	@echo "make test   - set up $(VENV) and run the test suite"
	@echo "make test-fast - the edit loop's tier: no Spark, Ray or slow tests (about 2 minutes)"
	@echo "make stack  - start the local MLflow server and Ray head (make demo does it too)"
	@echo "make status - show whether they are up"
	@echo "make stop   - stop them; nothing is left running"
	@echo "make clean  - stop the stack, remove $(VAR)/ (prepared data, runs); keeps $(VENV) and mlflow/state"

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (found " + sys.version.split()[0] + "); set PYTHON=python3.11")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# uv installs the same packages as pip in about half the time (it unpacks and compiles the
	@# bytecode in parallel: without it, every first import compiles, in every Ray process);
	@# pip where uv cannot be had (INSTALLER=pip chooses it). pip's settings reach uv as flags.
	@# (uv's lists of the packages it downloaded and installed are left out: its summaries stay)
	@set -eo pipefail; \
	if [ "$(INSTALLER)" != pip ] && $(PY) -m pip install -q uv; then \
	  install="$(PY) -m uv pip install --compile-bytecode --python $(PY) $(UV_FLAGS)"; echo "installing with uv (INSTALLER=pip for pip)"; \
	elif [ "$(INSTALLER)" = uv ]; then echo "INSTALLER=uv: uv could not be installed"; exit 1; \
	else $(PY) -m pip install -q --upgrade pip; install="$(PY) -m pip install -q"; echo "installing with pip"; fi; \
	kind="$(TORCH)"; if [ "$$kind" = auto ]; then \
	  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then kind=cuda; else kind=cpu; fi; fi; \
	case "$$kind" in \
	  cuda) echo "torch $(TORCH_VERSION): the CUDA build"; \
	        $$install "torch==$(TORCH_VERSION)" 2>&1 | sed '/^ [-+] /d; /^ *Download/d' ;; \
	  cpu)  echo "torch $(TORCH_VERSION): the CPU build (TORCH=cuda for a GPU)"; \
	        $$install "torch==$(TORCH_VERSION)+cpu" 2>/dev/null \
	        || $$install "torch==$(TORCH_VERSION)+cpu" --extra-index-url "$(TORCH_CPU_INDEX)" ;; \
	  *)    echo "TORCH=$$kind: use TORCH=cpu, TORCH=cuda or TORCH=auto"; exit 2 ;; \
	esac; \
	$$install -e ".[dev]" 2>&1 | sed '/^ [-+] /d; /^ *Download/d'
	@touch $@

venv: $(VENV)/.installed

java-check:
	@if [ -n "$$JAVA_HOME" ] && [ -x "$$JAVA_HOME/bin/java" ]; then exit 0; fi; \
	if ! command -v java >/dev/null; then \
	  echo "Java 17+ is required by Spark and was not found."; \
	  echo "  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless"; \
	  echo "  macOS:         brew install openjdk@17"; \
	  echo "  or set JAVA_HOME to a JDK 17+ installation."; exit 1; fi; \
	v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	if [ -n "$$v" ] && [ "$$v" -lt 17 ]; then \
	  echo "Java $$v found; Spark 4 needs Java 17+ (sudo apt-get install -y openjdk-17-jre-headless)"; exit 1; fi

demo: venv java-check
	$(PY) -m infra.demo --var $(VAR)

# two pytest processes side by side: the Spark/Ray tier and the rest (tests/tiers.py); a
# PYTEST_ARGS with its own -m runs one plain pytest
test: venv java-check
	$(PY) -m ruff check prepared runtime models etl training evaluation experiment infra tests benchmarks
	$(PY) -m tests.tiers $(PYTEST_ARGS)

# the edit loop: numpy/torch-level tests only (no Spark session, no Ray head, nothing marked slow)
test-fast: venv
	$(PY) -m ruff check prepared runtime models etl training evaluation experiment infra tests benchmarks
	$(PY) -m pytest -m 'not spark and not ray and not slow' $(PYTEST_ARGS)

stack: venv
	$(PY) -m infra.stack start

status: venv
	$(PY) -m infra.stack status

stop: venv
	$(PY) -m infra.stack stop

clean:
	@if [ -f $(VAR)/stack/stack.json ]; then $(PY) -m infra.stack stop; fi
	rm -rf $(VAR)

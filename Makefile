# Two commands for a fresh machine (Python 3.10+, Java 17+):
#   make demo   set up .venv and run the main job on the shipped ml-latest-small
#   make test   set up .venv and run the whole test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
VAR ?= var
PYTEST_ARGS ?=

.PHONY: demo test venv java-check clean help stack status stop

help:
	@echo "make demo   - set up $(VENV) and run the main job on data/ml-latest-small"
	@echo "make test   - set up $(VENV) and run the test suite"
	@echo "make stack  - start the local MLflow server and Ray head (make demo does it too)"
	@echo "make status - show whether they are up"
	@echo "make stop   - stop them; nothing is left running"
	@echo "make clean  - stop the stack, remove $(VAR)/ (prepared data, runs); keeps $(VENV) and mlflow/state"

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10+ is required (found " + sys.version.split()[0] + "); set PYTHON=python3.11")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build on Linux
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
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

test: venv java-check
	$(PY) -m ruff check prepared runtime models etl training evaluation infra tests benchmarks
	$(PY) -m pytest $(PYTEST_ARGS)

stack: venv
	$(PY) -m infra.stack start

status: venv
	$(PY) -m infra.stack status

stop: venv
	$(PY) -m infra.stack stop

clean:
	@if [ -f $(VAR)/stack/stack.json ]; then $(PY) -m infra.stack stop; fi
	rm -rf $(VAR)

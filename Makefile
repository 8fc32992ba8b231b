# The two commands a newcomer runs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Every built-in plugin is its own distribution under plugins/<kind>/<name>/.
PLUGINS := $(patsubst %/pyproject.toml,%,$(wildcard plugins/*/*/pyproject.toml))

.PHONY: install install-test demo test test-slow test-vllm bench clean

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)

# torch first and pinned: its CPU build installs without CUDA packages, and every later range is satisfied by it.
install: $(VENV)/bin/activate
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e . $(foreach p,$(PLUGINS),-e $(p))

install-test: install
	$(PIP) install -q -e ".[test]"

demo: install
	$(VENV)/bin/openmanus-rl train

test: install-test
	$(PY) -m pytest -q

test-vllm: install-test
	$(PY) -m pytest -q -m vllm

bench: install
	$(PY) bench/algorithms.py
	$(PY) bench/rollout.py
	$(PY) bench/trainer.py

clean:
	rm -rf $(VENV) outputs build *.egg-info

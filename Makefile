# Two commands on a fresh machine:  `make demo` (campaign + note)  and  `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO ?= runs/demo

.PHONY: venv demo test clean-demo

venv: $(VENV)/.installed

# torch first, pinned: the CPU build on this machine's disk (an unpinned torch pulls a CUDA build).
# DeepSpeed installs from source; DS_BUILD_OPS=0 keeps it pure Python (ops JIT-compile on GPUs).
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	DS_BUILD_OPS=0 $(PY) -m pip install -q -e ".[test]"
	touch $@

demo: venv
	rm -rf $(DEMO)
	$(VENV)/bin/runner all --out $(DEMO)
	# gloo's collectives measured beside the campaign: the note's per-category predictions price transfer with them
	$(VENV)/bin/runner commbench --device cpu --nproc 4 --out $(DEMO)/commbench
	$(VENV)/bin/report build $(DEMO)
	@echo "commands: . $(VENV)/bin/activate puts runner, report and ingest on PATH (README: First commands)"

# Two pytest-xdist workers: the tests that launch real engines run one after another in one of them
# (tests/conftest.py: ENGINE_MODULES), the other modules beside them in the other.
test: venv
	$(PY) -m pytest -q -n 2 --clean-checkout --durations=30

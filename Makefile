# tensorops developer commands. Every target creates the virtual environment and installs
# what it needs first, so each works on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The PyTorch CPU wheel used by the benchmarks ships on the machine image.
WHEELS ?= /opt/wheels
SOURCES := pyproject.toml setup.py $(shell find native -name '*.c' -o -name '*.h' -o -name '*.py' | grep -v '/build/')
ISA_LEVELS := avx512 avx2 scalar

.PHONY: test test-native bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.test-installed: $(VENV)/bin/python $(SOURCES)
	$(PY) -m pip install -q '.[test]'
	touch $@

$(VENV)/.bench-installed: $(VENV)/bin/python $(SOURCES)
	$(PY) -m pip install -q --find-links $(WHEELS) '.[bench]'
	touch $@

# The whole suite, then the native suite once per ISA level (TENSOROPS_ISA caps the
# level; a level the CPU lacks runs at the best level below it, as info() reports).
test: $(VENV)/.test-installed
	$(PY) -m pytest -q tests
	@for isa in avx2 scalar; do \
		echo "== native suite at TENSOROPS_ISA=$$isa =="; \
		TENSOROPS_ISA=$$isa $(PY) -m pytest -q tests/native || exit 1; \
	done

bench: $(VENV)/.bench-installed
	$(PY) bench/kernels.py
	$(PY) bench/qip.py

clean:
	rm -rf $(VENV) build native/build *.egg-info

# tensorops developer commands. Every target creates the virtual environment and installs
# what it needs first, so each works on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The PyTorch CPU wheel used by the benchmarks ships on the machine image.
WHEELS ?= /opt/wheels
SOURCES := pyproject.toml setup.py $(shell find native client server proto -name '*.c' -o -name '*.h' -o -name '*.py' -o -name '*.pyi' -o -name '*.proto' | grep -v '/build/')
ISA_LEVELS := avx512 avx2 scalar
# `make serve` address; extra flags in SERVE_FLAGS (see `tensorops-server --help`).
HOST ?= 127.0.0.1
PORT ?= 50051
METRICS_PORT ?= 9100
SERVE_FLAGS ?=

.PHONY: test test-native test-protobuf-range serve proto promtool node bench bench-rpc clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: $(VENV)/bin/python $(SOURCES)
	$(PY) -m pip install -q .
	touch $@

$(VENV)/.test-installed: $(VENV)/bin/python $(SOURCES)
	$(PY) -m pip install -q '.[test]'
	touch $@ $(VENV)/.installed

$(VENV)/.bench-installed: $(VENV)/bin/python $(SOURCES)
	$(PY) -m pip install -q --find-links $(WHEELS) '.[bench]'
	touch $@

# The whole suite, then the native suite once per ISA level (TENSOROPS_ISA caps the
# level; a level the CPU lacks runs at the best level below it, as info() reports).
test: $(VENV)/.test-installed promtool node
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pytest -q tests
	@for isa in avx2 scalar; do \
		echo "== native suite at TENSOROPS_ISA=$$isa =="; \
		TENSOROPS_ISA=$$isa $(PY) -m pytest -q tests/native || exit 1; \
	done

# Both ends of the supported protobuf range, each in a throwaway venv: the newest protobuf 7
# (a fresh install) and the oldest protobuf 6 beside tritonclient[grpc]; pip check, the
# client tests, one end-to-end file and (beside tritonclient) tests/kserve (see .ci/protobuf-range).
test-protobuf-range:
	PYTHON=$(PYTHON) .ci/protobuf-range

# The gRPC server on localhost, metrics on http://$(HOST):$(METRICS_PORT)/metrics.
serve: $(VENV)/.installed
	$(VENV)/bin/tensorops-server --host $(HOST) --port $(PORT) --metrics-port $(METRICS_PORT) $(SERVE_FLAGS)

# Regenerate the checked-in gRPC/protobuf code from proto/ (a test fails when it is stale).
proto: $(VENV)/.test-installed
	$(PY) -m grpc_tools.protoc -Iproto --python_out=client --pyi_out=client --grpc_python_out=client \
		$(sort $(wildcard proto/tensorops/v1/*.proto))
	# messages only: the server serves them under the name clients call (see the .proto)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=client --pyi_out=client \
		$(sort $(wildcard proto/tensorops/kserve/v2/*.proto))

# promtool (from Debian's prometheus package, unpacked into the venv: no daemon installed)
# lets the tests check the /metrics text. Best effort: without apt the check is skipped.
promtool: $(VENV)/bin/python
	@command -v promtool >/dev/null 2>&1 || [ -x $(VENV)/bin/promtool ] || { \
		dir=$$(mktemp -d) && cd $$dir && \
		{ apt-get download prometheus >/dev/null 2>&1 || \
		  { [ "$$(id -u)" = 0 ] && apt-get update -q >/dev/null 2>&1 && apt-get download prometheus >/dev/null 2>&1; }; } && \
		dpkg-deb -x prometheus_*.deb root && cp root/usr/bin/promtool $(abspath $(VENV))/bin/promtool; \
		rm -rf $$dir; \
		[ -x $(abspath $(VENV))/bin/promtool ] || echo "promtool unavailable: the metrics format check will be skipped"; \
	}

# Node.js and npm run the Node.js example against a live server (tests/e2e/test_node_example.py,
# which fails without them): Debian's nodejs and npm packages when they are missing.
node:
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { \
		echo "installing Node.js and npm (Debian packages nodejs, npm)"; \
		{ [ "$$(id -u)" = 0 ] && apt-get update -q >/dev/null && \
		  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm >/dev/null; } || \
		echo "could not install nodejs and npm (needs root and apt): tests/e2e/test_node_example.py will fail"; \
	}

bench: $(VENV)/.bench-installed
	$(PY) bench/kernels.py
	$(PY) bench/qip.py

# RPC latency and throughput against a raw-bytes gRPC echo (the floor).
bench-rpc: $(VENV)/.installed
	$(PY) bench/rpc.py

clean:
	rm -rf $(VENV) build native/build *.egg-info

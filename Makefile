# tensorops developer commands. Every target creates the virtual environment and installs
# what it needs first, so each works on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The PyTorch CPU wheel used by the benchmarks ships on the machine image.
WHEELS ?= /opt/wheels
SOURCES := pyproject.toml setup.py $(shell find native client server proto -name '*.c' -o -name '*.h' -o -name '*.py' -o -name '*.pyi' -o -name '*.proto' | grep -v '/build/')
# `make serve` address; extra flags in SERVE_FLAGS (see `tensorops-server --help`).
HOST ?= 127.0.0.1
PORT ?= 50051
# the metrics endpoint stays on loopback unless told otherwise, whatever HOST is
METRICS_HOST ?= 127.0.0.1
METRICS_PORT ?= 9100
SERVE_FLAGS ?=

.PHONY: lint format proto-descriptor test test-long test-native test-protobuf-range test-install test-sanitize fuzz-codec test-deploy serve proto promtool node bench bench-rpc clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: $(VENV)/bin/python $(SOURCES)
	$(PY) -m pip install -q .
	touch $@

# The lint extra too: tests/client/test_typing.py runs mypy on the client's API.
$(VENV)/.test-installed: $(VENV)/bin/python $(SOURCES)
	$(PY) -m pip install -q '.[test,lint]'
	touch $@ $(VENV)/.installed

$(VENV)/.deploy-installed: $(VENV)/bin/python $(SOURCES)
	$(PY) -m pip install -q '.[test,lint,deploy]'
	touch $@ $(VENV)/.test-installed $(VENV)/.installed

$(VENV)/.bench-installed: $(VENV)/bin/python $(SOURCES)
	$(PY) -m pip install -q --find-links $(WHEELS) '.[bench]'
	touch $@

# The checks read the sources: the lint venv gets the package's dependencies (the types
# mypy follows) and the `lint` extra, without building the extension.
$(VENV)/.lint-installed: $(VENV)/bin/python pyproject.toml
	$(PY) -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
		print('\n'.join(p['dependencies'] + p['optional-dependencies']['lint']))" > $(VENV)/lint-requirements.txt
	$(PY) -m pip install -q -r $(VENV)/lint-requirements.txt
	touch $@

# buf (protobuf linter and breaking-change checker) from npm, pinned in tools/buf/package.json.
BUF := tools/buf/node_modules/.bin/buf
$(BUF): tools/buf/package.json | node
	npm install --prefix tools/buf --no-package-lock --no-audit --no-fund --loglevel=error
	touch $@

NATIVE_C = $(shell find native/src native/include -name '*.[ch]')

# Python: ruff's lint rules and formatting ([tool.ruff]), mypy ([tool.mypy]); C: clang-format
# (.clang-format); protobuf: buf's style rules and the breaking-change check against the
# last release's descriptor (proto/buf.yaml), and a proof that this check refuses a
# renumbered field (.ci/proto-breaking-selftest). Every check runs and reports, then any failure
# fails the target. `make format` fixes what can be fixed by tool.
LINT_CHECKS = "$(VENV)/bin/ruff check ." \
	"$(VENV)/bin/ruff format --check ." \
	"$(PY) -m mypy" \
	"$(VENV)/bin/clang-format --dry-run --Werror $(NATIVE_C)" \
	"$(BUF) lint proto" \
	"$(BUF) breaking proto --against proto/descriptor/release.binpb" \
	"env BUF=$(BUF) .ci/proto-breaking-selftest"
lint: $(VENV)/.lint-installed $(BUF)
	@failed=""; for check in $(LINT_CHECKS); do \
		echo "== $$check" | cut -c1-100; \
		$$check || failed="$$failed\n  $$check"; \
	done; \
	if [ -n "$$failed" ]; then printf "lint failed:$$failed\n"; exit 1; fi

format: $(VENV)/.lint-installed
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .
	$(VENV)/bin/clang-format -i $(NATIVE_C)

# At a release, deliberately: the descriptor of proto/ that `make lint` holds later changes to.
proto-descriptor: $(BUF)
	$(BUF) build proto --exclude-source-info -o proto/descriptor/release.binpb

# What a change must pass, in a few minutes: the whole suite but the long campaigns (tests
# marked `long`, see test-long). The native kernel tests run at every ISA level this CPU
# supports, in one process (tests/native/conftest.py switches the dispatcher per test).
# TEST_WORKERS pytest-xdist processes share the files (a file's tests stay in one process,
# so a module's server or npm install is made once): most end-to-end tests wait on a server,
# so two of them keep two cores busy.
TEST_FLAGS ?=
TEST_WORKERS ?= 2
test: $(VENV)/.test-installed promtool node
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not long" \
		tests --ignore=tests/deploy $(TEST_FLAGS)

# The long campaigns, after `make test` in CI: the soak run, the live fuzzing campaign and
# the slowest sweeps (docs/testing.md lists them), one at a time: the soak and the campaign
# each load a server to measure it.
test-long: $(VENV)/.test-installed promtool
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pytest -q -m long tests --ignore=tests/deploy $(TEST_FLAGS)

# The native suite alone (both tiers); TENSOROPS_ISA=scalar|avx2|avx512 runs the kernel
# tests at that level only.
test-native: $(VENV)/.test-installed
	$(PY) -m pytest -q tests/native $(TEST_FLAGS)

# Both ends of the supported protobuf range, each in a throwaway venv: a fresh install (the
# newest grpcio and protobuf 6) and the oldest protobuf 6 and grpcio beside
# tritonclient[grpc]; pip check, the client and server tests and end-to-end files, and
# (beside tritonclient) the KServe tests; the wire decoder fuzzed on protobuf 7 (see
# .ci/protobuf-range).
test-protobuf-range:
	PYTHON=$(PYTHON) .ci/protobuf-range

# tensorops and tritonclient[grpc] installed into one fresh venv in each order (in one pip
# command, either way round, and in two, either first); pip check, and the installed server
# answers the tensorops SDK and tritonclient (see .ci/install-orders).
test-install:
	PYTHON=$(PYTHON) .ci/install-orders

# The native suite, its kernel tests at every ISA level in one process, with the extension
# built under AddressSanitizer and UndefinedBehaviorSanitizer (TENSOROPS_SANITIZE=1, see
# native/build_ffi.py), in its own virtual environment so that .venv keeps the fast build.
# The interpreter is not instrumented, so the sanitizer runtimes are preloaded. Python leaks
# by design (leak detection off); a huge allocation fails with MemoryError as it does
# without ASan; any finding aborts the run. test_huge_broadcast_view_fails_cleanly is left
# to `make test`: it runs under a 4 GiB address-space limit, too small for ASan's shadow
# memory.
# docs/security-testing.md has the details.
SANITIZE_VENV ?= .venv-sanitize
SANITIZE_TESTS ?= tests/native -k 'not test_huge_broadcast_view_fails_cleanly'
SANITIZE_ENV = LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# A read one element past a NumPy array, which ASan must report: proves the extension in use
# is the instrumented one.
SANITIZE_PROBE = import numpy as np, tensorops_native._native as n; a = np.ones(1000, np.float32); \
	n.lib.TnSynetUnaryOperation32f(n.ffi.from_buffer('float[]', a), 1001, 0, n.ffi.from_buffer('float[]', a.copy()))

$(SANITIZE_VENV)/bin/python:
	$(PYTHON) -m venv $(SANITIZE_VENV)
	echo '*' > $(SANITIZE_VENV)/.gitignore
	$(SANITIZE_VENV)/bin/python -m pip install -q --upgrade pip

# Built from a fresh copy of the sources, without pip's cache or build isolation, so that no
# object or wheel of the normal build (build/, native/build/, a cached wheel) can stand in
# for the sanitized one. What the native suite imports (NumPy, ml_dtypes, cffi, pytest) and
# the build requirements of pyproject.toml are ordinary installs from pip's cache; the
# suite needs nothing else of the project's dependencies.
BUILD_REQUIRES = import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires']))
$(SANITIZE_VENV)/.installed: $(SANITIZE_VENV)/bin/python $(SOURCES)
	rm -rf $(SANITIZE_VENV)/src && mkdir -p $(SANITIZE_VENV)/src
	tar -cf - --exclude=build --exclude='*.egg-info' --exclude=__pycache__ --exclude='*.so' \
		pyproject.toml setup.py README.md native client server proto | tar -xf - -C $(SANITIZE_VENV)/src
	$(SANITIZE_VENV)/bin/python -m pip install -q pytest numpy ml_dtypes $$($(PYTHON) -c "$(BUILD_REQUIRES)")
	TENSOROPS_SANITIZE=1 $(SANITIZE_VENV)/bin/python -m pip install -q --no-cache-dir --no-deps \
		--no-build-isolation '$(SANITIZE_VENV)/src'
	touch $@

test-sanitize: $(SANITIZE_VENV)/.installed
	@$(SANITIZE_ENV) ASAN_OPTIONS=detect_leaks=0 TENSOROPS_ISA=scalar $(SANITIZE_VENV)/bin/python -c "$(SANITIZE_PROBE)" 2>&1 \
		| grep -q 'AddressSanitizer: heap-buffer-overflow' \
		|| { echo "test-sanitize: ASan did not catch an out-of-bounds read: the extension is not instrumented"; exit 1; }
	$(SANITIZE_ENV) $(SANITIZE_VENV)/bin/python -m pytest -q -p no:cacheprovider $(SANITIZE_TESTS)

# Coverage-guided fuzzing of the wire decoder (tests/fuzz/fuzz_codec.py, atheris from PyPI)
# for FUZZ_SECONDS. The corpus grows in FUZZ_DIR/corpus from one run to the next; a crashing
# input is written to FUZZ_DIR/crash-*. FUZZ_FLAGS: more libFuzzer flags (-jobs=2, ...).
FUZZ_SECONDS ?= 60
FUZZ_DIR ?= build/fuzz-codec
FUZZ_FLAGS ?=

fuzz-codec: $(VENV)/.test-installed
	@$(PY) -c "import atheris" 2>/dev/null || $(PY) -m pip install -q atheris
	PYTHONPATH=tests/support $(PY) tests/fuzz/fuzz_codec.py --seeds $(FUZZ_DIR)/corpus
	PYTHONPATH=tests/support $(PY) tests/fuzz/fuzz_codec.py $(FUZZ_DIR)/corpus -max_total_time=$(FUZZ_SECONDS) \
		-artifact_prefix=$(FUZZ_DIR)/ $(FUZZ_FLAGS)

# The deployment (deploy/): images, compose with three replicas and the balancer,
# Kubernetes manifests. Installs Docker (Debian's docker.io, docker-compose, debootstrap)
# if missing, runs a private engine (deploy/scripts/docker-engine.sh: own data root,
# socket and pidfile), stops it and removes its bridges and iptables chains on exit.
# Needs root. A missing engine or tool fails the run; it is never skipped.
DEPLOY_TEST_FLAGS ?=
test-deploy: $(VENV)/.deploy-installed promtool
	TENSOROPS_DEPLOY_TESTS=1 PATH="$(abspath $(VENV))/bin:$$PATH" deploy/scripts/docker-engine.sh run \
		$(PY) -m pytest -v -ra --durations=0 tests/deploy $(DEPLOY_TEST_FLAGS)

# The gRPC server on localhost, metrics on http://$(METRICS_HOST):$(METRICS_PORT)/metrics.
serve: $(VENV)/.installed
	$(VENV)/bin/tensorops-server --host $(HOST) --port $(PORT) --metrics-host $(METRICS_HOST) \
		--metrics-port $(METRICS_PORT) $(SERVE_FLAGS)

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
	rm -rf $(VENV) $(SANITIZE_VENV) build native/build *.egg-info tools/buf/node_modules

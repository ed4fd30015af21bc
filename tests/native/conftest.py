"""Fixtures of the native suite: the ISA level of each test, a seeded random generator per
test, a runner of scripts at a chosen level, and a runner of code in a fresh interpreter
under a memory limit.

Every test of a kernel runs at every level this CPU supports, in this one process: the
autouse `isa` fixture switches the dispatcher (tensorops_native._info.set_isa_for_testing)
and puts it back. With TENSOROPS_ISA set, they run at that level only. A test or module
marked `level_independent` (argument checks, Python-side logic, tests that sweep the levels
or the QuantizedInnerProduct algorithms themselves) runs once, at the process's level.
Every test sees the same random inputs at every level: the seed leaves the level out.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from tensorops_native._native import lib

import tensorops_native as tn
from tensorops_native._info import set_isa_for_testing
from tn_testing import LEVELS, kernel_levels

HERE = pathlib.Path(__file__).resolve().parent
# The level in a test id: "[isa-avx2]" alone, "isa-avx2-" before other parameters.
_LEVELS_RE = "|".join(LEVELS)
_LEVEL_ID = re.compile(rf"\[isa-(?:{_LEVELS_RE})\]|isa-(?:{_LEVELS_RE})-")


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("level_independent") is None:
        metafunc.parametrize("isa", kernel_levels(), indirect=True, ids=lambda level: f"isa-{level}")


@pytest.fixture(autouse=True)
def isa(request):
    """The level this test runs at (the dispatcher is switched to it for the test)."""
    level = getattr(request, "param", None)
    if level is None:
        yield tn.isa()
        return
    previous = set_isa_for_testing(level)
    try:
        yield level
    finally:
        set_isa_for_testing(previous)


def pytest_report_header(config):
    missing = sorted(k for k, v in tn.kernels().items() if v == "missing")
    line = (
        f"tensorops_native: ISA {tn.isa()} (TENSOROPS_ISA={os.environ.get('TENSOROPS_ISA') or 'unset'}, "
        f"CPU supports {LEVELS[lib.TnSupportedIsa()]})"
    )
    line += f"; kernel tests run at {', '.join(kernel_levels())}"
    if missing:
        line += f"; kernels not implemented (their tests fail): {', '.join(missing)}"
    return line


@pytest.fixture
def rng(request):
    """numpy Generator seeded from the test id without its level: reproducible, independent
    between tests, the same at every level."""
    test_id = _LEVEL_ID.sub("", request.node.nodeid)
    seed = int.from_bytes(hashlib.sha256(test_id.encode()).digest()[:8], "little")
    return np.random.default_rng(seed)


def _env(**extra):
    env = dict(os.environ)
    env.update(extra)
    # The helpers of this folder (reference.py, tn_testing.py) importable by scripts.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


class IsaRunner:
    """Runs a script at a chosen level in this process (the dispatcher switched for the run,
    then put back). The script sees `inputs` (dict of arrays, its own copies), `np`, `tn`,
    and fills `outputs` (dict of arrays; store BF16 as uint16 bits). Results are cached per
    (name, level) for the session, so a baseline level is computed once."""

    def __init__(self):
        self.cache = {}

    def supported(self, level: str) -> bool:
        return LEVELS.index(level) <= lib.TnSupportedIsa()

    def skip_unless_supported(self, level: str) -> None:
        if not self.supported(level):
            pytest.skip(f"this CPU cannot run the {level} level (best: {LEVELS[lib.TnSupportedIsa()]})")

    def run(self, name: str, level: str, script: str, inputs: dict) -> dict:
        key = (name, level)
        if key in self.cache:
            return self.cache[key]
        self.skip_unless_supported(level)
        outputs = {}
        namespace = {"np": np, "tn": tn, "inputs": {k: np.array(v) for k, v in inputs.items()}, "outputs": outputs}
        code = compile(textwrap.dedent(script), f"<{name} at {level}>", "exec")
        previous = set_isa_for_testing(level)
        try:
            assert tn.isa() == level and set(tn.kernels().values()) == {level}
            exec(code, namespace)
        finally:
            set_isa_for_testing(previous)
        self.cache[key] = outputs
        return outputs


@pytest.fixture(scope="session")
def isa_runner():
    return IsaRunner()


def run_isolated(code: str, *, memory_limit: int | None = 4 << 30, timeout=120, **env):
    """Run Python code in a fresh interpreter (with an address-space limit, so that a huge
    allocation fails instead of exhausting the machine). Returns the CompletedProcess; a
    negative returncode means the process died from a signal (a crash)."""

    def limit():
        if memory_limit:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
    )


@pytest.fixture
def isolated():
    return run_isolated

"""Fixtures of the native suite: a seeded random generator per test, and runners that
execute code in a fresh interpreter, at a chosen ISA level or under a memory limit.

The suite runs once per ISA level (`make test` sets TENSOROPS_ISA); every test sees the same
random inputs at every level because the seed depends only on the test's id.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensorops_native as tn
from tensorops_native._native import lib

HERE = pathlib.Path(__file__).resolve().parent
LEVELS = ("scalar", "avx2", "avx512")


def pytest_report_header(config):
    missing = sorted(k for k, v in tn.kernels().items() if v == "missing")
    line = f"tensorops_native: ISA {tn.isa()} (TENSOROPS_ISA={os.environ.get('TENSOROPS_ISA') or 'unset'}, " \
           f"CPU supports {LEVELS[lib.TnSupportedIsa()]})"
    if missing:
        line += f"; kernels not implemented (their tests skip): {', '.join(missing)}"
    return line


@pytest.fixture
def rng(request):
    """numpy Generator seeded from the test id: reproducible, and independent between tests."""
    seed = int.from_bytes(hashlib.sha256(request.node.nodeid.encode()).digest()[:8], "little")
    return np.random.default_rng(seed)


def _env(**extra):
    env = dict(os.environ)
    env.update(extra)
    # The helpers of this folder (reference.py, tn_testing.py) importable by scripts.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


_DRIVER = """\
import sys
import numpy as np
import tensorops_native as tn
inputs = dict(np.load(sys.argv[1], allow_pickle=False))
outputs = {}
%s
np.savez(sys.argv[2], **outputs)
print(tn.isa())
"""


class IsaRunner:
    """Runs a script in a fresh interpreter with TENSOROPS_ISA=level. The script sees
    `inputs` (dict of arrays), `np`, `tn`, and fills `outputs` (dict of arrays; store BF16 as
    uint16 bits). Results are cached per (name, level) for the session, so a baseline
    level is computed once."""

    def __init__(self, tmp_dir: pathlib.Path):
        self.tmp = tmp_dir
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
        src = self.tmp / f"{name}-in.npz"
        if not src.exists():
            np.savez(src, **inputs)
        dst = self.tmp / f"{name}-{level}.npz"
        proc = subprocess.run([sys.executable, "-c", _DRIVER % textwrap.dedent(script), str(src), str(dst)],
                              env=_env(TENSOROPS_ISA=level), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{name} at TENSOROPS_ISA={level} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        active = proc.stdout.strip().splitlines()[-1]
        assert active == level, f"TENSOROPS_ISA={level} ran at {active} although the CPU supports it"
        with np.load(dst, allow_pickle=False) as data:
            result = {k: data[k] for k in data.files}
        self.cache[key] = result
        return result


@pytest.fixture(scope="session")
def isa_runner(tmp_path_factory):
    return IsaRunner(tmp_path_factory.mktemp("isa"))


def run_isolated(code: str, *, memory_limit: int | None = 4 << 30, timeout=120, **env):
    """Run Python code in a fresh interpreter (with an address-space limit, so that a huge
    allocation fails instead of exhausting the machine). Returns the CompletedProcess; a
    negative returncode means the process died from a signal (a crash)."""
    def limit():
        if memory_limit:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_env(**env), capture_output=True,
                          text=True, timeout=timeout, preexec_fn=limit)


@pytest.fixture
def isolated():
    return run_isolated

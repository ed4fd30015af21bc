"""The dispatcher: ISA level, cap by TENSOROPS_ISA, kernel report."""

import os
import subprocess
import sys

import pytest
from tensorops_native._native import lib

import tensorops_native as tn
from tensorops_native._info import set_isa_for_testing

# The dispatcher itself: each test sets or reads the levels it checks: run once, at the process's level.
pytestmark = pytest.mark.level_independent


def test_isa_is_one_of_three_words():
    assert tn.isa() in ("scalar", "avx2", "avx512")
    assert tn.info()["isa"] == tn.isa()


def test_cap_from_environment_is_respected():
    requested = os.environ.get("TENSOROPS_ISA")
    order = ("scalar", "avx2", "avx512")
    if requested:
        assert order.index(tn.isa()) <= order.index(requested)


def test_every_kernel_resolves_at_or_below_active_level():
    order = ("scalar", "avx2", "avx512")
    report = tn.kernels()
    assert report, "the kernel list is empty"
    for name, level in report.items():
        assert level != "missing", f"{name} has no implementation"
        assert order.index(level) <= order.index(tn.isa()), name


@pytest.mark.parametrize("level", ["scalar", "avx2", "avx512"])
def test_each_level_can_be_forced(level):
    code = "import tensorops_native as t; print(t.isa(), set(t.kernels().values()))"
    env = dict(os.environ, TENSOROPS_ISA=level)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    active, kernels = out.split(" ", 1)
    supported = subprocess.run(
        [sys.executable, "-c", "import tensorops_native as t; print(t.isa())"],
        env={k: v for k, v in os.environ.items() if k != "TENSOROPS_ISA"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    order = ("scalar", "avx2", "avx512")
    assert active == order[min(order.index(level), order.index(supported))]
    assert kernels.strip() == repr({active})


def test_unknown_isa_value_is_refused():
    env = dict(os.environ, TENSOROPS_ISA="sse9")
    proc = subprocess.run([sys.executable, "-c", "import tensorops_native"], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "TENSOROPS_ISA" in proc.stderr and "sse9" in proc.stderr


def test_the_testing_switch_re_resolves_every_kernel_and_refuses_what_the_cpu_lacks():
    order = ("scalar", "avx2", "avx512")
    supported = order[lib.TnSupportedIsa()]
    start = tn.isa()
    try:
        for level in order[: order.index(supported) + 1]:
            set_isa_for_testing(level)
            assert tn.isa() == level
            assert set(tn.kernels().values()) == {level}
        for level in order[order.index(supported) + 1 :]:
            with pytest.raises(ValueError, match=f"cannot run '{level}'"):
                set_isa_for_testing(level)
            assert tn.isa() == supported
        with pytest.raises(ValueError, match="level: expected one of scalar, avx2, avx512, got 'sse9'"):
            set_isa_for_testing("sse9")
        # below the C layer's range and above it: refused there too, nothing changed
        assert lib.TnSetIsaForTesting(-1) == -1 and lib.TnSetIsaForTesting(lib.TnSupportedIsa() + 1) == -1
        assert tn.isa() == supported
    finally:
        set_isa_for_testing(start)

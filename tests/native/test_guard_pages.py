"""Kernels never read or write outside the tensors they are given, not even a harmless
over-read of a vector tail: every direct C case (c_cases.py) runs in a child process with
each array next to an inaccessible page (guard_page_probe.py). A crash is reported with the
case that caused it."""

import pathlib
import signal
import sys

import pytest

from c_cases import KERNELS
from tn_testing import require

# The probe runs every case at every level itself: run once, at the process's level.
pytestmark = pytest.mark.level_independent

PROBE = pathlib.Path(__file__).resolve().parent / "guard_page_probe.py"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses mmap/mprotect guard pages")
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_stays_inside_its_tensors(isolated, kernel):
    require(kernel)
    proc = isolated(
        f"import runpy, sys; sys.argv = ['probe', {kernel!r}]; runpy.run_path({str(PROBE)!r}, run_name='__main__')",
        memory_limit=None,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        pytest.fail(
            f"{kernel} crashed with {name} in case '{lines[-1] if lines else '?'}': it accessed memory "
            f"outside its tensors (or its scratch beyond the documented size)\n{proc.stderr[-2000:]}"
        )
    mismatches = [line for line in lines if line.startswith("MISMATCH")]
    assert proc.returncode == 0 and lines and lines[-1] == "OK", "\n".join(mismatches[:10]) or proc.stderr[-3000:]

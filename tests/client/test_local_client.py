"""LocalClient: the clients' methods in-process, with the clients' errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tensorops


def test_client_package_does_not_import_native_or_server():
    code = (
        "import sys, tensorops, tensorops.aio; "
        "print(sorted(m for m in sys.modules if m.startswith(('tensorops_native', 'tensorops_server'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_argument_errors_are_invalid_argument_errors():
    with tensorops.LocalClient() as c:
        with pytest.raises(tensorops.InvalidArgumentError) as err:
            c.softmax(np.zeros(3, np.float64))
        assert err.value.field == "x" and "float32" in err.value.field_violations[0].description
        with pytest.raises(tensorops.InvalidArgumentError) as err:
            c.unary(np.zeros(3, np.float32), "expo", timeout=1, metadata=(("k", "v"),))
        assert err.value.field == "op"


def test_empty_calls_work_without_kernels():
    with tensorops.LocalClient() as c:
        assert c.softmax(np.zeros((0, 4), np.float32)).shape == (0, 4)
        assert c.info()["isa"] in ("scalar", "avx2", "avx512")


def test_out_receives_the_result():
    import tensorops_native as tn

    x = np.random.default_rng(0).standard_normal((4, 9)).astype(np.float32)
    with tensorops.LocalClient() as c:
        out = np.full_like(x, 7)
        assert c.softmax(x, out=out) is out and out.tobytes() == tn.softmax(x).tobytes()
        with pytest.raises(ValueError) as err:
            c.softmax(x, out=x)
        assert str(err.value).startswith("out: must not overlap an input")
        with pytest.raises(ValueError) as err:
            c.softmax(x, out=np.empty((4, 8), np.float32))
        assert "out" in str(err.value) and "(4, 9)" in str(err.value)

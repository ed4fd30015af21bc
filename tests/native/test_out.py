"""`out=`: the functions whose result has the shape of their first input write it into a
given array, bit-identical to the result they allocate; a wrong `out` is refused, naming
`out`, before any kernel runs."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tensorops_native as tn

BF16 = ml_dtypes.bfloat16


def _cases():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 5, 3)).astype(np.float32)
    c = (rng.random(6) + 0.5).astype(np.float32)
    return [
        ("normalize_l2", (x, c), {}),
        ("layer_norm_channels", (x, c, c), dict(format="nchw")),
        ("layer_norm_channels", (x.astype(BF16), c, c), {}),
        ("layer_norm_spatial", (x, c, c), {}),
        ("channel_norm", (x, c, c), {}),
        ("lrn_cross_channels", (x, 2, (1.0, 1e-4, -0.75)), {}),
        ("softmax", (x,), dict(axis=1)),
        ("softmax", (x.astype(BF16),), {}),
        ("tiled_scale_2d", (x, rng.standard_normal((6, 3)).astype(np.float32),
                            rng.standard_normal((6, 5)).astype(np.float32)), {}),
        ("unary", (x, "exp"), {}),
        ("eltwise", ([x, x * 2, x - 1], "sum", [0.5, 1.0, 2.0]), {}),
    ]


CASES = _cases()


@pytest.mark.parametrize("name, args, kwargs", CASES, ids=[f"{c[0]}-{c[1][0].dtype}" if hasattr(c[1][0], "dtype")
                                                           else c[0] for c in CASES])
def test_out_receives_the_result(name, args, kwargs):
    fn = getattr(tn, name)
    expected = fn(*args, **kwargs)
    out = np.full(expected.shape, 7, expected.dtype)
    assert fn(*args, **kwargs, out=out) is out
    assert out.tobytes() == expected.tobytes()


@pytest.mark.parametrize("out, error, message", [
    (np.empty((2, 6, 5, 3), np.float64), TypeError, "out: expected dtype float32 (the result's), got float64"),
    (np.empty((2, 6, 5, 4), np.float32), ValueError, "out: expected shape (2, 6, 5, 3) (the result's), got "
                                                     "(2, 6, 5, 4)"),
    (np.empty((2, 6, 5, 6), np.float32)[..., ::2], ValueError, "out: expected a writeable, aligned, C-contiguous"),
    ([0.0] * 180, TypeError, "out: expected a numpy.ndarray, got list"),
])
def test_bad_out_is_refused(out, error, message):
    x = np.ones((2, 6, 5, 3), np.float32)
    with pytest.raises(error) as info:
        tn.unary(x, "neg", out=out)
    assert str(info.value).startswith(message) and info.value.argument == "out"


def test_read_only_and_overlapping_out_are_refused():
    x = np.ones((4, 4), np.float32)
    frozen = np.empty_like(x)
    frozen.flags.writeable = False
    for out, message in ((frozen, "out: expected a writeable"), (x, "out: must not overlap an input")):
        with pytest.raises(ValueError) as info:
            tn.softmax(x, out=out)
        assert str(info.value).startswith(message)
    assert (x == 1).all()  # the input was not written


def test_out_of_the_wrong_bf16_flavour():
    x = np.ones((3, 8), BF16)
    with pytest.raises(TypeError) as info:
        tn.softmax(x, out=np.empty((3, 8), np.uint16))
    assert str(info.value) == "out: expected dtype bfloat16 (the result's), got uint16"

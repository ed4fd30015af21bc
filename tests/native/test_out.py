"""`out=`: the functions write their result into a given array (shuffle: a pair), bit-identical
to the result they allocate; a wrong `out` is refused, naming `out` (or `out[0]`/`out[1]`),
before any kernel runs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tensorops_native as tn

# Out= is checked and filled by the Python layer, the same at every level: run once, at the process's level.
pytestmark = pytest.mark.level_independent

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
        (
            "tiled_scale_2d",
            (x, rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal((6, 5)).astype(np.float32)),
            {},
        ),
        ("unary", (x, "exp"), {}),
        ("eltwise", ([x, x * 2, x - 1], "sum", [0.5, 1.0, 2.0]), {}),
        ("channel_sum", (x.astype(BF16),), dict(format="nhwc")),
        ("channel_sum", (np.empty((2, 6, 0, 3), BF16),), {}),  # no spatial size: zeros
        ("normalize", (x, c.reshape(1, 6, 1, 1), c.reshape(1, 6, 1, 1)), dict(axes=[2, 3])),
        ("normalize", (x.astype(np.float16),), dict(axes=[1], activation=("leaky_relu", 0.1))),
        ("normalize", (x,), dict(axes=[1, 2, 3], num_groups=2)),  # transposed through a work copy
    ]


CASES = _cases()


@pytest.mark.parametrize(
    "name, args, kwargs", CASES, ids=[f"{c[0]}-{c[1][0].dtype}" if hasattr(c[1][0], "dtype") else c[0] for c in CASES]
)
def test_out_receives_the_result(name, args, kwargs):
    fn = getattr(tn, name)
    expected = fn(*args, **kwargs)
    out = np.full(expected.shape, 7, expected.dtype)
    assert fn(*args, **kwargs, out=out) is out
    assert out.tobytes() == expected.tobytes()


@pytest.mark.parametrize(
    "out, error, message",
    [
        (np.empty((2, 6, 5, 3), np.float64), TypeError, "out: expected dtype float32 (the result's), got float64"),
        (
            np.empty((2, 6, 5, 4), np.float32),
            ValueError,
            "out: expected shape (2, 6, 5, 3) (the result's), got (2, 6, 5, 4)",
        ),
        (np.empty((2, 6, 5, 6), np.float32)[..., ::2], ValueError, "out: expected a writeable, aligned, C-contiguous"),
        ([0.0] * 180, TypeError, "out: expected a numpy.ndarray, got list"),
    ],
)
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


def _shuffle_inputs():
    rng = np.random.default_rng(1)
    return rng.standard_normal((2, 4, 3, 6)).astype(np.float32), rng.standard_normal((2, 4, 3, 6)).astype(np.float32)


@pytest.mark.parametrize(
    "kwargs", [dict(type="split"), dict(type="interleave", channels=(2, 6)), dict(type="interleave", format="nhwc")]
)
def test_shuffle_writes_both_results_into_out(kwargs):
    x0, x1 = _shuffle_inputs()
    y0, y1 = tn.shuffle(x0, x1, **kwargs)
    out = (np.full(y0.shape, 7, np.float32), np.full(y1.shape, 7, np.float32))
    got = tn.shuffle(x0, x1, **kwargs, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    assert out[0].tobytes() == y0.tobytes() and out[1].tobytes() == y1.tobytes()


def test_bad_shuffle_out_is_refused():
    x0, x1 = _shuffle_inputs()
    good = np.empty((2, 4, 3, 6), np.float32)
    cases = [
        (good, TypeError, "out", "out: expected a pair of numpy.ndarray (y0, y1), got ndarray"),
        ((good,), TypeError, "out", "out: expected a pair of numpy.ndarray (y0, y1), got tuple of 1"),
        (
            (good, np.empty((2, 4, 3, 6), np.float64)),
            TypeError,
            "out[1]",
            "out[1]: expected dtype float32 (the result's), got float64",
        ),
        (
            (np.empty((2, 8, 3, 6), np.float32), good),
            ValueError,
            "out[0]",
            "out[0]: expected shape (2, 4, 3, 6) (the result's), got (2, 8, 3, 6)",
        ),
        ((good, good), ValueError, "out[1]", "out[1]: must not overlap an input"),
        ((x0, good), ValueError, "out[0]", "out[0]: must not overlap an input"),
    ]
    for out, error, argument, message in cases:
        with pytest.raises(error) as info:
            tn.shuffle(x0, x1, type="split", out=out)
        assert str(info.value).startswith(message) and info.value.argument == argument


@pytest.mark.parametrize(
    "name, args, kwargs, out, error, message",
    [
        (
            "channel_sum",
            (np.ones((2, 6, 5), BF16),),
            {},
            np.empty((2, 5), np.float32),
            ValueError,
            "out: expected shape (2, 6) (the result's), got (2, 5)",
        ),
        (
            "channel_sum",
            (np.ones((2, 6, 5), BF16),),
            {},
            np.empty((2, 6), BF16),
            TypeError,
            "out: expected dtype float32 (the result's), got bfloat16",
        ),
        (
            "normalize",
            (np.ones((4, 8), np.float16),),
            dict(axes=[1]),
            np.empty((4, 8), np.float32),
            TypeError,
            "out: expected dtype float16 (the result's), got float32",
        ),
        (
            "normalize",
            (np.ones((4, 8), np.float32),),
            dict(axes=[1]),
            np.empty((8, 8), np.float32)[::2],
            ValueError,
            "out: expected a writeable, aligned, C-contiguous",
        ),
    ],
)
def test_bad_out_of_the_other_functions_is_refused(name, args, kwargs, out, error, message):
    with pytest.raises(error) as info:
        getattr(tn, name)(*args, **kwargs, out=out)
    assert str(info.value).startswith(message) and info.value.argument == "out"


def test_normalize_refuses_out_over_its_input():
    x = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError) as info:
        tn.normalize(x, axes=[1], out=x)
    assert str(info.value) == "out: must not overlap an input"


def test_quantized_inner_product_forward_into_out():
    rng = np.random.default_rng(2)
    b = rng.integers(-128, 128, (32, 16), dtype=np.int8)
    a = rng.integers(0, 256, (5, 32), dtype=np.uint8)
    with tn.QuantizedInnerProduct(
        b, b_scale=np.full(16, 0.02, np.float32), a_scale=0.05, a_zero=3, c_scale=0.5, c_zero=1, max_m=8
    ) as qip:
        expected = qip.forward(a)
        out = np.full((5, 16), 7, np.uint8)
        assert qip.forward(a, out=out) is out and out.tobytes() == expected.tobytes()
        for bad, error, message in (
            (np.empty((5, 16), np.int8), TypeError, "out: expected dtype uint8"),
            (np.empty((4, 16), np.uint8), ValueError, "out: expected shape (5, 16)"),
            (a[:, :16], ValueError, "out: expected a writeable, aligned, C-contiguous"),
        ):
            with pytest.raises(error) as info:
                qip.forward(a, out=bad)
            assert str(info.value).startswith(message) and info.value.argument == "out"

"""Argument validation of tensorops_native: one test per error class, each checking the
exception type (TypeError for kinds and dtypes, ValueError for values and shapes), that the
message starts with the argument's name, and that ArgumentError / ArgumentTypeError carry
it as `.argument`. Plus what must be accepted: non-contiguous and byte-swapped views (same
result as a contiguous copy), zero-size tensors (empty result of the right shape, no kernel
call), huge zero-size shapes, uint16 for BF16.

Errors are raised before any kernel runs, so most of these tests need no kernel.
"""

import contextlib
import re

import ml_dtypes
import numpy as np
import pytest

import reference as ref
import tensorops_native as tn
from tn_testing import assert_same_bits, require

# Argument checks, made before any kernel runs: run once, at the process's level.
pytestmark = pytest.mark.level_independent

BF16 = ml_dtypes.bfloat16
F32 = np.float32


@contextlib.contextmanager
def raises_arg(kind, argument):
    """The operation raises `kind` (TypeError or ValueError) as tensorops' own exception,
    naming `argument` in .argument and at the start of the message."""
    with pytest.raises(kind, match=rf"^{re.escape(argument)}: ") as info:
        yield info
    err = info.value
    own = tn.ArgumentTypeError if kind is TypeError else tn.ArgumentError
    assert isinstance(err, own), f"{type(err).__name__} is not {own.__name__}"
    assert err.argument == argument


def x4(shape=(2, 3, 4, 5), dtype=F32):
    return np.ones(shape, dtype)


def sc(n=3):
    return np.ones(n, F32)


# ---- exception classes ---------------------------------------------------------------------


def test_exception_classes():
    assert issubclass(tn.ArgumentError, ValueError)
    assert issubclass(tn.ArgumentTypeError, TypeError)
    err = tn.ArgumentError("scale", "bad")
    assert err.argument == "scale" and str(err).startswith("scale")


# ---- wrong dtype ---------------------------------------------------------------------------

WRONG_X_DTYPE = [
    ("normalize_l2 float64", lambda: tn.normalize_l2(x4(dtype=np.float64), sc())),
    ("normalize_l2 int32", lambda: tn.normalize_l2(x4(dtype=np.int32), sc())),
    ("normalize_l2 float16", lambda: tn.normalize_l2(x4(dtype=np.float16), sc())),
    ("normalize_l2 bf16", lambda: tn.normalize_l2(x4(dtype=BF16), sc())),
    ("layer_norm_channels float64", lambda: tn.layer_norm_channels(x4(dtype=np.float64), sc(), sc())),
    ("layer_norm_channels int16", lambda: tn.layer_norm_channels(x4(dtype=np.int16), sc(), sc())),
    ("layer_norm_spatial bf16", lambda: tn.layer_norm_spatial(x4(dtype=BF16), sc(), sc())),
    ("channel_norm uint16", lambda: tn.channel_norm(x4(dtype=np.uint16), sc(), sc())),
    ("channel_sum float32", lambda: tn.channel_sum(x4())),
    ("channel_sum int16", lambda: tn.channel_sum(x4(dtype=np.int16))),
    ("lrn float64", lambda: tn.lrn_cross_channels(x4(dtype=np.float64), 1, (1, 1, 1))),
    ("softmax float64", lambda: tn.softmax(x4(dtype=np.float64))),
    ("softmax int16", lambda: tn.softmax(x4(dtype=np.int16))),
    ("softmax complex64", lambda: tn.softmax(x4(dtype=np.complex64))),
    ("tiled float64", lambda: tn.tiled_scale_2d(x4(dtype=np.float64), np.ones((3, 5)), np.ones((3, 4)))),
    ("unary int32", lambda: tn.unary(np.ones(4, np.int32), "abs")),
    ("unary bool", lambda: tn.unary(np.ones(4, bool), "abs")),
    ("unary string", lambda: tn.unary("1.0", "abs")),
    ("unary nested list", lambda: tn.unary([[1.0, 2.0]], "abs")),
    ("unary ragged list", lambda: tn.unary([[1.0], [2.0, 3.0]], "abs")),
]


@pytest.mark.parametrize("call", [c for _, c in WRONG_X_DTYPE], ids=[n for n, _ in WRONG_X_DTYPE])
def test_wrong_dtype_of_x(call):
    with raises_arg(TypeError, "x"):
        call()


WRONG_OTHER_DTYPE = [
    ("x0", lambda: tn.shuffle(x4((2, 4, 5), np.float64), x4((2, 4, 5)), type=0)),
    ("x1", lambda: tn.shuffle(x4((2, 4, 5)), x4((2, 4, 5), np.float16), type=0)),
    ("inputs[1]", lambda: tn.eltwise([np.ones(4, F32), np.ones(4)], "sum")),
    ("inputs[0]", lambda: tn.eltwise([np.ones(4, np.int32), np.ones(4, F32)], "max")),
    ("scale", lambda: tn.normalize_l2(x4(), np.array(["a", "b", "c"]))),
    ("scale", lambda: tn.layer_norm_channels(x4(), np.ones(3, np.complex64), sc())),
    ("shift", lambda: tn.layer_norm_spatial(x4(), sc(), np.ones(3, bool))),
    ("shift", lambda: tn.channel_norm(x4(), sc(), [None, None, None])),
    ("ver", lambda: tn.tiled_scale_2d(x4(), np.array([["a"] * 5] * 3), np.ones((3, 4)))),
    ("hor", lambda: tn.tiled_scale_2d(x4(), np.ones((3, 5)), np.ones((3, 4), np.complex128))),
    ("weights", lambda: tn.eltwise([np.ones(4, F32)] * 2, "sum", weights=["a", "b"])),
    ("k", lambda: tn.lrn_cross_channels(x4(), 1, np.ones(3, np.complex64))),
    ("eps", lambda: tn.normalize_l2(x4(), sc(), eps="1e-5")),
    ("eps", lambda: tn.layer_norm_channels(x4(), sc(), sc(), eps=True)),
    ("eps", lambda: tn.channel_norm(x4(), sc(), sc(), eps=None)),
    ("half", lambda: tn.lrn_cross_channels(x4(), 1.5, (1, 1, 1))),
    ("half", lambda: tn.lrn_cross_channels(x4(), True, (1, 1, 1))),
    ("across_spatial", lambda: tn.normalize_l2(x4(), sc(), across_spatial=1)),
    ("axis", lambda: tn.softmax(x4(), axis=1.0)),
    ("axis", lambda: tn.softmax(x4(), axis=None)),
    ("inputs", lambda: tn.eltwise("abcd", "sum")),
    ("inputs", lambda: tn.eltwise(5, "sum")),
    ("channels", lambda: tn.shuffle(x4((1, 2, 3)), x4((1, 2, 3)), type=1, channels="22")),
    ("channels[0]", lambda: tn.shuffle(x4((1, 2, 3)), x4((1, 2, 3)), type=1, channels=(2.0, 2))),
]


@pytest.mark.parametrize(
    "argument,call", WRONG_OTHER_DTYPE, ids=[f"{a}-{i}" for i, (a, _) in enumerate(WRONG_OTHER_DTYPE)]
)
def test_wrong_type_of_other_arguments(argument, call):
    with raises_arg(TypeError, argument):
        call()


# ---- wrong ndim, shape vs format, lengths ---------------------------------------------------

BAD_VALUES = [
    # wrong ndim
    ("x", lambda: tn.normalize_l2(np.ones(3, F32), sc())),
    ("x", lambda: tn.layer_norm_channels(np.ones(3, F32), sc(), sc())),
    ("x", lambda: tn.layer_norm_channels(np.ones(3, BF16), sc(), sc())),
    ("x", lambda: tn.layer_norm_spatial(np.float32(1), sc(1), sc(1))),
    ("x", lambda: tn.channel_norm(np.ones(3, F32), sc(), sc())),
    ("x", lambda: tn.channel_sum(np.ones(3, BF16))),
    ("x", lambda: tn.lrn_cross_channels(np.ones(3, F32), 1, (1, 1, 1))),
    ("x0", lambda: tn.shuffle(np.ones(4, F32), x4((2, 4, 5)), type=0)),
    ("x", lambda: tn.tiled_scale_2d(x4((3, 4, 5)), np.ones((3, 5)), np.ones((3, 4)))),
    ("x", lambda: tn.tiled_scale_2d(x4((1, 3, 4, 5, 1)), np.ones((3, 5)), np.ones((3, 4)))),
    ("scale", lambda: tn.normalize_l2(x4(), np.ones((1, 3), F32))),
    # shape vs format: channels are axis 1 for NCHW, the last axis for NHWC
    ("scale", lambda: tn.layer_norm_channels(x4(), sc(3), sc(3), format="nhwc")),
    ("scale", lambda: tn.normalize_l2(x4(), sc(5), format="nchw")),
    ("shift", lambda: tn.layer_norm_spatial(x4(), sc(5), sc(3), format="nhwc")),
    ("ver", lambda: tn.tiled_scale_2d(x4((1, 3, 4, 5)), np.ones((3, 5)), np.ones((3, 4)), format="nhwc")),
    ("hor", lambda: tn.tiled_scale_2d(x4((1, 4, 5, 3)), np.ones((5, 3)), np.ones((3, 4)), format="nhwc")),
    ("x1", lambda: tn.shuffle(x4((2, 4, 5)), x4((2, 4, 6)), type=0)),  # spatial differs
    ("x1", lambda: tn.shuffle(x4((2, 5, 4)), x4((2, 6, 4)), type=0, format="nhwc")),  # spatial differs
    ("x1", lambda: tn.shuffle(x4((2, 4, 5)), x4((3, 4, 5)), type=0)),  # batch differs
    ("x1", lambda: tn.shuffle(x4((2, 4, 5)), x4((2, 4, 5, 1)), type=0)),  # ndim differs
    # lengths
    ("scale", lambda: tn.normalize_l2(x4(), sc(4))),
    ("scale", lambda: tn.layer_norm_channels(x4(), sc(2), sc())),
    ("shift", lambda: tn.layer_norm_channels(x4(), sc(), sc(4))),
    ("shift", lambda: tn.layer_norm_channels(x4(dtype=BF16), sc(), sc(2))),
    ("shift", lambda: tn.channel_norm(x4(), sc(), sc(0))),
    ("ver", lambda: tn.tiled_scale_2d(x4(), np.ones((3, 4)), np.ones((3, 4)))),
    ("hor", lambda: tn.tiled_scale_2d(x4(), np.ones((3, 5)), np.ones((3, 5)))),
    ("hor", lambda: tn.tiled_scale_2d(x4(), np.ones((3, 5)), np.ones(12))),
    ("weights", lambda: tn.eltwise([np.ones(4, F32)] * 3, "sum", weights=[1, 2])),
    ("weights", lambda: tn.eltwise([np.ones(4, F32)] * 2, "sum", weights=[[1, 2]])),
    ("k", lambda: tn.lrn_cross_channels(x4(), 1, (1, 1))),
    ("k", lambda: tn.lrn_cross_channels(x4(), 1, (1, 1, 1, 1))),
    # eps: finite, >= 0, representable in fp32
    ("eps", lambda: tn.normalize_l2(x4(), sc(), eps=float("nan"))),
    ("eps", lambda: tn.layer_norm_channels(x4(), sc(), sc(), eps=float("inf"))),
    ("eps", lambda: tn.layer_norm_spatial(x4(), sc(), sc(), eps=-float("inf"))),
    ("eps", lambda: tn.channel_norm(x4(), sc(), sc(), eps=-1e-5)),
    ("eps", lambda: tn.layer_norm_channels(x4(dtype=BF16), sc(), sc(), eps=-1.0)),
    ("eps", lambda: tn.normalize_l2(x4(), sc(), eps=1e39)),
    ("eps", lambda: tn.layer_norm_channels(x4(), sc(), sc(), eps=np.float64("nan"))),
    ("k", lambda: tn.lrn_cross_channels(x4(), 1, (1, float("nan"), 1))),
    ("k", lambda: tn.lrn_cross_channels(x4(), 1, (float("inf"), 1, 1))),
    ("k", lambda: tn.lrn_cross_channels(x4(), 1, [1, 1, 2.0**128 - 2.0**103])),  # rounds to inf in float32
    ("k", lambda: tn.lrn_cross_channels(x4(), 1, (-3.5e38, 1, 1))),
    # half
    ("half", lambda: tn.lrn_cross_channels(x4(), -1, (1, 1, 1))),
    # shuffle channel counts
    ("x0", lambda: tn.shuffle(x4((2, 3, 5)), x4((2, 4, 5)), type=0)),
    ("x1", lambda: tn.shuffle(x4((2, 4, 5)), x4((2, 5, 5)), type=0)),
    ("x0", lambda: tn.shuffle(x4((2, 5, 3)), x4((2, 5, 4)), type=0, format="nhwc")),
    ("channels", lambda: tn.shuffle(x4((2, 4, 5)), x4((2, 4, 5)), type=0, channels=(4, 4))),
    ("x1", lambda: tn.shuffle(x4((2, 4, 5)), x4((2, 6, 5)), type=1)),
    ("channels[0]", lambda: tn.shuffle(x4((2, 3, 5)), x4((2, 3, 5)), type=1)),
    ("channels[0]", lambda: tn.shuffle(x4((2, 3, 5)), x4((2, 3, 5)), type=1, channels=(3, 3))),
    ("channels[1]", lambda: tn.shuffle(x4((2, 3, 5)), x4((2, 3, 5)), type=1, channels=(8, -2))),
    ("channels", lambda: tn.shuffle(x4((2, 3, 5)), x4((2, 3, 5)), type=1, channels=(2, 2))),
    ("channels", lambda: tn.shuffle(x4((2, 3, 5)), x4((2, 3, 5)), type=1, channels=(6,))),
    ("channels[0]", lambda: tn.shuffle(x4((2, 3, 5)), x4((2, 3, 5)), type=1, channels=(-2, 8))),
    ("type", lambda: tn.shuffle(x4((2, 4, 5)), x4((2, 4, 5)), type=2)),
    ("type", lambda: tn.shuffle(x4((2, 4, 5)), x4((2, 4, 5)), type="merge")),
    # unknown names and enum values
    ("op", lambda: tn.unary(np.ones(3, F32), "expp")),
    ("op", lambda: tn.unary(np.ones(3, F32), 17)),
    ("op", lambda: tn.unary(np.ones(3, F32), -1)),
    ("op", lambda: tn.unary(np.ones(3, F32), True)),
    ("op", lambda: tn.unary(np.ones(3, F32), "")),
    ("op", lambda: tn.eltwise([np.ones(3, F32)] * 2, "avg")),
    ("op", lambda: tn.eltwise([np.ones(3, F32)] * 2, 4)),
    ("format", lambda: tn.normalize_l2(x4(), sc(), format="nchwc")),
    ("format", lambda: tn.layer_norm_channels(x4(), sc(), sc(), format=2)),
    ("format", lambda: tn.channel_sum(x4(dtype=BF16), format="chw")),
    ("format", lambda: tn.lrn_cross_channels(x4(), 1, (1, 1, 1), format=None)),
    ("format", lambda: tn.shuffle(x4((2, 4, 5)), x4((2, 4, 5)), type=0, format="hwc")),
    ("format", lambda: tn.tiled_scale_2d(x4(), np.ones((3, 5)), np.ones((3, 4)), format="NCHW4c")),
    # axis
    ("axis", lambda: tn.softmax(x4((3, 4)), axis=2)),
    ("axis", lambda: tn.softmax(x4((3, 4)), axis=-3)),
    ("axis", lambda: tn.softmax(np.ones(5, BF16), axis=1)),
    # eltwise inputs
    ("inputs", lambda: tn.eltwise([], "sum")),
    ("inputs", lambda: tn.eltwise([np.ones(3, F32)], "product")),
    ("inputs[1]", lambda: tn.eltwise([np.ones(3, F32), np.ones(4, F32)], "max")),
    ("inputs[2]", lambda: tn.eltwise([np.ones((3, 4), F32)] * 2 + [np.ones((4, 3), F32)], "min")),
    ("weights", lambda: tn.eltwise([np.ones(3, F32)] * 2, "product", weights=[1, 1])),
    ("weights", lambda: tn.eltwise([np.ones(3, F32)] * 2, "max", weights=[1, 1])),
    ("weights", lambda: tn.eltwise([np.ones(3, F32)] * 2, "min", weights=[1, 1])),
]


@pytest.mark.parametrize("argument,call", BAD_VALUES, ids=[f"{a}-{i}" for i, (a, _) in enumerate(BAD_VALUES)])
def test_bad_values(argument, call):
    with raises_arg(ValueError, argument):
        call()


# ---- zero-size tensors: empty result of the right shape, no kernel call ---------------------

ZERO_SIZE = [
    ("normalize_l2 batch 0", lambda: tn.normalize_l2(x4((0, 3, 5)), sc()), [((0, 3, 5), F32)]),
    ("normalize_l2 channels 0", lambda: tn.normalize_l2(x4((2, 0, 5)), sc(0)), [((2, 0, 5), F32)]),
    ("normalize_l2 spatial 0", lambda: tn.normalize_l2(x4((2, 3, 0)), sc(), across_spatial=True), [((2, 3, 0), F32)]),
    (
        "layer_norm_channels nhwc spatial 0",
        lambda: tn.layer_norm_channels(x4((2, 0, 4, 3)), sc(), sc(), format="NHWC"),
        [((2, 0, 4, 3), F32)],
    ),
    ("layer_norm_channels bf16", lambda: tn.layer_norm_channels(x4((0, 3, 5), BF16), sc(), sc()), [((0, 3, 5), BF16)]),
    (
        "layer_norm_channels uint16",
        lambda: tn.layer_norm_channels(x4((2, 3, 0), np.uint16), sc(), sc()),
        [((2, 3, 0), np.uint16)],
    ),
    ("layer_norm_spatial", lambda: tn.layer_norm_spatial(x4((2, 3, 0, 7)), sc(), sc()), [((2, 3, 0, 7), F32)]),
    ("channel_norm", lambda: tn.channel_norm(x4((0, 5, 3), F32), sc(3), sc(3), format="nhwc"), [((0, 5, 3), F32)]),
    ("channel_sum batch 0", lambda: tn.channel_sum(x4((0, 3, 4), BF16)), [((0, 3), F32)]),
    ("channel_sum channels 0", lambda: tn.channel_sum(x4((2, 0, 4), BF16)), [((2, 0), F32)]),
    ("eltwise", lambda: tn.eltwise([x4((3, 0))] * 3, "sum"), [((3, 0), F32)]),
    ("eltwise 1-D", lambda: tn.eltwise([np.ones(0, F32)] * 2, "max"), [((0,), F32)]),
    ("lrn", lambda: tn.lrn_cross_channels(x4((2, 3, 0)), 2, (1, 1, 1)), [((2, 3, 0), F32)]),
    (
        "lrn channels 0",
        lambda: tn.lrn_cross_channels(x4((2, 4, 0), F32), 2, (1, 1, 1), format="nhwc"),
        [((2, 4, 0), F32)],
    ),
    ("shuffle spatial 0", lambda: tn.shuffle(x4((2, 4, 0)), x4((2, 6, 0)), type=0), [((2, 5, 0), F32)] * 2),
    (
        "shuffle batch 0",
        lambda: tn.shuffle(x4((0, 4, 3)), x4((0, 4, 3)), type=1, channels=(2, 6)),
        [((0, 2, 3), F32), ((0, 6, 3), F32)],
    ),
    ("softmax outer 0", lambda: tn.softmax(x4((0, 5)), axis=1), [((0, 5), F32)]),
    ("softmax count 0", lambda: tn.softmax(x4((5, 0)), axis=1), [((5, 0), F32)]),
    ("softmax inner 0 bf16", lambda: tn.softmax(x4((5, 3, 0), BF16), axis=1), [((5, 3, 0), BF16)]),
    ("tiled", lambda: tn.tiled_scale_2d(x4((2, 3, 0, 5)), np.ones((3, 5)), np.ones((3, 0))), [((2, 3, 0, 5), F32)]),
    (
        "tiled batch 0",
        lambda: tn.tiled_scale_2d(x4((0, 3, 4, 5)), np.ones((3, 5)), np.ones((3, 4))),
        [((0, 3, 4, 5), F32)],
    ),
    ("unary", lambda: tn.unary(x4((3, 0, 2)), "exp"), [((3, 0, 2), F32)]),
    # huge dimensions, zero elements: nothing may be allocated or touched
    ("huge softmax", lambda: tn.softmax(np.empty((0, 2**40), F32)), [((0, 2**40), F32)]),
    ("huge softmax axis 0", lambda: tn.softmax(np.empty((2**40, 0), F32), axis=0), [((2**40, 0), F32)]),
    ("huge unary", lambda: tn.unary(np.empty((2**40, 0), F32), "sin"), [((2**40, 0), F32)]),
    ("huge eltwise", lambda: tn.eltwise([np.empty((0, 2**40), F32)] * 2, "sum"), [((0, 2**40), F32)]),
    ("huge layer norm", lambda: tn.layer_norm_channels(np.empty((2**40, 0), F32), sc(0), sc(0)), [((2**40, 0), F32)]),
    (
        "huge layer norm nhwc",
        lambda: tn.layer_norm_spatial(np.empty((2**20, 2**30, 0), F32), sc(0), sc(0), format="nhwc"),
        [((2**20, 2**30, 0), F32)],
    ),
    (
        "huge normalize_l2",
        lambda: tn.normalize_l2(np.empty((0, 3, 2**40), F32), sc(), across_spatial=True),
        [((0, 3, 2**40), F32)],
    ),
    ("huge channel_norm", lambda: tn.channel_norm(np.empty((0, 3, 2**40), F32), sc(), sc()), [((0, 3, 2**40), F32)]),
    ("huge channel_sum", lambda: tn.channel_sum(np.empty((2**40, 0), BF16)), [((2**40, 0), F32)]),
    ("huge lrn", lambda: tn.lrn_cross_channels(np.empty((0, 2**40, 1), F32), 2**50, (1, 1, 1)), [((0, 2**40, 1), F32)]),
    (
        "huge shuffle",
        lambda: tn.shuffle(np.empty((0, 2**40), F32), np.empty((0, 2), F32), type=0),
        [((0, 2**39 + 1), F32)] * 2,
    ),
    (
        "huge tiled",
        lambda: tn.tiled_scale_2d(np.empty((2**40, 0, 1, 1), F32), np.ones((0, 1)), np.ones((0, 1))),
        [((2**40, 0, 1, 1), F32)],
    ),
    ("broadcast zero-size", lambda: tn.unary(np.broadcast_to(F32(1), (0, 2**40)), "abs"), [((0, 2**40), F32)]),
]


@pytest.mark.parametrize("call,expected", [(c, e) for _, c, e in ZERO_SIZE], ids=[n for n, _, _ in ZERO_SIZE])
def test_zero_size_gives_empty_result(call, expected):
    result = call()
    results = result if isinstance(result, tuple) else (result,)
    assert len(results) == len(expected)
    for r, (shape, dtype) in zip(results, expected, strict=True):
        assert isinstance(r, np.ndarray) and r.shape == shape and r.dtype == np.dtype(dtype)


def test_softmax_of_a_scalar_is_refused():
    """A 0-d array has no axis. (A contiguity copy with np.ascontiguousarray would turn it
    into shape (1,) and reach the kernel: hence the kernel requirement, so that the test
    fails instead of crashing where the kernel is missing.)"""
    require("SynetSoftmax32f")
    for x in (np.float32(1.0), np.array(1.0, F32)):
        with raises_arg(ValueError, "x"):
            tn.softmax(x)


def test_elementwise_ops_keep_a_scalar_shape():
    """unary and eltwise of 0-d arrays give 0-d results, like NumPy's ufuncs."""
    require("SynetUnaryOperation32f", "SynetEltwiseLayerForward")
    x = np.array(-2.0, F32)
    y = tn.unary(x, "abs")
    assert y.shape == () and y == 2.0
    z = tn.eltwise([x, np.array(3.0, F32)], "sum")
    assert z.shape == () and z == 1.0


def test_channel_sum_over_no_spatial_position_is_zero():
    """Sums over an empty set are 0, written even though no kernel runs."""
    y = tn.channel_sum(np.ones((2, 3, 0), BF16))
    assert y.shape == (2, 3) and y.dtype == np.float32 and (y.view(np.uint32) == 0).all()
    y = tn.channel_sum(np.ones((2, 0, 3), np.uint16), format="nhwc")
    assert y.shape == (2, 3) and (y == 0).all()


def test_format_is_case_insensitive_and_accepts_enum_values():
    for fmt in ("nchw", "NCHW", "Nchw", 0):
        assert tn.normalize_l2(x4((0, 3, 5)), sc(), format=fmt).shape == (0, 3, 5)
    for fmt in ("nhwc", "NHWC", 1):
        assert tn.normalize_l2(x4((0, 5, 3)), sc(), format=fmt).shape == (0, 5, 3)


@pytest.mark.parametrize(
    "code",
    [
        "tn.unary(np.broadcast_to(np.float32(1), (2 ** 40,)), 'abs')",
        "tn.softmax(np.broadcast_to(np.float32(1), (2 ** 20, 2 ** 30)), axis=0)",
        "tn.layer_norm_channels(np.broadcast_to(np.float32(1), (2 ** 30, 4, 2 ** 10)), np.ones(4), np.ones(4))",
        "tn.eltwise([np.broadcast_to(np.float32(1), (2 ** 42,))] * 2, 'sum')",
    ],
)
def test_huge_broadcast_view_fails_cleanly(isolated, code):
    """A broadcast view with a huge shape (stride 0) would need terabytes once made
    contiguous: the call must fail with a Python exception (run under a 4 GiB address-space
    limit, in a child process so that a crash cannot take the suite down), never crash."""
    proc = isolated(f"""
        import numpy as np, tensorops_native as tn
        try:
            r = {code}
            print("result", r.shape)
        except (MemoryError, ValueError) as e:
            print("refused", type(e).__name__)
    """)
    assert proc.returncode == 0, f"crashed or raised unexpectedly ({proc.returncode}):\n{proc.stderr[-2000:]}"
    assert proc.stdout.startswith(("refused", "result"))


# ---- accepted layouts: non-contiguous, byte-swapped, broadcast, huge strides ---------------


def _strided(x):
    base = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
    base[..., ::2] = x
    return base[..., ::2]


def _fortran(x):
    return np.asfortranarray(x)


def _reversed(x):
    return np.ascontiguousarray(x[..., ::-1])[..., ::-1]


def _huge_strides(x):
    base = np.zeros(x.shape + (1024,), x.dtype)  # 4 KiB (fp32) between elements
    base[..., 0] = x
    return base[..., 0]


def _byteswapped(x):
    if x.dtype == BF16:
        return x.view(np.uint16).astype(">u2")
    return x.astype(x.dtype.newbyteorder(">"))


VIEWS = {
    "strided": _strided,
    "fortran": _fortran,
    "reversed": _reversed,
    "huge-strides": _huge_strides,
    "byteswapped": _byteswapped,
}


def _bits(a):
    a = np.ascontiguousarray(a)
    if a.dtype.kind == "u" and not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    return a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint16)


def _ops(rng):
    """(kernels, x, call(x) -> tuple of results) per operation, x small."""
    f = rng.normal(size=(2, 5, 3, 4)).astype(F32)
    b = f.astype(BF16)
    s5, s4 = rng.uniform(0.5, 1.5, 5).astype(F32), rng.uniform(0.5, 1.5, 4).astype(F32)
    other = rng.normal(size=f.shape).astype(F32)
    return {
        "normalize_l2": (["SynetNormalizeLayerForward"], f, lambda x: (tn.normalize_l2(x, s5),)),
        "layer_norm_channels": (
            ["SynetNormalizeLayerForwardV2"],
            f,
            lambda x: (tn.layer_norm_channels(x, s4, s4, format="nhwc"),),
        ),
        "layer_norm_channels_bf16": (
            ["SynetNormalizeLayerForward16bV2"],
            b,
            lambda x: (tn.layer_norm_channels(x, s5, s5),),
        ),
        "layer_norm_spatial": (["SynetNormalizeLayerForwardV3"], f, lambda x: (tn.layer_norm_spatial(x, s5, s5),)),
        "channel_norm": (["SynetNormalizeLayerForwardV4"], f, lambda x: (tn.channel_norm(x, s4, s4, format="nhwc"),)),
        "channel_sum": (["SynetChannelSum16b"], b, lambda x: (tn.channel_sum(x),)),
        "eltwise": (["SynetEltwiseLayerForward"], f, lambda x: (tn.eltwise([other, x, x], "sum", [1, 2, 3]),)),
        "lrn": (["SynetLrnLayerCrossChannels"], f, lambda x: (tn.lrn_cross_channels(x, 1, (1, 0.5, -0.75)),)),
        "shuffle": (["SynetShuffleLayerForward"], f[:, :4], lambda x: tn.shuffle(x, x, type=0)),
        "softmax": (["SynetSoftmax32f"], f, lambda x: (tn.softmax(x, axis=1),)),
        "softmax_bf16": (["SynetSoftmax16b"], b, lambda x: (tn.softmax(x, axis=-1),)),
        "tiled_scale_2d": (
            ["SynetTiledScale2D32f"],
            f,
            lambda x: (tn.tiled_scale_2d(x, np.ones((5, 4)) * 2, np.ones((5, 3)) * 3),),
        ),
        "unary": (["SynetUnaryOperation32f"], f, lambda x: (tn.unary(x, "tanh"),)),
    }


OP_NAMES = list(_ops(np.random.default_rng(0)))


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("op", OP_NAMES)
def test_non_contiguous_input_same_as_contiguous(rng, op, view):
    kernels, x, call = _ops(rng)[op]
    require(*kernels)
    xv = VIEWS[view](x)
    assert view in ("byteswapped",) or not xv.flags.c_contiguous or x.ndim < 2
    before = xv.copy()
    want = call(np.ascontiguousarray(x))
    got = call(xv)
    assert_same_bits(_bits(xv), _bits(before), what="the input view was modified")
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert_same_bits(_bits(g), _bits(w), what=f"{op} on a {view} view")


def test_broadcast_input_same_as_contiguous(rng):
    require("SynetNormalizeLayerForwardV2", "SynetSoftmax32f")
    row = rng.normal(size=(1, 7, 1, 5)).astype(F32)
    x = np.broadcast_to(row, (3, 7, 4, 5))
    assert x.strides[0] == 0
    s = np.ones(7, F32)
    assert_same_bits(tn.layer_norm_channels(x, s, s), tn.layer_norm_channels(np.ascontiguousarray(x), s, s))
    assert_same_bits(tn.softmax(x, axis=2), tn.softmax(np.ascontiguousarray(x), axis=2))


def test_non_contiguous_parameters(rng):
    require("SynetNormalizeLayerForwardV3", "SynetTiledScale2D32f", "SynetEltwiseLayerForward")
    x = rng.normal(size=(2, 5, 3, 4)).astype(F32)
    scale = rng.normal(size=10).astype(np.float64)[::2]  # float64 and strided: converted
    shift = np.arange(5, dtype=np.int64)[::-1]
    assert_same_bits(
        tn.layer_norm_spatial(x, scale, shift),
        tn.layer_norm_spatial(x, scale.astype(F32).copy(), shift.astype(F32).copy()),
    )
    ver = np.asfortranarray(rng.normal(size=(5, 4)).astype(F32))
    hor = rng.normal(size=(3, 5)).astype(F32).T  # (5, 3), transposed view
    assert_same_bits(tn.tiled_scale_2d(x, ver, hor), tn.tiled_scale_2d(x, ver.copy(order="C"), hor.copy()))
    w = np.float64([0.5, 2.0, 8.0])[::-1]
    xs = [rng.normal(size=7).astype(F32) for _ in range(3)]
    assert_same_bits(tn.eltwise(xs, "sum", w), tn.eltwise(xs, "sum", [8.0, 2.0, 0.5]))


def test_no_spatial_dimensions_means_spatial_one(rng):
    """An image tensor (batch, channels) has no spatial dimension: spatial = 1, both formats
    the same tensor."""
    require("SynetNormalizeLayerForwardV2")
    x = rng.normal(size=(4, 17)).astype(F32)
    s, t = rng.uniform(0.5, 1.5, 17).astype(F32), rng.normal(size=17).astype(F32)
    exact = ref.synet_normalize_layer_forward_v2(x.astype(np.float64)[:, :, None], s, t, np.float32(1e-5))[:, :, 0]
    for fmt in ("nchw", "nhwc"):  # different code paths: equal within rounding, not bitwise
        y = tn.layer_norm_channels(x, s, t, format=fmt)
        assert y.shape == x.shape
        np.testing.assert_allclose(y, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())


def test_python_sequences_accepted_for_parameters(rng):
    require("SynetLrnLayerCrossChannels", "SynetEltwiseLayerForward")
    x = rng.normal(size=(1, 5, 4)).astype(F32)
    assert_same_bits(
        tn.lrn_cross_channels(x, 1, [1, 0.5, -0.75]), tn.lrn_cross_channels(x, 1, np.float32([1, 0.5, -0.75]))
    )
    xs = (x, x)  # a tuple of inputs
    assert_same_bits(tn.eltwise(xs, "max"), x)

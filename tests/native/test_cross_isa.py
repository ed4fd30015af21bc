"""The same inputs at every ISA level, each in its own interpreter (TENSOROPS_ISA=scalar,
avx2, avx512; a level this CPU lacks is skipped with the reason):

- BF16 outputs (layer_norm_channels, softmax) are identical bit for bit, NaNs included
  (docs/kernels.md: every level produces bit-identical BF16 outputs);
- LRN outputs are identical bit for bit (docs/kernels.md), over bases from 2^-104 to 2^104
  and special values, for LRN's own power and the table pow;
- unary results: bit-identical for the exact ops, within each other's accuracy bounds
  (twice the docs/kernels.md bound, same NaN and infinity positions) for the others.
"""

import numpy as np
import pytest

import reference as ref
from tn_testing import (
    CHANNELS,
    EXACT_OPS,
    UNARY_OPS,
    assert_same_bits,
    image_shape,
    require,
    unary_checked_mask,
    unary_inputs,
    unary_tolerance,
)

# Each test runs the levels it compares itself: run once, at the process's level.
pytestmark = pytest.mark.level_independent

PAIRS = [("scalar", "avx2"), ("scalar", "avx512"), ("avx2", "avx512")]
PAIR_IDS = [f"{a}-vs-{b}" for a, b in PAIRS]

BF16_SCRIPT = """
import ml_dtypes
for key in sorted(inputs):
    if not key.endswith("_x"):
        continue
    name = key[:-2]
    x = inputs[key].view(ml_dtypes.bfloat16)
    if name.startswith("ln"):
        fmt = ("nchw", "nhwc")[int(inputs[name + "_fmt"])]
        y = tn.layer_norm_channels(x, inputs[name + "_scale"], inputs[name + "_shift"], format=fmt)
    else:
        y = tn.softmax(x, axis=int(inputs[name + "_axis"]))
    outputs[name] = y.view(np.uint16)
"""

UNARY_SCRIPT = """
for op in inputs["ops"].tolist():
    outputs[op] = tn.unary(inputs["x_" + op], op)
"""


def bf16_inputs():
    rng = np.random.default_rng(20240603)
    inputs = {}
    i = 0
    for fmt_code, fmt in enumerate(("nchw", "nhwc")):
        for channels in CHANNELS:
            for spatial in (1, 5, 16, 49, 3136) if channels in (3, 16, 17, 67) else (5, 16):
                shape = image_shape(1 + i % 2 * 2, channels, spatial, fmt)
                x = (rng.normal(0.3, 1.0, shape)).astype(np.float32).astype(ref.BF16)
                if i % 5 == 0:
                    x.view(np.uint16).reshape(-1)[[0, -1]] = [0x7FC0, 0xFF80]
                inputs[f"ln{i:03d}_x"] = x.view(np.uint16)
                inputs[f"ln{i:03d}_scale"] = rng.uniform(-1.5, 1.5, channels).astype(np.float32)
                inputs[f"ln{i:03d}_shift"] = rng.uniform(-1, 1, channels).astype(np.float32)
                inputs[f"ln{i:03d}_fmt"] = np.array(fmt_code)
                i += 1
    # Denormal and +-0 outputs among normal ones: NHWC rows are written 32 values at a time
    # (the conversion of such a pair falls back to the exact one), the NCHW twin one vector
    # of positions at a time (a vector holding a denormal takes the exact conversion).
    for j, fmt in enumerate(("nhwc", "nchw")):
        x = rng.normal(0.3, 1.0, image_shape(2, 80, 7, fmt)).astype(np.float32).astype(ref.BF16)
        scale = rng.uniform(-1.5, 1.5, 80).astype(np.float32)
        shift = rng.uniform(-1, 1, 80).astype(np.float32)
        scale[[2, 35, 64]], shift[[2, 35, 64]] = 1e-39, 0.0
        scale[[7, 50]], shift[7], shift[50] = 0.0, 0.0, -0.0
        inputs[f"ln{i + j:03d}_x"] = x.view(np.uint16)
        inputs[f"ln{i + j:03d}_scale"], inputs[f"ln{i + j:03d}_shift"] = scale, shift
        inputs[f"ln{i + j:03d}_fmt"] = np.array(("nchw", "nhwc").index(fmt))
    shapes = (
        [((c,), -1) for c in CHANNELS]
        + [((3, c, 5), 1) for c in CHANNELS]
        + [((c, 16), 0) for c in CHANNELS]
        + [((2, 3136), -1), ((1, 67, 49), 1), ((4, 33, 1), 1)]
    )
    for j, (shape, axis) in enumerate(shapes):
        x = (rng.normal(size=shape) * 4).astype(np.float32).astype(ref.BF16)
        if j % 4 == 0 and x.size > 2:
            x.view(np.uint16).reshape(-1)[[1]] = 0x7F80  # a +inf: its row is NaN
        inputs[f"sm{j:03d}_x"] = x.view(np.uint16)
        inputs[f"sm{j:03d}_axis"] = np.array(axis)
    return inputs


@pytest.fixture(scope="session")
def bf16_case():
    return bf16_inputs()


@pytest.mark.parametrize("a,b", PAIRS, ids=PAIR_IDS)
def test_bf16_outputs_identical_across_isa_levels(isa_runner, bf16_case, a, b):
    require("SynetNormalizeLayerForward16bV2", "SynetSoftmax16b")
    same_bits_at_levels(isa_runner, "bf16", BF16_SCRIPT, bf16_case, a, b, lambda n: n > 50)


def same_bits_at_levels(isa_runner, tag, script, case, a, b, count_ok):
    ya = isa_runner.run(tag, a, script, case)
    yb = isa_runner.run(tag, b, script, case)
    assert ya.keys() == yb.keys() and count_ok(len(ya))
    for name in sorted(ya):
        assert_same_bits(yb[name], ya[name], what=f"{name} at {b} vs {a}")


@pytest.fixture(scope="session")
def unary_case():
    rng = np.random.default_rng(7)
    inputs = {"ops": np.array(UNARY_OPS)}
    for op in UNARY_OPS:
        inputs["x_" + op] = unary_inputs(op, rng, n=1 << 17)
    return inputs


@pytest.mark.parametrize("a,b", PAIRS, ids=PAIR_IDS)
def test_unary_agrees_across_isa_levels(isa_runner, unary_case, a, b):
    require("SynetUnaryOperation32f")
    ya = isa_runner.run("unary", a, UNARY_SCRIPT, unary_case)
    yb = isa_runner.run("unary", b, UNARY_SCRIPT, unary_case)
    problems = []
    for op in UNARY_OPS:
        x, p, q = unary_case["x_" + op], ya[op], yb[op]
        if op in EXACT_OPS:
            if op in ("abs", "neg", "not", "zero"):
                diff = p.view(np.uint32) != q.view(np.uint32)
            else:  # NaN payloads are not part of IEEE's exact results
                diff = (p.view(np.uint32) != q.view(np.uint32)) & ~(np.isnan(p) & np.isnan(q))
        else:
            r = ref.synet_unary_operation_32f(x, op)
            with np.errstate(invalid="ignore", over="ignore"):
                p64, q64 = p.astype(np.float64), q.astype(np.float64)
                same_class = (np.isnan(p) == np.isnan(q)) & (np.isinf(p) == np.isinf(q))
                close = np.isnan(p) | (p64 == q64) | (np.abs(p64 - q64) <= 2 * unary_tolerance(op, r))
            diff = ~(same_class & close) & unary_checked_mask(op, x)
        if diff.any():
            i = np.flatnonzero(diff)[0]
            problems.append(f"{op}: {int(diff.sum())} differ, e.g. x={x[i]!r}: {a} {p[i]!r}, {b} {q[i]!r}")
    assert not problems, "\n".join(problems)


LRN_SCRIPT = """
for key in sorted(inputs):
    if key.endswith("_x"):
        name = key[:-2]
        fmt = ("nchw", "nhwc")[int(inputs[name + "_fmt"])]
        outputs[name] = tn.lrn_cross_channels(inputs[key], int(inputs[name + "_half"]), inputs[name + "_k"],
                                              format=fmt).view(np.uint32)
"""


@pytest.fixture(scope="session")
def lrn_case():
    rng = np.random.default_rng(11)
    inputs = {}
    i = 0
    for fmt_code, fmt in enumerate(("nchw", "nhwc")):
        for channels, half, spatial in [(17, 2, 49), (96, 2, 300), (16, 5, 37), (5, 1, 3136)]:
            for k2 in (-0.75, -1.0, 0.3, -1.5):
                shape = image_shape(1, channels, spatial, fmt)
                x = (np.exp2(rng.uniform(-26, 26, shape)) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)
                if i % 2:  # ordinary activations: long runs of one exponent
                    x = rng.normal(0, 4, shape).astype(np.float32)
                x.reshape(-1)[[3, 40, -1]] = [np.nan, np.inf, 0.0]
                inputs[f"lrn{i:03d}_x"] = x
                inputs[f"lrn{i:03d}_half"] = np.array(half)
                inputs[f"lrn{i:03d}_k"] = np.float32([i % 3 * 0.5, 1e-4 if i % 2 else 1.0, k2])
                inputs[f"lrn{i:03d}_fmt"] = np.array(fmt_code)
                i += 1
    return inputs


@pytest.mark.parametrize("a,b", PAIRS, ids=PAIR_IDS)
def test_lrn_identical_across_isa_levels(isa_runner, lrn_case, a, b):
    require("SynetLrnLayerCrossChannels")
    same_bits_at_levels(isa_runner, "lrn", LRN_SCRIPT, lrn_case, a, b, lambda n: n == 32)

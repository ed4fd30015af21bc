"""Random valid calls of every operation, with the C kernels each one needs."""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

import tensorops_native as tn

BF16 = ml_dtypes.bfloat16


@dataclass
class Case:
    id: str
    op: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    kernels: tuple[str, ...] = ()

    def missing(self) -> list[str]:
        """Kernels this build lacks (calling them would crash the process)."""
        if not hasattr(tn, self.op):
            return [f"tensorops_native.{self.op}"]
        report = tn.kernels()
        return [k for k in self.kernels if report.get(k, "missing") == "missing"]


def _qip_kernels() -> tuple[str, ...]:
    return tuple(k for k in tn.kernels() if "Quantized" in k)


def cases(seed: int = 0) -> list[Case]:
    rng = np.random.default_rng(seed)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def pos(*shape):
        return (rng.random(shape) + 0.5).astype(np.float32)

    out: list[Case] = []
    for fmt in ("nchw", "nhwc"):
        shape = (2, 5, 3, 4) if fmt == "nchw" else (2, 3, 4, 5)
        x = f32(*shape)
        out += [
            Case(f"normalize_l2-{fmt}", "normalize_l2", (x, pos(5)), dict(format=fmt), ("SynetNormalizeLayerForward",)),
            Case(
                f"normalize_l2-across-{fmt}",
                "normalize_l2",
                (x, pos(5)),
                dict(eps=1e-6, across_spatial=True, format=fmt),
                ("SynetNormalizeLayerForward",),
            ),
            Case(
                f"layer_norm_channels-{fmt}",
                "layer_norm_channels",
                (x, pos(5), f32(5)),
                dict(format=fmt),
                ("SynetNormalizeLayerForwardV2",),
            ),
            Case(
                f"layer_norm_channels-bf16-{fmt}",
                "layer_norm_channels",
                (x.astype(BF16), pos(5), f32(5)),
                dict(eps=1e-3, format=fmt),
                ("SynetNormalizeLayerForward16bV2",),
            ),
            Case(
                f"layer_norm_channels-bits-{fmt}",
                "layer_norm_channels",
                (x.astype(BF16).view(np.uint16), pos(5), f32(5)),
                dict(format=fmt),
                ("SynetNormalizeLayerForward16bV2",),
            ),
            Case(
                f"layer_norm_spatial-{fmt}",
                "layer_norm_spatial",
                (x, pos(5), f32(5)),
                dict(format=fmt),
                ("SynetNormalizeLayerForwardV3",),
            ),
            Case(
                f"channel_norm-{fmt}",
                "channel_norm",
                (x, pos(5), f32(5)),
                dict(eps=1e-4, format=fmt),
                ("SynetNormalizeLayerForwardV4",),
            ),
            Case(f"channel_sum-{fmt}", "channel_sum", (x.astype(BF16),), dict(format=fmt), ("SynetChannelSum16b",)),
            Case(
                f"lrn_cross_channels-{fmt}",
                "lrn_cross_channels",
                (x, 2, (1.0, 1e-4, -0.75)),
                dict(format=fmt),
                ("SynetLrnLayerCrossChannels",),
            ),
            Case(
                f"tiled_scale_2d-{fmt}",
                "tiled_scale_2d",
                (x, f32(5, 4) if fmt == "nchw" else f32(4, 5), f32(5, 3) if fmt == "nchw" else f32(3, 5)),
                dict(format=fmt),
                ("SynetTiledScale2D32f",),
            ),
        ]
        c4 = (2, 4, 3, 2) if fmt == "nchw" else (2, 3, 2, 4)
        c6 = (2, 6, 3, 2) if fmt == "nchw" else (2, 3, 2, 6)
        out += [
            Case(
                f"shuffle-split-{fmt}",
                "shuffle",
                (f32(*c4), f32(*c6)),
                dict(type="split", format=fmt),
                ("SynetShuffleLayerForward",),
            ),
            Case(
                f"shuffle-interleave-{fmt}",
                "shuffle",
                (f32(*c4), f32(*c4)),
                dict(type=1, format=fmt, channels=(2, 6)),
                ("SynetShuffleLayerForward",),
            ),
        ]
    for op in ("product", "sum", "max", "min"):
        out.append(
            Case(f"eltwise-{op}", "eltwise", ([f32(3, 17) for _ in range(3)], op), {}, ("SynetEltwiseLayerForward",))
        )
    out.append(
        Case("eltwise-weighted", "eltwise", ([f32(33), f32(33)], "sum", [0.5, -2.0]), {}, ("SynetEltwiseLayerForward",))
    )
    for axis in (-1, 0, 1):
        out.append(Case(f"softmax-axis{axis}", "softmax", (f32(3, 19, 5),), dict(axis=axis), ("SynetSoftmax32f",)))
    out.append(Case("softmax-bf16", "softmax", (f32(4, 33).astype(BF16),), {}, ("SynetSoftmax16b",)))
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3.4e38], np.float32)
    for op in tn.UNARY_OPS:
        x = np.concatenate([f32(40) * 3, pos(20), special])
        out.append(Case(f"unary-{op}", "unary", (x, op), {}, ("SynetUnaryOperation32f",)))
    out.append(Case("unary-by-value", "unary", (f32(2, 9), 4), {}, ("SynetUnaryOperation32f",)))
    # The quantized inner product (one-shot; the sessions have tests of their own).
    m, k, n = 5, 37, 11
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    params = qip_params(rng, n)
    out.append(Case("quantized_inner_product", "quantized_inner_product", (a, b), params, _qip_kernels()))
    out.append(
        Case(
            "quantized_inner_product-trans_b",
            "quantized_inner_product",
            (a, np.ascontiguousarray(b.T)),
            dict(params, trans_b=True),
            _qip_kernels(),
        )
    )
    return out


def qip_params(rng, n: int) -> dict:
    return dict(
        b_scale=(rng.random(n) * 0.02 + 0.001).astype(np.float32),
        a_scale=0.05,
        a_zero=7,
        c_scale=0.6,
        c_zero=3,
        bias=rng.integers(-2000, 2000, n, dtype=np.int32),
    )


def qip_problem(seed: int, m: int, k: int, n: int):
    """(b, params, a, expected): a quantized inner-product session's arguments, one input
    and the in-process result for it."""
    rng = np.random.default_rng(seed)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    p = qip_params(rng, n)
    with tn.QuantizedInnerProduct(b, **p) as local:
        return b, p, a, local.forward(a)


def same(expected, got) -> bool:
    """Bit-for-bit equality of results (arrays or tuples of arrays)."""
    if isinstance(expected, tuple):
        return isinstance(got, tuple) and len(got) == len(expected) and all(map(same, expected, got))
    return expected.dtype == got.dtype and expected.shape == got.shape and expected.tobytes() == got.tobytes()

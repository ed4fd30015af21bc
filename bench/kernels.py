#!/usr/bin/env python3
"""Kernel benchmark: tensorops_native at each ISA level against NumPy, PyTorch CPU and
ONNX Runtime CPU, all on one thread, each relative to a memcpy of the same bytes.

    python bench/kernels.py                        # every case, every contender
    python bench/kernels.py --only softmax --only lrn   # cases whose name contains a filter
    python bench/kernels.py --isa avx2 --repeat 200
    python bench/kernels.py --peers-only           # NumPy / PyTorch / ONNX Runtime only
    python bench/kernels.py --list                 # the case names
    python bench/kernels.py --cold --only lrn      # inputs from DRAM (caches evicted per call)

Prints Markdown tables (ratios to memcpy, then absolute medians) and never asserts on
time. The ISA level of tensorops_native is fixed at import (TENSOROPS_ISA), so each level
runs in its own worker process: this script started again with `--worker --isa LEVEL`,
which prepares a case and then times blocks of calls on request, one JSON line per request
on stdout, so the main process can alternate it with memcpy and the peers in rounds. A
worker that crashes (a kernel still missing or broken) costs only the case it was running;
the next case gets a new worker.
"""

from __future__ import annotations

import os

# One thread everywhere, set before NumPy, PyTorch or ONNX Runtime load their runtimes.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import selectors  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

F32 = np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)
ISA_LEVELS = ("avx512", "avx2", "scalar")
PEERS = ("numpy", "torch", "ort")
PEER_TITLES = {"numpy": "NumPy", "torch": "PyTorch", "ort": "ONNX Runtime"}
ONNX_OPSET = 17  # the first opset with LayerNormalization
ONNX_IR_VERSION = 8  # the IR version that goes with opset 17
ONNX_IR_VERSIONS = {17: 8, 18: 8, 19: 9, 20: 9, 21: 10}  # opset -> its IR version
MIB = 1 << 20
CASE_TIMEOUT_S = 120.0  # a worker silent for this long on one case is stopped

# Targets of the issue, as ratios to memcpy, for tensors of at least 1 MiB (memcpy bytes).
FAMILY_CAPS = {
    "norm": 1.5,
    "channel_sum": 1.5,
    "eltwise": 1.5,
    "shuffle": 1.5,
    "tiled": 1.5,
    "softmax": 2.0,
    "lrn": 2.0,
    "unary": 1.2,
}

# Reference ratios (time / memcpy time of the same bytes, one thread) quoted in the issue:
# (Simd library, PyTorch, ONNX Runtime). Measured on another machine: indicative only.
REFERENCE = {
    "layer_norm_channels nhwc (1,3136,64)": (3.01, 7.05, 7.46),
    "layer_norm_channels nhwc (8,197,768)": (1.35, 1.27, 2.01),
    "layer_norm_channels nhwc (1,4096,1024)": (1.60, 2.69, 2.27),
    "layer_norm_spatial nchw (1,64,3136)": (3.13, 16.6, 3.91),
    "layer_norm_spatial nchw (8,256,784)": (1.21, 6.32, 1.49),
    "normalize_l2 nchw (1,512,1444)": (1.71, 7.48, 9.27),
    "softmax (64,1000,1) axis=1": (6.66, 52.5, 6.69),
    "softmax (18912,197,1) axis=1": (4.10, 18.0, 5.56),
    "softmax (1,21,1444) axis=1": (7.43, 10.2, 20.2),
    "lrn nchw (1,96,3025) half=2": (3.42, 108, 138),
    "unary exp (1M)": (1.19, 1.18, 1.24),
    "unary erf (1M)": (1.25, 2.79, 2.37),
    "unary tanh (1M)": (1.25, 1.52, 1.29),
    "unary log (1M)": (1.17, 1.22, 7.35),
    "unary sqrt (1M)": (1.10, 1.20, 1.19),
}


# ---------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------


@dataclass
class Setup:
    """The data of one case and how each contender runs on it. Each factory returns a
    zero-argument callable producing the result (an array or a tuple of arrays), except
    `onnx`, which returns an OnnxGraph that the harness turns into a bound session."""

    inputs: list[np.ndarray]  # the tensors read (counted in the bytes)
    ours: Callable[[Any], Callable[[], Any]]  # given the tensorops_native module
    numpy: Callable[[], Any]  # also the reference for the checks
    torch: Callable[[], Callable[[], Any]] | None = None
    onnx: Callable[[], OnnxGraph] | None = None
    tol: tuple[float, float] = (1e-3, 1e-4)  # (rtol, atol) of the output checks


@dataclass
class OnnxGraph:
    nodes: list  # onnx NodeProtos
    feeds: dict[str, np.ndarray]  # graph inputs, bound once
    outputs: list[str]  # graph outputs, in the order of the NumPy results
    inits: dict[str, np.ndarray] = field(default_factory=dict)
    opset: int = ONNX_OPSET  # e.g. 21 for GroupNormalization with per-channel scale


@dataclass
class Case:
    name: str  # unique; --only filters on it
    family: str  # key of FAMILY_CAPS
    kernel: str  # the C kernel, as tensorops_native.kernels() names it
    build: Callable[[np.random.Generator], Setup]
    notes: tuple[str, ...] = ()  # footnote keys

    def rng(self) -> np.random.Generator:
        # Same data in the parent and in every worker.
        return np.random.default_rng(zlib.crc32(self.name.encode()))


def shape_text(shape) -> str:
    return "(" + ",".join(str(d) for d in shape) + ")"


def normal(rng, shape, dtype=F32, loc=0.0, scale=1.0):
    return (rng.standard_normal(shape, dtype=np.float32) * scale + loc).astype(dtype)


def uniform(rng, shape, low, high):
    return rng.uniform(low, high, shape).astype(np.float32)


def to_torch(a):
    import torch

    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def onnx_node(op, inputs, outputs, **attrs):
    from onnx import helper

    return helper.make_node(op, inputs, outputs, **attrs)


def i64(*values):
    return np.array(values, np.int64)


# --- normalization family ---------------------------------------------------------------


def layer_norm_channels_case(shape, dtype=F32) -> Case:
    """Layer norm over channels of an NHWC tensor (batch, spatial, channels)."""
    bf16 = dtype == BF16
    name = f"layer_norm_channels{'_bf16' if bf16 else ''} nhwc {shape_text(shape)}"
    eps = 1e-5

    def build(rng):
        c = shape[-1]
        x = normal(rng, shape, dtype, loc=0.5, scale=2.0)
        scale = normal(rng, (c,), loc=1.0, scale=0.1)
        shift = normal(rng, (c,), scale=0.1)

        def numpy_impl():
            xf = x.astype(np.float32) if bf16 else x
            mean = xf.mean(axis=-1, keepdims=True)
            d = xf - mean
            var = (d * d).mean(axis=-1, keepdims=True)
            y = d / np.sqrt(var + eps) * scale + shift
            return y.astype(BF16) if bf16 else y

        def torch_impl():
            import torch.nn.functional as F

            xt, st, bt = to_torch(x), to_torch(scale), to_torch(shift)
            return lambda: F.layer_norm(xt, (c,), st, bt, eps)

        def onnx_impl():
            # BF16: ONNX Runtime's own BF16 LayerNormalization (scale and shift in BF16).
            p = (lambda a: a.astype(BF16)) if bf16 else (lambda a: a)
            return OnnxGraph(
                [onnx_node("LayerNormalization", ["x", "scale", "shift"], ["y"], axis=-1, epsilon=eps)],
                {"x": x},
                ["y"],
                {"scale": p(scale), "shift": p(shift)},
            )

        return Setup(
            [x],
            lambda tn: lambda: tn.layer_norm_channels(x, scale, shift, eps=eps, format="nhwc"),
            numpy_impl,
            torch_impl,
            onnx_impl,
            tol=(2e-2, 3e-2) if bf16 else (1e-3, 1e-4),
        )

    kernel = "SynetNormalizeLayerForward16bV2" if bf16 else "SynetNormalizeLayerForwardV2"
    return Case(name, "norm", kernel, build, ("ln_bf16",) if bf16 else ())


def layer_norm_spatial_case(shape) -> Case:
    """Layer norm over the spatial positions of each channel of an NCHW tensor."""
    eps = 1e-5

    def build(rng):
        c = shape[1]
        x = normal(rng, shape, loc=0.5, scale=2.0)
        scale = normal(rng, (c,), loc=1.0, scale=0.1)
        shift = normal(rng, (c,), scale=0.1)

        def numpy_impl():
            mean = x.mean(axis=2, keepdims=True)
            d = x - mean
            var = (d * d).mean(axis=2, keepdims=True)
            return d / np.sqrt(var + eps) * scale[:, None] + shift[:, None]

        def torch_impl():
            import torch.nn.functional as F

            xt, st, bt = to_torch(x), to_torch(scale), to_torch(shift)
            return lambda: F.instance_norm(xt, weight=st, bias=bt, eps=eps)

        def onnx_impl():
            return OnnxGraph(
                [onnx_node("InstanceNormalization", ["x", "scale", "shift"], ["y"], epsilon=eps)],
                {"x": x},
                ["y"],
                {"scale": scale, "shift": shift},
            )

        return Setup(
            [x],
            lambda tn: lambda: tn.layer_norm_spatial(x, scale, shift, eps=eps, format="nchw"),
            numpy_impl,
            torch_impl,
            onnx_impl,
        )

    return Case(
        f"layer_norm_spatial nchw {shape_text(shape)}",
        "norm",
        "SynetNormalizeLayerForwardV3",
        build,
        ("instance_norm",),
    )


def normalize_l2_case(shape) -> Case:
    """L2 normalization across channels at each spatial position, NCHW, per-channel scale."""
    eps = 1e-10

    def build(rng):
        c = shape[1]
        x = normal(rng, shape)
        scale = normal(rng, (c,), loc=1.0, scale=0.1)

        def numpy_impl():
            norm = np.sqrt((x * x).sum(axis=1, keepdims=True) + eps)
            return x / norm * scale[:, None]

        def torch_impl():
            import torch.nn.functional as F

            xt, st = to_torch(x), to_torch(scale).view(c, 1)
            return lambda: F.normalize(xt, p=2.0, dim=1, eps=eps) * st

        def onnx_impl():
            return OnnxGraph(
                [onnx_node("LpNormalization", ["x"], ["n"], axis=1, p=2), onnx_node("Mul", ["n", "scale"], ["y"])],
                {"x": x},
                ["y"],
                {"scale": scale.reshape(c, 1)},
            )

        return Setup(
            [x], lambda tn: lambda: tn.normalize_l2(x, scale, eps=eps, format="nchw"), numpy_impl, torch_impl, onnx_impl
        )

    return Case(f"normalize_l2 nchw {shape_text(shape)}", "norm", "SynetNormalizeLayerForward", build, ("l2",))


def channel_norm_case(shape) -> Case:
    """Channel-norm scaling (normalize V4), NCHW: no single ONNX or PyTorch operator."""
    eps = 1e-5

    def build(rng):
        c = shape[1]
        x = normal(rng, shape)
        scale = normal(rng, (c,), scale=0.1)
        shift = normal(rng, (c,), scale=0.1)

        def numpy_impl():
            n = np.sqrt((x * x).sum(axis=2, keepdims=True))
            norm = 1.0 / (n.mean(axis=1, keepdims=True) + eps)
            return x * (1.0 + scale[:, None] * n * norm) + shift[:, None]

        def torch_impl():
            import torch

            xt, st, bt = to_torch(x), to_torch(scale).view(c, 1), to_torch(shift).view(c, 1)

            def run():
                n = torch.linalg.vector_norm(xt, dim=2, keepdim=True)
                return xt * (1.0 + st * n / (n.mean(dim=1, keepdim=True) + eps)) + bt

            return run

        def onnx_impl():
            return OnnxGraph(
                [
                    onnx_node("ReduceL2", ["x"], ["n"], axes=[2], keepdims=1),
                    onnx_node("ReduceMean", ["n"], ["m"], axes=[1], keepdims=1),
                    onnx_node("Add", ["m", "eps"], ["d"]),
                    onnx_node("Div", ["n", "d"], ["r"]),
                    onnx_node("Mul", ["r", "scale"], ["a"]),
                    onnx_node("Add", ["a", "one"], ["alpha"]),
                    onnx_node("Mul", ["x", "alpha"], ["xa"]),
                    onnx_node("Add", ["xa", "shift"], ["y"]),
                ],
                {"x": x},
                ["y"],
                {
                    "eps": np.array(eps, np.float32),
                    "one": np.array(1.0, np.float32),
                    "scale": scale.reshape(c, 1),
                    "shift": shift.reshape(c, 1),
                },
            )

        return Setup(
            [x],
            lambda tn: lambda: tn.channel_norm(x, scale, shift, eps=eps, format="nchw"),
            numpy_impl,
            torch_impl,
            onnx_impl,
        )

    return Case(
        f"channel_norm nchw {shape_text(shape)}", "norm", "SynetNormalizeLayerForwardV4", build, ("channel_norm",)
    )


# The generic normalization (TensorRT INormalization / DirectML MVN1) on the three layouts
# of the issue: (x shape, normalize() keyword arguments, per-channel parameters?).
GENERIC_NORMS = {
    "layer_norm": ((8, 197, 768), dict(axes=[-1]), False),
    "instance_norm": ((8, 64, 56, 56), dict(axes=[2, 3]), True),
    "group_norm": ((8, 256, 28, 28), dict(axes=[2, 3], num_groups=32), True),
}


def generic_norm_case(kind, dtype=F32) -> Case:
    """tensorops_native.normalize against torch layer_norm / instance_norm / group_norm and
    ONNX Runtime LayerNormalization / InstanceNormalization / GroupNormalization (opset 21:
    per-channel scale and bias). Scale and bias fp32, per position (layer norm) or per channel."""
    shape, kwargs, per_channel = GENERIC_NORMS[kind]
    bf16 = dtype == BF16
    eps = 1e-5

    def build(rng):
        c = shape[1] if per_channel else shape[-1]
        x = normal(rng, shape, dtype, loc=0.5, scale=2.0)
        scale = normal(rng, (c,), loc=1.0, scale=0.1)
        shift = normal(rng, (c,), scale=0.1)
        pshape = (1, c) + (1,) * (len(shape) - 2) if per_channel else (c,)
        s4, b4 = scale.reshape(pshape), shift.reshape(pshape)
        groups = kwargs.get("num_groups", c if per_channel else 1)

        def numpy_impl():
            xf = x.astype(np.float32) if bf16 else x
            if per_channel:  # instance norm is group norm with one channel per group
                xg = xf.reshape(shape[0], groups, -1)
                mean = xg.mean(axis=-1, keepdims=True)
                d = xg - mean
                var = (d * d).mean(axis=-1, keepdims=True)
                y = (d / np.sqrt(var + eps)).reshape(shape) * s4 + b4
            else:
                mean = xf.mean(axis=-1, keepdims=True)
                d = xf - mean
                var = (d * d).mean(axis=-1, keepdims=True)
                y = d / np.sqrt(var + eps) * scale + shift
            return y.astype(BF16) if bf16 else y

        def torch_impl():
            import torch.nn.functional as F

            xt, st, bt = to_torch(x), to_torch(scale), to_torch(shift)
            if kind == "layer_norm":
                return lambda: F.layer_norm(xt, (c,), st, bt, eps)
            if kind == "instance_norm":
                return lambda: F.instance_norm(xt, weight=st, bias=bt, eps=eps)
            return lambda: F.group_norm(xt, groups, st, bt, eps)

        def onnx_impl():
            op = {
                "layer_norm": "LayerNormalization",
                "instance_norm": "InstanceNormalization",
                "group_norm": "GroupNormalization",
            }[kind]
            attrs = dict(epsilon=eps)
            if kind == "layer_norm":
                attrs["axis"] = -1
            if kind == "group_norm":
                attrs["num_groups"] = groups
            opset = 21 if kind == "group_norm" else ONNX_OPSET
            if not bf16 or kind == "layer_norm":
                # BF16 layer norm: ORT's own BF16 LayerNormalization (scale and shift in BF16)
                p = (lambda a: a.astype(BF16)) if bf16 else (lambda a: a)
                return OnnxGraph(
                    [onnx_node(op, ["x", "scale", "shift"], ["y"], **attrs)],
                    {"x": x},
                    ["y"],
                    {"scale": p(scale), "shift": p(shift)},
                    opset,
                )
            from onnx import TensorProto

            return OnnxGraph(
                [
                    onnx_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
                    onnx_node(op, ["xf", "scale", "shift"], ["yf"], **attrs),
                    onnx_node("Cast", ["yf"], ["y"], to=TensorProto.BFLOAT16),
                ],
                {"x": x},
                ["y"],
                {"scale": scale, "shift": shift},
                opset,
            )

        return Setup(
            [x],
            lambda tn: lambda: tn.normalize(x, s4, b4, eps=eps, **kwargs),
            numpy_impl,
            torch_impl,
            onnx_impl,
            tol=(2e-2, 3e-2) if bf16 else (1e-3, 1e-4),
        )

    axes = "axes=" + ",".join(str(a) for a in kwargs["axes"])
    extra = f" G={kwargs['num_groups']}" if "num_groups" in kwargs else ""
    name = f"normalize {kind}{'_bf16' if bf16 else ''} {shape_text(shape)} {axes}{extra}"
    return Case(name, "norm", "NormalizationRows", build, ("generic_norm_bf16",) if bf16 else ("generic_norm",))


# --- softmax, LRN -----------------------------------------------------------------------


def softmax_case(shape, axis=1, dtype=F32) -> Case:
    bf16 = dtype == BF16

    def build(rng):
        x = normal(rng, shape, dtype, scale=3.0)

        def numpy_impl():
            xf = x.astype(np.float32) if bf16 else x
            e = np.exp(xf - xf.max(axis=axis, keepdims=True))
            e /= e.sum(axis=axis, keepdims=True)
            return e.astype(BF16) if bf16 else e

        def torch_impl():
            import torch

            xt = to_torch(x)
            return lambda: torch.softmax(xt, dim=axis)

        def onnx_impl():
            if not bf16:
                return OnnxGraph([onnx_node("Softmax", ["x"], ["y"], axis=axis)], {"x": x}, ["y"])
            from onnx import TensorProto

            return OnnxGraph(
                [
                    onnx_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
                    onnx_node("Softmax", ["xf"], ["yf"], axis=axis),
                    onnx_node("Cast", ["yf"], ["y"], to=TensorProto.BFLOAT16),
                ],
                {"x": x},
                ["y"],
            )

        return Setup(
            [x],
            lambda tn: lambda: tn.softmax(x, axis=axis),
            numpy_impl,
            torch_impl,
            onnx_impl,
            tol=(2e-2, 1e-3) if bf16 else (1e-3, 1e-6),
        )

    name = f"softmax{'_bf16' if bf16 else ''} {shape_text(shape)} axis={axis}"
    return Case(
        name, "softmax", "SynetSoftmax16b" if bf16 else "SynetSoftmax32f", build, ("softmax_bf16",) if bf16 else ()
    )


def lrn_case(channels, height, width, size=5, alpha=1e-4, beta=0.75, bias=1.0) -> Case:
    """ONNX LRN (size, alpha, beta, bias) = our LRN with half = (size - 1) / 2 and
    k = (bias, alpha / size, -beta). The tensor is 4-D because ORT's LRN requires it."""
    half = (size - 1) // 2
    shape = (1, channels, height, width)

    def build(rng):
        x = normal(rng, shape, scale=4.0)

        def numpy_impl():
            sq = np.pad(x * x, ((0, 0), (half, half), (0, 0), (0, 0)))
            s = sq[:, 0:channels].copy()
            for i in range(1, size):
                s += sq[:, i : i + channels]
            return x * (bias + (alpha / size) * s) ** np.float32(-beta)

        def torch_impl():
            import torch.nn.functional as F

            xt = to_torch(x)
            return lambda: F.local_response_norm(xt, size, alpha=alpha, beta=beta, k=bias)

        def onnx_impl():
            return OnnxGraph(
                [onnx_node("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta, bias=bias)], {"x": x}, ["y"]
            )

        k = (bias, alpha / size, -beta)
        return Setup(
            [x], lambda tn: lambda: tn.lrn_cross_channels(x, half, k, format="nchw"), numpy_impl, torch_impl, onnx_impl
        )

    return Case(
        f"lrn nchw (1,{channels},{height * width}) half={half}", "lrn", "SynetLrnLayerCrossChannels", build, ("lrn",)
    )


# --- element-wise -----------------------------------------------------------------------


def erf_numpy(x):
    """erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7) in float32: NumPy has no erf."""
    a = np.abs(x)
    t = np.float32(1.0) / (np.float32(1.0) + np.float32(0.3275911) * a)
    poly = t * (
        np.float32(0.254829592)
        + t
        * (
            np.float32(-0.284496736)
            + t * (np.float32(1.421413741) + t * (np.float32(-1.453152027) + t * np.float32(1.061405429)))
        )
    )
    return np.copysign(np.float32(1.0) - poly * np.exp(-a * a), x)


UNARY_CASES = {  # op: (input range, NumPy, ONNX operator)
    "exp": ((-10.0, 10.0), np.exp, "Exp"),
    "erf": ((-3.0, 3.0), erf_numpy, "Erf"),
    "tanh": ((-5.0, 5.0), np.tanh, "Tanh"),
    "log": ((1e-3, 1e3), np.log, "Log"),
    "sqrt": ((0.0, 1e3), np.sqrt, "Sqrt"),
}


def unary_case(op, size=1 << 20) -> Case:
    (low, high), np_fn, onnx_op = UNARY_CASES[op]

    def build(rng):
        x = uniform(rng, (size,), low, high)

        def torch_impl():
            import torch

            fn = getattr(torch, op)
            xt = to_torch(x)
            return lambda: fn(xt)

        return Setup(
            [x],
            lambda tn: lambda: tn.unary(x, op),
            lambda: np_fn(x),
            torch_impl,
            lambda: OnnxGraph([onnx_node(onnx_op, ["x"], ["y"])], {"x": x}, ["y"]),
            tol=(1e-5, 2e-6),
        )

    return Case(f"unary {op} (1M)", "unary", "SynetUnaryOperation32f", build, ("erf",) if op == "erf" else ())


def eltwise_sum_case(count=3, size=1 << 20) -> Case:
    def build(rng):
        xs = [normal(rng, (size,)) for _ in range(count)]

        def numpy_impl():
            y = xs[0] + xs[1]
            for x in xs[2:]:
                y += x
            return y

        def torch_impl():
            import torch

            ts = [to_torch(x) for x in xs]

            def run():
                y = torch.add(ts[0], ts[1])
                for t in ts[2:]:
                    y.add_(t)
                return y

            return run

        names = [f"x{i}" for i in range(count)]
        return Setup(
            xs,
            lambda tn: lambda: tn.eltwise(xs, "sum"),
            numpy_impl,
            torch_impl,
            lambda: OnnxGraph([onnx_node("Sum", names, ["y"])], dict(zip(names, xs, strict=True)), ["y"]),
        )

    return Case(f"eltwise sum {count}x(1M)", "eltwise", "SynetEltwiseLayerForward", build, ("eltwise",))


# --- layout kernels ---------------------------------------------------------------------


def shuffle_case(shape_nchw, fmt) -> Case:
    """Type 0: S = concat(x0, x1) over channels; y0 = S[even channels], y1 = S[odd]."""
    n, c, h, w = shape_nchw
    half = c  # two inputs of c channels give outputs of (2c) / 2 channels
    shape = shape_nchw if fmt == "nchw" else (n, h, w, c)
    axis = 1 if fmt == "nchw" else 3

    def build(rng):
        x0, x1 = normal(rng, shape), normal(rng, shape)
        pairs = (n, half, 2, h * w) if fmt == "nchw" else (n, h * w, half, 2)
        pick = (slice(None), slice(None), 0) if fmt == "nchw" else (slice(None), slice(None), slice(None), 0)
        pick1 = pick[:-1] + (1,)

        def numpy_impl():
            s = np.concatenate([x0, x1], axis=axis).reshape(pairs)
            return np.ascontiguousarray(s[pick]).reshape(shape), np.ascontiguousarray(s[pick1]).reshape(shape)

        def torch_impl():
            import torch

            t0, t1 = to_torch(x0), to_torch(x1)

            def run():
                s = torch.cat([t0, t1], dim=axis).view(pairs)
                return s[pick].contiguous().view(shape), s[pick1].contiguous().view(shape)

            return run

        def onnx_impl():
            split_axis = 2 if fmt == "nchw" else 3
            return OnnxGraph(
                [
                    onnx_node("Concat", ["x0", "x1"], ["s"], axis=axis),
                    onnx_node("Reshape", ["s", "pairs"], ["p"]),
                    onnx_node("Split", ["p"], ["p0", "p1"], axis=split_axis),
                    onnx_node("Reshape", ["p0", "shape"], ["y0"]),
                    onnx_node("Reshape", ["p1", "shape"], ["y1"]),
                ],
                {"x0": x0, "x1": x1},
                ["y0", "y1"],
                {"pairs": i64(*pairs), "shape": i64(*shape)},
            )

        return Setup(
            [x0, x1],
            lambda tn: lambda: tn.shuffle(x0, x1, type=0, format=fmt),
            numpy_impl,
            torch_impl,
            onnx_impl,
            tol=(0.0, 0.0),
        )

    return Case(
        f"shuffle type0 {fmt} 2x{shape_text(shape)}", "shuffle", "SynetShuffleLayerForward", build, ("shuffle",)
    )


def tiled_scale_case(shape_nchw, fmt) -> Case:
    n, c, h, w = shape_nchw
    shape = shape_nchw if fmt == "nchw" else (n, h, w, c)

    def build(rng):
        x = normal(rng, shape)
        if fmt == "nchw":
            ver, hor = normal(rng, (c, w), loc=1.0, scale=0.2), normal(rng, (c, h), loc=1.0, scale=0.2)
            ver_b, hor_b = ver.reshape(c, 1, w), hor.reshape(c, h, 1)
        else:
            ver, hor = normal(rng, (w, c), loc=1.0, scale=0.2), normal(rng, (h, c), loc=1.0, scale=0.2)
            ver_b, hor_b = ver.reshape(1, w, c), hor.reshape(h, 1, c)

        def torch_impl():
            xt, vt, ht = to_torch(x), to_torch(ver_b), to_torch(hor_b)
            return lambda: xt * vt * ht

        return Setup(
            [x],
            lambda tn: lambda: tn.tiled_scale_2d(x, ver, hor, format=fmt),
            lambda: x * ver_b * hor_b,
            torch_impl,
            lambda: OnnxGraph(
                [onnx_node("Mul", ["x", "ver"], ["xv"]), onnx_node("Mul", ["xv", "hor"], ["y"])],
                {"x": x},
                ["y"],
                {"ver": ver_b, "hor": hor_b},
            ),
            tol=(1e-6, 1e-6),
        )

    return Case(f"tiled_scale_2d {fmt} {shape_text(shape)}", "tiled", "SynetTiledScale2D32f", build, ("tiled",))


def channel_sum_case(shape_nchw, fmt) -> Case:
    n, c, h, w = shape_nchw
    shape = shape_nchw if fmt == "nchw" else (n, h, w, c)
    axes = (2, 3) if fmt == "nchw" else (1, 2)

    def build(rng):
        x = normal(rng, shape, BF16)

        def torch_impl():
            import torch

            xt = to_torch(x)
            return lambda: xt.sum(dim=axes, dtype=torch.float32)

        def onnx_impl():
            from onnx import TensorProto

            return OnnxGraph(
                [
                    onnx_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
                    onnx_node("ReduceSum", ["xf", "axes"], ["y"], keepdims=0),
                ],
                {"x": x},
                ["y"],
                {"axes": i64(*axes)},
            )

        return Setup(
            [x],
            lambda tn: lambda: tn.channel_sum(x, format=fmt),
            lambda: x.astype(np.float32).sum(axis=axes),
            torch_impl,
            onnx_impl,
            tol=(1e-4, 5e-3),
        )

    return Case(
        f"channel_sum_bf16 {fmt} {shape_text(shape)}", "channel_sum", "SynetChannelSum16b", build, ("channel_sum",)
    )


def all_cases() -> list[Case]:
    return [
        layer_norm_channels_case((1, 3136, 64)),
        layer_norm_channels_case((8, 197, 768)),
        layer_norm_channels_case((1, 4096, 1024)),
        layer_norm_spatial_case((1, 64, 3136)),
        layer_norm_spatial_case((8, 256, 784)),
        normalize_l2_case((1, 512, 1444)),
        channel_norm_case((8, 256, 784)),
        softmax_case((64, 1000, 1)),
        softmax_case((18912, 197, 1)),
        softmax_case((1, 21, 1444)),
        lrn_case(96, 55, 55),
        *(unary_case(op) for op in UNARY_CASES),
        eltwise_sum_case(),
        shuffle_case((1, 116, 28, 28), "nchw"),
        shuffle_case((1, 116, 28, 28), "nhwc"),
        shuffle_case((1, 244, 28, 28), "nchw"),
        shuffle_case((1, 244, 28, 28), "nhwc"),
        tiled_scale_case((1, 64, 56, 56), "nchw"),
        tiled_scale_case((1, 64, 56, 56), "nhwc"),
        tiled_scale_case((1, 128, 56, 56), "nchw"),
        tiled_scale_case((1, 128, 56, 56), "nhwc"),
        channel_sum_case((1, 256, 56, 56), "nchw"),
        channel_sum_case((1, 256, 56, 56), "nhwc"),
        layer_norm_channels_case((8, 197, 768), BF16),
        softmax_case((18912, 197), axis=1, dtype=BF16),
        *(generic_norm_case(kind, dtype) for dtype in (F32, BF16) for kind in GENERIC_NORMS),
    ]


FOOTNOTES = {
    "instance_norm": "layer norm over spatial: ONNX InstanceNormalization and torch instance_norm "
    "(the same math: per (n, c) statistics with per-channel scale and shift).",
    "l2": "L2 normalize: ORT LpNormalization(axis=1, p=2) then Mul by scale (2 nodes) divides by the "
    "norm without eps; torch F.normalize(dim=1) divides by max(norm, eps), then multiplies by "
    "scale; ours and NumPy divide by sqrt(sum of squares + eps) (eps = 1e-10: no visible difference).",
    "channel_norm": "channel norm (normalize V4) has no single operator: ORT runs ReduceL2, ReduceMean, "
    "Add, Div, Mul, Add, Mul, Add; torch and NumPy the same formula op by op.",
    "lrn": "LRN: the tensor is (1, 96, 55, 55) (ORT's LRN requires 4-D); ONNX size 5, alpha 1e-4, "
    "beta 0.75, bias 1 = our half 2, k = (1, 2e-5, -0.75); torch F.local_response_norm.",
    "erf": "erf: NumPy has none; its column is the Abramowitz-Stegun 7.1.26 formula in float32 "
    "(|error| <= 1.5e-7), which is also the reference of the check.",
    "eltwise": "eltwise sum: ours is the weighted sum with weights 1; ORT Sum of 3 inputs; torch "
    "add then add_ (one allocation); NumPy a + b then += c.",
    "shuffle": "shuffle type 0: ORT runs Concat, Reshape, Split, Reshape x2; torch and NumPy "
    "concatenate then copy the even and odd channels out (strided copies).",
    "tiled": "tiled scale: two broadcast multiplies (ORT Mul x2 with the scales as initializers).",
    "channel_sum": "channel sum BF16: ORT has no BF16 ReduceSum on CPU: Cast to float then ReduceSum; "
    "torch sum(dtype=float32) on the bfloat16 tensor; NumPy astype(float32).sum().",
    "ln_bf16": "layer norm BF16: ORT's native BF16 LayerNormalization (scale and shift in BF16, as the "
    "operator requires); torch layer_norm on a bfloat16 tensor with float32 weights.",
    "softmax_bf16": "softmax BF16: ORT has no BF16 Softmax on CPU: Cast, Softmax, Cast; torch softmax "
    "on the bfloat16 tensor; NumPy in float32 then astype(bfloat16).",
    "generic_norm": "normalize (TensorRT INormalization / DirectML MVN1): layer norm over the last axis "
    "against torch layer_norm and ORT LayerNormalization; instance norm over (2, 3) against "
    "torch instance_norm and ORT InstanceNormalization; group norm (32 groups) against torch "
    "group_norm and ORT GroupNormalization (opset 21, per-channel scale and bias); fp32 "
    "scale and bias per position (layer norm) or per channel.",
    "generic_norm_bf16": "normalize BF16: torch on the bfloat16 tensor with fp32 weights; ORT's own BF16 "
    "LayerNormalization (BF16 scale and shift), and Cast, InstanceNormalization / "
    "GroupNormalization, Cast (no BF16 kernels for those on CPU).",
}


# ---------------------------------------------------------------------------------------
# Timing and checks
# ---------------------------------------------------------------------------------------

COLD_CALLS_MAX = 300  # timed calls per contender with --cold (each eviction costs ms)


def last_level_cache_bytes() -> int:
    """The largest CPU cache of this machine (sysfs), 32 MiB when unknown."""
    sizes = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    for index in os.listdir(base) if os.path.isdir(base) else []:
        try:
            with open(os.path.join(base, index, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * unit)
    return max(sizes, default=32 * MIB)


def cache_evictor():
    """A function that pushes every earlier working set out of the caches by reading a
    buffer of three times the last-level cache; --cold runs it before each call, untimed,
    so each call reads its inputs (and writes its outputs) from DRAM."""
    buf = np.ones(3 * last_level_cache_bytes() // 8, np.uint64)
    return lambda: buf.max()


def warm_up(fn, budget: float, evict=None) -> float:
    """Call `fn` for about a quarter of `budget` seconds (at least twice, at most 1000
    times; `evict` untimed before each call) and return the median seconds per call."""
    times, start = [], time.perf_counter()
    while len(times) < 2 or (time.perf_counter() - start < budget / 4 and len(times) < 1000):
        if evict:
            evict()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return max(float(np.median(times)), 1e-7)


def time_calls(fn, n: int, evict=None) -> list[int]:
    """The times of `n` calls of `fn` in nanoseconds, the garbage collector off and `evict`
    (when given) run untimed before each call."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        samples = []
        clock = time.perf_counter_ns
        for _ in range(n):
            if evict:
                evict()
            t = clock()
            fn()
            samples.append(clock() - t)
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples


def calls_per_round(estimate: float, args, evict) -> int:
    """Timed calls per round for a contender taking `estimate` seconds per call: --repeat
    spread over the rounds, or as many as fill --budget (at least 7 and at most 20000 calls
    in all; COLD_CALLS_MAX with eviction)."""
    total = args.repeat or int(min(max(args.budget / estimate, 7), COLD_CALLS_MAX if evict else 20000))
    return max(1, -(-total // args.rounds))


def as_arrays(result) -> list[np.ndarray]:
    items = result if isinstance(result, (tuple, list)) else (result,)
    out = []
    for item in items:
        if not isinstance(item, np.ndarray):  # a torch tensor
            import torch

            if item.dtype == torch.bfloat16:
                item = item.contiguous().view(torch.int16).numpy().view(BF16)
            else:
                item = item.contiguous().numpy()
        out.append(item)
    return out


def check(result, reference, tol) -> str | None:
    """None when `result` matches the NumPy reference within tol = (rtol, atol), else a
    short description of the difference."""
    got, want = as_arrays(result), as_arrays(reference)
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    rtol, atol = tol
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape:
            return f"shape {g.shape}, expected {w.shape}"
        g32, w32 = g.astype(np.float32), w.astype(np.float32)
        if not np.allclose(g32, w32, rtol=rtol, atol=atol):
            with np.errstate(invalid="ignore"):
                err = np.nanmax(np.abs(g32 - w32)) if np.isfinite(g32).any() else float("nan")
            bad = int(np.count_nonzero(~np.isclose(g32, w32, rtol=rtol, atol=atol)))
            return f"{bad} of {g32.size} values off (max abs error {err:.3g})"
    return None


def nbytes(arrays) -> int:
    return sum(a.nbytes for a in as_arrays(arrays))


# ---------------------------------------------------------------------------------------
# Contenders in the main process: memcpy, NumPy, PyTorch, ONNX Runtime
# ---------------------------------------------------------------------------------------


def memcpy_fn(size: int):
    src = np.frombuffer(np.random.default_rng(0).bytes(size), np.uint8).copy()
    dst = np.empty_like(src)
    return lambda: np.copyto(dst, src)


_torch_ready = False


def torch_module():
    global _torch_ready
    import torch

    if not _torch_ready:
        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # only allowed before any inter-op work: harmless later
            pass
        _torch_ready = True
    return torch


def onnx_element_type(dtype):
    from onnx import TensorProto, helper

    return TensorProto.BFLOAT16 if dtype == BF16 else helper.np_dtype_to_tensor_dtype(dtype)


def onnx_runner(graph: OnnxGraph, reference: list[np.ndarray]):
    """An ONNX Runtime session of `graph` (one thread, sequential), its inputs and outputs
    bound once to NumPy memory, so each call is run_with_iobinding and nothing else.
    Returns (call, result) where result() gives the output arrays."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    def tensor(name, a):
        if a.dtype == BF16:
            return helper.make_tensor(name, onnx.TensorProto.BFLOAT16, a.shape, a.view(np.uint16).tobytes(), raw=True)
        return numpy_helper.from_array(a, name)

    def value(name, a):
        return helper.make_tensor_value_info(name, onnx_element_type(a.dtype), a.shape)

    outs = {name: np.empty(ref.shape, ref.dtype) for name, ref in zip(graph.outputs, reference, strict=True)}
    g = helper.make_graph(
        graph.nodes,
        "bench",
        [value(k, a) for k, a in graph.feeds.items()],
        [value(k, a) for k, a in outs.items()],
        [tensor(k, a) for k, a in graph.inits.items()],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", graph.opset)])
    model.ir_version = ONNX_IR_VERSIONS.get(graph.opset, ONNX_IR_VERSION)
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def ortvalue(a):
        if a.dtype == BF16:
            return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint16), onnx.TensorProto.BFLOAT16)
        return ort.OrtValue.ortvalue_from_numpy(a)

    binding = session.io_binding()
    keep = []  # the OrtValues must outlive the binding
    for name, a in graph.feeds.items():
        keep.append(ortvalue(a))
        binding.bind_ortvalue_input(name, keep[-1])
    for name, a in outs.items():
        keep.append(ortvalue(a))
        binding.bind_ortvalue_output(name, keep[-1])

    def call():
        session.run_with_iobinding(binding)

    call.keep = (keep, binding, session)
    return call, lambda: tuple(outs.values())


def peer_callable(peer: str, setup: Setup, reference):
    """(call, result) for one peer, or None when the case has no such peer."""
    if peer == "numpy":
        return setup.numpy, setup.numpy
    if peer == "torch":
        if setup.torch is None:
            return None
        torch_module()
        fn = setup.torch()
        return fn, fn
    if peer == "ort":
        if setup.onnx is None:
            return None
        return onnx_runner(setup.onnx(), as_arrays(reference))
    raise ValueError(peer)


# ---------------------------------------------------------------------------------------
# Workers: tensorops_native at one ISA level
# ---------------------------------------------------------------------------------------


def worker_main(args) -> int:
    """Answer requests from stdin, one JSON line each: {"case", "budget"} prepares a case
    (build, check against NumPy, warm up) and {"calls": n} times n calls of the prepared one."""
    import faulthandler

    faulthandler.enable()  # a crashing kernel leaves its Python stack on stderr
    import tensorops_native as tn

    report = tn.kernels()
    cases = {c.name: c for c in all_cases()}
    out = sys.stdout
    evict = cache_evictor() if args.cold else None
    out.write(json.dumps({"hello": True, "isa": tn.isa(), "kernels": report}) + "\n")
    out.flush()
    fn = None
    for line in sys.stdin:
        request = json.loads(line)
        if "calls" in request:
            answer = {"samples_ns": time_calls(fn, request["calls"], evict)}
        else:
            fn = None
            case = cases[request["case"]]
            answer = {"case": case.name, "kernel_isa": report.get(case.kernel, "missing")}
            if answer["kernel_isa"] == "missing":
                answer["status"] = "missing"
            else:
                try:
                    setup = case.build(case.rng())
                    fn = setup.ours(tn)
                    answer["mismatch"] = check(fn(), setup.numpy(), setup.tol)
                    answer["estimate_s"] = warm_up(fn, request["budget"], evict)
                    answer["status"] = "ok"
                except Exception as exc:  # a Python-level failure: report it, keep serving
                    fn = None
                    answer["status"] = "error"
                    answer["error"] = f"{type(exc).__name__}: {exc}"
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


class Worker:
    """One `--worker --isa LEVEL` subprocess, restarted after a crash."""

    def __init__(self, isa: str, cold: bool = False):
        self.isa = isa
        self.cold = cold
        self.proc: subprocess.Popen | None = None
        self.hello: dict | None = None
        self.broken: str | None = None  # why the worker cannot start, once it failed to
        self.case: Case | None = None  # the case prepared last

    def start(self):
        env = dict(os.environ, TENSOROPS_ISA=self.isa)
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            "--isa",
            self.isa,
            *(["--cold"] if self.cold else []),
        ]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1)
        line = self._read_line(CASE_TIMEOUT_S)
        if line is None:
            self.broken = f"worker did not start ({self._ended()})"
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            return
        self.hello = json.loads(line)

    def _read_line(self, timeout: float) -> str | None:
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                return None
        line = self.proc.stdout.readline()
        return line or None

    def _ended(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def prepare(self, case: Case, budget: float) -> dict:
        """Build, check and warm up `case` in the worker: its entry ("status" "ok" with
        "estimate_s", or why not)."""
        if self.proc is None or self.proc.poll() is not None:
            if not self.broken:
                self.start()
            if self.broken:
                return {"case": case.name, "status": "error", "error": self.broken}
        self.case = case
        return self._ask({"case": case.name, "budget": budget})

    def time_calls(self, n: int) -> dict:
        """{"samples_ns": [...]} for n calls of the prepared case, or a failed entry."""
        return self._ask({"calls": n})

    def _ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self._read_line(CASE_TIMEOUT_S)
        if line is not None:
            return json.loads(line)
        if self.proc.poll() is None:  # silent for too long: stop it, the next case restarts it
            self.proc.kill()
            self.proc.wait()
            status, reason = "timeout", f"no answer in {CASE_TIMEOUT_S:.0f} s"
        else:
            status, reason = "crashed", self._ended()
        self.proc = None
        return {
            "case": self.case.name,
            "status": status,
            "error": reason,
            "kernel_isa": (self.hello or {}).get("kernels", {}).get(self.case.kernel, "?"),
        }

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---------------------------------------------------------------------------------------
# Main process: run the cases, print the tables
# ---------------------------------------------------------------------------------------


def select_cases(only: list[str] | None) -> list[Case]:
    """The cases whose name contains one of the filters (case-insensitive; commas are
    literal, since shapes contain them)."""
    cases = all_cases()
    if not only:
        return cases
    filters = [f.lower() for f in only]
    return [c for c in cases if any(f in c.name.lower() for f in filters)]


def log(message: str):
    print(message, file=sys.stderr, flush=True)


class LocalContender:
    """memcpy or a peer, timed in this process."""

    def __init__(self, fn, evict):
        self.fn, self.evict = fn, evict

    def prepare(self, budget: float) -> float:
        return warm_up(self.fn, budget, self.evict)

    def time_calls(self, n: int) -> dict:
        return {"samples_ns": time_calls(self.fn, n, self.evict)}


def run_case(case: Case, args, peers, workers) -> dict:
    """Prepare every contender, then time them in rounds: each round times a block of calls
    of memcpy and of every contender in turn (in a new random order each round), and a
    contender's ratio is the median over the rounds of its block median / memcpy's block
    median of the same round.
    The memory speed of a shared machine drifts by tens of percent within minutes; rounds
    of a fraction of a second each put every contender under the same drift."""
    row = {
        "case": case.name,
        "family": case.family,
        "kernel": case.kernel,
        "notes": list(case.notes),
        "peers": {},
        "ours": {},
    }
    setup = case.build(case.rng())
    reference = setup.numpy()
    row["in_bytes"] = nbytes(setup.inputs)
    row["out_bytes"] = nbytes(reference)
    # A copy of n bytes reads n and writes n: the copy moving the same traffic as the
    # operation (read every input once, write every output once) is (in + out) / 2.
    row["copy_bytes"] = (row["in_bytes"] + row["out_bytes"]) // 2
    evict = cache_evictor() if args.cold else None
    memcpy = LocalContender(memcpy_fn(row["copy_bytes"]), evict)
    timed = [(None, memcpy, calls_per_round(memcpy.prepare(args.budget), args, evict))]  # (entry, contender, calls)
    for peer in peers:
        entry = {}
        try:
            made = peer_callable(peer, setup, reference)
            if made is None:
                entry["status"] = "n/a"
            else:
                call, result = made
                call()
                entry["mismatch"] = check(result(), reference, setup.tol)
                contender = LocalContender(call, evict)
                timed.append((entry, contender, calls_per_round(contender.prepare(args.budget), args, evict)))
                entry["status"] = "ok"
        except Exception as exc:  # a peer refusing the graph is a result, not a failure
            entry = {"status": "error", "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        row["peers"][peer] = entry
    for isa, worker in workers.items():
        entry = row["ours"][isa] = worker.prepare(case, args.budget)
        if entry.get("status") == "ok":
            timed.append((entry, worker, calls_per_round(entry.pop("estimate_s"), args, evict)))

    samples = {id(c): [] for _, c, _ in timed}
    round_medians = {id(c): [] for _, c, _ in timed}
    # A new order each round, not a rotation: a rotation keeps every contender behind the
    # same one, and what a contender leaves in the caches can slow the next one over a whole
    # block (in a C harness, the function timed right after an 8 MiB memcpy ran 6-50%
    # slower than the same function timed after others).
    shuffler = random.Random(0)
    for _ in range(args.rounds):
        order = list(timed)
        shuffler.shuffle(order)
        for entry, contender, n in order:
            if entry is not None and entry.get("status") != "ok":
                continue  # its worker died in an earlier round
            answer = contender.time_calls(n)
            if "samples_ns" not in answer:
                entry.clear()
                entry.update(answer)
                continue
            samples[id(contender)] += answer["samples_ns"]
            round_medians[id(contender)].append(float(np.median(answer["samples_ns"])))
    base = round_medians[id(memcpy)]
    row["memcpy_us"] = float(np.median(samples[id(memcpy)])) / 1e3
    row["memcpy_round_us"] = [t / 1e3 for t in base]
    for entry, contender, _ in timed[1:]:
        if entry.get("status") == "ok":
            mine = round_medians[id(contender)]
            entry["median_us"] = float(np.median(samples[id(contender)])) / 1e3
            entry["calls"] = len(samples[id(contender)])
            entry["ratio"] = float(np.median([t / b for t, b in zip(mine, base, strict=False)]))
    return row


def fmt_ratio(r: float) -> str:
    return f"{r:.0f}" if r >= 100 else f"{r:.1f}" if r >= 10 else f"{r:.2f}"


def fmt_us(t: float) -> str:
    return f"{t:.0f}" if t >= 100 else f"{t:.1f}"


def cell(entry: dict | None, memcpy_us: float | None, requested_isa: str | None = None) -> str:
    """A table cell: the ratio to memcpy (memcpy_us given) or the median in microseconds."""
    if entry is None:
        return ""
    status = entry.get("status")
    if status != "ok":
        return {"n/a": "n/a", "missing": "missing"}.get(status, status or "?")
    text = fmt_ratio(entry["ratio"]) if memcpy_us else fmt_us(entry["median_us"])
    if requested_isa and entry.get("kernel_isa") not in (None, requested_isa):
        text += f" ({entry['kernel_isa']})"
    if entry.get("mismatch"):
        text += " ✗"
    return text


def target_of(row: dict) -> tuple[float | None, str]:
    """(target ratio, why): at or below the best reference ratio of the issue, and at most
    the family cap for tensors of at least 1 MiB (memcpy bytes)."""
    candidates = []
    ref = REFERENCE.get(row["case"])
    if ref:
        candidates.append((min(ref), "best ref"))
    cap = FAMILY_CAPS.get(row["family"])
    if cap is not None and row["copy_bytes"] >= MIB:
        candidates.append((cap, "cap"))
    if not candidates:
        return None, ""
    return min(candidates)


def judged_isa(isas: list[str]) -> str | None:
    """The highest ISA level measured: the one the targets are judged on."""
    for level in ISA_LEVELS:
        if level in isas:
            return level
    return None


def render(rows: list[dict], args, peers, isas, hellos) -> str:
    lines = []
    add = lines.append
    add("# tensorops kernel benchmark")
    add("")
    add(
        f"- Machine: {cpu_model()}, {os.cpu_count()} logical CPUs; Python {platform.python_version()}, "
        f"{versions(peers)}."
    )
    if isas:
        levels = ", ".join(f"TENSOROPS_ISA={i} runs {hellos.get(i, {}).get('isa', '?')}" for i in isas)
        add(
            f"- tensorops_native: {levels}; each level in its own process, Python call included "
            "(argument checks, output allocation)."
        )
    add(
        "- One thread everywhere: torch.set_num_threads(1) and set_num_interop_threads(1); ONNX Runtime "
        "intra_op_num_threads=1, inter_op_num_threads=1, ORT_SEQUENTIAL; OMP/MKL/OpenBLAS threads 1; "
        f"every process pinned to CPU {args.cpu}."
    )
    add(
        "- Time: after a warm-up, every contender and memcpy are timed in turn, in "
        f"{args.rounds} rounds (in a new random order each round), "
        + (
            f"{args.repeat} timed calls per contender in all."
            if args.repeat
            else f"as many timed calls as fit in {args.budget:g} s per contender (7 to 20000 in all)."
        )
    )
    add(
        "- **memcpy**: np.copyto of a preallocated uint8 array into another, of (input bytes + output bytes) / 2: "
        "the copy that moves the same memory traffic as the operation must (read every input once, "
        "write every output once; inputs = the data tensors, not the small per-channel parameters), Python call "
        "included. **Ratios** are the median over the rounds of (contender's median / memcpy's median in that "
        "round), lower is better: the memory speed of a shared machine drifts within minutes, and the rounds "
        "put memcpy and the contenders under the same drift. Absolute times are medians over all calls."
    )
    if args.cold:
        add(
            "- **Cold caches (--cold)**: before every call (untimed) a read of "
            f"{3 * last_level_cache_bytes() >> 20} MiB (three times the last-level cache) evicts the case's data, "
            "for every contender and for memcpy alike, "
            f"so inputs are read from DRAM; at most {COLD_CALLS_MAX} timed calls each."
        )
    else:
        add(
            "- Warm caches: the same inputs on every call, so tensors that fit the last-level cache are read "
            "from it (memcpy included); `--cold` measures with data in DRAM."
        )
    add(
        "- ONNX Runtime: models built in memory (onnx.helper, opset 17), inputs and outputs bound once "
        "(run_with_iobinding: no per-call output copy); ours, NumPy and PyTorch allocate their outputs "
        "on every call."
    )
    add(
        "- Issue columns: the reference ratios quoted in the issue (Simd library, PyTorch, ONNX Runtime on "
        "their machine). **target**: at or below the best of those three, and at most 1.5x memcpy "
        "(normalize family, channel sum, eltwise, shuffle, tiled scale), 2x (softmax, LRN) or 1.2x (unary) "
        "when the tensor is at least 1 MiB. **met?** is judged on "
        f"ours at {judged_isa(isas) or '(not measured)'}."
    )
    add(
        "- Cell marks: `✗` result differs from the NumPy reference (see notes); `(avx2)` the kernel "
        "resolved to a lower level than requested; `missing` no kernel at that level; `crashed` the "
        "worker died in this case; `n/a` no such contender."
    )
    add("")

    ours_cols = [f"ours {i}" for i in isas]
    peer_cols = [PEER_TITLES[p] for p in peers]
    judge = judged_isa(isas)

    add("## Time / memcpy time (lower is better)")
    add("")
    head = ["case", "MiB", *ours_cols, *peer_cols, "Simd (issue)", "PyTorch (issue)", "ORT (issue)", "target", "met?"]
    add("| " + " | ".join(head) + " |")
    add("|" + "|".join([" --- "] + [" ---: "] * (len(head) - 1)) + "|")
    for row in rows:
        m = row["memcpy_us"]
        ref = REFERENCE.get(row["case"])
        target, why = target_of(row)
        met = ""
        if target is not None and judge:
            entry = row["ours"].get(judge, {})
            if entry.get("status") == "ok":
                ratio = entry["ratio"]
                met = "yes" if ratio <= target and not entry.get("mismatch") else "NO"
            else:
                met = "—"
        cells = [
            row["case"],
            f"{row['copy_bytes'] / MIB:.2f}",
            *(cell(row["ours"].get(i), m, i) for i in isas),
            *(cell(row["peers"].get(p), m) for p in peers),
            *((fmt_ratio(v) for v in ref) if ref else ("",) * 3),
            f"≤ {target:.2f} ({why})" if target is not None else "",
            met,
        ]
        add("| " + " | ".join(cells) + " |")
    add("")

    add("## Median time per call (µs)")
    add("")
    head = ["case", "memcpy", *ours_cols, *peer_cols]
    add("| " + " | ".join(head) + " |")
    add("|" + "|".join([" --- "] + [" ---: "] * (len(head) - 1)) + "|")
    for row in rows:
        cells = [
            row["case"],
            fmt_us(row["memcpy_us"]),
            *(cell(row["ours"].get(i), None, i) for i in isas),
            *(cell(row["peers"].get(p), None) for p in peers),
        ]
        add("| " + " | ".join(cells) + " |")
    add("")

    add("## Notes")
    add("")
    used = []
    for row in rows:
        for key in row["notes"]:
            if key not in used:
                used.append(key)
    for key in used:
        add(f"- {FOOTNOTES[key]}")
    add(
        "- Checks: every result is compared with the NumPy one (fp32: rtol 1e-3 or tighter; BF16: "
        "rtol 2e-2); a difference is reported, never fatal."
    )
    for row in rows:
        for who, entry in [
            *((f"ours {i}", e) for i, e in row["ours"].items()),
            *((PEER_TITLES[p], e) for p, e in row["peers"].items()),
        ]:
            if entry.get("mismatch"):
                add(f"- ✗ {row['case']}, {who}: {entry['mismatch']}.")
            elif entry.get("status") in ("error", "crashed", "timeout"):
                add(f"- {row['case']}, {who}: {entry['status']}: {entry.get('error', '')}.")
    return "\n".join(lines)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions(peers) -> str:
    parts = [f"NumPy {np.__version__}"]
    if "torch" in peers:
        torch = torch_module()
        parts.append(f"PyTorch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})")
    if "ort" in peers:
        import onnx
        import onnxruntime

        parts.append(f"ONNX Runtime {onnxruntime.__version__} (onnx {onnx.__version__})")
    return ", ".join(parts)


def parse_list(text: str, allowed, what: str) -> list[str]:
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    if items == ["none"]:
        return []
    for item in items:
        if item not in allowed:
            raise SystemExit(f"--{what}: unknown {item!r}; choose from {', '.join(allowed)} (comma-separated) or none")
    return items


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--only",
        action="append",
        metavar="TEXT",
        help="run the cases whose name contains TEXT (case-insensitive; repeat for several); see --list",
    )
    p.add_argument(
        "--isa",
        default=",".join(ISA_LEVELS),
        help="ISA levels of tensorops_native to measure, comma-separated (default: %(default)s)",
    )
    p.add_argument("--peers", default=",".join(PEERS), help="peers to measure (default: %(default)s, or none)")
    p.add_argument("--peers-only", action="store_true", help="do not measure tensorops_native")
    p.add_argument("--repeat", type=int, help="timed calls per contender (default: adaptive, see --budget)")
    p.add_argument(
        "--rounds",
        type=int,
        default=20,
        help="rounds that alternate the contenders; each contender's timed calls are spread evenly over them "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=0.2,
        help="seconds of timed calls per contender when --repeat is not given (default: %(default)s)",
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="evict the caches before every timed call (inputs and outputs in DRAM), for all contenders and memcpy",
    )
    p.add_argument(
        "--cpu",
        type=int,
        default=min(os.sched_getaffinity(0)),
        help="the CPU that every contender runs on (default: the first one allowed, %(default)s)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the raw results as JSON")
    p.add_argument("--list", action="store_true", help="print the case names and exit")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.repeat is not None and args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.worker:
        return worker_main(args)
    if args.list:
        print("\n".join(c.name for c in all_cases()))
        return 0
    cases = select_cases(args.only)
    if not cases:
        p.error(f"--only {args.only!r} matches no case (see --list)")
    isas = [] if args.peers_only else parse_list(args.isa, ISA_LEVELS, "isa")
    peers = parse_list(args.peers, PEERS, "peers")

    # Contenders take turns, never run at once: on one CPU (workers inherit the affinity)
    # they all see the same core and caches. Left to the scheduler, the workers' times from
    # DRAM were biased against the main process's (fp32 layer norm: ours 1.7-2.1x memcpy
    # against PyTorch's 1.3-1.9x; pinned, the two within 10% in five runs).
    try:
        os.sched_setaffinity(0, {args.cpu})
    except OSError as exc:
        p.error(f"--cpu {args.cpu}: {exc.strerror}")
    started = time.perf_counter()
    workers = {isa: Worker(isa, args.cold) for isa in isas}
    hellos = {}
    rows = []
    try:
        for isa, worker in workers.items():
            worker.start()
            hellos[isa] = worker.hello or {"isa": worker.broken}
        for i, case in enumerate(cases, 1):
            row = run_case(case, args, peers, workers)
            rows.append(row)
            summary = ", ".join(
                f"{k} {cell(e, row['memcpy_us'])}" for k, e in [*row["ours"].items(), *row["peers"].items()]
            )
            log(f"[{i}/{len(cases)}] {case.name}: memcpy {fmt_us(row['memcpy_us'])} us; x memcpy: {summary}")
    finally:
        for worker in workers.values():
            worker.close()
    log(f"done in {time.perf_counter() - started:.0f} s")
    print(render(rows, args, peers, isas, hellos))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cases": rows, "isa": hellos, "args": vars(args)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

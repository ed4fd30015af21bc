"""Direct C calls of every kernel (through tensorops_native._native), described as data so
that the same cases run with canary-guarded memory (test_c_memory.py) and with memory fenced
by inaccessible pages (test_guard_pages.py, via guard_page_probe.py).

A Case names the kernel, its input arrays, its outputs (shape, dtype), the argument list in
C order, the documented scratch size (None: no buf argument), and how to get the
expected outputs through the Python API, which the C results must equal bit for bit.
Argument tokens: "in:<name>", "out:<name>", "buf", "list:<name>,<name>..." (a pointer
array), or a plain value (int; None for NULL).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import reference as ref
import tensorops_native as tn
from tn_testing import FMT_CODE, scratch_floats

FORMATS = ("nchw", "nhwc")
NORM_SHAPES = [(1, 1, 1), (3, 5, 3), (16, 16, 1), (17, 49, 2), (67, 5, 1), (8, 3136, 1), (33, 7, 1)]


@dataclass
class Case:
    kernel: str
    label: str
    inputs: dict
    outputs: dict
    args: list
    api: Callable[[], dict]
    scratch: int | None = None


def materialize(case: Case, make, buf=None):
    """The C argument list of a case: make(values) -> array placed in the memory under test
    (for outputs, values is the poisoned initial content); buf: the scratch array or None
    (NULL). Returns (args, inputs, outputs) with the placed arrays."""
    ins = {k: make(v) for k, v in case.inputs.items()}
    outs = {}
    for k, (shape, dtype) in case.outputs.items():
        poison = np.empty(shape, dtype)
        poison.view(np.uint32 if poison.dtype.itemsize == 4 else np.uint16)[...] = (
            0x7FC0DEAD if poison.dtype.itemsize == 4 else 0xFFFF
        )
        outs[k] = make(poison)
    args = []
    for a in case.args:
        if isinstance(a, str) and a.startswith("in:"):
            args.append(ins[a[3:]])
        elif isinstance(a, str) and a.startswith("out:"):
            args.append(outs[a[4:]])
        elif isinstance(a, str) and a.startswith("list:"):
            args.append([ins[n] for n in a[5:].split(",")])
        elif a == "buf":
            args.append(buf)
        else:
            args.append(a)
    return args, ins, outs


def _api_shape(batch, channels, spatial, fmt):
    return (batch, channels, spatial) if fmt == "nchw" else (batch, spatial, channels)


def normalize_cases(rng):
    out = []
    for kernel in (
        "SynetNormalizeLayerForward",
        "SynetNormalizeLayerForwardV2",
        "SynetNormalizeLayerForwardV3",
        "SynetNormalizeLayerForwardV4",
        "SynetNormalizeLayerForward16bV2",
    ):
        for c, s, b in NORM_SHAPES:
            for fmt in FORMATS:
                for across in (False, True) if kernel == "SynetNormalizeLayerForward" else (False,):
                    shape = _api_shape(b, c, s, fmt)
                    x = rng.normal(0.3, 1.0, shape).astype(np.float32)
                    bf16 = kernel.endswith("16bV2")
                    if bf16:
                        x = x.astype(ref.BF16).view(np.uint16)
                    scale = rng.uniform(-1.5, 1.5, c).astype(np.float32)
                    shift = rng.uniform(-1, 1, c).astype(np.float32)
                    eps = np.float32([1e-10 if kernel == "SynetNormalizeLayerForward" else 1e-5])
                    inputs = {"x": x, "scale": scale, "eps": eps}
                    fcode = FMT_CODE[fmt]
                    if kernel == "SynetNormalizeLayerForward":
                        args = ["in:x", b, c, s, "in:scale", "in:eps", int(across), fcode, "buf", "out:y"]

                        def api(x=x, scale=scale, eps=eps, across=across, fmt=fmt):
                            return {
                                "y": tn.normalize_l2(x, scale, eps=float(eps[0]), across_spatial=across, format=fmt)
                            }
                    else:
                        inputs["shift"] = shift
                        args = ["in:x", b, c, s, "in:scale", "in:shift", "in:eps", fcode, "buf", "out:y"]
                        fn = {
                            "V2": tn.layer_norm_channels,
                            "V3": tn.layer_norm_spatial,
                            "V4": tn.channel_norm,
                            "6bV2": tn.layer_norm_channels,
                        }[kernel[-2:] if not bf16 else "6bV2"]

                        def api(x=x, scale=scale, shift=shift, eps=eps, fmt=fmt, fn=fn, bf16=bf16):
                            return {
                                "y": fn(
                                    x if not bf16 else x.view(ref.BF16), scale, shift, eps=float(eps[0]), format=fmt
                                ).view(x.dtype)
                            }

                    label = f"c{c}-s{s}-b{b}-{fmt}" + ("-across" if across else "")
                    out.append(
                        Case(
                            kernel,
                            label,
                            inputs,
                            {"y": (shape, x.dtype)},
                            args,
                            api,
                            scratch_floats(kernel, fmt, c, s, across),
                        )
                    )
    return out


def other_cases(rng):
    out = []
    # channel sum: one batch item per call
    for c, s in [(1, 1), (3, 5), (16, 16), (17, 49), (67, 3), (8, 3136)]:
        for fmt in FORMATS:
            x = rng.normal(size=_api_shape(1, c, s, fmt)).astype(np.float32).astype(ref.BF16).view(np.uint16)
            out.append(
                Case(
                    "SynetChannelSum16b",
                    f"c{c}-s{s}-{fmt}",
                    {"x": x},
                    {"sum": ((c,), np.float32)},
                    ["in:x", c, s, FMT_CODE[fmt], "out:sum"],
                    lambda x=x, fmt=fmt: {"sum": tn.channel_sum(x, format=fmt)[0]},
                )
            )
    # eltwise
    for op in range(4):
        for count in (2, 3, 5):
            for size in (1, 7, 16, 17, 67, 3139):
                srcs = {f"s{i}": rng.normal(size=size).astype(np.float32) for i in range(count)}
                inputs = dict(srcs)
                if op == 1:
                    inputs["w"] = rng.uniform(-2, 2, count).astype(np.float32)
                names = ",".join(srcs)
                args = [f"list:{names}", "in:w" if op == 1 else None, count, size, op, "out:y"]

                def api(srcs=srcs, op=op, inputs=inputs):
                    return {"y": tn.eltwise(list(srcs.values()), op, weights=inputs.get("w"))}

                out.append(
                    Case(
                        "SynetEltwiseLayerForward",
                        f"op{op}-n{count}-size{size}",
                        inputs,
                        {"y": ((size,), np.float32)},
                        args,
                        api,
                    )
                )
    # LRN, one batch item per call
    for c, s in [(1, 1), (3, 5), (8, 16), (17, 7), (67, 3)]:
        for half in (0, 2, 5):
            for fmt in FORMATS:
                x = rng.normal(size=_api_shape(1, c, s, fmt)).astype(np.float32)
                k = np.float32([1.0, 0.2, -0.75])
                out.append(
                    Case(
                        "SynetLrnLayerCrossChannels",
                        f"c{c}-s{s}-half{half}-{fmt}",
                        {"x": x, "k": k},
                        {"y": (x.shape, np.float32)},
                        ["in:x", half, c, s, "in:k", "out:y", FMT_CODE[fmt]],
                        lambda x=x, k=k, half=half, fmt=fmt: {"y": tn.lrn_cross_channels(x, half, k, format=fmt)},
                    )
                )
    # shuffle
    for type_, c0, c1 in [(0, 2, 2), (0, 2, 4), (0, 16, 18), (0, 34, 32), (1, 2, 2), (1, 4, 6), (1, 32, 34), (1, 0, 6)]:
        for s in (1, 5, 17):
            for fmt in FORMATS:
                half = (c0 + c1) // 2
                ci0, ci1 = (c0, c1) if type_ == 0 else (half, half)
                x0 = rng.normal(size=_api_shape(1, ci0, s, fmt)).astype(np.float32)
                x1 = rng.normal(size=_api_shape(1, ci1, s, fmt)).astype(np.float32)
                o0, o1 = (half, half) if type_ == 0 else (c0, c1)

                def api(x0=x0, x1=x1, type_=type_, fmt=fmt, ch=(c0, c1)):
                    y0, y1 = tn.shuffle(x0, x1, type=type_, format=fmt, channels=ch if type_ == 1 else None)
                    return {"y0": y0, "y1": y1}

                out.append(
                    Case(
                        "SynetShuffleLayerForward",
                        f"type{type_}-{c0}+{c1}-s{s}-{fmt}",
                        {"x0": x0, "x1": x1},
                        {"y0": (_api_shape(1, o0, s, fmt), np.float32), "y1": (_api_shape(1, o1, s, fmt), np.float32)},
                        ["in:x0", "in:x1", c0, c1, s, "out:y0", "out:y1", FMT_CODE[fmt], type_],
                        api,
                    )
                )
    # softmax
    for outer, count, inner in [(1, 1, 1), (3, 7, 1), (2, 16, 1), (1, 17, 5), (2, 33, 16), (1, 67, 3), (1, 3136, 1)]:
        shape = (outer, count, inner)
        x = (rng.normal(size=shape) * 4).astype(np.float32)
        out.append(
            Case(
                "SynetSoftmax32f",
                f"{outer}x{count}x{inner}",
                {"x": x},
                {"y": (shape, np.float32)},
                ["in:x", outer, count, inner, "out:y"],
                lambda x=x: {"y": tn.softmax(x, axis=1)},
            )
        )
        xb = x.astype(ref.BF16).view(np.uint16)
        out.append(
            Case(
                "SynetSoftmax16b",
                f"{outer}x{count}x{inner}",
                {"x": xb},
                {"y": (shape, np.uint16)},
                ["in:x", outer, count, inner, "out:y"],
                lambda xb=xb: {"y": tn.softmax(xb.view(ref.BF16), axis=1).view(np.uint16)},
            )
        )
    # tiled scale, one batch item per call
    for c, h, w in [(1, 1, 1), (3, 5, 7), (16, 4, 4), (17, 3, 5), (67, 2, 3)]:
        for fmt in FORMATS:
            shape = (1, c, h, w) if fmt == "nchw" else (1, h, w, c)
            x = rng.normal(size=shape).astype(np.float32)
            ver = rng.normal(size=(c, w) if fmt == "nchw" else (w, c)).astype(np.float32)
            hor = rng.normal(size=(c, h) if fmt == "nchw" else (h, c)).astype(np.float32)
            out.append(
                Case(
                    "SynetTiledScale2D32f",
                    f"c{c}-h{h}-w{w}-{fmt}",
                    {"x": x, "ver": ver, "hor": hor},
                    {"y": (shape, np.float32)},
                    ["in:x", c, h, w, FMT_CODE[fmt], "in:ver", "in:hor", "out:y"],
                    lambda x=x, ver=ver, hor=hor, fmt=fmt: {"y": tn.tiled_scale_2d(x, ver, hor, format=fmt)},
                )
            )
    # unary
    for op in range(17):
        for size in (1, 17, 67):
            x = (rng.normal(size=size) * 3).astype(np.float32)
            out.append(
                Case(
                    "SynetUnaryOperation32f",
                    f"op{op}-size{size}",
                    {"x": x},
                    {"y": ((size,), np.float32)},
                    ["in:x", size, op, "out:y"],
                    lambda x=x, op=op: {"y": tn.unary(x, op)},
                )
            )
    return out


def all_cases():
    rng = np.random.default_rng(12345)
    return normalize_cases(rng) + other_cases(rng)


KERNELS = (
    "SynetNormalizeLayerForward",
    "SynetNormalizeLayerForwardV2",
    "SynetNormalizeLayerForwardV3",
    "SynetNormalizeLayerForwardV4",
    "SynetNormalizeLayerForward16bV2",
    "SynetChannelSum16b",
    "SynetEltwiseLayerForward",
    "SynetLrnLayerCrossChannels",
    "SynetShuffleLayerForward",
    "SynetSoftmax32f",
    "SynetSoftmax16b",
    "SynetTiledScale2D32f",
    "SynetUnaryOperation32f",
)

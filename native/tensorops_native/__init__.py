"""tensorops_native: fast CPU tensor kernels (Simd Synet semantics) for NumPy arrays.

Every function validates its arguments (TypeError / ValueError naming the argument),
returns new arrays and never modifies its inputs. Kernels are C with scalar, AVX2 and
AVX-512 variants chosen once at import from the CPU; TENSOROPS_ISA=scalar|avx2|avx512
caps the level.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from ._info import check_isa_environment as _check_isa_environment

_check_isa_environment()

from ._checks import ArgumentError, ArgumentTypeError  # noqa: E402
from ._info import cpu_features, isa, kernels  # noqa: E402
from ._normalize import ACTIVATIONS, normalize  # noqa: E402
from ._ops import (  # noqa: E402
    ELTWISE_OPS,
    UNARY_OPS,
    channel_norm,
    channel_sum,
    eltwise,
    layer_norm_channels,
    layer_norm_spatial,
    lrn_cross_channels,
    normalize_l2,
    shuffle,
    softmax,
    tiled_scale_2d,
    unary,
)
from ._qip import QuantizedInnerProduct, quantized_inner_product  # noqa: E402

try:
    __version__ = _version("tensorops")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

OPERATIONS = (
    "normalize_l2",
    "layer_norm_channels",
    "layer_norm_spatial",
    "channel_norm",
    "channel_sum",
    "eltwise",
    "lrn_cross_channels",
    "shuffle",
    "softmax",
    "tiled_scale_2d",
    "unary",
    "quantized_inner_product",
    "normalize",
)


def info() -> dict:
    """Version, active ISA level, CPU features, the ISA of every kernel, limits and the
    list of operations."""
    return {
        "version": __version__,
        "isa": isa(),
        "cpu_features": cpu_features(),
        "kernels": kernels(),
        "limits": {
            "max_ndim": 32,
            "unary_ops": sorted(UNARY_OPS, key=UNARY_OPS.get),
            "eltwise_ops": sorted(ELTWISE_OPS, key=ELTWISE_OPS.get),
            "activations": list(ACTIVATIONS),
        },
        "operations": list(OPERATIONS),
    }


__all__ = [
    "ACTIVATIONS",
    "ArgumentError",
    "ArgumentTypeError",
    "OPERATIONS",
    "QuantizedInnerProduct",
    "channel_norm",
    "channel_sum",
    "cpu_features",
    "eltwise",
    "info",
    "isa",
    "kernels",
    "layer_norm_channels",
    "layer_norm_spatial",
    "lrn_cross_channels",
    "normalize",
    "normalize_l2",
    "quantized_inner_product",
    "shuffle",
    "softmax",
    "tiled_scale_2d",
    "unary",
]

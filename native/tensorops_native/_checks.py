"""Argument validation shared by every operation.

Nothing reaches C without passing through here. Each failure raises TypeError (wrong kind
or dtype) or ValueError (wrong value or shape) whose message starts with the argument's
name, so callers (and the gRPC server) can tell which field was wrong.

Tensors that are not C-contiguous, or not in native byte order, are copied once into a
contiguous native array; inputs are never modified.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
U16 = np.dtype(np.uint16)
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_ROUNDS_TO_INF = 2.0**128 - 2.0**103  # the smallest magnitude that float32 rounds to inf
FORMATS = {"nchw": 0, "nhwc": 1}
FORMAT_NAMES = {v: k for k, v in FORMATS.items()}


class ArgumentError(ValueError):
    """A bad value; ``argument`` names the offending argument."""

    def __init__(self, argument: str, message: str):
        super().__init__(f"{argument}: {message}")
        self.argument = argument


class ArgumentTypeError(TypeError):
    """A bad type or dtype; ``argument`` names the offending argument."""

    def __init__(self, argument: str, message: str):
        super().__init__(f"{argument}: {message}")
        self.argument = argument


def _as_array(value, name: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    try:
        arr = np.asarray(value)
    except Exception as exc:  # ragged lists and similar
        raise ArgumentTypeError(name, f"expected an array, got {type(value).__name__} ({exc})") from None
    if arr.dtype == object:
        raise ArgumentTypeError(name, f"expected a numeric array, got {type(value).__name__}")
    return arr


def _native_contiguous(arr: np.ndarray) -> np.ndarray:
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)  # (not for 0-d arrays: it would make them 1-d)
    return arr


def f32_tensor(value, name: str) -> np.ndarray:
    """A float32 tensor, C-contiguous, native byte order."""
    if type(value) is np.ndarray and value.dtype is F32 and value.flags.c_contiguous:
        return value  # the common case, checked cheaply
    arr = _as_array(value, name)
    if arr.dtype.kind != "f" or arr.dtype.itemsize != 4:
        raise ArgumentTypeError(name, f"expected a float32 array, got dtype {arr.dtype}")
    return _native_contiguous(arr)


def bf16_tensor(value, name: str) -> np.ndarray:
    """A BF16 tensor (ml_dtypes.bfloat16, or uint16 holding BF16 bits), contiguous."""
    if type(value) is np.ndarray and (value.dtype is BF16 or value.dtype is U16) and value.flags.c_contiguous:
        return value
    arr = _as_array(value, name)
    if arr.dtype != BF16 and not (arr.dtype.kind == "u" and arr.dtype.itemsize == 2):
        raise ArgumentTypeError(
            name, f"expected a bfloat16 array (ml_dtypes.bfloat16 or uint16 bits), got dtype {arr.dtype}"
        )
    return _native_contiguous(arr)


def is_bf16(value) -> bool:
    dtype = getattr(value, "dtype", None)
    return dtype is not None and (dtype == BF16 or (dtype.kind == "u" and dtype.itemsize == 2))


def f32_params(
    value, name: str, shape: tuple[int, ...], *, other_format: tuple[int, tuple[int, ...]] | None = None
) -> np.ndarray:
    """Per-channel (or similar) float parameters: any real array-like of exactly `shape`,
    converted to contiguous float32. `other_format`, for parameters whose shape follows
    the image format: (the format x is read in, the shape the other format would expect),
    so that a shape only the other format explains is reported as a format mistake."""
    if type(value) is np.ndarray and value.dtype is F32 and value.shape == shape and value.flags.c_contiguous:
        return value
    arr = _as_array(value, name)
    if arr.dtype.kind not in "fiu":
        raise ArgumentTypeError(name, f"expected real numbers, got dtype {arr.dtype}")
    if tuple(arr.shape) != tuple(shape):
        expected = shape[0] if len(shape) == 1 else shape
        message = f"expected shape {tuple(shape)} ({expected} values), got shape {tuple(arr.shape)}"
        if other_format is not None and tuple(arr.shape) == tuple(other_format[1]):
            message += format_mistake(other_format[0])
        raise ArgumentError(name, message)
    return np.ascontiguousarray(arr, dtype=np.float32)


def format_mistake(fmt: int) -> str:
    """What to add to an error that the other image format would explain."""
    given, other = FORMAT_NAMES[fmt], FORMAT_NAMES[1 - fmt]
    default = " (the default)" if given == "nchw" else ""
    return (
        f", the shape for format='{other}': x is read as format='{given}'{default}; "
        f"if x is {other.upper()}, pass format='{other}'"
    )


def finite_float(value, name: str, *, minimum: float | None = None) -> float:
    """A real number that is finite as a float32 (and >= minimum)."""
    if type(value) is not float:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise ArgumentTypeError(name, f"expected a real number, got {type(value).__name__}")
        value = float(value)
    if not math.isfinite(value):
        raise ArgumentError(name, f"must be finite, got {value}")
    if minimum is not None and value < minimum:
        raise ArgumentError(name, f"must be >= {minimum}, got {value}")
    if abs(value) > FLOAT32_MAX:
        raise ArgumentError(name, f"must fit in float32 (|value| <= {FLOAT32_MAX:.6g}), got {value}")
    return value


def integer(value, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    if type(value) is int:  # the usual case: skips the ABC check, slow from cold caches
        result = value
    elif isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(name, f"expected an integer, got {type(value).__name__}")
    else:
        result = int(value)
    if minimum is not None and result < minimum:
        raise ArgumentError(name, f"must be >= {minimum}, got {result}")
    if maximum is not None and result > maximum:
        raise ArgumentError(name, f"must be <= {maximum}, got {result}")
    return result


def boolean(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(name, f"expected a bool, got {type(value).__name__}")
    return bool(value)


def choice(value, name: str, names: dict[str, int]) -> int:
    """An enumeration given by (case-insensitive) name or by its integer value."""
    if type(value) is str:
        key = value.lower()
        if key in names:
            return names[key]
    elif (
        isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)) and int(value) in names.values()
    ):
        return int(value)
    allowed = ", ".join(f"'{k}' ({v})" for k, v in names.items())
    raise ArgumentError(name, f"expected one of {allowed}, got {value!r}")


def tensor_format(value) -> int:
    return choice(value, "format", FORMATS)


def image_dims(arr: np.ndarray, name: str, fmt: int) -> tuple[int, int, int]:
    """(batch, channels, spatial) of an image tensor: NCHW is (batch, channels, *spatial),
    NHWC is (batch, *spatial, channels)."""
    if arr.ndim < 2:
        layout = "(batch, channels, *spatial)" if fmt == 0 else "(batch, *spatial, channels)"
        raise ArgumentError(
            name, f"expected at least 2 dimensions {layout} for format '{FORMAT_NAMES[fmt]}', got shape {arr.shape}"
        )
    batch = arr.shape[0]
    if fmt == 0:
        channels, spatial_dims = arr.shape[1], arr.shape[2:]
    else:
        channels, spatial_dims = arr.shape[-1], arr.shape[1:-1]
    return batch, channels, math.prod(spatial_dims)


def axis_index(axis, ndim: int, name: str = "axis") -> int:
    value = integer(axis, name)
    if not -ndim <= value < ndim:
        raise ArgumentError(name, f"out of range for an array of {ndim} dimensions, got {value}")
    return value % ndim


def sequence(value, name: str) -> list:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ArgumentTypeError(name, f"expected a sequence, got {type(value).__name__}")
    return list(value)


def output(
    out, shape: tuple[int, ...], dtype: np.dtype, inputs: Iterable[np.ndarray] = (), name: str = "out"
) -> np.ndarray:
    """The array a result is written into: a new one, or `out`, which must be exactly the
    result's (shape and dtype, C-contiguous, aligned, writeable, native byte order) and
    must not overlap an input (the kernels read inputs while they write). `name`: the
    argument in errors (`out[0]` for one of a pair)."""
    if out is None:
        return np.empty(shape, dtype)
    if type(out) is not np.ndarray:
        raise ArgumentTypeError(name, f"expected a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != dtype:
        raise ArgumentTypeError(name, f"expected dtype {dtype} (the result's), got {out.dtype}")
    if out.shape != tuple(shape):
        raise ArgumentError(name, f"expected shape {tuple(shape)} (the result's), got {out.shape}")
    if not (out.flags.c_contiguous and out.flags.aligned and out.flags.writeable and out.dtype.isnative):
        raise ArgumentError(name, "expected a writeable, aligned, C-contiguous array in native byte order")
    for arr in inputs:
        if isinstance(arr, np.ndarray) and np.may_share_memory(out, arr):
            raise ArgumentError(name, "must not overlap an input")
    return out


def output_pair(out, shapes, dtype: np.dtype, inputs: Iterable[np.ndarray] = ()) -> tuple[np.ndarray, np.ndarray]:
    """The two arrays a pair of results is written into: new ones, or `out`, a tuple of
    two arrays each checked as output() does (`out[0]`, `out[1]`), not overlapping."""
    if out is None:
        return np.empty(shapes[0], dtype), np.empty(shapes[1], dtype)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ArgumentTypeError(
            "out",
            f"expected a pair of numpy.ndarray (y0, y1), got {type(out).__name__}"
            + (f" of {len(out)}" if isinstance(out, (tuple, list)) else ""),
        )
    inputs = tuple(inputs)
    first = output(out[0], shapes[0], dtype, inputs, "out[0]")
    return first, output(out[1], shapes[1], dtype, inputs + (first,), "out[1]")

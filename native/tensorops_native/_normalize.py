"""Generic normalization: TensorRT INormalization and DirectML MEAN_VARIANCE_NORMALIZATION1.

normalize() validates its arguments, then reduces any request to one of two C kernels:

- rows (TnNormalizationRows): x seen as (outer, segments, segment_size), each row of
  segments * segment_size contiguous values normalized over itself. Layer norm over trailing
  axes, instance norm over the spatial axes of each (n, c), and group norm (the channels of a
  group and their spatial axes form one row; the parameters change per channel, i.e. per
  segment) are all rows;
- columns (TnNormalizationColumns): x seen as (outer, count, inner), normalized over count
  for each (outer, inner): a reduced block followed by kept axes, e.g. NCHW over channels.

Canonical form: with num_groups > 1, axis 1 is split into (groups, channels / groups) and the
second part joins the reduced axes; axes of size 1 are dropped; neighbouring axes that are
both reduced or both kept merge. Kept-reduced gives rows, reduced-kept or
kept-reduced-kept gives columns; any other pattern (reduced axes separated by kept ones) is
transposed with one copy so that the reduced axes come last (rows), and transposed back.

Scale and bias travel as fp32 arrays described by (period, outer stride, stride, step): the
value of an element is data[(o % period) * outer_stride + j * stride + s * step], o the row
(outer item), j the segment (reduced index for columns), s the position in a contiguous run.
The broadcast strides of the parameter as given (after NumPy broadcasting to x) are used
directly whenever they fit that form: per-position vectors (layer norm), per-channel values
(instance and group norm), per-(n, c) values, scalars. A parameter whose broadcast pattern
does not fit (for instance one that varies along an outer axis but not along a later one) is
expanded into an fp32 array over the axes from its first varying one on: correct for any
pattern, at the cost of that copy. The same expansion replaces very short segments (fewer
than 16 values) when it is small.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import _checks as ck
from ._native import ffi, lib

F16 = np.dtype(np.float16)
MAX_NDIM = 8
_TYPE_CODES = {"float32": 0, "bfloat16": 7, "float16": 8}
_SHORT_SEGMENT = 16  # segments shorter than this are worth expanding the parameters for
_SMALL_EXPANSION = 1 << 16  # ... when the expanded parameter has at most this many values

# DirectML's fused activations (the wire's Activation enum numbers them in this order from
# 1; the value is TnActivationType). Each parameter has DirectML's typical default, or None
# where DirectML documents none (then it is required).
ACTIVATIONS = {
    "identity": (0, ()),
    "linear": (1, (("alpha", None), ("beta", None))),
    "relu": (2, ()),
    "leaky_relu": (3, (("alpha", 0.01),)),
    "parametric_softplus": (4, (("alpha", None), ("beta", None))),
    "elu": (5, (("alpha", 1.0),)),
    "celu": (6, (("alpha", 1.0),)),
    "scaled_elu": (7, (("alpha", 1.6732), ("gamma", 1.0507))),
    "sigmoid": (8, ()),
    "hard_sigmoid": (9, (("alpha", 0.2), ("beta", 0.5))),
    "tanh": (10, ()),
    "scaled_tanh": (11, (("alpha", 1.0), ("beta", 0.5))),
    "softplus": (12, (("steepness", 1.0),)),
    "softsign": (13, ()),
    "thresholded_relu": (14, (("alpha", 1.0),)),
    "shrink": (15, (("bias", 0.0), ("threshold", 0.5))),
    "gelu": (16, ()),
}


class ArgumentTypeValueError(ck.ArgumentTypeError, ValueError):
    """A value of the wrong type or dtype: a TypeError (ArgumentTypeError) like the other
    operations' type errors, and a ValueError, as every bad input of normalize() is."""


def _typed(check, value, name, **kwargs):
    """A _checks validator whose type errors are also ValueErrors."""
    try:
        return check(value, name, **kwargs)
    except ck.ArgumentTypeError as exc:
        raise ArgumentTypeValueError(exc.argument, str(exc).split(": ", 1)[-1]) from None


# ---------------------------------------------------------------------------------------
# Arguments


def _input(x):
    if ck.is_bf16(x):
        x = _typed(ck.bf16_tensor, x, "x")
        code = _TYPE_CODES["bfloat16"]
    else:
        x = _typed(ck._as_array, x, "x")
        if x.dtype == F16:
            code = _TYPE_CODES["float16"]
        elif x.dtype.kind == "f" and x.dtype.itemsize == 4:
            code = _TYPE_CODES["float32"]
        else:
            raise ArgumentTypeValueError(
                "x",
                f"expected float32, float16 or bfloat16 (ml_dtypes.bfloat16, or uint16 "
                f"holding BF16 bits), got dtype {x.dtype}",
            )
        x = ck._native_contiguous(x)
    if not 1 <= x.ndim <= MAX_NDIM:
        raise ck.ArgumentError("x", f"expected 1 to {MAX_NDIM} dimensions, got {x.ndim} (shape {x.shape})")
    return x, code


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def reduced_axes(axes, ndim: int) -> tuple[int, ...]:
    """The sorted axis indices of `axes`: an iterable of indices (negative allowed) or a
    TensorRT bitmask int (bit i = axis i)."""
    if axes is None:
        raise ck.ArgumentError("axes", "required: a list of axis indices or a bitmask int")
    if _is_int(axes):
        mask = int(axes)
        if mask < 0:
            raise ck.ArgumentError("axes", f"a bitmask must be non-negative, got {mask}")
        if mask >> ndim:
            raise ck.ArgumentError("axes", f"bitmask {mask:#x} has bits beyond the {ndim} dimensions of x")
        found = tuple(i for i in range(ndim) if mask >> i & 1)
    else:
        if isinstance(axes, (str, bytes, bool, np.bool_, float)) or not hasattr(axes, "__iter__"):
            raise ck.ArgumentError("axes", f"expected a list of axis indices or a bitmask int, got {axes!r}")
        found = []
        for a in list(axes):
            if not _is_int(a):
                raise ck.ArgumentError("axes", f"axis indices must be integers, got {a!r}")
            if not -ndim <= int(a) < ndim:
                raise ck.ArgumentError("axes", f"axis {int(a)} is out of range for {ndim} dimensions")
            i = int(a) % ndim
            if i in found:
                raise ck.ArgumentError("axes", f"axis {int(a)} is repeated")
            found.append(i)
        found = tuple(sorted(found))
    if not found:
        raise ck.ArgumentError("axes", "the set of axes is empty")
    return found


def activation_spec(activation) -> tuple[int, tuple[float, float]]:
    """(TnActivationType, two fp32 parameters) of None, a name, or (name, *parameters)."""
    if activation is None:
        return 0, (0.0, 0.0)
    if isinstance(activation, str):
        name, given = activation, []
    elif isinstance(activation, (tuple, list)) and activation and isinstance(activation[0], str):
        name, given = activation[0], list(activation[1:])
    else:
        raise ck.ArgumentError("activation", f"expected None, a name or (name, *parameters), got {activation!r}")
    key = name.lower()
    if key not in ACTIVATIONS:
        raise ck.ArgumentError("activation", f"unknown activation {name!r}; expected one of {', '.join(ACTIVATIONS)}")
    code, spec = ACTIVATIONS[key]
    required = sum(1 for _, default in spec if default is None)
    if not required <= len(given) <= len(spec):
        names = ", ".join(p for p, _ in spec) or "none"
        count = f"{required} to {len(spec)}" if required != len(spec) else f"{len(spec)}"
        raise ck.ArgumentError("activation", f"{key!r} takes {count} parameters ({names}), got {len(given)}")
    values = []
    for i, (_, default) in enumerate(spec):
        v = _typed(ck.finite_float, given[i], "activation") if i < len(given) else default
        values.append(float(v))
    if key == "softplus" and values[0] < 1.0:
        raise ck.ArgumentError("activation", f"softplus steepness must be >= 1, got {values[0]}")
    if key == "celu" and values[0] == 0.0:
        raise ck.ArgumentError("activation", "celu alpha must be nonzero")
    values += [0.0] * (2 - len(values))
    return code, (values[0], values[1])


def _compute_dtype(value) -> None:
    if value is None:
        return
    try:
        name = np.dtype(value).name if not isinstance(value, str) else value.lower()
    except TypeError:
        name = repr(value)
    if name not in ("float32", "fp32"):
        raise ck.ArgumentError("compute_dtype", f"only float32 computation is available (the default), got {value!r}")


def _parameter(value, name: str, shape: tuple[int, ...], groups: int) -> np.ndarray | None:
    """A compact fp32 array with x's rank whose dimensions are 1 or x's (per-group values
    expanded to their channels)."""
    if value is None:
        return None
    if (
        type(value) is np.ndarray
        and value.dtype is ck.F32
        and value.flags.c_contiguous
        and value.ndim == len(shape)
        and all(p == 1 or p == n for p, n in zip(value.shape, shape, strict=True))
    ):
        return value  # the common case, checked cheaply
    if ck.is_bf16(value):
        arr = _typed(ck._as_array, value, name)
        arr = (arr.view(ck.BF16) if arr.dtype == ck.U16 else arr).astype(np.float32)
    else:
        arr = _typed(ck._as_array, value, name)
        if arr.dtype.kind not in "fiu":
            raise ArgumentTypeValueError(
                name, f"expected float32, float16, bfloat16 or real numbers, got dtype {arr.dtype}"
            )
    ndim = len(shape)
    if arr.ndim > ndim:
        raise ck.ArgumentError(name, f"shape {arr.shape} has more dimensions than x {shape}")
    pshape = (1,) * (ndim - arr.ndim) + arr.shape
    arr = arr.reshape(pshape)
    if any(p not in (1, n) for p, n in zip(pshape, shape, strict=True)):
        grouped = (
            groups > 1
            and pshape[1] == groups
            and all(p in (1, n) for i, (p, n) in enumerate(zip(pshape, shape, strict=True)) if i != 1)
        )
        if not grouped:
            also = f" or per group {(1, groups) + (1,) * (ndim - 2)}" if groups > 1 else ""
            raise ck.ArgumentError(name, f"shape {arr.shape} is not broadcastable to x's shape {shape}{also}")
        arr = np.repeat(arr, shape[1] // groups, axis=1)
    return np.ascontiguousarray(arr, dtype=np.float32)


# ---------------------------------------------------------------------------------------
# Canonical form


class _Param:
    """A parameter during planning: its element strides over the working axes and, once it
    had to be expanded, how (the axis from which it is copied, and the view it is copied
    from)."""

    def __init__(self, strides: list[int]):
        self.strides = strides
        self.expansion = None

    def first(self, reduced_from: int) -> int:
        """Where an expansion starts: the first axis the parameter varies along, or the first
        reduced axis if that comes earlier (the reduced axes are always copied whole: a
        parameter constant along a leading reduced axis but not a later one has no stride
        over the reduced index)."""
        return min(next((i for i, s in enumerate(self.strides) if s), len(self.strides)), reduced_from)

    def expand(self, sizes: list[int], reduced_from: int) -> None:
        first = self.first(reduced_from)
        self.expansion = (first, tuple(sizes), tuple(self.strides))
        self.strides = [0] * first + _contiguous(sizes[first:])


def _contiguous(sizes) -> list[int]:
    strides, step = [], 1
    for n in reversed(sizes):
        strides.append(step)
        step *= n
    return strides[::-1]


def _chain(strides, sizes) -> bool:
    """One stride describes these axes together (all zero included)."""
    return all(strides[i] == strides[i + 1] * sizes[i + 1] for i in range(len(strides) - 1))


def _run_step(strides, sizes) -> int | None:
    """0 if the values are constant along these axes, 1 if contiguous, None otherwise."""
    if not any(strides):
        return 0
    if strides[-1] == 1 and _chain(strides, sizes):
        return 1
    return None


def _outer(strides, sizes) -> tuple[int, int] | None:
    """(period, outer stride) of the kept axes before the reduced ones, or None."""
    q = next((i for i, s in enumerate(strides) if s), None)
    if q is None:
        return 1, 0
    if not _chain(strides[q:], sizes[q:]):
        return None
    return math.prod(sizes[q:]), strides[-1]


def _rows_splits(strides, sizes) -> dict[int, tuple[int, int]]:
    """For each valid m (the first m reduced axes are the segments): (stride, step)."""
    found = {}
    for m in range(len(sizes) + 1):
        step = _run_step(strides[m:], sizes[m:])
        if step is not None and _chain(strides[:m], sizes[:m]):
            found[m] = (strides[m - 1] if m else 0, step)
    return found


@dataclass(frozen=True)
class _Plan:
    rows: bool  # rows kernel, else columns
    dims: tuple[int, int, int]  # (outer, segments, segment size) or (outer, count, inner)
    params: tuple  # per parameter: None or (expansion, period, outer stride, stride, step)
    transpose: tuple | None  # (working shape, permutation, inverse, permuted shape)


@lru_cache(maxsize=512)
def _plan(shape: tuple[int, ...], reduced: frozenset, groups: int, pshapes: tuple) -> _Plan:
    """How to run a normalization of x's shape, from the shapes alone."""
    params = [
        None if ps is None else _Param([st if n > 1 else 0 for st, n in zip(_contiguous(ps), ps, strict=True)])
        for ps in pshapes
    ]
    sizes, marks, cols = [], [], [[] for _ in params]
    for i, n in enumerate(shape):
        parts = ((n, i in reduced, 1),)
        if i == 1 and groups > 1:
            parts = ((groups, False, n // groups), (n // groups, True, 1))  # each group on its own
        for size, red, mult in parts:
            if size == 1:
                continue
            sizes.append(size)
            marks.append(red)
            for k, p in enumerate(params):
                if p is not None:
                    cols[k].append(p.strides[i] * mult)
    for k, p in enumerate(params):
        if p is not None:
            p.strides = cols[k]
    pattern = "".join("R" if m else "K" for j, m in enumerate(marks) if j == 0 or m != marks[j - 1])
    transpose = None
    if pattern not in ("", "K", "R", "KR", "RK", "KRK"):
        perm = [j for j, m in enumerate(marks) if not m] + [j for j, m in enumerate(marks) if m]
        inverse = tuple(perm.index(j) for j in range(len(perm)))
        work = tuple(sizes)
        sizes = [sizes[j] for j in perm]
        marks = [marks[j] for j in perm]
        for p in params:
            if p is not None:
                p.strides = [p.strides[j] for j in perm]
        transpose = (work, tuple(perm), inverse, tuple(sizes))
        pattern = "KR"
    nk = marks.index(True) if True in marks else len(marks)
    present = [p for p in params if p is not None]

    if pattern in ("RK", "KRK"):
        nr = nk + marks[nk:].index(False)
        ko, rd, ki = slice(0, nk), slice(nk, nr), slice(nr, len(sizes))
        for p in present:
            if (
                _outer(p.strides[ko], sizes[ko]) is None
                or _run_step(p.strides[ki], sizes[ki]) is None
                or not _chain(p.strides[rd], sizes[rd])
            ):
                p.expand(sizes, nk)
        out = tuple(
            None
            if p is None
            else (
                p.expansion,
                *_outer(p.strides[ko], sizes[ko]),
                p.strides[nr - 1],
                _run_step(p.strides[ki], sizes[ki]),
            )
            for p in params
        )
        return _Plan(False, (math.prod(sizes[ko]), math.prod(sizes[rd]), math.prod(sizes[ki])), out, transpose)

    ks, rs = sizes[:nk], sizes[nk:]
    everything = set(range(len(rs) + 1))
    for p in present:
        if _outer(p.strides[:nk], ks) is None:
            p.expand(sizes, nk)

    def common():
        valid = set(everything)
        for p in present:
            valid &= set(_rows_splits(p.strides[nk:], rs))
        return min(valid) if valid else None

    m = common()
    for p in present:
        if m is not None:
            break
        if _rows_splits(p.strides[nk:], rs).keys() != everything:
            p.expand(sizes, nk)
            m = common()
    if m > 0 and math.prod(rs[m:]) < _SHORT_SEGMENT:
        for p in present:
            if 0 not in _rows_splits(p.strides[nk:], rs) and math.prod(sizes[p.first(nk) :]) <= _SMALL_EXPANSION:
                p.expand(sizes, nk)
        m = common()
    out = tuple(
        None if p is None else (p.expansion, *_outer(p.strides[:nk], ks), *_rows_splits(p.strides[nk:], rs)[m])
        for p in params
    )
    return _Plan(True, (math.prod(ks), math.prod(rs[:m]), math.prod(rs[m:])), out, transpose)


def _param_buffer(arr: np.ndarray, expansion):
    if expansion is not None:
        first, sizes, strides = expansion
        view = as_strided(arr, shape=sizes, strides=[4 * s for s in strides], writeable=False)
        arr = np.ascontiguousarray(view[(0,) * first])
    return ffi.from_buffer("float[]", arr)


@dataclass(frozen=True, eq=False)
class _Call:
    """A validated call: everything but the arrays."""

    code: int
    plan: _Plan
    eps: float
    variance: bool
    act: int
    act_params: tuple[float, float]
    pshapes: tuple  # the parameters' shapes with x's rank (None: absent)

    @cached_property
    def template(self):
        """The C descriptor of the call, data pointers left NULL (each call copies it)."""
        norm = ffi.new("TnNormalization *")
        norm.type = self.code
        norm.eps = self.eps
        norm.normalizeVariance = self.variance
        norm.activation = self.act
        norm.activationParams = self.act_params
        for spec, c in zip(self.plan.params, (norm.scale, norm.bias), strict=True):
            if spec is not None:
                _, c.period, c.outerStride, c.stride, c.step = spec
        return norm


_F32_DTYPES = frozenset([ck.F32])
_X_DTYPES = frozenset([ck.F32, F16, ck.BF16, ck.U16])
_CALLS: dict = {}  # fast-path key -> _Call, for arguments of plain types
_MAX_CALLS = 1024


def _fast_key(x, scale, bias, axes, num_groups, eps, normalize_variance, activation, compute_dtype):
    """A hashable key of a call whose arguments are of plain types and whose arrays need no
    conversion (so that a validated _Call can be reused), or None."""
    if type(x) is not np.ndarray or x.dtype not in _X_DTYPES or not x.flags.c_contiguous:
        return None
    shapes = []
    for p in (scale, bias):
        if p is None:
            shapes.append(None)
        elif type(p) is np.ndarray and p.dtype in _F32_DTYPES and p.flags.c_contiguous:
            shapes.append(p.shape)
        else:
            return None
    t = type(axes)
    if t is tuple or t is list:
        axes = tuple(axes)
        for a in axes:
            if type(a) is not int:
                return None
    elif t is not int:
        return None
    if type(num_groups) is not int or type(eps) is not float or type(normalize_variance) is not bool:
        return None
    if activation is not None and type(activation) is not str:
        if type(activation) not in (tuple, list):
            return None
        for v in activation:
            if type(v) not in (str, float, int):
                return None
        activation = tuple(map(_exact, activation))
    if compute_dtype is not None and type(compute_dtype) is not str:
        return None
    return (
        x.dtype,
        x.shape,
        t is int,
        axes,
        num_groups,
        _exact(eps),
        normalize_variance,
        activation,
        compute_dtype,
        *shapes,
    )


def _exact(v):
    """A key part that tells -0.0 from 0.0 (equal, with one hash, as dict keys; an
    activation parameter of either sign gives results of different signs)."""
    return (v, math.copysign(1.0, v)) if type(v) is float and v == 0.0 else v


def _validate(x, scale, bias, axes, num_groups, eps, normalize_variance, activation, compute_dtype):
    """(x, [scale, bias] as compact fp32 arrays with x's rank, _Call) after every check."""
    x, code = _input(x)
    shape, ndim = x.shape, x.ndim
    reduced = reduced_axes(axes, ndim)
    groups = _typed(ck.integer, num_groups, "num_groups", minimum=1)
    if groups > 1:
        if ndim < 2:
            raise ck.ArgumentError(
                "num_groups", f"group normalization needs at least 2 dimensions (N, C, ...), got shape {shape}"
            )
        if shape[1] % groups:
            raise ck.ArgumentError("num_groups", f"{shape[1]} channels cannot be split into {groups} groups")
    eps = _typed(ck.finite_float, eps, "eps", minimum=0.0)
    variance = _typed(ck.boolean, normalize_variance, "normalize_variance")
    act, act_params = activation_spec(activation)
    _compute_dtype(compute_dtype)
    given = [_parameter(scale, "scale", shape, groups), _parameter(bias, "bias", shape, groups)]
    pshapes = tuple(None if p is None else p.shape for p in given)
    plan = _plan(shape, frozenset(reduced), groups, pshapes) if x.size else None
    return x, given, _Call(code, plan, eps, variance, act, act_params, pshapes)


_ALIGNED_OUTPUT = 2 << 20  # outputs this large are written with streaming stores (see gnorm.h)


def _output_like(x: np.ndarray) -> np.ndarray:
    """np.empty_like(x); a large one starts on a 64-byte boundary, so that whole cache lines
    of its rows can take the kernel's streaming stores."""
    if x.nbytes < _ALIGNED_OUTPUT:
        return np.empty_like(x)
    buf = np.empty(x.nbytes + 64, np.uint8)
    start = -buf.ctypes.data % 64
    return buf[start : start + x.nbytes].view(x.dtype).reshape(x.shape)


def normalize(
    x,
    scale=None,
    bias=None,
    *,
    axes,
    num_groups=1,
    eps=1e-5,
    normalize_variance=True,
    activation=None,
    compute_dtype=None,
    out=None,
):
    """Generic normalization (TensorRT INormalization, DirectML MVN1):
    y = act((x - mean) / sqrt(var + eps) * scale + bias), or act((x - mean) * scale + bias)
    without variance normalization; mean and population variance over `axes`.

    x: float32, float16 or bfloat16 (ml_dtypes.bfloat16, or uint16 holding BF16 bits), 1 to 8
    dimensions; the result has its dtype and shape. axes: axis indices (negative allowed) or
    a TensorRT bitmask int (bit i = axis i). num_groups > 1: axis 1 (channels, divisible by
    num_groups) is split into groups, and each group's channels are reduced together with
    `axes` (group normalization); every group is normalized on its own, so axis 1 in `axes`
    adds nothing (it names the group's channels, which are reduced anyway: axes=[1] gives
    group normalization of an (N, C) tensor). scale, bias: optional, each independently; broadcastable
    to x (NumPy rules), or for group normalization also (1, num_groups, 1, ...) per group;
    float32, float16, bfloat16 or real numbers, used as float32. activation: None, a name of
    ACTIVATIONS, or (name, *parameters) with DirectML's parameters in its order, e.g.
    ("leaky_relu", 0.01); parameters left out take DirectML's typical defaults (linear and
    parametric_softplus have none: both parameters are required).

    compute_dtype: None or "float32" only. Every dtype is computed in float32 and rounded
    once to the output dtype; reduced-precision computation (TensorRT's compute precision
    for FP16 networks) would only lose accuracy on a CPU, without any speed to gain, so it is
    refused rather than emulated. Results are bit-identical on every ISA level; a NaN result
    is the quiet NaN 0x7FC00000 (FP16 0x7E00, BF16 0x7FC0).

    out: an array to write the result into (x's shape and dtype), as for the other
    functions that take one.
    """
    key = _fast_key(x, scale, bias, axes, num_groups, eps, normalize_variance, activation, compute_dtype)
    call = _CALLS.get(key) if key is not None else None
    if call is None:
        x, given, call = _validate(x, scale, bias, axes, num_groups, eps, normalize_variance, activation, compute_dtype)
        if key is not None and all(
            g is None or g is p or g.base is p for g, p in zip(given, (scale, bias), strict=True)
        ):
            if len(_CALLS) >= _MAX_CALLS:
                _CALLS.clear()
            _CALLS[key] = call
    else:
        given = [None if p is None else p.reshape(ps) for p, ps in zip((scale, bias), call.pshapes, strict=True)]
    y = _output_like(x) if out is None else ck.output(out, x.shape, x.dtype, (x, *given))
    plan = call.plan
    if plan is None:  # an empty tensor
        return y
    norm = ffi.new("TnNormalization *", call.template[0])
    keep = []
    for arr, spec, c in zip(given, plan.params, (norm.scale, norm.bias), strict=True):
        if arr is not None:
            c.data = data = _param_buffer(arr, spec[0])
            keep.append(data)
    src, dst = x, y  # C takes the raw bits of any dtype straight from the buffers
    if plan.transpose is not None:
        work, perm, inverse, permuted = plan.transpose
        src = np.ascontiguousarray(x.reshape(work).transpose(perm))
        dst = np.empty(permuted, x.dtype)
    kernel = lib.TnNormalizationRows if plan.rows else lib.TnNormalizationColumns
    kernel(ffi.from_buffer(src), *plan.dims, norm, ffi.from_buffer(dst))
    if plan.transpose is not None:
        np.copyto(y.reshape(work), dst.transpose(inverse))
    return y

"""Quantized inner product (seed 004): UINT8 A x INT8 B -> UINT8 C, exact.

``QuantizedInnerProduct`` holds a C context: B, bias and the quantization parameters are
validated and packed once, then ``forward`` runs for any number of rows. The one-shot
``quantized_inner_product`` creates a context that takes B with the call (constB = false).

Semantics: with int32 sums acc = A x B,
    bias'[j] = (bias[j] or 0) - a_zero * sum_k B[k, j]
    norm[j]  = (a_scale * b_scale[j]) / c_scale                 (float32)
    C[i, j]  = clip(rint(float32(acc[i, j] + bias'[j]) * norm[j]) + c_zero, 0, 255)
rint rounds to nearest, ties to even. Every ISA level gives the same bytes.

Limits (ValueError otherwise): 1 <= K <= 65793 (int32 sums cannot overflow);
|bias[j]| <= 2**31 - 1 - 32640 * K (bias' and the biased sums fit in int32); scales
finite in float32, a_scale and c_scale > 0, b_scale >= 0, norm finite.

Threads: ``forward`` may run from several threads at once on one object (cffi releases
the GIL around the C call); ``close`` waits for running forwards and then frees the
context. Objects not closed are freed when garbage-collected.

State in the caller's memory: a context's state (scales, bias', packed B, behind a header
that describes them) can be packed straight into a buffer the caller allocates
(``state=``), for example a shared mapping of a file, and other contexts, in this or any
process mapping the same file, ``attach`` to it without packing B again.
"""

from __future__ import annotations

import threading

import numpy as np

from . import _checks as ck
from ._info import ISA_NAMES
from ._native import ffi, lib

K_MAX = 65793
_INT32_MAX = 2**31 - 1
_MAX_PRODUCT = 255 * 128
_UINT8, _INT8 = lib.TnTensorData8u, lib.TnTensorData8i
ALGORITHMS = {
    "scalar": lib.TnQipAlgorithmScalar,
    "avx2": lib.TnQipAlgorithmAvx2,
    "avx2-vnni": lib.TnQipAlgorithmAvx2Vnni,
    "avx512-vnni": lib.TnQipAlgorithmAvx512Vnni,
    "amx": lib.TnQipAlgorithmAmx,
}


def _typed_matrix(value, name: str, dtype) -> np.ndarray:
    arr = ck._as_array(value, name)
    if arr.dtype != dtype:
        raise ck.ArgumentTypeError(name, f"expected a {np.dtype(dtype).name} array, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ck.ArgumentError(name, f"expected 2 dimensions, got shape {arr.shape}")
    return np.ascontiguousarray(arr)


def _zero_point(value, name: str) -> int:
    return ck.integer(value, name, minimum=0, maximum=255)


def _scale(value, name: str) -> np.float32:
    with np.errstate(over="ignore"):  # too large for float32: finite_float says so
        scale = np.float32(ck.finite_float(value, name))
    if not scale > 0:
        raise ck.ArgumentError(name, f"must be > 0 in float32, got {value!r}")
    return scale


# What TnSynetQuantizedInnerProductCheckState finds wrong with a state buffer.
_STATE_PROBLEMS = {
    lib.TnQipStateMisaligned: "the buffer must start at a 64-byte boundary (a memory mapping does)",
    lib.TnQipStateBadSize: "the buffer's size is not the size of the state it holds (truncated or extended)",
    lib.TnQipStateBadMagic: "the buffer does not hold a quantized inner product state (wrong magic number)",
    lib.TnQipStateBadVersion: "the state was made by a build with another state layout",
    lib.TnQipStateNotReady: "the state was never completely filled (its creator did not finish)",
    lib.TnQipStateCorrupt: "the state's header is inconsistent (sizes or algorithm out of range)",
}


def _state_problem(status: int) -> str:
    if status == lib.TnQipStateUnavailable:
        return (
            "the state was packed for an algorithm not available here: this CPU lacks it, or it is above "
            f"the ISA level in effect ({ISA_NAMES[lib.TnActiveIsa()]}, see TENSOROPS_ISA)"
        )
    return _STATE_PROBLEMS[status]


def _state_pointer(buffer, size: int | None, writable: bool):
    """A C pointer to `buffer` (the argument `state`), which must be `size` bytes when
    given. The pointer keeps the buffer exported (a mapping cannot be closed under it)
    until ffi.release: every path that refuses the buffer releases it first, so that the
    caller can close it at once (and no traceback keeps it exported)."""
    kind = "a writable buffer" if writable else "a buffer"
    try:
        ptr = ffi.from_buffer("uint8_t[]", buffer, require_writable=writable)
    except (TypeError, BufferError):  # BufferError: a read-only buffer where writable is required
        raise ck.ArgumentTypeError("state", f"expected {kind}, got {type(buffer).__name__}") from None
    if size is not None and len(ptr) != size:
        ffi.release(ptr)
        raise ck.ArgumentError("state", f"expected a buffer of {size} bytes (state_size), got {len(ptr)}")
    return ptr


def _algorithm(value) -> int:
    if value is None:
        return lib.TnQipAlgorithmAuto
    if not isinstance(value, str) or value.lower() not in ALGORITHMS:
        allowed = ", ".join(repr(k) for k in ALGORITHMS)
        raise ck.ArgumentError("algorithm", f"expected None or one of {allowed}, got {value!r}")
    return ALGORITHMS[value.lower()]


class _Params:
    """Validated arguments shared by the class and the one-shot function."""

    def __init__(self, b, b_scale, a_scale, a_zero, c_scale, c_zero, bias, trans_b):
        self.trans_b = ck.boolean(trans_b, "trans_b")
        self.b = _typed_matrix(b, "b", np.int8)
        if self.trans_b:
            self.n, self.k = self.b.shape
        else:
            self.k, self.n = self.b.shape
        layout = "(N, K) with trans_b" if self.trans_b else "(K, N)"
        if self.k < 1 or self.n < 1:
            raise ck.ArgumentError("b", f"expected a non-empty {layout} matrix, got shape {self.b.shape}")
        if self.k > K_MAX:
            raise ck.ArgumentError("b", f"K = {self.k} exceeds {K_MAX}, the largest K whose int32 sums cannot overflow")
        self.a_scale = _scale(a_scale, "a_scale")
        self.c_scale = _scale(c_scale, "c_scale")
        self.a_zero = _zero_point(a_zero, "a_zero")
        self.c_zero = _zero_point(c_zero, "c_zero")
        self.b_scale = ck.f32_params(b_scale, "b_scale", (self.n,))
        if not (np.all(np.isfinite(self.b_scale)) and np.all(self.b_scale >= 0)):
            raise ck.ArgumentError("b_scale", "must be finite and >= 0 in float32")
        with np.errstate(over="ignore", under="ignore"):
            norm = (self.a_scale * self.b_scale) / self.c_scale
        if not np.all(np.isfinite(norm)):
            j = int(np.argmin(np.isfinite(norm)))
            raise ck.ArgumentError("b_scale", f"a_scale * b_scale[{j}] / c_scale overflows float32")
        self.bias = None
        if bias is not None:
            arr = ck._as_array(bias, "bias")
            if arr.dtype.kind not in "iu":
                raise ck.ArgumentTypeError("bias", f"expected an integer array, got dtype {arr.dtype}")
            if arr.shape != (self.n,):
                raise ck.ArgumentError("bias", f"expected shape ({self.n},), got shape {arr.shape}")
            limit = _INT32_MAX - _MAX_PRODUCT * self.k
            if arr.size and (int(arr.max()) > limit or int(arr.min()) < -limit):
                raise ck.ArgumentError(
                    "bias",
                    f"values must lie within +-{limit} (2**31 - 1 - 32640 * K) so that the int32 sums cannot overflow",
                )
            self.bias = np.ascontiguousarray(arr, dtype=np.int32)

    def set_params(self, ctx, with_b: bool) -> None:
        lib.TnSynetQuantizedInnerProductSetParams(
            ctx,
            ffi.new("float *", float(self.a_scale)),
            ffi.new("uint8_t *", self.a_zero),
            ffi.from_buffer("int8_t[]", self.b) if with_b else ffi.NULL,
            ffi.from_buffer("float[]", self.b_scale),
            ffi.from_buffer("int32_t[]", self.bias) if self.bias is not None else ffi.NULL,
            ffi.new("float *", float(self.c_scale)),
            ffi.new("uint8_t *", self.c_zero),
        )


def _check_a(a, k: int) -> np.ndarray:
    a = _typed_matrix(a, "a", np.uint8)
    if a.shape[1] != k:
        raise ck.ArgumentError("a", f"expected shape (M, {k}) to match K of b, got {a.shape}")
    return a


def _init(m: int, p: _Params, const_b: bool, algorithm: int):
    ctx = lib.TnSynetQuantizedInnerProductInitAlgorithm(
        m, p.n, p.k, _UINT8, _INT8, _UINT8, int(p.trans_b), int(const_b), int(p.bias is not None), algorithm
    )
    if ctx == ffi.NULL:
        if algorithm != lib.TnQipAlgorithmAuto:
            name = next(k for k, v in ALGORITHMS.items() if v == algorithm)
            raise ck.ArgumentError(
                "algorithm",
                f"{name!r} is not available: this CPU lacks it, or it is above "
                f"the ISA level in effect ({ISA_NAMES[lib.TnActiveIsa()]}, see TENSOROPS_ISA)",
            )
        raise MemoryError("quantized inner product: context allocation failed")
    return ctx


class QuantizedInnerProduct:
    """A quantized inner product with constant B (SimdSynetQuantizedInnerProduct*).

    b: int8 (K, N), or (N, K) with ``trans_b``; b_scale: N floats; a_scale, c_scale:
    floats > 0; a_zero, c_zero: integers in [0, 255]; bias: N integers or None.

    ``max_m`` (default 1, the matrix-vector case) is the number of rows expected per
    forward: it is the C context's M and sizes ``external_buffer_size``. ``forward``
    accepts any number of rows: each thread keeps a scratch buffer grown to
    ``external_buffer_size_for(m)``, which stops growing beyond an internal row block, so
    large M costs no more memory than a few hundred rows.

    ``algorithm`` (None = the best this CPU offers under TENSOROPS_ISA) forces one of
    ``ALGORITHMS`` ('scalar', 'avx2', 'avx2-vnni', 'avx512-vnni', 'amx'), for testing and
    benchmarking; ValueError if this CPU or ISA level cannot run it. ``info`` names the
    implementation selected.

    ``state`` (None: the context allocates its own) is a callable ``allocate(nbytes)``
    returning a writable buffer of exactly nbytes (``state_size``), 64-byte aligned (a
    memory mapping is): called once, and the state (scales, bias', packed B) is packed
    straight into it. The object keeps the buffer exported (an mmap cannot be closed under
    it) until ``close``. ``attach`` makes further objects over the filled buffer.

    ``internal_buffer_size`` is the memory the object's context holds: its state included
    when it allocated it, only its own small part when the state is the caller's
    (``state=``, ``attach``). ``state_size`` is the size of the state either way.
    """

    def __init__(
        self,
        b,
        *,
        b_scale,
        a_scale,
        a_zero,
        c_scale,
        c_zero,
        bias=None,
        trans_b=False,
        max_m=1,
        algorithm=None,
        state=None,
    ):
        self._ctx = None
        p = _Params(b, b_scale, a_scale, a_zero, c_scale, c_zero, bias, trans_b)
        max_m = ck.integer(max_m, "max_m", minimum=1, maximum=2**40)
        if state is not None and not callable(state):
            raise ck.ArgumentTypeError(
                "state", f"expected None or a callable allocate(nbytes) -> buffer, got {type(state).__name__}"
            )
        ctx = ffi.gc(_init(max_m, p, True, _algorithm(algorithm)), lib.TnRelease)
        state_ptr = None
        if state is not None:
            size = int(lib.TnSynetQuantizedInnerProductStateSize(ctx))
            state_ptr = _state_pointer(state(size), size, writable=True)
            if lib.TnSynetQuantizedInnerProductPlaceState(ctx, state_ptr, size) != 0:
                # A new constant-B context and the size checked: only the alignment is left.
                ffi.release(state_ptr)
                raise ck.ArgumentError("state", _STATE_PROBLEMS[lib.TnQipStateMisaligned])
        p.set_params(ctx, with_b=True)  # packs B: the caller's array is not kept
        self._setup(ctx, max_m, state_ptr)

    @classmethod
    def attach(cls, state, *, max_m=1) -> QuantizedInnerProduct:
        """A new object over a state another object filled (``state=``), possibly in another
        process mapping the same file: nothing is packed again, results are bit-identical.
        ``state`` is a buffer (read-only accepted) of exactly the state's size, 64-byte
        aligned, and must not change while attached; the object keeps it exported until
        ``close``. ValueError (naming ``state``) when it is not a filled state this process
        can use: truncated, not a state, made by another build, its algorithm unavailable
        under this CPU or ISA level."""
        max_m = ck.integer(max_m, "max_m", minimum=1, maximum=2**40)
        ptr = _state_pointer(state, None, writable=False)
        status = lib.TnSynetQuantizedInnerProductCheckState(ptr, len(ptr))
        if status != lib.TnQipStateOk:
            ffi.release(ptr)
            raise ck.ArgumentError("state", _state_problem(status))
        ctx = lib.TnSynetQuantizedInnerProductAttach(ptr, len(ptr), max_m)
        if ctx == ffi.NULL:
            ffi.release(ptr)
            raise MemoryError("quantized inner product: context allocation failed")
        attached = cls.__new__(cls)
        attached._setup(ffi.gc(ctx, lib.TnRelease), max_m, ptr)
        return attached

    def _setup(self, ctx, max_m: int, state_ptr) -> None:
        """What every object holds beside its context, read from the context."""
        self.max_m = max_m
        self._state = state_ptr  # the caller's state buffer, or None
        n, k, trans_b = ffi.new("size_t *"), ffi.new("size_t *"), ffi.new("int *")
        lib.TnSynetQuantizedInnerProductShape(ctx, n, k, trans_b)
        self.n, self.k, self.trans_b = int(n[0]), int(k[0]), bool(trans_b[0])
        self.info = ffi.string(lib.TnSynetQuantizedInnerProductInfo(ctx)).decode()
        self.internal_buffer_size = int(lib.TnSynetQuantizedInnerProductInternalBufferSize(ctx))
        self.external_buffer_size = int(lib.TnSynetQuantizedInnerProductExternalBufferSize(ctx))
        self.state_size = int(lib.TnSynetQuantizedInnerProductStateSize(ctx))
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._active = 0
        self._local = threading.local()
        self._sizes = {}  # m -> scratch bytes (the C answer depends on m only)
        self._ctx = ctx

    def external_buffer_size_for(self, m) -> int:
        """Bytes of scratch a forward of m rows uses (0: none)."""
        m = ck.integer(m, "m", minimum=0)
        ctx = self._enter()
        try:
            return int(lib.TnSynetQuantizedInnerProductExternalBufferSizeRows(ctx, m))
        finally:
            self._leave()

    def _enter(self):
        with self._lock:
            if self._ctx is None:
                raise ValueError("QuantizedInnerProduct: the context is closed")
            self._active += 1
            return self._ctx

    def _leave(self) -> None:
        with self._lock:
            self._active -= 1
            if not self._active and self._ctx is None:
                self._idle.notify_all()  # close() is waiting

    def _scratch(self, size: int):
        """This thread's scratch buffer (as a C pointer), grown on demand: the forwards of
        one thread reuse it, concurrent threads each have their own."""
        local = self._local
        if getattr(local, "size", 0) < size:
            local.buf = np.empty(size, np.uint8)
            local.ptr = ffi.from_buffer("uint8_t[]", local.buf)
            local.size = size
        return local.ptr

    def forward(self, a, *, out=None) -> np.ndarray:
        """C (M, N) uint8 from a (M, K) uint8, for any M (0 included); written into `out`
        (uint8 (M, N)) when given."""
        a = _check_a(a, self.k)
        m = a.shape[0]
        c = ck.output(out, (m, self.n), np.dtype(np.uint8), (a,))
        if m == 0:
            return c
        with self._lock:
            ctx = self._ctx
            if ctx is None:
                raise ValueError("QuantizedInnerProduct: the context is closed")
            self._active += 1
        try:
            size = self._sizes.get(m)
            if size is None:
                size = int(lib.TnSynetQuantizedInnerProductExternalBufferSizeRows(ctx, m))
                if len(self._sizes) < 256:
                    self._sizes[m] = size
            lib.TnSynetQuantizedInnerProductForwardRows(
                ctx,
                m,
                ffi.from_buffer("uint8_t[]", a),
                ffi.NULL,
                self._scratch(size) if size else ffi.NULL,
                ffi.from_buffer("uint8_t[]", c),
            )
        finally:
            self._leave()
        return c

    __call__ = forward

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def close(self) -> None:
        """Free the context, after the forwards running now have finished, then let go of
        the caller's state buffer. Idempotent."""
        with self._lock:
            ctx, self._ctx = self._ctx, None
            while self._active:
                self._idle.wait()
        if ctx is not None:
            ffi.release(ctx)
            if self._state is not None:
                ffi.release(self._state)
                self._state = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.info
        return f"QuantizedInnerProduct(N={self.n}, K={self.k}, trans_b={self.trans_b}, {state})"


def quantized_inner_product(
    a, b, *, b_scale, a_scale, a_zero, c_scale, c_zero, bias=None, trans_b=False, algorithm=None
) -> np.ndarray:
    """One-shot C = A x B requantized (the context takes B with the call: constB = false).
    Arguments as for QuantizedInnerProduct; a: uint8 (M, K)."""
    p = _Params(b, b_scale, a_scale, a_zero, c_scale, c_zero, bias, trans_b)
    a = _check_a(a, p.k)
    algo = _algorithm(algorithm)
    m = a.shape[0]
    c = np.empty((m, p.n), np.uint8)
    if m == 0:
        return c
    ctx = _init(m, p, False, algo)
    try:
        p.set_params(ctx, with_b=False)
        size = lib.TnSynetQuantizedInnerProductExternalBufferSize(ctx)
        buf = np.empty(size, np.uint8) if size else None
        lib.TnSynetQuantizedInnerProductForward(
            ctx,
            ffi.from_buffer("uint8_t[]", a),
            ffi.from_buffer("uint8_t[]", p.b),
            ffi.from_buffer("uint8_t[]", buf) if buf is not None else ffi.NULL,
            ffi.from_buffer("uint8_t[]", c),
        )
    finally:
        lib.TnRelease(ctx)
    return c

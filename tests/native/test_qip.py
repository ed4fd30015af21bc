"""Quantized inner product (seed 004): bit-exact against an integer NumPy reference of the
docs/kernels.md formula, for every algorithm the active ISA level can run (the suite runs once
per TENSOROPS_ISA level), plus extremes, concurrency, buffers and validation."""

import concurrent.futures
import functools
import gc
import itertools
import os
import threading
import weakref

import numpy as np
import pytest
from tensorops_native._native import ffi, lib

import tensorops_native as tn
from tensorops_native._qip import ALGORITHMS, K_MAX

# Each QuantizedInnerProduct algorithm is chosen explicitly, whatever the level: run once, at the process's level.
pytestmark = pytest.mark.level_independent

ORDER = ("scalar", "avx2", "avx512")
ALGORITHM_LEVEL = {"scalar": "scalar", "avx2": "avx2", "avx2-vnni": "avx2", "avx512-vnni": "avx512", "amx": "avx512"}


def _runnable(algorithm):
    """Whether this process can run `algorithm` (CPU features and the TENSOROPS_ISA cap)."""
    if ORDER.index(ALGORITHM_LEVEL[algorithm]) > ORDER.index(tn.isa()):
        return False
    b = np.zeros((4, 1), np.int8)
    try:
        tn.QuantizedInnerProduct(
            b, b_scale=[1.0], a_scale=1.0, a_zero=0, c_scale=1.0, c_zero=0, algorithm=algorithm
        ).close()
    except ValueError:
        return False
    return True


RUNNABLE = [a for a in ALGORITHMS if _runnable(a)]
ALGORITHM_PARAMS = [
    pytest.param(
        a, marks=pytest.mark.skipif(a not in RUNNABLE, reason=f"{a} not available at this CPU / TENSOROPS_ISA level")
    )
    for a in ALGORITHMS
]


def reference(a, b_kn, b_scale, a_scale, a_zero, c_scale, c_zero, bias=None):
    """docs/kernels.md formula: exact integer sums, bias' in int64, then the fp32 pipeline
    (int32 -> float32 rounding, one float32 multiply by norm, round half to even)."""
    # float64 products and sums of these integers are exact (|sum| < 2**31 << 2**53).
    acc = (a.astype(np.float64) @ b_kn.astype(np.float64)).astype(np.int64)
    bias64 = np.zeros(b_kn.shape[1], np.int64) if bias is None else np.asarray(bias, np.int64)
    s = acc + (bias64 - np.int64(a_zero) * b_kn.astype(np.int64).sum(axis=0))
    assert np.abs(s).max(initial=0) < 2**31
    norm = (np.float32(a_scale) * np.asarray(b_scale, np.float32)) / np.float32(c_scale)
    y = s.astype(np.int32).astype(np.float32) * norm
    r = np.clip(np.rint(y.astype(np.float64)), -1024, 1024).astype(np.int64) + c_zero
    return np.clip(r, 0, 255).astype(np.uint8)


def _kw(p, trans_b, algorithm):
    return dict(
        b_scale=p["b_scale"],
        a_scale=p["a_scale"],
        a_zero=p["a_zero"],
        c_scale=p["c_scale"],
        c_zero=p["c_zero"],
        bias=p["bias"],
        trans_b=trans_b,
        algorithm=algorithm,
    )


# ---- The grid -------------------------------------------------------------------------

GRID_M = (1, 2, 3, 11, 12, 13, 64, 100)
GRID_N = (1, 15, 16, 17, 31, 32, 33, 100, 256)
GRID_K = (1, 3, 4, 5, 63, 64, 65, 300, 1024)
_ROW_OFFSETS = np.cumsum((0,) + GRID_M)  # the M rows of each case, taken from one stacked A


@functools.cache
def _grid_case(n, k, with_bias):
    """B, parameters, the stacked A of every M and its reference, for one (N, K)."""
    rng = np.random.default_rng([n, k, with_bias])
    b_kn = rng.integers(-128, 128, (k, n), dtype=np.int8)
    a = rng.integers(0, 256, (int(_ROW_OFFSETS[-1]), k), dtype=np.uint8)
    p = {
        "b_scale": rng.uniform(0.5, 2.0, n).astype(np.float32),
        # Outputs spread over [0, 255] with some clamping at both ends.
        "a_scale": float(rng.uniform(0.5, 2.0) * 0.012 / np.sqrt(k)),
        "c_scale": float(rng.uniform(0.5, 2.0)),
        "a_zero": int(rng.integers(0, 256)),
        "c_zero": int(rng.integers(0, 256)),
        "bias": rng.integers(-(2**20), 2**20, n).astype(np.int32) if with_bias else None,
    }
    return b_kn, a, p, reference(a, b_kn, **p)


@pytest.mark.parametrize("k", GRID_K)
@pytest.mark.parametrize("algorithm", ALGORITHM_PARAMS)
def test_grid_bit_exact(algorithm, k):
    for n, with_bias in itertools.product(GRID_N, (False, True)):
        b_kn, a, p, ref = _grid_case(n, k, with_bias)
        for trans_b in (False, True):
            b = np.ascontiguousarray(b_kn.T) if trans_b else b_kn
            kw = _kw(p, trans_b, algorithm)
            with tn.QuantizedInnerProduct(b, max_m=max(GRID_M), **kw) as qip:
                for m, r0 in zip(GRID_M, _ROW_OFFSETS, strict=False):
                    rows = slice(r0, r0 + m)
                    case = f"{algorithm} M={m} N={n} K={k} trans_b={trans_b} bias={with_bias}"
                    np.testing.assert_array_equal(qip.forward(a[rows]), ref[rows], err_msg=case + " constB")
                    np.testing.assert_array_equal(
                        tn.quantized_inner_product(a[rows], b, **kw), ref[rows], err_msg=case + " one-shot"
                    )


# The scalar loops have no blocks: the grid covers them, and these shapes only take long.
LARGE_SHAPE_PARAMS = [
    pytest.param(*p.values, marks=(*p.marks, pytest.mark.long), id=p.id) if p.values == ("scalar",) else p
    for p in ALGORITHM_PARAMS
]


@pytest.mark.parametrize("algorithm", LARGE_SHAPE_PARAMS)
def test_large_shapes_and_k_blocks(algorithm):
    """K beyond one K block, M beyond one M block, N tails, AMX row groups of 16/32."""
    rng = np.random.default_rng(7)
    for m, n, k in ((300, 70, 2100), (48, 65, 4096), (48, 40, 5000), (17, 33, 1500), (33, 40, 127), (256, 16, 64)):
        b_kn = rng.integers(-128, 128, (k, n), dtype=np.int8)
        a = rng.integers(0, 256, (m, k), dtype=np.uint8)
        p = {
            "b_scale": rng.uniform(0.5, 2, n).astype(np.float32),
            "a_scale": 0.012 / np.sqrt(k),
            "c_scale": 1.0,
            "a_zero": 77,
            "c_zero": 130,
            "bias": rng.integers(-1000, 1000, n).astype(np.int32),
        }
        ref = reference(a, b_kn, **p)
        for trans_b in (False, True):
            b = np.ascontiguousarray(b_kn.T) if trans_b else b_kn
            kw = _kw(p, trans_b, algorithm)
            with tn.QuantizedInnerProduct(b, max_m=m, **kw) as qip:
                np.testing.assert_array_equal(qip.forward(a), ref, err_msg=f"{algorithm} {m}x{n}x{k} {trans_b}")
            np.testing.assert_array_equal(tn.quantized_inner_product(a, b, **kw), ref)


# ---- Extremes -------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHM_PARAMS)
@pytest.mark.parametrize("k", [1, 2, 5, 64, 1000, K_MAX])
def test_saturation_extremes(algorithm, k):
    """A all 255 against B all -128 or 127 (the sums that break pairwise 16-bit
    saturation, up to the largest K), with a_zero 0 and 255."""
    m, n = 17, 17  # 16 rows for the AMX tiles, one for the vector tiles
    a = np.full((m, k), 255, np.uint8)
    for b_value, a_zero in itertools.product((-128, 127), (0, 255)):
        b = np.full((k, n), b_value, np.int8)
        # norm maps the extreme sum to about 100 so the exact value shows in the output.
        total = abs(255 * b_value * k - a_zero * b_value * k) or 1
        p = {
            "b_scale": np.full(n, 100.0 / total, np.float32),
            "a_scale": 1.0,
            "c_scale": 1.0,
            "a_zero": a_zero,
            "c_zero": 128,
            "bias": None,
        }
        ref = reference(a, b, **p)
        if a_zero == 0:
            assert ref[0, 0] == (28 if b_value < 0 else 228)  # 128 -+ 100
        else:
            assert ref[0, 0] == 128  # sum and bias' cancel exactly
        with tn.QuantizedInnerProduct(b, max_m=m, **_kw(p, False, algorithm)) as qip:
            np.testing.assert_array_equal(qip.forward(a), ref, err_msg=f"B={b_value} a_zero={a_zero}")
        np.testing.assert_array_equal(tn.quantized_inner_product(a, b, **_kw(p, False, algorithm)), ref)


@pytest.mark.parametrize("algorithm", ALGORITHM_PARAMS)
def test_bias_at_its_limit(algorithm):
    k, n = 1000, 20
    limit = 2**31 - 1 - 32640 * k
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (5, k), dtype=np.uint8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    bias = np.where(np.arange(n) % 2 == 0, limit, -limit).astype(np.int32)
    p = {
        "b_scale": np.full(n, 1e-7, np.float32),
        "a_scale": 1.0,
        "c_scale": 1.0,
        "a_zero": 255,
        "c_zero": 100,
        "bias": bias,
    }
    np.testing.assert_array_equal(tn.quantized_inner_product(a, b, **_kw(p, False, algorithm)), reference(a, b, **p))


@pytest.mark.parametrize("algorithm", ALGORITHM_PARAMS)
def test_tiny_and_huge_scales_clamp(algorithm):
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, (13, 70), dtype=np.uint8)
    b = rng.integers(-128, 128, (70, 33), dtype=np.int8)
    b[:, 0] = 0  # a zero column: its sum is exactly 0 whatever the scale
    base = {"b_scale": np.ones(33, np.float32), "a_scale": 1.0, "a_zero": 0, "c_zero": 128, "bias": None}
    huge_p = base | {"c_scale": 1e-30}  # norm = 1e30: every nonzero sum clamps
    huge = tn.quantized_inner_product(a, b, **_kw(huge_p, False, algorithm))
    np.testing.assert_array_equal(huge, reference(a, b, **huge_p))
    assert set(np.unique(huge[:, 1:])) <= {0, 255} and (huge[:, 0] == 128).all()
    assert (huge == 0).any() and (huge == 255).any()
    tiny = tn.quantized_inner_product(a, b, **_kw(base | {"c_scale": 1e30}, False, algorithm))
    assert (tiny == 128).all()  # norm = 1e-30: everything rounds to c_zero
    for c_zero in (0, 255):  # c_zero at the ends of its range, outputs pushed beyond them
        p = base | {"c_scale": 1e-3, "c_zero": c_zero}
        np.testing.assert_array_equal(
            tn.quantized_inner_product(a, b, **_kw(p, False, algorithm)), reference(a, b, **p)
        )


@pytest.mark.parametrize("algorithm", ALGORITHM_PARAMS)
def test_rounding_ties_to_even(algorithm):
    """norm = 0.5 and odd sums: every value lands exactly on .5."""
    k, n = 1, 40
    s = np.arange(-20, 20, dtype=np.int64)  # per column: sum = A * B with A = 1
    a = np.ones((2, k), np.uint8)
    b = s.astype(np.int8).reshape(1, n)
    p = {
        "b_scale": np.full(n, 0.5, np.float32),
        "a_scale": 1.0,
        "c_scale": 1.0,
        "a_zero": 0,
        "c_zero": 100,
        "bias": None,
    }
    expected = (100 + np.rint(s / 2)).astype(np.uint8)  # rint: ties to even
    assert expected[s == 1][0] == 100 and expected[s == 3][0] == 102 and expected[s == -1][0] == 100
    assert expected[s == -3][0] == 98
    out = tn.quantized_inner_product(a, b, **_kw(p, False, algorithm))
    np.testing.assert_array_equal(out, np.tile(expected, (2, 1)))
    # Ties that only appear after the int32 -> float32 rounding of large sums.
    rng = np.random.default_rng(5)
    a = rng.integers(0, 256, (7, 4096), dtype=np.uint8)
    b = rng.integers(-128, 128, (4096, 24), dtype=np.int8)
    p = {
        "b_scale": np.full(24, 2.0**-18, np.float32),
        "a_scale": 1.0,
        "c_scale": 1.0,
        "a_zero": 3,
        "c_zero": 128,
        "bias": rng.integers(2**24, 2**25, 24).astype(np.int32),
    }
    np.testing.assert_array_equal(tn.quantized_inner_product(a, b, **_kw(p, False, algorithm)), reference(a, b, **p))


# ---- Contexts -------------------------------------------------------------------------


def _context(n=48, k=200, max_m=8, seed=0, **extra):
    rng = np.random.default_rng(seed)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    p = {
        "b_scale": rng.uniform(0.5, 2, n).astype(np.float32),
        "a_scale": 0.001,
        "c_scale": 1.0,
        "a_zero": 100,
        "c_zero": 120,
        "bias": rng.integers(-500, 500, n).astype(np.int32),
    }
    return b, p, tn.QuantizedInnerProduct(b, max_m=max_m, **p, **extra)


def test_info_names_the_selected_isa_and_algorithm():
    _, _, qip = _context()
    with qip:
        level = tn.isa()
        features = tn.cpu_features()
        if level == "scalar":
            assert qip.info.startswith("scalar:")
        elif level == "avx2":
            assert qip.info.startswith("avx2-vnni:" if "avxvnni" in features else "avx2:")
        elif "avx512vnni" in features:
            assert qip.info.startswith(("avx512-amx:", "avx512-vnni:"))
        else:
            assert qip.info.startswith(("avx2-vnni:", "avx2:"))
        assert "tdpbusd" in qip.info or "vpdpbusd" in qip.info or "vpmaddwd" in qip.info or "scalar" in qip.info


def test_isa_cap_selects_the_path():
    for name in RUNNABLE:
        _, _, qip = _context(algorithm=name)
        with qip:
            prefix = {
                "amx": "avx512-amx:",
                "avx512-vnni": "avx512-vnni:",
                "avx2-vnni": "avx2-vnni:",
                "avx2": "avx2:",
                "scalar": "scalar:",
            }[name]
            assert qip.info.startswith(prefix)
    for name in ALGORITHMS:
        if ORDER.index(ALGORITHM_LEVEL[name]) > ORDER.index(tn.isa()):
            with pytest.raises(ValueError, match="algorithm"):
                _context(algorithm=name)


def test_any_m_and_empty_m():
    b, p, qip = _context(max_m=4)
    rng = np.random.default_rng(1)
    with qip:
        for m in (0, 1, 4, 5, 33, 600):
            a = rng.integers(0, 256, (m, b.shape[0]), dtype=np.uint8)
            out = qip.forward(a)
            assert out.shape == (m, b.shape[1]) and out.dtype == np.uint8
            np.testing.assert_array_equal(out, reference(a, b, **p))
            np.testing.assert_array_equal(tn.quantized_inner_product(a, b, **p), reference(a, b, **p))


def test_non_contiguous_inputs_and_unchanged_inputs():
    b, p, qip = _context()
    rng = np.random.default_rng(2)
    big = rng.integers(0, 256, (10, 2 * b.shape[0]), dtype=np.uint8)
    a = big[:, ::2]
    keep = a.copy()
    with qip:
        np.testing.assert_array_equal(qip.forward(a), reference(np.ascontiguousarray(a), b, **p))
    np.testing.assert_array_equal(a, keep)
    bt = np.asfortranarray(b)  # any memory layout of b
    np.testing.assert_array_equal(tn.quantized_inner_product(keep, bt, **p), reference(keep, b, **p))


def test_buffer_sizes_are_reported_honestly():
    b, p, qip = _context(n=100, k=3000, max_m=64)
    with qip:
        assert qip.internal_buffer_size >= b.size  # B is held, packed
        assert qip.external_buffer_size == qip.external_buffer_size_for(64)
        sizes = [qip.external_buffer_size_for(m) for m in (0, 1, 16, 64, 256, 10_000, 100_000)]
        assert sizes[0] == 0
        assert sizes == sorted(sizes)
        assert sizes[-1] == sizes[-2]  # grows only up to the row block


def _guarded(size, fill):
    """A buffer of `size` bytes inside 64 guard bytes on each side."""
    raw = np.full(size + 128, fill, np.uint8)
    return raw, raw[64 : 64 + size]


@pytest.mark.parametrize("algorithm", ALGORITHM_PARAMS)
@pytest.mark.parametrize("const_b", [True, False])
def test_c_forward_stays_inside_its_buffers(algorithm, const_b):
    """The C API with a caller buffer of exactly ExternalBufferSize (and with NULL): same
    result, nothing written outside C or buf."""
    m, n, k = 37, 45, 301
    rng = np.random.default_rng(9)
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)
    p = {
        "b_scale": rng.uniform(0.5, 2, n).astype(np.float32),
        "a_scale": 0.002,
        "c_scale": 1.0,
        "a_zero": 9,
        "c_zero": 99,
        "bias": None,
    }
    ref = reference(a, np.ascontiguousarray(b.T), **p)
    ctx = lib.TnSynetQuantizedInnerProductInitAlgorithm(
        m, n, k, lib.TnTensorData8u, lib.TnTensorData8i, lib.TnTensorData8u, 1, int(const_b), 0, ALGORITHMS[algorithm]
    )
    assert ctx != ffi.NULL
    try:
        lib.TnSynetQuantizedInnerProductSetParams(
            ctx,
            ffi.new("float *", p["a_scale"]),
            ffi.new("uint8_t *", p["a_zero"]),
            ffi.from_buffer("int8_t[]", b) if const_b else ffi.NULL,
            ffi.from_buffer("float[]", p["b_scale"]),
            ffi.NULL,
            ffi.new("float *", p["c_scale"]),
            ffi.new("uint8_t *", p["c_zero"]),
        )
        size = lib.TnSynetQuantizedInnerProductExternalBufferSize(ctx)
        for use_buf in (True, False):
            raw_c, c = _guarded(m * n, 0xA5)
            raw_buf, buf = _guarded(max(size, 1), 0x5A)
            lib.TnSynetQuantizedInnerProductForward(
                ctx,
                ffi.from_buffer("uint8_t[]", a),
                ffi.from_buffer("uint8_t[]", b) if not const_b else ffi.NULL,
                ffi.from_buffer("uint8_t[]", buf) if use_buf and size else ffi.NULL,
                ffi.from_buffer("uint8_t[]", c),
            )
            np.testing.assert_array_equal(c.reshape(m, n), ref)
            assert (raw_c[:64] == 0xA5).all() and (raw_c[-64:] == 0xA5).all()
            assert (raw_buf[:64] == 0x5A).all() and (raw_buf[-64:] == 0x5A).all()
        assert ffi.string(lib.TnSynetQuantizedInnerProductInfo(ctx)).decode()
    finally:
        lib.TnRelease(ctx)


_GUARD_PROBE = r"""
import ctypes, mmap, sys
import numpy as np
from tensorops_native._native import ffi, lib
from tensorops_native._qip import ALGORITHMS

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
keep = []

def fenced(values, where):
    # values copied next to an inaccessible page: ending at it ("tail") or starting after it ("head")
    values = np.ascontiguousarray(values)
    pages = -(-max(values.nbytes, 1) // PAGE)
    mm = mmap.mmap(-1, (pages + 2) * PAGE)
    anchor = ctypes.c_char.from_buffer(mm)
    addr = ctypes.addressof(anchor)
    del anchor
    for page in (0, pages + 1):
        assert libc.mprotect(addr + page * PAGE, PAGE, 0) == 0
    offset = PAGE if where == "head" else (pages + 1) * PAGE - values.nbytes
    arr = np.frombuffer(mm, values.dtype, values.size, offset).reshape(values.shape)
    arr[...] = values
    keep.append(mm)
    return arr

def ptr(kind, arr):
    return ffi.from_buffer(kind, arr)

rng = np.random.default_rng(0)
for algorithm in sys.argv[1:]:
    for m, n, k in ((1, 1, 1), (3, 17, 5), (13, 33, 65), (17, 40, 129), (40, 70, 300), (1, 31, 1030), (20, 50, 4099)):
        for trans_b in (0, 1):
            for const_b in (1, 0):
                for where in ("tail", "head"):
                    print(algorithm, m, n, k, trans_b, const_b, where, flush=True)
                    a = fenced(rng.integers(0, 256, (m, k), dtype=np.uint8), where)
                    b = fenced(rng.integers(-128, 128, (n, k) if trans_b else (k, n), dtype=np.int8), where)
                    scale = fenced(rng.uniform(0.5, 2, n).astype(np.float32) / (64 * k ** 0.5), where)
                    bias = fenced(rng.integers(-99, 99, n).astype(np.int32), where)
                    ctx = lib.TnSynetQuantizedInnerProductInitAlgorithm(m, n, k, lib.TnTensorData8u, lib.TnTensorData8i,
                        lib.TnTensorData8u, trans_b, const_b, 1, ALGORITHMS[algorithm])
                    assert ctx != ffi.NULL
                    lib.TnSynetQuantizedInnerProductSetParams(ctx, ffi.new("float *", 1.0), ffi.new("uint8_t *", 7),
                        ptr("int8_t[]", b) if const_b else ffi.NULL, ptr("float[]", scale), ptr("int32_t[]", bias),
                        ffi.new("float *", 1.0), ffi.new("uint8_t *", 9))
                    size = lib.TnSynetQuantizedInnerProductExternalBufferSize(ctx)
                    buf = fenced(np.zeros(size, np.uint8), where) if size else None
                    c = fenced(np.zeros((m, n), np.uint8), where)
                    lib.TnSynetQuantizedInnerProductForward(ctx, ptr("uint8_t[]", a),
                        ptr("uint8_t[]", b) if not const_b else ffi.NULL,
                        ptr("uint8_t[]", buf) if buf is not None else ffi.NULL, ptr("uint8_t[]", c))
                    lib.TnRelease(ctx)
print("OK", flush=True)
"""


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="uses mmap/mprotect guard pages")
def test_c_accesses_stay_inside_the_tensors():
    """Every array (A, B, bias, scales, buf of exactly ExternalBufferSize, C) placed against
    an inaccessible page, before and after it: any read or write outside them kills the
    child process with SIGSEGV; the last line printed names the case."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _GUARD_PROBE, *RUNNABLE],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=600,
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines[-1:] == ["OK"], (
        f"crashed ({proc.returncode}) in case {lines[-1] if lines else '?'}\n{proc.stderr[-2000:]}"
    )


def test_c_init_refuses_unsupported_arguments():
    u8, i8, f32 = lib.TnTensorData8u, lib.TnTensorData8i, lib.TnTensorData32f
    good = (4, 5, 6, u8, i8, u8, 0, 1, 0)
    ctx = lib.TnSynetQuantizedInnerProductInit(*good)
    assert ctx != ffi.NULL
    lib.TnRelease(ctx)
    lib.TnRelease(ffi.NULL)
    for bad in ((0, 5, 6), (4, 0, 6), (4, 5, 0), (4, 5, K_MAX + 1)):
        assert lib.TnSynetQuantizedInnerProductInit(*bad, u8, i8, u8, 0, 1, 0) == ffi.NULL
    for types in ((f32, i8, u8), (u8, u8, u8), (u8, i8, i8)):
        assert lib.TnSynetQuantizedInnerProductInit(4, 5, 6, *types, 0, 1, 0) == ffi.NULL


def test_concurrent_forwards_match_one_thread():
    b, p, qip = _context(n=130, k=700, max_m=32)
    rng = np.random.default_rng(11)
    inputs = [rng.integers(0, 256, (int(rng.integers(1, 40)), b.shape[0]), dtype=np.uint8) for _ in range(48)]
    with qip:
        expected = [qip.forward(a) for a in inputs]
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            for _ in range(3):
                results = list(pool.map(qip.forward, inputs))
                for got, want in zip(results, expected, strict=True):
                    np.testing.assert_array_equal(got, want)


def test_close_waits_for_running_forwards_and_refuses_later_ones():
    b, p, qip = _context(n=256, k=2048, max_m=64)
    a = np.random.default_rng(12).integers(0, 256, (64, b.shape[0]), dtype=np.uint8)
    expected = qip.forward(a)
    errors, mismatches = [], []
    started = threading.Barrier(5)

    def worker():
        started.wait()
        try:
            while True:
                if not np.array_equal(qip.forward(a), expected):
                    mismatches.append(1)
        except ValueError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    started.wait()
    qip.close()
    for t in threads:
        t.join(timeout=60)
    assert not mismatches
    assert len(errors) == 4 and all("closed" in e for e in errors)
    assert qip.closed
    qip.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        qip.forward(a)
    with pytest.raises(ValueError, match="closed"):
        qip.external_buffer_size_for(1)


def test_contexts_are_released_by_the_garbage_collector():
    # The C context is an ffi.gc cdata whose destructor is TnRelease: once the cdata is
    # gone, the context was released. A weak reference to each one tells.
    contexts = []
    for i in range(200):
        _, _, qip = _context(n=64, k=256, seed=i % 3)
        qip.forward(np.zeros((1, 256), np.uint8))
        contexts.append(weakref.ref(qip._ctx))
        del qip
    gc.collect()
    assert [ref for ref in contexts if ref() is not None] == []


def test_exported_and_listed():
    assert "quantized_inner_product" in tn.OPERATIONS
    assert tn.QuantizedInnerProduct is not None and "QuantizedInnerProduct" in tn.__all__


# ---- Validation: one test per class of error -------------------------------------------

GOOD = dict(b_scale=np.ones(3, np.float32), a_scale=0.1, a_zero=1, c_scale=0.2, c_zero=2)
B = np.zeros((4, 3), np.int8)
A = np.zeros((2, 4), np.uint8)


def _raises(exc, argument, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert info.value.argument == argument, str(info.value)
    assert str(info.value).startswith(argument)


def test_b_dtype_and_shape():
    _raises(TypeError, "b", tn.QuantizedInnerProduct, B.astype(np.uint8), **GOOD)
    _raises(TypeError, "b", tn.QuantizedInnerProduct, B.astype(np.float32), **GOOD)
    _raises(ValueError, "b", tn.QuantizedInnerProduct, np.zeros(4, np.int8), **GOOD)
    _raises(ValueError, "b", tn.QuantizedInnerProduct, np.zeros((0, 3), np.int8), **GOOD)
    _raises(
        ValueError,
        "b",
        tn.quantized_inner_product,
        np.zeros((1, K_MAX + 1), np.uint8),
        np.zeros((K_MAX + 1, 3), np.int8),
        **GOOD,
    )


def test_a_dtype_and_shape():
    with tn.QuantizedInnerProduct(B, **GOOD) as qip:
        _raises(TypeError, "a", qip.forward, A.astype(np.int8))
        _raises(TypeError, "a", qip.forward, A.astype(np.float32))
        _raises(ValueError, "a", qip.forward, np.zeros(4, np.uint8))
        _raises(ValueError, "a", qip.forward, np.zeros((2, 5), np.uint8))
    _raises(ValueError, "a", tn.quantized_inner_product, np.zeros((2, 3), np.uint8), B, **GOOD)
    _raises(TypeError, "a", tn.quantized_inner_product, [[1, 2, 3, 4]], B, **GOOD)


def test_n_and_k_follow_trans_b():
    # B of shape (3, 4) read as (N, K) with trans_b: b_scale needs N = 3 values and a K = 4.
    with tn.QuantizedInnerProduct(np.zeros((3, 4), np.int8), trans_b=True, **GOOD) as qip:
        assert (qip.n, qip.k) == (3, 4) and qip.forward(A).shape == (2, 3)
    _raises(ValueError, "b_scale", tn.QuantizedInnerProduct, np.zeros((4, 3), np.int8), trans_b=True, **GOOD)
    _raises(TypeError, "trans_b", tn.QuantizedInnerProduct, B, trans_b=1, **GOOD)


def test_b_scale_length_and_values():
    _raises(ValueError, "b_scale", tn.QuantizedInnerProduct, B, **(GOOD | {"b_scale": np.ones(4, np.float32)}))
    _raises(ValueError, "b_scale", tn.QuantizedInnerProduct, B, **(GOOD | {"b_scale": [1.0, -1.0, 1.0]}))
    _raises(ValueError, "b_scale", tn.QuantizedInnerProduct, B, **(GOOD | {"b_scale": [1.0, np.nan, 1.0]}))
    _raises(ValueError, "b_scale", tn.QuantizedInnerProduct, B, **(GOOD | {"b_scale": [1.0, np.inf, 1.0]}))
    _raises(TypeError, "b_scale", tn.QuantizedInnerProduct, B, **(GOOD | {"b_scale": ["x", "y", "z"]}))
    # norm = a_scale * b_scale / c_scale must be finite in float32
    _raises(
        ValueError, "b_scale", tn.QuantizedInnerProduct, B, **(GOOD | {"b_scale": [1.0, 3e38, 1.0], "c_scale": 1e-3})
    )


def test_bias_length_dtype_and_range():
    _raises(ValueError, "bias", tn.QuantizedInnerProduct, B, bias=[1, 2], **GOOD)
    _raises(TypeError, "bias", tn.QuantizedInnerProduct, B, bias=[1.0, 2.0, 3.0], **GOOD)
    limit = 2**31 - 1 - 32640 * 4
    tn.QuantizedInnerProduct(B, bias=[limit, -limit, 0], **GOOD).close()
    _raises(ValueError, "bias", tn.QuantizedInnerProduct, B, bias=[limit + 1, 0, 0], **GOOD)
    _raises(ValueError, "bias", tn.QuantizedInnerProduct, B, bias=np.array([0, -(limit + 1), 0], np.int64), **GOOD)


def test_zero_points_in_range():
    for name in ("a_zero", "c_zero"):
        _raises(ValueError, name, tn.QuantizedInnerProduct, B, **(GOOD | {name: 256}))
        _raises(ValueError, name, tn.QuantizedInnerProduct, B, **(GOOD | {name: -1}))
        _raises(TypeError, name, tn.QuantizedInnerProduct, B, **(GOOD | {name: 1.5}))
        _raises(TypeError, name, tn.quantized_inner_product, A, B, **(GOOD | {name: None}))


def test_scales_positive_and_finite():
    for name in ("a_scale", "c_scale"):
        for bad in (0.0, -1.0, np.nan, np.inf, 1e-50, 1e40):
            _raises(ValueError, name, tn.QuantizedInnerProduct, B, **(GOOD | {name: bad}))
        _raises(TypeError, name, tn.QuantizedInnerProduct, B, **(GOOD | {name: "1"}))


def test_max_m_and_algorithm():
    _raises(ValueError, "max_m", tn.QuantizedInnerProduct, B, max_m=0, **GOOD)
    _raises(TypeError, "max_m", tn.QuantizedInnerProduct, B, max_m=2.0, **GOOD)
    _raises(ValueError, "algorithm", tn.QuantizedInnerProduct, B, algorithm="sse9", **GOOD)
    _raises(ValueError, "m", tn.QuantizedInnerProduct(B, **GOOD).external_buffer_size_for, -1)


def test_missing_arguments_are_type_errors():
    with pytest.raises(TypeError):
        tn.QuantizedInnerProduct(B, b_scale=GOOD["b_scale"])  # scales and zero points are required
    with pytest.raises(TypeError):
        tn.quantized_inner_product(A, B, 0.1, 1, 0.2, 2)  # keyword-only


def test_isa_env_is_respected_in_subprocess():
    """TENSOROPS_ISA=avx2 / scalar select those paths (checked in a fresh process)."""
    import subprocess
    import sys

    code = (
        "import numpy as np, tensorops_native as t; "
        "q = t.QuantizedInnerProduct(np.zeros((4, 2), np.int8), b_scale=[1, 1], a_scale=1.0, a_zero=0, "
        "c_scale=1.0, c_zero=0); print(q.info.split(':')[0])"
    )
    for level, allowed in (("scalar", {"scalar"}), ("avx2", {"avx2", "avx2-vnni", "scalar"})):
        env = dict(os.environ, TENSOROPS_ISA=level)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() in allowed

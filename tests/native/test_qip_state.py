"""Quantized inner product state in the caller's memory: a context packs into a buffer the
caller allocates (``state=``), others attach to the filled buffer (``attach``), in this
process or in another one mapping the same file, and every one of them gives the bytes of a
plain context and of the integer reference, at every ISA level."""

import gc
import mmap
import os
import pathlib
import tempfile
import weakref

import numpy as np
import pytest
from tensorops_native._native import ffi, lib

import tensorops_native as tn
from tensorops_native._info import set_isa_for_testing
from test_qip import reference
from tn_testing import LEVELS

SHM = pathlib.Path("/dev/shm")


class Mappings:
    """A state allocator: each call maps `nbytes` of fresh anonymous shared memory (page
    aligned, as a mapping of a file is) and remembers it."""

    def __init__(self):
        self.maps = []

    def __call__(self, nbytes):
        self.maps.append(mmap.mmap(-1, nbytes))
        return self.maps[-1]

    @property
    def last(self):
        return self.maps[-1]


def problem(rng, n, k, trans_b, with_bias):
    b_kn = rng.integers(-128, 128, (k, n), dtype=np.int8)
    kw = dict(
        b_scale=rng.uniform(0.001, 0.02, n).astype(np.float32),
        a_scale=0.05,
        a_zero=int(rng.integers(0, 256)),
        c_scale=0.25,
        c_zero=int(rng.integers(0, 256)),
        bias=rng.integers(-5000, 5000, n, dtype=np.int32) if with_bias else None,
        trans_b=trans_b,
    )
    b = np.ascontiguousarray(b_kn.T) if trans_b else b_kn
    return b, b_kn, kw


def expected(a, b_kn, kw):
    return reference(a, b_kn, kw["b_scale"], kw["a_scale"], kw["a_zero"], kw["c_scale"], kw["c_zero"], kw["bias"])


# N not a multiple of the 32-column panel, K not a multiple of 4, and the K blocks of the
# vector tiles (K > 2048) once.
SHAPES = [(1, 1), (17, 5), (33, 70), (100, 131), (256, 64), (45, 2051)]
# From the matrix-vector case to beyond the row block (240 rows; 256 for AMX).
ROWS = (1, 7, 13, 241, 520)


@pytest.mark.parametrize("trans_b", [False, True], ids=["kn", "nk"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize(("n", "k"), SHAPES, ids=[f"n{n}-k{k}" for n, k in SHAPES])
def test_created_with_state_and_attached_give_the_bytes_of_a_plain_context(rng, n, k, trans_b, with_bias):
    b, b_kn, kw = problem(rng, n, k, trans_b, with_bias)
    maps = Mappings()
    plain = tn.QuantizedInnerProduct(b, **kw)
    created = tn.QuantizedInnerProduct(b, state=maps, **kw)
    attached = tn.QuantizedInnerProduct.attach(maps.last, max_m=13)
    read_only = tn.QuantizedInnerProduct.attach(memoryview(maps.last).toreadonly())
    assert len(maps.maps) == 1 and len(maps.last) == created.state_size
    for q in (created, attached, read_only):
        assert (q.n, q.k, q.trans_b, q.info, q.state_size) == (n, k, trans_b, plain.info, plain.state_size)
    assert attached.max_m == 13
    assert attached.external_buffer_size == attached.external_buffer_size_for(13)
    for m in ROWS:
        a = rng.integers(0, 256, (m, k), dtype=np.uint8)
        want = expected(a, b_kn, kw)
        np.testing.assert_array_equal(plain.forward(a), want)
        for q in (created, attached, read_only):
            np.testing.assert_array_equal(q.forward(a), want)
    for q in (plain, created, attached, read_only):
        q.close()
    for m in maps.maps:
        m.close()  # the objects let go of the buffer at close


def test_attached_objects_outlive_the_creator_and_close_independently(rng):
    b, b_kn, kw = problem(rng, 40, 37, False, True)
    maps = Mappings()
    created = tn.QuantizedInnerProduct(b, state=maps, **kw)
    first = tn.QuantizedInnerProduct.attach(maps.last)
    second = tn.QuantizedInnerProduct.attach(maps.last)
    created.close()
    first.close()
    first.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        first.forward(np.zeros((1, 37), np.uint8))
    with pytest.raises(BufferError):
        maps.last.close()  # `second` still holds it
    a = rng.integers(0, 256, (5, 37), dtype=np.uint8)
    np.testing.assert_array_equal(second.forward(a), expected(a, b_kn, kw))
    second.close()
    maps.last.close()


def test_the_state_is_the_only_copy_of_packed_b_and_b_is_not_kept(rng):
    n, k = 96, 1000
    b, _, kw = problem(rng, n, k, True, True)  # b: (N, K), its own array
    b_ref = weakref.ref(b)
    maps = Mappings()
    created = tn.QuantizedInnerProduct(b, state=maps, **kw)
    del b
    gc.collect()
    assert b_ref() is None
    plain = tn.QuantizedInnerProduct(np.zeros((n, k), np.int8), **{**kw, "bias": None})
    attached = tn.QuantizedInnerProduct.attach(maps.last)
    assert created.state_size >= n * k
    # A plain context holds its state; with the caller's state, only its own small part.
    assert plain.internal_buffer_size >= plain.state_size
    assert created.internal_buffer_size == attached.internal_buffer_size < 4096
    # The attached object reads the caller's memory, not a copy: clearing everything after
    # the header (norm included) leaves every output at c_zero.
    a = rng.integers(0, 256, (3, k), dtype=np.uint8)
    maps.last[64:] = bytes(len(maps.last) - 64)
    np.testing.assert_array_equal(attached.forward(a), np.full((3, n), kw["c_zero"], np.uint8))
    for q in (created, plain, attached):
        q.close()


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm")
def test_attach_from_another_process_to_a_file_in_dev_shm(rng, isa, isolated, tmp_path):
    """The state is packed into a shared mapping of a file in /dev/shm; a separate process
    (at the same ISA level) maps the file read-only, attaches, and computes the same bytes;
    the file is unchanged by it."""
    b, b_kn, kw = problem(rng, 70, 203, True, True)
    a = rng.integers(0, 256, (300, 203), dtype=np.uint8)
    fd, name = tempfile.mkstemp(prefix="tensorops-test-qip-", dir=SHM)
    try:
        maps = []

        def allocate(nbytes):
            os.ftruncate(fd, nbytes)
            maps.append(mmap.mmap(fd, nbytes))
            return maps[0]

        created = tn.QuantizedInnerProduct(b, state=allocate, **kw)
        before = bytes(maps[0])
        np.save(tmp_path / "a.npy", a)
        proc = isolated(
            f"""
            import mmap, numpy as np, tensorops_native as tn
            with open({name!r}, "rb") as f:
                state = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            q = tn.QuantizedInnerProduct.attach(state, max_m=300)
            np.save({str(tmp_path / "c.npy")!r}, q.forward(np.load({str(tmp_path / "a.npy")!r})))
            print(q.info)
            """,
            memory_limit=None,  # no huge allocation here; and AddressSanitizer needs the address space
            TENSOROPS_ISA=isa,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == created.info
        c = np.load(tmp_path / "c.npy")
        np.testing.assert_array_equal(c, created.forward(a))
        np.testing.assert_array_equal(c, expected(a, b_kn, kw))
        assert bytes(maps[0]) == before
        created.close()
        maps[0].close()
    finally:
        os.close(fd)
        os.unlink(name)


# ---- Bad states ----------------------------------------------------------------------


def filled_state(rng, **extra):
    b, _, kw = problem(rng, 20, 9, False, True)
    maps = Mappings()
    tn.QuantizedInnerProduct(b, state=maps, **kw, **extra).close()
    return bytes(maps.last)


def mapped(data: bytes) -> mmap.mmap:
    m = mmap.mmap(-1, max(len(data), 1))
    m[: len(data)] = data
    return m


def refused(state, match):
    with pytest.raises(ValueError, match=match) as info:
        tn.QuantizedInnerProduct.attach(state)
    assert info.value.argument == "state"
    # A refused buffer is not kept exported: the caller can let go of it at once.
    state.release() if isinstance(state, memoryview) else state.close()


@pytest.mark.level_independent
def test_bad_states_are_refused_naming_state(rng):
    good = filled_state(rng)
    tn.QuantizedInnerProduct.attach(mapped(good)).close()
    refused(memoryview(mapped(good))[: len(good) - 1], "size")  # truncated
    refused(memoryview(mapped(good + bytes(64))), "size")  # extended
    refused(mapped(good[:32]), "size")  # shorter than the header
    refused(mapped(bytes(len(good))), "magic")  # zeroed
    refused(mapped(b"XXXX" + good[4:]), "magic")
    refused(memoryview(mapped(bytes(1) + good))[1:], "64-byte boundary")
    # Header fields (qip.h, TnQipState): version at 4, N at 16, kqp at 44, ready at 60.
    header = bytearray(good)
    header[4] ^= 0xFF
    refused(mapped(bytes(header)), "another state layout")
    header = bytearray(good)
    header[16:24] = (0).to_bytes(8, "little")
    refused(mapped(bytes(header)), "inconsistent")
    header = bytearray(good)
    header[44] += 1
    refused(mapped(bytes(header)), "inconsistent")
    header = bytearray(good)
    header[60] = 0
    refused(mapped(bytes(header)), "never completely filled")


@pytest.mark.level_independent
def test_a_state_never_filled_is_refused():
    """A context that got its state placed but no SetParams (its creator stopped halfway)."""
    ctx = ffi.gc(
        lib.TnSynetQuantizedInnerProductInit(
            1, 8, 8, lib.TnTensorData8u, lib.TnTensorData8i, lib.TnTensorData8u, 0, 1, 0
        ),
        lib.TnRelease,
    )
    size = lib.TnSynetQuantizedInnerProductStateSize(ctx)
    state = mmap.mmap(-1, size)
    ptr = ffi.from_buffer("uint8_t[]", state)
    assert lib.TnSynetQuantizedInnerProductPlaceState(ctx, ptr, size - 1) == -1
    assert lib.TnSynetQuantizedInnerProductPlaceState(ctx, ptr + 1, size) == -1
    assert lib.TnSynetQuantizedInnerProductPlaceState(ctx, ptr, size) == 0
    assert lib.TnSynetQuantizedInnerProductCheckState(ptr, size) == lib.TnQipStateNotReady
    assert lib.TnSynetQuantizedInnerProductAttach(ptr, size, 1) == ffi.NULL
    ffi.release(ptr)
    refused(state, "never completely filled")


@pytest.mark.level_independent
def test_a_filled_state_cannot_be_placed_again_nor_an_attached_one_refilled(rng):
    good = mapped(filled_state(rng))
    ptr = ffi.from_buffer("uint8_t[]", good)
    before = bytes(good)
    attached = ffi.gc(lib.TnSynetQuantizedInnerProductAttach(ptr, len(good), 1), lib.TnRelease)
    assert attached != ffi.NULL
    assert lib.TnSynetQuantizedInnerProductPlaceState(attached, ptr, len(good)) == -1
    one, zero = ffi.new("float *", 1.0), ffi.new("uint8_t *", 0)
    scales = ffi.new("float[]", [2.0] * 20)
    lib.TnSynetQuantizedInnerProductSetParams(attached, one, zero, ffi.NULL, scales, ffi.NULL, one, zero)
    assert bytes(good) == before  # read only


@pytest.mark.level_independent
def test_a_state_is_refused_where_its_algorithm_is_not_allowed(rng):
    """Made at each level this CPU runs, attached at each: refused below the level of its
    algorithm (the TENSOROPS_ISA cap), else the same bytes as everywhere."""
    b, b_kn, kw = problem(rng, 50, 30, False, True)
    a = rng.integers(0, 256, (20, 30), dtype=np.uint8)
    want = expected(a, b_kn, kw)
    levels = LEVELS[: lib.TnSupportedIsa() + 1]
    checked = 0
    for made in levels:
        previous = set_isa_for_testing(made)
        try:
            maps = Mappings()
            created = tn.QuantizedInnerProduct(b, state=maps, **kw)
            algorithm_level = created.info.split(":")[0].split("-")[0]
            created.close()
        finally:
            set_isa_for_testing(previous)
        for used in levels:
            previous = set_isa_for_testing(used)
            try:
                if LEVELS.index(used) < LEVELS.index(algorithm_level):
                    refused(memoryview(maps.last), "not available here")
                    checked += 1
                else:
                    with tn.QuantizedInnerProduct.attach(maps.last) as q:
                        np.testing.assert_array_equal(q.forward(a), want)
            finally:
                set_isa_for_testing(previous)
    if len(levels) > 1:
        assert checked > 0


# ---- Arguments -----------------------------------------------------------------------


@pytest.mark.level_independent
def test_state_and_attach_arguments(rng):
    b, _, kw = problem(rng, 8, 8, False, False)
    with pytest.raises(TypeError, match="^state: expected None or a callable"):
        tn.QuantizedInnerProduct(b, state=bytearray(10**4), **kw)
    with pytest.raises(ValueError, match=r"^state: expected a buffer of \d+ bytes \(state_size\), got 7"):
        tn.QuantizedInnerProduct(b, state=lambda nbytes: mmap.mmap(-1, 7), **kw)
    with pytest.raises(TypeError, match="^state: expected a writable buffer, got bytes"):
        tn.QuantizedInnerProduct(b, state=lambda nbytes: bytes(nbytes), **kw)
    with pytest.raises(ValueError, match="^state: the buffer must start at a 64-byte boundary"):
        tn.QuantizedInnerProduct(b, state=lambda nbytes: memoryview(mmap.mmap(-1, nbytes + 1))[1:], **kw)
    with pytest.raises(TypeError, match="^state: expected a buffer, got int"):
        tn.QuantizedInnerProduct.attach(5)
    with pytest.raises(ValueError, match="^max_m"):
        tn.QuantizedInnerProduct.attach(mapped(filled_state(rng)), max_m=0)

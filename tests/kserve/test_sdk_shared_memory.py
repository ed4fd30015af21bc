"""The tensorops SDK through shared memory (`Client(shared_memory=True)`): every operation
bit-identical to tensorops_native, through the KServe endpoint's regions when the server
serves them (counted in its metrics), over the wire when it does not or when the result
does not fit; errors as over the wire; regions unlinked by close()."""

from __future__ import annotations

import os
from concurrent import futures

import numpy as np
import pytest

import tensorops
import tensorops_native as tn
from rpc_cases import cases, qip_params, same
from rpc_server import metric_value

CASES = [c for c in cases(seed=21) if not c.missing()]


def kserve_calls(server) -> float:
    return metric_value(
        server.metrics_text(), "tensorops_request_duration_seconds_count", operation="kserve_model_infer", code="OK"
    )


def regions_of_this_process() -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"tensorops_{os.getpid()}_")]


def test_every_operation(shm_server):
    before = kserve_calls(shm_server)
    with tensorops.Client(shm_server.target, shared_memory=True, shared_memory_min_bytes=0) as client:
        for case in CASES:
            expected = getattr(tn, case.op)(*case.args, **case.kwargs)
            assert same(expected, getattr(client, case.op)(*case.args, **case.kwargs)), case.id
        assert client.shared_memory and client.shared_memory_refusal is None
        assert regions_of_this_process()
    single_output = [c for c in CASES if c.op != "shuffle"]  # two outputs: over the wire
    assert kserve_calls(shm_server) - before == len(single_output)
    assert not regions_of_this_process()


def test_large_call_and_result_is_writable(shm_server):
    x = np.random.default_rng(1).standard_normal((1, 256, 64, 64)).astype(np.float32)  # 4 MiB
    scale, shift = np.ones(256, np.float32), np.zeros(256, np.float32)
    before = kserve_calls(shm_server)
    with tensorops.Client(shm_server.target, shared_memory=True) as client:
        y = client.layer_norm_channels(x, scale, shift)
        y2 = client.layer_norm_channels(x * 2, scale, shift)  # the region is reused: y is untouched
    assert same(tn.layer_norm_channels(x, scale, shift), y) and y.flags.writeable
    assert same(tn.layer_norm_channels(x * 2, scale, shift), y2)
    assert kserve_calls(shm_server) - before == 2


def test_recurring_and_varying_calls(shm_server):
    """The client keeps the requests of calls that recur (64 at most): calls that differ
    from one another in a parameter, a shape, a place or a small tensor in the message,
    more of them than it keeps, each get their own result."""
    rng = np.random.default_rng(3)
    before = kserve_calls(shm_server)
    calls = 0
    with tensorops.Client(shm_server.target, shared_memory=True, shared_memory_min_bytes=0) as client:
        x = client.shared_array((1, 8, 128, 8), np.float32)  # 32 KB: a copy goes into a region; 8 channels
        y = client.shared_array(x.shape, np.float32)
        x[...] = rng.standard_normal(x.shape)
        for i in range(70):
            scale = (rng.random(8) + 0.5).astype(np.float32)
            shift = rng.standard_normal(8).astype(np.float32)
            eps = 1e-5 * (1 + i % 40)
            fmt = ("nchw", "nhwc")[i % 2]
            given = x if i % 3 else np.array(x)  # in place, or copied into the call's region
            expected = tn.layer_norm_channels(given, scale, shift, eps=eps, format=fmt)
            assert same(expected, client.layer_norm_channels(given, scale, shift, eps=eps, format=fmt, out=y)), i
            calls += 1
            z = rng.standard_normal((i % 5 + 1, 64)).astype(np.float32)
            assert same(tn.softmax(z, axis=i % 2), client.softmax(z, axis=i % 2)), i
            calls += 1
    assert kserve_calls(shm_server) - before == calls


def test_concurrent_calls(shm_server):
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((64, 1024)).astype(np.float32) for _ in range(16)]
    with tensorops.Client(shm_server.target, shared_memory=True) as client:
        with futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda x: client.softmax(x), xs))
    for x, y in zip(xs, results, strict=True):
        assert same(tn.softmax(x), y)


def test_a_result_larger_than_its_room_goes_over_the_wire(shm_server):
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (256, 8), dtype=np.uint8)
    b = rng.integers(-128, 128, (8, 2048), dtype=np.int8)  # C: 256 x 2048 bytes, 8 x the inputs
    params = qip_params(rng, 2048)
    with tensorops.Client(shm_server.target, shared_memory=True, shared_memory_min_bytes=0) as client:
        c = client.quantized_inner_product(a, b, **params)
        assert client.shared_memory
    assert same(tn.quantized_inner_product(a, b, **params), c)


def test_errors_name_the_argument(shm_server):
    x = np.ones((64, 1024), np.float32)
    with tensorops.Client(shm_server.target, shared_memory=True) as client:
        with pytest.raises(tensorops.InvalidArgumentError) as info:
            client.softmax(x, axis=5)
        assert info.value.field == "axis"
        with pytest.raises(tensorops.InvalidArgumentError) as info:
            client.unary(x, "exq")
        assert info.value.field == "op"
        assert client.shared_memory


def test_falls_back_to_the_wire_when_the_server_refuses(server):
    x = np.random.default_rng(4).standard_normal((64, 1024)).astype(np.float32)
    with tensorops.Client(server.target, shared_memory=True) as client:
        assert same(tn.softmax(x), client.softmax(x))
        assert not client.shared_memory
        assert "--allow-shared-memory" in client.shared_memory_refusal
        assert same(tn.softmax(x), client.softmax(x))
    assert not regions_of_this_process()


def test_falls_back_when_the_prefix_is_not_the_servers(shm_server):
    x = np.random.default_rng(5).standard_normal((64, 1024)).astype(np.float32)
    with tensorops.Client(shm_server.target, shared_memory=True, shared_memory_prefix="other_") as client:
        assert same(tn.softmax(x), client.softmax(x))
        assert "PERMISSION_DENIED" in client.shared_memory_refusal


def test_asyncio_client(shm_server, server):
    import asyncio

    import tensorops.aio

    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((64, 1024)).astype(np.float32) for _ in range(6)]
    before = kserve_calls(shm_server)

    async def main(target):
        async with tensorops.aio.Client(target, shared_memory=True) as client:
            results = await asyncio.gather(*(client.softmax(x) for x in xs))
            return results, client.shared_memory, client.shared_memory_refusal

    results, on, refusal = asyncio.run(main(shm_server.target))
    assert on and refusal is None and kserve_calls(shm_server) - before == len(xs)
    assert all(same(tn.softmax(x), y) for x, y in zip(xs, results, strict=True))
    results, on, refusal = asyncio.run(main(server.target))  # refused: over the wire
    assert not on and "--allow-shared-memory" in refusal
    assert all(same(tn.softmax(x), y) for x, y in zip(xs, results, strict=True))
    assert not regions_of_this_process()


def server_regions(target) -> dict:
    """The regions the server holds for this (unauthenticated) caller, by tritonclient."""
    import tritonclient.grpc as tc

    with tc.InferenceServerClient(target) as triton:
        return dict(triton.get_system_shared_memory_status().regions)


def test_zero_copy_with_shared_arrays(shm_server):
    """An input in a shared_array is read where it is and an `out` in one receives the result
    from the kernel: the call uses no region of its own, and nothing is copied."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 32, 64, 64)).astype(np.float32)
    scale, shift = (rng.random(32) + 0.5).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    expected = tn.layer_norm_channels(x, scale, shift, eps=1e-4)
    before = kserve_calls(shm_server)
    others = set(server_regions(shm_server.target))
    with tensorops.Client(shm_server.target, shared_memory=True) as client:
        xs = client.shared_array(x.shape, np.float32)
        ys = client.shared_array(x.shape, "float32")
        assert xs.shape == x.shape and xs.flags.writeable and not np.may_share_memory(xs, ys)
        xs[...] = x
        for _ in range(2):
            ys.fill(7)
            assert client.layer_norm_channels(xs, scale, shift, eps=1e-4, out=ys) is ys
            assert same(expected, ys)
        arrays = set(server_regions(shm_server.target)) - others
        assert len(arrays) == 2  # the two arrays' regions only
        # a shared input, a new result (copied out of a region of the call)
        assert same(expected, client.layer_norm_channels(xs, scale, shift, eps=1e-4))
        others |= set(server_regions(shm_server.target)) - arrays  # the call's own region, kept for others
        # small tensors in shared arrays use them too, whatever shared_memory_min_bytes says
        small = client.shared_array((3, 5), np.float32)
        arrays |= set(server_regions(shm_server.target)) - others
        small[...] = x.reshape(-1)[:15].reshape(3, 5)
        assert same(tn.softmax(small), client.softmax(small))
        assert kserve_calls(shm_server) - before == 4
        del xs, ys, small
        import gc

        gc.collect()
        client.softmax(np.ones((4, 4), np.float32))  # the next call unregisters what is gone
        assert len(arrays) == 3 and not arrays & set(server_regions(shm_server.target))
    assert not regions_of_this_process()


@pytest.mark.parametrize("shared_memory", [True, False], ids=["shm", "wire"])
def test_out_receives_the_result(shm_server, shared_memory):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    with tensorops.Client(shm_server.target, shared_memory=shared_memory) as client:
        for op, call in (
            ("softmax", lambda out: client.softmax(x, out=out)),
            ("unary", lambda out: client.unary(x, "exp", out=out)),
            ("normalize", lambda out: client.normalize(x, axes=[1], out=out)),
        ):
            expected = getattr(tn, op)(
                x, *(("exp",) if op == "unary" else ()), **({"axes": [1]} if op == "normalize" else {})
            )
            out = np.full_like(x, 7)
            assert call(out) is out and same(expected, out), op


def test_bad_out_is_refused(shm_server):
    x = np.ones((64, 1024), np.float32)
    with tensorops.Client(shm_server.target, shared_memory=True) as client:
        shared = client.shared_array((64, 512), np.float32)
        frozen = np.empty_like(x)
        frozen.flags.writeable = False
        for out, error, message in (
            ([0.0], TypeError, "out: expected a numpy.ndarray, got list"),
            (np.empty((64, 2048), np.float32)[:, ::2], ValueError, "out: expected a writeable, aligned, C-contiguous"),
            (frozen, ValueError, "out: expected a writeable"),
            (x, ValueError, "out: must not overlap an input"),
            (np.empty_like(x, np.float64), TypeError, "out: expected dtype float32 (the result's), got float64"),
            (np.empty((32, 1024), np.float32), ValueError, "out: expected shape (64, 1024) (the result's)"),
            (shared, ValueError, "out: the result does not fit"),
        ):
            with pytest.raises(error) as info:
                client.softmax(x, out=out)
            assert str(info.value).startswith(message), (message, str(info.value))
        assert client.shared_memory  # refusals of `out` leave shared memory on


def test_shared_array_needs_shared_memory(server):
    with tensorops.Client(server.target) as client:
        with pytest.raises(ValueError, match="without shared_memory=True"):
            client.shared_array((4,), np.float32)
    with tensorops.Client(server.target, shared_memory=True) as client:  # the server refuses regions
        with pytest.raises(ValueError, match="shared memory is off for this client .*--allow-shared-memory"):
            client.shared_array((4,), np.float32)
    assert not regions_of_this_process()

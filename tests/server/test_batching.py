"""Dynamic batching of session forwards, through an in-process server with the NumPy
stand-in of the native context (whose forward is an exact int64 reference): concurrent
forwards are merged into one kernel call, every caller gets exactly its own rows, the
row cap holds, and one caller's failure, deadline or cancellation, or the session's
release, reaches nobody else."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

import tensorops
import tensorops.aio
from fake_qip import FakeQuantizedInnerProduct as Fake
from tensorops.protocol import wire
from tensorops.v1 import tensorops_pb2 as pb
from test_sessions_service import K, N, params, serve  # noqa: F401 - serve is a fixture (real servers with the fake kernel)

FORWARD = wire.FORWARD_SESSION


def batches(srv) -> list[tuple[float, float]]:
    """(kernel calls, forwards merged) of the server's batch histogram so far."""
    registry = srv.server.metrics.registry
    count = registry.get_sample_value("tensorops_forward_batch_requests_count") or 0
    total = registry.get_sample_value("tensorops_forward_batch_requests_sum") or 0
    return count, total


def max_rows_seen(srv) -> float:
    """The smallest bucket bound that holds every batch's row count."""
    registry = srv.server.metrics.registry
    count = registry.get_sample_value("tensorops_forward_batch_rows_count")
    for bound in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096):
        if registry.get_sample_value("tensorops_forward_batch_rows_bucket", {"le": str(float(bound))}) == count:
            return bound
    return float("inf")


async def forward_raw(c: tensorops.aio.Client, session_id: str, a, timeout=30):
    """One Forward without the session object (which would re-create a lost session)."""
    request = wire.build_request(FORWARD, {"session_id": session_id, "a": a})
    raw = await c._invoke(FORWARD.path, request.data, timeout=timeout)
    return wire.decode_response(FORWARD, raw)


def run(target, fn):
    async def main():
        async with tensorops.aio.Client(target, timeout=60) as c:
            return await fn(c)

    return asyncio.run(main())


def concurrent_forwards(srv, rng, rows):
    """Forwards of `rows` rows each, sent at once on one new session: (inputs, results, the
    in-process reference)."""
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    p = params(rng)
    inputs = [rng.integers(0, 256, (m, K), dtype=np.uint8) for m in rows]

    async def calls(c):
        s = await c.quantized_inner_product(b, **p)
        return await asyncio.gather(*(s.forward(a) for a in inputs))

    return inputs, run(srv.target, calls), Fake(b, **p)


def test_concurrent_forwards_are_merged_and_bit_identical(serve, rng):
    srv = serve(batch_window_us=50_000)  # every forward sent at once lands in one batch window
    inputs, results, reference = concurrent_forwards(srv, rng, [1, 3, 1, 2, 5, 1, 1, 4, 2, 1, 1, 3, 1, 1, 2, 1])
    for a, got in zip(inputs, results, strict=True):
        assert got.shape == (a.shape[0], N)
        assert np.array_equal(got, reference.forward(a))
    kernel_calls, merged = batches(srv)
    assert merged == len(inputs) and kernel_calls < len(inputs)  # merged, not one call each


def test_the_row_cap_splits_batches_and_a_larger_request_runs_alone(serve, rng):
    srv = serve(batch_window_us=50_000, max_batch_rows=8)
    inputs, results, reference = concurrent_forwards(srv, rng, [3, 3, 3, 2, 20, 1, 5])  # 20 rows: above the cap, alone
    assert all(np.array_equal(got, reference.forward(a)) for a, got in zip(inputs, results, strict=True))
    registry = srv.server.metrics.registry
    # every kernel call but the lone 20-row one held at most 8 rows
    assert (
        registry.get_sample_value("tensorops_forward_batch_rows_bucket", {"le": "8.0"})
        == registry.get_sample_value("tensorops_forward_batch_rows_count") - 1
    )
    kernel_calls, merged = batches(srv)
    assert merged == len(inputs) and kernel_calls >= 4  # 18 rows under the cap need 3 batches, plus the lone one


def test_batching_off_runs_every_forward_alone(serve, rng):
    srv = serve(batch_window_us=50_000, max_batch_rows=1)
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    p = params(rng)
    inputs = [rng.integers(0, 256, (m, K), dtype=np.uint8) for m in (1, 2, 1, 1)]

    async def calls(c):
        s = await c.quantized_inner_product(b, **p)
        return await asyncio.gather(*(s.forward(a) for a in inputs))

    results = run(srv.target, calls)
    assert all(np.array_equal(got, Fake(b, **p).forward(a)) for a, got in zip(inputs, results, strict=True))
    assert batches(srv) == (len(inputs), len(inputs))


def test_a_failing_or_expired_caller_affects_no_other(serve, rng):
    srv = serve(batch_window_us=100_000)
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    p = params(rng)
    good = [rng.integers(0, 256, (m, K), dtype=np.uint8) for m in (1, 2, 1)]
    wrong_k = rng.integers(0, 256, (1, K + 1), dtype=np.uint8)
    wrong_dtype = rng.integers(0, 256, (1, K)).astype(np.int32)

    async def calls(c):
        s = await c.quantized_inner_product(b, **p)
        sid = s.session_id
        outcomes = await asyncio.gather(
            forward_raw(c, sid, good[0]),
            forward_raw(c, sid, wrong_k),
            forward_raw(c, sid, good[1], timeout=0.02),  # expires during the batch window
            forward_raw(c, sid, wrong_dtype),
            forward_raw(c, sid, good[2]),
            return_exceptions=True,
        )
        return outcomes

    outcomes = run(srv.target, calls)
    reference = Fake(b, **p)
    assert np.array_equal(outcomes[0], reference.forward(good[0]))
    assert isinstance(outcomes[1], tensorops.InvalidArgumentError) and outcomes[1].field == "a"
    assert isinstance(outcomes[2], tensorops.DeadlineExceededError)
    assert isinstance(outcomes[3], (tensorops.InvalidArgumentError,)) and outcomes[3].field == "a"
    assert np.array_equal(outcomes[4], reference.forward(good[2]))
    kernel_calls, merged = batches(srv)
    assert merged == 2  # the two good ones that waited; the expired one never ran


def test_a_cancelled_caller_leaves_its_batch(serve, rng):
    srv = serve(batch_window_us=200_000)
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    p = params(rng)
    a = [rng.integers(0, 256, (1, K), dtype=np.uint8) for _ in range(3)]

    async def calls(c):
        s = await c.quantized_inner_product(b, **p)
        sid = s.session_id
        tasks = [asyncio.create_task(forward_raw(c, sid, x)) for x in a]
        await asyncio.sleep(0.05)
        tasks[1].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    outcomes = run(srv.target, calls)
    reference = Fake(b, **p)
    assert np.array_equal(outcomes[0], reference.forward(a[0]))
    assert isinstance(outcomes[1], asyncio.CancelledError)
    assert np.array_equal(outcomes[2], reference.forward(a[2]))
    assert batches(srv) == (1, 2)


def test_release_fails_the_forwards_still_waiting(serve, rng):
    srv = serve(batch_window_us=300_000)
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    p = params(rng)
    a = rng.integers(0, 256, (2, K), dtype=np.uint8)

    async def calls(c):
        s = await c.quantized_inner_product(b, **p)
        sid = s.session_id
        waiting = [asyncio.create_task(forward_raw(c, sid, a)) for _ in range(3)]
        await asyncio.sleep(0.05)
        await c._invoke(
            wire.method_path("ReleaseSession"), pb.ReleaseSessionRequest(session_id=sid).SerializeToString()
        )
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
        return outcomes, await c.list_sessions()

    outcomes, left = run(srv.target, calls)
    assert all(isinstance(o, tensorops.NotFoundError) and o.field == "session_id" for o in outcomes), outcomes
    assert left == [] and batches(srv) == (0, 0)
    assert all(f.closed for f in Fake.instances[-1:])  # the context was closed once its users left


def test_blocking_clients_are_batched_too(serve, rng):
    """16 threads of the blocking client, one row each, on one session."""
    import threading

    srv = serve(batch_window_us=20_000)
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    p = params(rng)
    inputs = [rng.integers(0, 256, (1, K), dtype=np.uint8) for _ in range(16)]
    results = [None] * 16
    with tensorops.Client(srv.target, timeout=60) as c:
        s = c.quantized_inner_product(b, **p)
        barrier = threading.Barrier(16)

        def worker(i):
            barrier.wait()
            results[i] = s.forward(inputs[i])

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    reference = Fake(b, **p)
    assert all(np.array_equal(got, reference.forward(a)) for a, got in zip(inputs, results, strict=True))
    kernel_calls, merged = batches(srv)
    assert merged == 16 and kernel_calls < 16


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def test_grpc_status_of_unknown_session_forward(serve, rng):
    srv = serve()
    with grpc.insecure_channel(srv.target) as channel:
        request = wire.build_request(FORWARD, {"session_id": "nope", "a": np.zeros((1, K), np.uint8)})
        with pytest.raises(grpc.RpcError) as err:
            channel.unary_unary(FORWARD.path)(request.data)
    assert err.value.code() is grpc.StatusCode.NOT_FOUND

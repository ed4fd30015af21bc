"""Quantized inner-product sessions through an in-process server, with a NumPy stand-in for
the native context (so this runs whether or not the kernel is in the build): create,
forward, describe, list, release, NOT_FOUND, eviction, TTL, concurrent forwards, and the
clients' transparent re-creation (after eviction, expiry, and a server restart)."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import numpy as np
import pytest

import tensorops
import tensorops.aio
from fake_qip import FakeQuantizedInnerProduct as Fake
from rpc_cases import qip_params
from rpc_server import free_port
from tensorops.v1 import tensorops_pb2 as pb
from tensorops_server import Config, TensorOpsServer

M, K, N = 6, 40, 9


def params(rng, n=N):
    return qip_params(rng, n)


class Running:
    def __init__(self, port=0, **overrides):
        config = Config(**dict(dict(port=port, metrics_port=-1, threads=4, grace=1.0), **overrides))
        self.server = TensorOpsServer(config, qip_class=Fake)
        self.server.start()
        self.target = f"127.0.0.1:{self.server.port}"

    def stop(self):
        self.server.stop(0.5)


@pytest.fixture
def serve():
    running = []

    def start(**overrides):
        r = Running(**overrides)
        running.append(r)
        return r

    yield start
    for r in running:
        r.stop()


@pytest.fixture
def rng():
    return np.random.default_rng(5)


def test_session_lifecycle(serve, rng):
    srv = serve()
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    p = params(rng)
    a = rng.integers(0, 256, (M, K), dtype=np.uint8)
    with tensorops.Client(srv.target) as c:
        s = c.quantized_inner_product(b, **p)
        # the session's memory: the stand-in keeps B as int64 beside its other parameters
        assert s.info == "fake: numpy int64" and s.internal_buffer_size == s.describe()["bytes"] > 8 * K * N
        assert np.array_equal(s.forward(a), Fake(b, **p).forward(a))
        assert np.array_equal(s.forward(a[:1]), Fake(b, **p).forward(a[:1]))  # any M
        assert s.external_buffer_size_for(100) == 4 * 100 * N
        d = s.describe()
        assert (d["n"], d["k"], d["forward_count"]) == (N, K, 2)
        listed = c.list_sessions()
        assert [x["session_id"] for x in listed] == [s.session_id]
        s.close()
        assert c.list_sessions() == []
        with pytest.raises(tensorops.SessionClosedError):
            s.forward(a)
        with c.QuantizedInnerProduct(np.ascontiguousarray(b.T), trans_b=True, **p) as t:
            assert np.array_equal(t.forward(a), Fake(b, **p).forward(a))
        assert c.list_sessions() == []


def test_errors_of_sessions(serve, rng):
    srv = serve()
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    with tensorops.Client(srv.target) as c:
        s = c.quantized_inner_product(b, **params(rng))
        with pytest.raises(tensorops.InvalidArgumentError) as err:
            s.forward(np.zeros((2, K), np.float32))
        assert err.value.field == "a"
        with pytest.raises(tensorops.InvalidArgumentError) as err:
            s.forward(np.zeros((2, K + 1), np.uint8))
        assert err.value.field == "a"
        with pytest.raises(tensorops.InvalidArgumentError) as err:
            s.external_buffer_size_for(-1)
        assert err.value.field == "m"
        with pytest.raises(tensorops.InvalidArgumentError) as err:  # native validation of the parameters
            c.quantized_inner_product(b.astype(np.int32), **params(rng))
        assert err.value.field == "b"
        p = params(rng)
        del p["a_scale"]
        with pytest.raises(tensorops.InvalidArgumentError) as err:  # unset on the wire -> None -> named
            c._open_session(dict(b=b, a_scale=None, **p), None, None)
        assert err.value.field == "a_scale"
        with grpc.insecure_channel(srv.target) as channel:
            for rpc, request in [
                ("QuantizedInnerProductForward", pb.QuantizedInnerProductForwardRequest(session_id="x")),
                ("DescribeSession", pb.DescribeSessionRequest(session_id="x")),
                ("ReleaseSession", pb.ReleaseSessionRequest(session_id="x")),
            ]:
                call = channel.unary_unary(f"/tensorops.v1.TensorOps/{rpc}")
                with pytest.raises(grpc.RpcError) as raw_err:
                    call(request.SerializeToString())
                e = tensorops._errors.from_rpc_error(raw_err.value)
                assert isinstance(e, tensorops.NotFoundError) and e.field == "session_id", rpc


def test_session_memory_cap(serve, rng):
    srv = serve(max_session_bytes=K * N * 2)
    with tensorops.Client(srv.target) as c:
        with pytest.raises(tensorops.ResourceExhaustedError) as err:
            c.quantized_inner_product(rng.integers(-128, 128, (K, 3 * N), dtype=np.int8), **params(rng, 3 * N))
        assert err.value.field == "b"


def test_eviction_and_transparent_recreation(serve, rng):
    srv = serve(max_sessions=2)
    a = rng.integers(0, 256, (M, K), dtype=np.uint8)
    bs = [rng.integers(-128, 128, (K, N), dtype=np.int8) for _ in range(3)]
    ps = [params(rng) for _ in range(3)]
    with tensorops.Client(srv.target) as c:
        sessions = [
            c.quantized_inner_product(b, **p) for b, p in zip(bs, ps, strict=True)
        ]  # the third evicts the first
        assert len(c.list_sessions()) == 2
        with grpc.insecure_channel(srv.target) as channel:
            describe = channel.unary_unary("/tensorops.v1.TensorOps/DescribeSession")
            with pytest.raises(grpc.RpcError) as err:
                describe(pb.DescribeSessionRequest(session_id=sessions[0].session_id).SerializeToString())
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        old_id = sessions[0].session_id
        assert np.array_equal(sessions[0].forward(a), Fake(bs[0], **ps[0]).forward(a))
        assert sessions[0].recreated == 1 and sessions[0].session_id != old_id
        # ... which evicted the least recently used: sessions[1]
        assert np.array_equal(sessions[1].forward(a), Fake(bs[1], **ps[1]).forward(a))
        assert sessions[1].recreated == 1 and sessions[2].recreated == 0
        evictions = srv.server.metrics.evictions.labels("capacity")._value.get()
        assert evictions == 3


def test_ttl_expiry_and_recreation(serve, rng):
    srv = serve(session_ttl=0.3)
    a = rng.integers(0, 256, (M, K), dtype=np.uint8)
    b, p = rng.integers(-128, 128, (K, N), dtype=np.int8), params(rng)
    with tensorops.Client(srv.target) as c:
        s = c.quantized_inner_product(b, **p)
        s.forward(a)
        time.sleep(0.45)
        assert c.list_sessions() == []  # expired
        assert np.array_equal(s.forward(a), Fake(b, **p).forward(a))
        assert s.recreated >= 1  # once, or twice on a machine slow enough to expire it early


def test_recreation_after_server_restart(rng):
    port = free_port()
    first = Running(port=port)
    a = rng.integers(0, 256, (M, K), dtype=np.uint8)
    b, p = rng.integers(-128, 128, (K, N), dtype=np.int8), params(rng)
    expected = Fake(b, **p).forward(a)
    with tensorops.Client(f"127.0.0.1:{port}") as c:
        s = c.quantized_inner_product(b, **p)
        assert np.array_equal(s.forward(a), expected)
        first.stop()
        second = Running(port=port)
        try:
            assert np.array_equal(s.forward(a), expected)
            assert s.recreated == 1
        finally:
            second.stop()


def test_async_session_recreation(serve, rng):
    srv = serve(max_sessions=1)
    a = rng.integers(0, 256, (M, K), dtype=np.uint8)
    b, p = rng.integers(-128, 128, (K, N), dtype=np.int8), params(rng)

    async def main():
        async with tensorops.aio.Client(srv.target) as c:
            s = await c.quantized_inner_product(b, **p)
            first = await s.forward(a)
            other = await c.QuantizedInnerProduct(b, **p)  # evicts s
            second = await s.forward(a)
            size = await s.external_buffer_size_for(3)
            await other.close()
            async with s:
                pass
            return first, second, s.recreated, size, await c.list_sessions()

    first, second, recreated, size, left = asyncio.run(main())
    expected = Fake(b, **p).forward(a)
    assert np.array_equal(first, expected) and np.array_equal(second, expected)
    assert recreated == 1 and size == 4 * 3 * N and left == []


def test_concurrent_forwards_on_one_session(serve, rng):
    srv = serve(threads=8)
    b, p = rng.integers(-128, 128, (K, N), dtype=np.int8), params(rng)
    inputs = [rng.integers(0, 256, (1 + i % 5, K), dtype=np.uint8) for i in range(16)]
    expected = [Fake(b, **p).forward(a) for a in inputs]
    failures = []
    with tensorops.Client(srv.target) as c:
        s = c.quantized_inner_product(b, **p)

        def worker(t):
            for i in range(t, len(inputs) * 4, 8):
                if not np.array_equal(s.forward(inputs[i % len(inputs)]), expected[i % len(inputs)]):
                    failures.append(i)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert s.describe()["forward_count"] == len(inputs) * 4
    assert failures == []

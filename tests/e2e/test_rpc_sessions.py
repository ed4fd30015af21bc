"""Quantized inner-product sessions on a real server with the real kernel: results as
in-process, NOT_FOUND, eviction, TTL, and transparent re-creation after a restart."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

import tensorops
import tensorops_native as tn
from rpc_cases import qip_params

M, K, N = 7, 45, 13


@pytest.fixture(autouse=True)
def needs_the_kernel():
    missing = [k for k, level in tn.kernels().items() if "Quantized" in k and level == "missing"]
    assert not missing, f"missing from this build (a call would crash): {', '.join(missing)}"


@pytest.fixture
def problem():
    rng = np.random.default_rng(11)
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    p = qip_params(rng, N)
    a = rng.integers(0, 256, (M, K), dtype=np.uint8)
    with tn.QuantizedInnerProduct(b, **p) as local:
        expected = local.forward(a)
        info = local.info
    return b, p, a, expected, info


def test_session_matches_native(client, problem):
    b, p, a, expected, info = problem
    with client.quantized_inner_product(b, **p) as s:
        assert s.info == info
        assert np.array_equal(s.forward(a), expected)
        assert np.array_equal(s.forward(a[2:3]), expected[2:3])
        with tn.QuantizedInnerProduct(b, **p) as local:  # the session's memory is the context's state
            assert s.internal_buffer_size == local.state_size
            assert s.external_buffer_size_for(M) == local.external_buffer_size_for(M)
    assert np.array_equal(client.quantized_inner_product(a, b, **p), expected)


def test_async_session_matches_native(server, run_async, problem):
    b, p, a, expected, _ = problem

    async def use(c):
        async with await c.quantized_inner_product(b, **p) as s:
            return await s.forward(a)

    assert np.array_equal(run_async(server.target, use), expected)


def test_eviction_and_ttl_are_transparent(start_server, problem):
    b, p, a, expected, _ = problem
    srv = start_server("--max-sessions", "1", "--session-ttl", "0.5")
    with tensorops.Client(srv.target, timeout=30) as c:
        s1 = c.quantized_inner_product(b, **p)
        s2 = c.quantized_inner_product(b, **p)  # evicts s1
        assert np.array_equal(s1.forward(a), expected) and s1.recreated == 1
        time.sleep(0.8)
        assert np.array_equal(s2.forward(a), expected) and s2.recreated == 1


def test_recreated_after_server_restart(start_server, problem):
    b, p, a, expected, _ = problem
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    first = start_server(port=port)
    with tensorops.Client(first.target, timeout=30) as c:
        s = c.quantized_inner_product(b, **p)
        assert np.array_equal(s.forward(a), expected)
        assert first.stop() == 0
        start_server(port=port)
        assert np.array_equal(s.forward(a), expected) and s.recreated == 1


@pytest.mark.parametrize("window_us", ["0", "20000"])
def test_batched_forwards_of_the_real_kernel_are_bit_identical(start_server, run_async, window_us):
    """64 concurrent forwards of 1-9 rows on a 1024 x 1024 session (AMX, VNNI or AVX2 rows
    depending on M) give exactly the rows of separate in-process forwards."""
    from rpc_server import metric_value

    srv = start_server("--batch-window-us", window_us, "--max-batch-rows", "32")
    rng = np.random.default_rng(3)
    k = n = 1024
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    p = qip_params(rng, n)
    inputs = [rng.integers(0, 256, (int(m), k), dtype=np.uint8) for m in rng.integers(1, 10, 64)]
    with tn.QuantizedInnerProduct(b, **p) as local:
        expected = [local.forward(a) for a in inputs]

    async def use(c):
        async with await c.quantized_inner_product(b, **p) as s:
            import asyncio

            return await asyncio.gather(*(s.forward(a) for a in inputs))

    results = run_async(srv.target, use)
    assert all(np.array_equal(got, want) for got, want in zip(results, expected, strict=True))
    text = srv.metrics_text()
    merged = metric_value(text, "tensorops_forward_batch_requests_sum")
    kernel_calls = metric_value(text, "tensorops_forward_batch_requests_count")
    assert merged == len(inputs)
    if window_us != "0":  # without a window, merging depends on how fast calls arrive
        assert kernel_calls < len(inputs)

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
    return metric_value(server.metrics_text(), "tensorops_request_duration_seconds_count",
                        operation="kserve_model_infer", code="OK")


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


def test_concurrent_calls(shm_server):
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((64, 1024)).astype(np.float32) for _ in range(16)]
    with tensorops.Client(shm_server.target, shared_memory=True) as client:
        with futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda x: client.softmax(x), xs))
    for x, y in zip(xs, results):
        assert same(tn.softmax(x), y)


def test_a_result_larger_than_its_room_goes_over_the_wire(shm_server):
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (256, 8), dtype=np.uint8)
    b = rng.integers(-128, 128, (8, 2048), dtype=np.int8)      # C: 256 x 2048 bytes, 8 x the inputs
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
    assert all(same(tn.softmax(x), y) for x, y in zip(xs, results))
    results, on, refusal = asyncio.run(main(server.target))  # refused: over the wire
    assert not on and "--allow-shared-memory" in refusal
    assert all(same(tn.softmax(x), y) for x, y in zip(xs, results))
    assert not regions_of_this_process()

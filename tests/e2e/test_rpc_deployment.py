"""What a deployment behind a balancer relies on: the instance name in GetServerInfo, the
drain (NOT_SERVING while still serving, then stop), the connection age, and the session
routing key the client sends with every call of a session."""

from __future__ import annotations

import asyncio
import signal
import socket
import time

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

import tensorops
import tensorops.aio
import tensorops_native as tn
from rpc_cases import qip_problem

SERVICE = "tensorops.v1.TensorOps"


def test_instance_is_the_host_name_unless_named(server, start_server):
    with tensorops.Client(server.target, timeout=10) as c:
        assert c.info()["instance"] == socket.gethostname()
    named = start_server("--instance-name", "r7")
    with tensorops.Client(named.target, timeout=10) as c:
        assert c.info()["instance"] == "r7"


def test_drain_reports_not_serving_while_still_serving(start_server):
    srv = start_server("--drain-delay", "1.5", "--grace", "5")
    x = np.arange(8, dtype=np.float32)
    with grpc.insecure_channel(srv.target) as channel, tensorops.Client(srv.target, timeout=5, max_attempts=1) as c:
        health = health_pb2_grpc.HealthStub(channel)
        check = health_pb2.HealthCheckRequest(service=SERVICE)
        assert health.Check(check, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        signalled = time.monotonic()
        srv.signal(signal.SIGTERM)
        statuses, calls = [], 0
        while time.monotonic() < signalled + 1.2:  # inside the drain delay: everything answers
            statuses.append(health.Check(check, timeout=5).status)
            assert np.array_equal(c.softmax(x), tn.softmax(x))
            calls += 1
            time.sleep(0.02)
        first = statuses.index(health_pb2.HealthCheckResponse.NOT_SERVING)
        assert time.monotonic() - signalled < 1.5
        assert set(statuses[first:]) == {health_pb2.HealthCheckResponse.NOT_SERVING}
        assert first < len(statuses) - 10 and calls > 10
    assert srv.wait(30) == 0
    assert time.monotonic() - signalled >= 1.5
    draining = [e for e in srv.events() if e.get("event") == "draining"]
    assert draining and draining[0]["drain_delay_seconds"] == 1.5


def goaway_after(port: int, limit: float) -> float | None:
    """Seconds until the server sends GOAWAY on an idle HTTP/2 connection (None: not
    within `limit`). Reads raw frames: a 9-byte header (length, type, flags, stream)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))  # preface, SETTINGS
        opened, buffer = time.monotonic(), b""
        sock.settimeout(0.1)
        while time.monotonic() < opened + limit:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                return None
            buffer += data
            while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                if buffer[3] == 0x7:  # GOAWAY
                    return time.monotonic() - opened
                buffer = buffer[9 + int.from_bytes(buffer[:3], "big") :]
        return None
    finally:
        sock.close()


def test_connection_age_sends_goaway_and_calls_go_on(start_server):
    srv = start_server("--max-connection-age", "0.5", "--max-connection-age-grace", "1")
    after = goaway_after(srv.port, 5)
    assert after is not None and 0.4 < after < 3, after
    assert goaway_after(start_server().port, 1.5) is None  # the default age is minutes
    x = np.arange(8, dtype=np.float32)
    with tensorops.Client(srv.target, timeout=5) as c:  # a client simply reconnects
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert np.array_equal(c.softmax(x), tn.softmax(x))


def session_problem():
    return qip_problem(5, m=3, k=16, n=8)


class Recording(tensorops.Client):
    """A client that records the metadata of every call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def _invoke(self, path, data, timeout=None, metadata=None):
        self.calls.append((path.rsplit("/", 1)[1], dict(metadata or ())))
        return super()._invoke(path, data, timeout, metadata)


def test_every_session_call_carries_its_routing_key(start_server):
    srv = start_server("--max-sessions", "1")
    b, p, a, expected = session_problem()
    key = tensorops.SESSION_KEY_HEADER
    with Recording(srv.target, timeout=10) as c:
        s = c.quantized_inner_product(b, **p)
        assert np.array_equal(s.forward(a), expected)
        other = c.quantized_inner_product(b, **p)  # evicts s (one session at most)
        assert np.array_equal(s.forward(a), expected)  # NOT_FOUND: re-created, same key
        assert s.recreated == 1 and s.describe()["session_id"] == s.session_id
        s.close()
        other.close()
        c.softmax(np.zeros(4, np.float32))
    assert len(s.routing_key) == 32 and s.routing_key != other.routing_key
    session_calls = [(rpc, md[key]) for rpc, md in c.calls if rpc != "Softmax"]
    assert [rpc for rpc, _ in session_calls] == [
        "CreateQuantizedInnerProduct",
        "QuantizedInnerProductForward",
        "CreateQuantizedInnerProduct",
        "QuantizedInnerProductForward",
        "CreateQuantizedInnerProduct",
        "QuantizedInnerProductForward",
        "DescribeSession",
        "ReleaseSession",
        "ReleaseSession",
    ]
    keys = [k for _, k in session_calls]
    assert keys[2] == other.routing_key and keys[-1] == other.routing_key
    assert set(keys[:2] + keys[3:-1]) == {s.routing_key}
    assert key not in dict(c.calls[-1][1])  # stateless calls carry no key


def test_async_session_calls_carry_the_routing_key(start_server):
    srv = start_server("--max-sessions", "1")
    b, p, a, expected = session_problem()
    seen = []

    class AsyncRecording(tensorops.aio.Client):
        async def _invoke(self, path, data, timeout=None, metadata=None):
            seen.append((path.rsplit("/", 1)[1], dict(metadata or ()).get(tensorops.SESSION_KEY_HEADER)))
            return await super()._invoke(path, data, timeout, metadata)

    async def main():
        async with AsyncRecording(srv.target, timeout=10) as c:
            s = await c.quantized_inner_product(b, **p)
            first = await s.forward(a)
            other = await c.quantized_inner_product(b, **p)  # evicts s
            second = await s.forward(a)  # re-created with the same key
            await s.close()
            await other.close()
            return s, other, first, second

    s, other, first, second = asyncio.run(main())
    assert np.array_equal(first, expected) and np.array_equal(second, expected) and s.recreated == 1
    assert [k for rpc, k in seen if k != other.routing_key] == [s.routing_key] * 6
    assert [rpc for rpc, k in seen if k == other.routing_key] == ["CreateQuantizedInnerProduct", "ReleaseSession"]
    assert None not in [k for _, k in seen]

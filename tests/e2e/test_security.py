"""Attacks on a live server, each as a regression test: stalled streams, output
amplification, work beyond the deadline, floods past the in-flight byte cap, health
under load; token authentication and per-caller session isolation; the status recorded
for every call; clean startup failures; SIGTERM while a long kernel runs."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import tensorops
import tensorops_native as tn
from rpc_cases import BF16, qip_params, same
from rpc_server import LIST_SERVICES, metric_value, reflection_call, resident_bytes
from tensorops.protocol import wire
from tensorops.v1 import tensorops_pb2 as pb

LAYER_NORM = wire.OPERATIONS["layer_norm_channels"]
# The scalar kernels make a product of 8192 x 2048 x 2048 take seconds (AMX would take
# milliseconds): long work without a huge request.
SLOW_KERNELS = {"TENSOROPS_ISA": "scalar"}
# The tests of one process's admission and memory: a server of several processes shares its
# caps out among its workers (docs/running.md, "Workers"; tests/e2e/test_workers.py).
ONE_PROCESS = ("--workers", "1")


def health_latency(target: str, timeout: float = 5.0) -> float:
    """Seconds one health check takes on a fresh channel (so no other call shares it)."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        grpc.channel_ready_future(channel).result(timeout=timeout)
        start = time.perf_counter()
        answer = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        elapsed = time.perf_counter() - start
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    return elapsed


def layer_norm_case(rows=64, channels=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, rows, channels)).astype(np.float32)
    scale, shift = rng.standard_normal(channels).astype(np.float32), rng.standard_normal(channels).astype(np.float32)
    return (x, scale, shift), tn.layer_norm_channels(x, scale, shift, format="nhwc")


# ---------------------------------------------------------------------------------------
# Stalled streams: raw HTTP/2 that declares a message and never finishes it


class StalledStreams:
    """A raw HTTP/2 connection (the h2 library) with streams that each declare a
    1000-byte gRPC message and send 10 bytes of it."""

    def __init__(self, port: int, streams: int):
        import h2.config
        import h2.connection

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.ended: set[int] = set()
        for _ in range(streams):
            self.open()

    def open(self) -> int:
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", LAYER_NORM.path),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        self.conn.send_data(stream, b"\x00" + (1000).to_bytes(4, "big") + bytes(10))
        self.sock.sendall(self.conn.data_to_send())
        return stream

    def poll(self, seconds: float) -> set[int]:
        """Read what the server sends for `seconds`; returns the streams it ended."""
        import h2.events

        self.sock.settimeout(0.1)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                break
            for event in self.conn.receive_data(data):
                if isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                    self.ended.add(event.stream_id)
            self.sock.sendall(self.conn.data_to_send())
        return self.ended

    def close(self) -> None:
        self.sock.close()


def test_stalled_streams_hold_no_worker_and_time_out(start_server):
    srv = start_server(
        "--threads",
        "2",
        "--max-concurrent-rpcs",
        "4",
        "--read-timeout",
        "2",
        "--max-pending-requests",
        "16",
        *ONE_PROCESS,
    )
    stalled = StalledStreams(srv.port, streams=12)  # more than workers and the concurrency limit
    try:
        time.sleep(0.3)
        args, expected = layer_norm_case()
        with tensorops.Client(srv.target, timeout=10) as c:
            for _ in range(20):  # real calls and health keep working while the streams stall
                assert np.array_equal(c.layer_norm_channels(*args, format="nhwc"), expected)
        print(f"\nhealth latency with 12 stalled streams: {health_latency(srv.target) * 1e3:.1f} ms")
        ended = stalled.poll(4.0)  # the read timeout (2 s) cuts every stalled stream off
        assert len(ended) == 12, ended
    finally:
        stalled.close()
    text = srv.metrics_text()
    assert metric_value(text, "tensorops_errors_total", operation="layer_norm_channels", code="DEADLINE_EXCEEDED") == 12


def test_beyond_the_pending_limit_the_longest_waiting_stream_goes(start_server):
    srv = start_server("--max-pending-requests", "4", "--read-timeout", "30", *ONE_PROCESS)
    stalled = StalledStreams(srv.port, streams=4)
    try:
        stalled.poll(0.3)
        first = sorted(stalled.conn.streams)
        for _ in range(3):
            stalled.open()
        assert stalled.poll(1.0) == set(first[:3])  # the three that waited longest lost their places
        args, expected = layer_norm_case()
        with tensorops.Client(srv.target, timeout=10) as c:  # a complete request is read at once: it runs
            for _ in range(5):
                assert np.array_equal(c.layer_norm_channels(*args, format="nhwc"), expected)
        health_latency(srv.target)
        assert first[3] in stalled.poll(0.5)  # and took the place of the next oldest stalled stream
    finally:
        stalled.close()
    assert (
        metric_value(
            srv.metrics_text(), "tensorops_errors_total", operation="layer_norm_channels", code="RESOURCE_EXHAUSTED"
        )
        == 4
    )


# ---------------------------------------------------------------------------------------
# Output amplification and work beyond the deadline


def test_amplifying_products_are_refused_before_any_allocation(server):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (32768, 1), dtype=np.uint8)
    b = rng.integers(-128, 128, (1, 32768), dtype=np.int8)
    p = qip_params(rng, 32768)
    before = resident_bytes(server.proc.pid)
    with tensorops.Client(server.target, timeout=30) as c:
        start = time.perf_counter()
        with pytest.raises(tensorops.ResourceExhaustedError) as err:
            c.quantized_inner_product(a, b, **p)
        refused_in = time.perf_counter() - start
        assert err.value.field == "a" and "would exceed" in str(err.value)
        session = c.quantized_inner_product(b, **p)  # a session of 1 x 32768: a forward of 32768 rows
        with pytest.raises(tensorops.ResourceExhaustedError) as err:
            session.forward(a)
        assert err.value.field == "a"
        session.close()
    grown = resident_bytes(server.proc.pid) - before
    print(f"\namplification refused in {refused_in * 1e3:.1f} ms; server memory grew {grown / 2**20:.1f} MiB")
    assert grown < 64 << 20  # the 1 GiB result was never allocated


def test_an_empty_image_cannot_make_a_huge_channel_sum(start_server):
    """channel_sum's result is (batch, channels) float32 whatever the spatial size: an x of
    shape (2**24, 4, 0) is 12 request bytes and a 256 MiB result. (Found by the live fuzzer:
    the server allocated, filled and serialized the result before refusing the response.)"""
    srv = start_server("--max-tensor-bytes", str(1 << 20), "--max-message-bytes", str(4 << 20))
    before = resident_bytes(srv.proc.pid, "VmHWM")
    with tensorops.Client(srv.target, timeout=30) as c:
        for shape, fmt in (((1 << 24, 4, 0), "nchw"), ((1 << 24, 0, 4), "nhwc"), ((4, 1 << 24, 0, 9), "nchw")):
            with pytest.raises(tensorops.ResourceExhaustedError) as err:
                c.channel_sum(np.empty(shape, BF16), format=fmt)
            assert err.value.field == "x" and "would exceed" in str(err.value), err.value
        small = np.empty((3, 0, 5), BF16)  # an empty x within the limit: zeros, as in-process
        assert same(c.channel_sum(small, format="nhwc"), tn.channel_sum(small, format="nhwc"))
    grown = resident_bytes(srv.proc.pid, "VmHWM") - before
    print(f"\nempty-image channel sums refused; server peak memory grew {grown / 2**20:.1f} MiB")
    assert grown < 64 << 20  # no result was allocated


def test_failed_calls_free_their_requests_at_once(start_server):
    """A failed call must not keep its request alive. The exception a kernel raised, the
    future that carried it to the event loop and grpc's abort made reference cycles with
    the frames that held the request, freed only by Python's cyclic collector: invalid
    8 MiB requests sent back to back made the server hold hundreds of MiB. (Found by the
    live fuzzer, whose server's memory kept growing with the campaign.)"""
    srv = start_server("--max-message-bytes", str(16 << 20), "--max-tensor-bytes", str(16 << 20))
    x = np.zeros((2048, 1024), np.float32)  # 8 MiB, offloaded to a worker; axis 5 is out of range
    with tensorops.Client(srv.target, timeout=30) as c:
        for i in range(200):
            if i == 20:  # warm: the heaps hold their working set
                warm = resident_bytes(srv.proc.pid)
            with pytest.raises(tensorops.InvalidArgumentError) as err:
                c.softmax(x, axis=5)
            assert err.value.field == "axis"
    grown = resident_bytes(srv.proc.pid, "VmHWM") - warm
    print(f"\n200 failed 8 MiB calls: server peak memory {grown / 2**20:.0f} MiB above the warm level")
    assert grown < 96 << 20  # a few requests' worth (received, decoded, retained by malloc), not dozens


def test_a_long_product_stops_at_its_deadline(start_server):
    srv = start_server("--threads", "1", env=SLOW_KERNELS)
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (8192, 2048), dtype=np.uint8)  # 16 MiB in, 8192 x 2048 x 2048 multiply-adds:
    b = rng.integers(-128, 128, (2048, 2048), dtype=np.int8)  # seconds of work
    p = qip_params(rng, 2048)
    args, expected = layer_norm_case()
    with tensorops.Client(srv.target, timeout=60) as c:
        start = time.perf_counter()
        with pytest.raises(tensorops.DeadlineExceededError):
            c.quantized_inner_product(a, b, **p, timeout=0.5)
        # the single worker is free again soon after the deadline: the next call (which
        # needs it: 16 MiB goes to a worker) completes
        big = rng.standard_normal((4096, 1024)).astype(np.float32)
        assert np.array_equal(c.softmax(big, timeout=30), tn.softmax(big))
        elapsed = time.perf_counter() - start
    print(f"\nlong product: deadline 0.5 s, worker free and the next call done after {elapsed:.2f} s")
    text = srv.metrics_text()
    assert (
        metric_value(text, "tensorops_errors_total", operation="quantized_inner_product", code="DEADLINE_EXCEEDED")
        + metric_value(text, "tensorops_errors_total", operation="quantized_inner_product", code="CANCELLED")
        == 1
    )


# ---------------------------------------------------------------------------------------
# Floods

FLOOD_CLIENT = """
import sys, numpy as np, tensorops, tensorops_native as tn
x = np.random.default_rng(int(sys.argv[2])).standard_normal((2048, 2048)).astype(np.float32)  # 16 MiB
expected = tn.softmax(x)
with tensorops.Client(sys.argv[1], timeout=60, max_attempts=1) as c:
    for _ in range(int(sys.argv[3])):
        try:
            print("ok" if np.array_equal(c.softmax(x), expected) else "WRONG", flush=True)
        except tensorops.ResourceExhaustedError:
            print("shed", flush=True)
"""


def test_floods_past_the_inflight_cap_are_shed_and_memory_stays_bounded(start_server):
    """Six client processes send 16 MiB softmax calls (each charges 48 MiB: request,
    result and response) against a 64 MiB in-flight cap, while this process probes the
    health service."""
    srv = start_server("--max-inflight-bytes", str(64 << 20), "--threads", "2", *ONE_PROCESS)
    peak = [resident_bytes(srv.proc.pid)]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], resident_bytes(srv.proc.pid))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", FLOOD_CLIENT, srv.target, str(i), "4"], stdout=subprocess.PIPE, text=True
        )
        for i in range(6)
    ]
    latencies = []
    try:
        while any(p.poll() is None for p in clients):
            latencies.append(health_latency(srv.target))
            time.sleep(0.02)
        outcomes = [line.strip() for p in clients for line in p.communicate(timeout=120)[0].splitlines()]
    finally:
        stop.set()
        watcher.join()
        for p in clients:
            p.kill()
    latencies.sort()
    print(
        f"\nflood: {outcomes.count('ok')} admitted, {outcomes.count('shed')} shed; peak server memory "
        f"{peak[0] / 2**20:.0f} MiB; {len(latencies)} health checks: median "
        f"{latencies[len(latencies) // 2] * 1e3:.1f} ms, worst {latencies[-1] * 1e3:.1f} ms"
    )
    assert len(outcomes) == 24 and "WRONG" not in outcomes
    assert outcomes.count("shed") > 0 and outcomes.count("ok") > 0
    # admitted calls hold at most 64 MiB (+ their copies in gRPC's buffers); the rest is
    # requests being received (6 x 16 MiB) and the interpreter
    assert peak[0] < 900 << 20


# ---------------------------------------------------------------------------------------
# Authentication and isolation


def bearer(token):
    return (("authorization", f"Bearer {token}"),)


def test_tokens_are_required_except_for_health_and_reflection(start_server):
    srv = start_server(env={"TENSOROPS_AUTH_TOKENS": "alpha-token, beta-token"})
    args, expected = layer_norm_case()
    with tensorops.Client(srv.target, timeout=10) as c:
        with pytest.raises(tensorops.TensorOpsError) as err:
            c.layer_norm_channels(*args, format="nhwc")
        assert err.value.code is grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(tensorops.TensorOpsError) as err:
            c.layer_norm_channels(*args, format="nhwc", metadata=bearer("gamma-token"))
        assert err.value.code is grpc.StatusCode.UNAUTHENTICATED
        for token in ("alpha-token", "beta-token"):  # two valid at once, as during a rotation
            assert np.array_equal(c.layer_norm_channels(*args, format="nhwc", metadata=bearer(token)), expected)
    health_latency(srv.target)  # open without a token
    for service in ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"):
        [listed] = reflection_call(srv.target, service, [LIST_SERVICES])
        assert "tensorops.v1.TensorOps" in {s.name for s in listed.list_services_response.service}


def test_the_token_file_is_re_read_for_rotation(start_server, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("old-token\n")
    srv = start_server("--auth-token-file", str(tokens))
    args, expected = layer_norm_case()

    def works(token):
        try:
            c.layer_norm_channels(*args, format="nhwc", metadata=bearer(token))
            return True
        except tensorops.TensorOpsError as exc:
            assert exc.code is grpc.StatusCode.UNAUTHENTICATED
            return False

    def eventually(condition, seconds=5.0):
        deadline = time.monotonic() + seconds
        while not condition():
            assert time.monotonic() < deadline
            time.sleep(0.1)

    with tensorops.Client(srv.target, timeout=10) as c:
        assert works("old-token") and not works("new-token")
        tokens.write_text("# rotation\nold-token\nnew-token\n")
        eventually(lambda: works("new-token"))
        assert works("old-token")
        tokens.write_text("new-token\n")
        eventually(lambda: not works("old-token"))
        assert works("new-token")


def test_sessions_are_invisible_to_other_callers(start_server):
    srv = start_server(env={"TENSOROPS_AUTH_TOKENS": "alpha-token,beta-token"})
    rng = np.random.default_rng(3)
    b = rng.integers(-128, 128, (16, 8), dtype=np.int8)
    p = qip_params(rng, 8)
    a = rng.integers(0, 256, (2, 16), dtype=np.uint8)
    alpha, beta = bearer("alpha-token"), bearer("beta-token")
    with (
        tensorops.Client(srv.target, timeout=10, metadata=alpha) as ca,
        tensorops.Client(srv.target, timeout=10, metadata=beta) as cb,
    ):
        session = ca.quantized_inner_product(b, **p)
        sid = session.session_id
        assert [s["session_id"] for s in ca.list_sessions()] == [sid]
        assert cb.list_sessions() == []
        forward = wire.build_request(wire.FORWARD_SESSION, {"session_id": sid, "a": a}).data
        describe = pb.DescribeSessionRequest(session_id=sid).SerializeToString()
        release = pb.ReleaseSessionRequest(session_id=sid).SerializeToString()
        for path, request in (
            (wire.FORWARD_SESSION.path, forward),
            (wire.method_path("DescribeSession"), describe),
            (wire.method_path("ReleaseSession"), release),
        ):
            with pytest.raises(tensorops.NotFoundError):
                cb._invoke(path, request)
        with tn.QuantizedInnerProduct(b, **p) as local:
            assert np.array_equal(session.forward(a), local.forward(a))  # still there for its owner


def test_one_caller_cannot_evict_the_sessions_of_another(start_server):
    srv = start_server(
        "--max-sessions",
        "4",
        "--max-sessions-per-caller",
        "2",
        env={"TENSOROPS_AUTH_TOKENS": "alpha-token,beta-token,gamma-token"},
    )
    rng = np.random.default_rng(4)
    b = rng.integers(-128, 128, (16, 8), dtype=np.int8)
    p = qip_params(rng, 8)
    clients = {
        name: tensorops.Client(srv.target, timeout=10, metadata=bearer(f"{name}-token"))
        for name in ("alpha", "beta", "gamma")
    }
    try:
        alpha = [clients["alpha"].quantized_inner_product(b, **p) for _ in range(2)]
        beta = [clients["beta"].quantized_inner_product(b, **p) for _ in range(3)]  # evicts beta's own first
        assert sorted(s["session_id"] for s in clients["alpha"].list_sessions()) == sorted(s.session_id for s in alpha)
        assert sorted(s["session_id"] for s in clients["beta"].list_sessions()) == sorted(
            s.session_id for s in beta[1:]
        )
        with pytest.raises(tensorops.ResourceExhaustedError):  # full of other callers' sessions
            clients["gamma"].quantized_inner_product(b, **p)
        assert len(clients["alpha"].list_sessions()) == 2
    finally:
        for c in clients.values():
            c.close()


# ---------------------------------------------------------------------------------------
# Status recorded for every call, error details, startup, shutdown


def test_error_details_stay_small(client):
    with pytest.raises(tensorops.InvalidArgumentError) as err:  # the server echoes the value it refuses
        client.normalize(np.zeros((2, 3), np.float32), axes=[1], compute_dtype="x" * 7000)
    assert err.value.field == "compute_dtype" and "more characters" in str(err.value)
    assert len(str(err.value)) < 1500


def test_a_reply_too_large_is_recorded_as_such(start_server):
    srv = start_server("--max-message-bytes", str(1 << 20), "--max-tensor-bytes", str(1 << 20))
    rng = np.random.default_rng(5)
    b = rng.integers(-128, 128, (1, 1000), dtype=np.int8)
    p = qip_params(rng, 1000)
    with tensorops.Client(srv.target, timeout=10, max_message_bytes=4 << 20) as c:
        small = rng.integers(0, 256, (1000, 1), dtype=np.uint8)  # a 1 MB result: fits
        with tn.QuantizedInnerProduct(b, **p) as local:
            assert np.array_equal(c.quantized_inner_product(small, b, **p), local.forward(small))
        with pytest.raises(tensorops.ResourceExhaustedError):  # 1.1 MB: does not
            c.quantized_inner_product(rng.integers(0, 256, (1100, 1), dtype=np.uint8), b, **p)
    text = srv.metrics_text()
    assert (
        metric_value(text, "tensorops_errors_total", operation="quantized_inner_product", code="RESOURCE_EXHAUSTED")
        == 1
    )
    assert (
        metric_value(text, "tensorops_request_duration_seconds_count", operation="quantized_inner_product", code="OK")
        == 1
    )


def test_a_port_in_use_is_a_clean_startup_failure(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "tensorops_server", "--port", str(port), "--metrics-port", "-1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and '"event": "cannot start"' in done.stderr


def test_sigterm_exits_within_the_grace_period_whatever_runs(start_server):
    srv = start_server("--grace", "1", "--drain-delay", "0", "--threads", "1", env=SLOW_KERNELS)
    rng = np.random.default_rng(6)
    a = rng.integers(0, 256, (8192, 2048), dtype=np.uint8)
    b = rng.integers(-128, 128, (2048, 2048), dtype=np.int8)
    p = qip_params(rng, 2048)
    errors = []

    def long_call():
        with tensorops.Client(srv.target, timeout=60, max_attempts=1) as c:
            try:
                c.quantized_inner_product(a, b, **p)
            except tensorops.TensorOpsError as exc:
                errors.append(exc)
            else:
                errors.append("no error")

    caller = threading.Thread(target=long_call)
    caller.start()
    deadline = time.monotonic() + 20
    while metric_value(srv.metrics_text(), "tensorops_requests_in_flight", operation="quantized_inner_product") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    start = time.perf_counter()
    srv.signal(signal.SIGTERM)
    assert srv.wait(10) == 0
    took = time.perf_counter() - start
    caller.join()
    print(f"\nSIGTERM with a long kernel running: exited 0 after {took:.2f} s (grace 1 s)")
    assert took < 2.0 and len(errors) == 1 and isinstance(errors[0], tensorops.TensorOpsError), errors

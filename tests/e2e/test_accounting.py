"""One memory account per call, from its admission until its response was sent: responses
that a client never reads count against --max-inflight-bytes, large results are charged
before they exist, a connection that never reads is cut off, calls refused by the drain
get UNAVAILABLE, and a failed call is one short log line."""

from __future__ import annotations

import signal
import socket
import threading
import time

import grpc
import numpy as np
import pytest

import tensorops
from rpc_cases import BF16, qip_params
from rpc_server import metric_value, resident_bytes
from tensorops.protocol import wire
from test_security import ONE_PROCESS, health_latency, layer_norm_case

MiB = 1 << 20
CAP = 64 * MiB
CHANNEL_SUM = wire.OPERATIONS["channel_sum"]
LAYER_NORM = wire.OPERATIONS["layer_norm_channels"]
SOFTMAX = wire.OPERATIONS["softmax"]


@pytest.fixture
def start_server(start_server):
    """One server process: these tests follow one process's accounting (a server of several
    shares its caps out among its workers, docs/running.md "Workers")."""
    return lambda *flags, **kwargs: start_server(*flags, *ONE_PROCESS, **kwargs)


def channel_sum_request(result_bytes: int) -> bytes:
    """A ChannelSum of a few bytes whose result takes `result_bytes`: x of shape (N, C, 0)
    gives N x C float32 sums."""
    return wire.build_request(CHANNEL_SUM, dict(x=np.empty((result_bytes // (4 * 1024), 1024, 0), BF16))).data


def layer_norm_request(nbytes: int) -> bytes:
    channels = 256
    x = np.ones((1, nbytes // (4 * channels), channels), np.float32)
    scale, shift = np.ones(channels, np.float32), np.zeros(channels, np.float32)
    return wire.build_request(LAYER_NORM, dict(x=x, scale=scale, shift=shift, format="nhwc")).data


class RawConnection:
    """A raw HTTP/2 connection (the h2 library) making unary gRPC calls. With `window=0`
    (its SETTINGS_INITIAL_WINDOW_SIZE) the server may send no response data: responses
    wait on the server's side, unsent. Records each call's grpc-status and when it came."""

    def __init__(self, port: int, window: int = 65535):
        import h2.config
        import h2.connection
        import h2.settings

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
        )
        self.conn.initiate_connection()
        self._flush()
        self.sent: dict[int, float] = {}  # stream -> when its request was complete
        self.status: dict[int, tuple[str, float]] = {}  # stream -> (grpc-status or "reset", when)
        self.closed = False  # by the server

    def call(self, path: str, message: bytes, complete: bool = True) -> int:
        """Start a call; `complete=False` sends the message's prefix and 10 bytes only."""
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        body = b"\x00" + len(message).to_bytes(4, "big") + message
        if not complete:
            self.conn.send_data(stream, body[:15])
            self._flush()
            return stream
        view = memoryview(body)
        while view:  # within the server's flow-control windows
            room = min(self.conn.local_flow_control_window(stream), self.conn.max_outbound_frame_size)
            if room == 0:  # wait for the server's WINDOW_UPDATE
                self.poll(0.001)
                continue
            self.conn.send_data(stream, view[:room].tobytes())
            view = view[room:]
            self._flush()
        self.conn.end_stream(stream)
        self._flush()
        self.sent[stream] = time.monotonic()
        return stream

    def poll(self, seconds: float) -> dict[int, tuple[str, float]]:
        """Read what the server sends for `seconds` (never acknowledging response data)."""
        import h2.events
        import h2.exceptions

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.closed:
            self.sock.settimeout(0.02)
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                self.closed = True
                break
            try:
                events = self.conn.receive_data(data)
            except h2.exceptions.ProtocolError:  # frames after the server's GOAWAY
                continue
            for event in events:
                headers = getattr(event, "headers", None)
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    found = dict(headers).get(b"grpc-status")
                    if found is not None:
                        self.status.setdefault(event.stream_id, (found.decode(), time.monotonic()))
                elif isinstance(event, h2.events.StreamReset):
                    self.status.setdefault(event.stream_id, ("reset", time.monotonic()))
            self._flush()
        return self.status

    def _flush(self) -> None:
        pending = self.conn.data_to_send()
        if pending:
            self.sock.settimeout(10)
            self.sock.sendall(pending)

    def close(self) -> None:
        self.sock.close()


RESOURCE_EXHAUSTED, UNAVAILABLE = "8", "14"  # grpc-status codes


class PeakMemory:
    """Samples the server's VmRSS every 10 ms on a thread of its own."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, resident_bytes(pid), threading.Event()
        self._thread = threading.Thread(target=self._watch)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, resident_bytes(self.pid))
            time.sleep(0.01)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


class HealthProbe:
    """Health checks on fresh channels, one after another on a thread, until stop()
    (which returns their latencies, sorted)."""

    def __init__(self, target: str):
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, args=(target,))
        self._thread.start()

    def _probe(self, target: str) -> None:
        while not self._stop.is_set():
            self.latencies.append(health_latency(target))
            time.sleep(0.02)

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join()
        return sorted(self.latencies)


def test_unread_responses_count_and_a_stalled_connection_is_cut_off(start_server):
    """32 ChannelSums of 12 bytes with 16 MiB results and 40 layer norms of 16 MiB from a
    client that never reads (window 0), against a 64 MiB cap: what would pass the cap is
    refused at once, memory stays bounded, health and a normal client are served, and the
    connection is cut off at its age plus grace, its memory freed."""
    age, grace = 20, 2
    srv = start_server(
        "--max-inflight-bytes",
        str(CAP),
        "--max-connection-age",
        str(age),
        "--max-connection-age-grace",
        str(grace),
        "--threads",
        "2",
    )
    args, expected = layer_norm_case()
    with tensorops.Client(srv.target, timeout=30, max_attempts=1) as c:  # warm
        assert np.array_equal(c.layer_norm_channels(*args, format="nhwc"), expected)
    baseline = resident_bytes(srv.proc.pid, "VmHWM")
    memory = PeakMemory(srv.proc.pid)
    health = HealthProbe(srv.target)
    raw = RawConnection(srv.port, window=0)
    opened = time.monotonic()
    try:
        sums = [raw.call(CHANNEL_SUM.path, channel_sum_request(16 * MiB)) for _ in range(32)]
        norm = layer_norm_request(16 * MiB)
        norms = []
        for _ in range(40):
            norms.append(raw.call(LAYER_NORM.path, norm))
            raw.poll(0.01)
        raw.poll(1.0)
        with tensorops.Client(srv.target, timeout=30, max_attempts=1) as c:
            for _ in range(10):  # a normal client's calls fit beside what the stalled one holds
                assert np.array_equal(c.layer_norm_channels(*args, format="nhwc"), expected)
        latencies = health.stop()
        refused = {s: raw.status[s] for s in sums + norms if s in raw.status}
        unanswered = [s for s in sums + norms if s not in raw.status]
        # each admitted ChannelSum holds 12 + 2 x 16 MiB (result, response): one fits in 64 MiB
        assert len(unanswered) == 1 and unanswered[0] == sums[0], (unanswered, refused)
        assert all(code == RESOURCE_EXHAUSTED for code, _ in refused.values()), refused
        slowest = max(when - raw.sent[s] for s, (_, when) in refused.items())
        # cut off at the connection's age (+10% jitter) plus its grace: memory freed
        while not raw.closed and time.monotonic() - opened < 2 * (age + grace):
            raw.poll(0.5)
        cut_after = time.monotonic() - opened
        assert raw.closed, "the stalled connection was not cut off"
    finally:
        raw.close()
        health.stop()
        peak = memory.stop()
    hwm = resident_bytes(srv.proc.pid, "VmHWM")
    print(
        f"\nzero-window attack: {len(refused)} refused, the slowest in {slowest * 1e3:.1f} ms; server peak "
        f"{(max(peak, hwm) - baseline) / MiB:.0f} MiB above its warm peak (cap {CAP // MiB} MiB); "
        f"{len(latencies)} health checks during it: median {latencies[len(latencies) // 2] * 1e3:.1f} ms, "
        f"worst {latencies[-1] * 1e3:.1f} ms; connection cut off after {cut_after:.1f} s"
    )
    assert slowest < 2.0  # an upper bound: this client reads while it uploads the next request
    assert latencies[len(latencies) // 2] < 0.1
    assert cut_after < age * 1.1 + grace + 2
    # Beyond the cap: the stalled client's 16 MiB requests while they arrive (gRPC's buffer
    # and the message's bytes, a few at once) and what malloc keeps for reuse (up to
    # 4 x 32 MiB at the top of a heap: tensorops.retain_freed_buffers). Without the
    # account, the unsent responses alone took over 1 GiB here.
    assert max(peak, hwm) - baseline < CAP + 192 * MiB
    with tensorops.Client(srv.target, timeout=30, max_attempts=1) as c:  # its charge was given back
        x = np.ones((2048, 2048), np.float32)  # 16 MiB: 48 MiB charged
        assert c.softmax(x).shape == x.shape
    assert (
        metric_value(srv.metrics_text(), "tensorops_errors_total", operation="channel_sum", code="RESOURCE_EXHAUSTED")
        == 31
    )


def softmax_admitted_once_released(srv, x) -> None:
    """A softmax of x succeeds within 10 s: the server noticed the closed connection and
    released the charge of its unsent response."""
    deadline = time.monotonic() + 10
    with tensorops.Client(srv.target, timeout=30, max_attempts=1) as c:
        while True:
            try:
                assert c.softmax(x).shape == x.shape
                return
            except tensorops.ResourceExhaustedError:
                assert time.monotonic() < deadline, "the charge was not released when the client went away"
                time.sleep(0.05)


def test_the_charge_is_held_until_the_response_was_sent(start_server):
    """A response the client does not read keeps its bytes charged: a call that would pass
    the cap beside it is refused, and admitted once that client went away. (Releasing the
    charge when the handler returned, before the send, admitted it.)"""
    srv = start_server("--max-inflight-bytes", str(CAP))
    x = np.ones((1024, 2048), np.float32)  # 8 MiB: 8 + 2 x 8 MiB charged
    raw = RawConnection(srv.port, window=0)
    try:
        stalled = raw.call(CHANNEL_SUM.path, channel_sum_request(20 * MiB))  # 40 MiB held
        raw.poll(0.5)
        assert stalled not in raw.status  # computed; its response waits for the client
        with tensorops.Client(srv.target, timeout=30, max_attempts=1) as c:
            with pytest.raises(tensorops.ResourceExhaustedError) as err:
                c.softmax(x)
            assert "--max-inflight-bytes" in str(err.value)
    finally:
        raw.close()
    softmax_admitted_once_released(srv, x)


def test_a_stream_response_is_charged_until_it_was_sent(start_server):
    """The same on KServe's ModelStreamInfer: each response of a stream is written inside
    its call, so a stream whose client does not read holds the charge of its unsent
    response (and reads no further request meanwhile)."""
    from tensorops.kserve.v2 import inference_pb2 as pb

    srv = start_server("--max-inflight-bytes", str(CAP))
    request = pb.ModelInferRequest(
        model_name="channel_sum",
        inputs=[
            pb.ModelInferRequest.InferInputTensor(name="x", datatype="BF16", shape=[20 * MiB // (4 * 1024), 1024, 0])
        ],
        raw_input_contents=[b""],
    )
    x = np.ones((1024, 2048), np.float32)
    raw = RawConnection(srv.port, window=0)
    try:
        raw.call("/inference.GRPCInferenceService/ModelStreamInfer", request.SerializeToString())
        raw.poll(0.5)
        with tensorops.Client(srv.target, timeout=30, max_attempts=1) as c:
            with pytest.raises(tensorops.ResourceExhaustedError):
                c.softmax(x)
    finally:
        raw.close()
    softmax_admitted_once_released(srv, x)


def test_a_result_beyond_the_cap_is_refused_before_it_exists(start_server):
    srv = start_server("--max-inflight-bytes", str(CAP))
    before = resident_bytes(srv.proc.pid, "VmHWM")
    with tensorops.Client(srv.target, timeout=30, max_attempts=1) as c:
        start = time.perf_counter()
        with pytest.raises(tensorops.ResourceExhaustedError) as err:  # 40 MiB result + its response
            c.channel_sum(np.empty((10 * 1024, 1024, 0), BF16))
        elapsed = time.perf_counter() - start
        assert err.value.field == "x"
    assert resident_bytes(srv.proc.pid, "VmHWM") - before < 16 * MiB
    assert elapsed < 1.0


def test_products_are_charged_their_result_one_shot_and_in_sessions(start_server):
    """The quantized inner product's (M, N) result outgrows its request (M x K + K x N):
    40 MiB from 40 KiB, charged with its response before the kernel runs, one-shot and as
    a session's forward; smaller products beside it still run."""
    srv = start_server("--max-inflight-bytes", str(CAP))
    rng = np.random.default_rng(3)
    n = 1024
    a = rng.integers(0, 256, (40 * 1024, 1), dtype=np.uint8)
    b = rng.integers(-128, 128, (1, n), dtype=np.int8)
    p = qip_params(rng, n)
    before = resident_bytes(srv.proc.pid, "VmHWM")
    with tensorops.Client(srv.target, timeout=30, max_attempts=1) as c:
        with pytest.raises(tensorops.ResourceExhaustedError) as err:
            c.quantized_inner_product(a, b, **p)
        assert err.value.field == "a" and "--max-inflight-bytes" in str(err.value)
        with c.quantized_inner_product(b, **p) as session:
            with pytest.raises(tensorops.ResourceExhaustedError) as err:
                session.forward(a)
            assert err.value.field == "a"
            small = a[:1024]  # 1 MiB results
            assert np.array_equal(session.forward(small), c.quantized_inner_product(small, b, **p))
    assert resident_bytes(srv.proc.pid, "VmHWM") - before < 32 * MiB  # no 40 MiB result was made


def test_calls_arriving_once_the_drain_began_get_unavailable(start_server):
    """A call whose request is still arriving when the drain begins is answered UNAVAILABLE
    at once (its client retries elsewhere), not left to the read timeout or cancelled at
    the end of the grace period."""
    srv = start_server("--drain-delay", "0", "--grace", "5", "--read-timeout", "30")
    release = threading.Event()

    def requests():  # the request never comes (as a message still arriving)
        release.wait(30)
        yield b""

    with grpc.insecure_channel(srv.target) as channel:
        arriving = channel.stream_unary(SOFTMAX.path).future(requests(), timeout=30)
        time.sleep(0.5)  # the call started; its request is awaited
        assert not arriving.done()
        signalled = time.monotonic()
        srv.signal(signal.SIGTERM)
        try:
            with pytest.raises(grpc.RpcError) as err:
                arriving.result(timeout=10)
            answered = time.monotonic() - signalled
        finally:
            release.set()
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE, err.value
    assert answered < 2.0  # at once, not at the read timeout or the grace's end
    assert srv.wait(30) == 0


def test_one_short_log_line_per_failed_call(start_server):
    srv = start_server("--log-level", "debug")
    offset = srv.log_path.stat().st_size
    x = np.zeros((4, 4), np.float32)
    with tensorops.Client(srv.target, timeout=30, max_attempts=1) as c:
        for _ in range(20):
            with pytest.raises(tensorops.InvalidArgumentError):
                c.softmax(x, axis=5)
    time.sleep(0.2)
    failed = [e for e in srv.events(offset) if e.get("event") == "call failed"]
    assert len(failed) == 20
    assert all(e["code"] == "INVALID_ARGUMENT" and e["level"] == "debug" and "exception" not in e for e in failed)
    assert not [e for e in srv.events(offset) if e.get("event") == "call" and e.get("operation") == "softmax"]
    text = srv.log_path.read_text()[offset:]
    assert "Traceback" not in text and len(text) < 20 * 600, len(text)


def test_client_errors_are_not_logged_at_the_default_level(start_server):
    srv = start_server()
    offset = srv.log_path.stat().st_size
    with tensorops.Client(srv.target, timeout=30, max_attempts=1) as c:
        for _ in range(200):
            with pytest.raises(tensorops.InvalidArgumentError):
                c.softmax(np.zeros(3, np.float32), axis=5)
    assert srv.log_path.read_text()[offset:] == ""


def test_accounts_are_exact_under_threads_and_held_by_a_worker_still_computing():
    """In-process: reservations from many threads add up exactly and are all given back;
    a cancelled call's account stays charged until its worker is done."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from tensorops_server import errors
    from tensorops_server.admission import Admission

    admission = Admission(max_pending=4, read_timeout=1, max_concurrent=0, max_inflight_bytes=5_000)
    accounts = [admission.admit(10) for _ in range(8)]

    def charge(account):
        refused = 0
        for _ in range(1000):
            try:
                account.reserve(1, "x")
            except errors.Failure:
                refused += 1
        return refused

    with ThreadPoolExecutor(8) as pool:
        refused = sum(pool.map(charge, accounts))
    assert admission.inflight_bytes == 5_000 and refused == 8 * 1000 - (5_000 - 8 * 10)
    worker = Future()
    accounts[0].hold_until(worker)
    for account in accounts:
        account.close()
    assert admission.inflight_bytes == accounts[0].nbytes > 0 and admission.running == 0
    with pytest.raises(errors.Failure):  # the worker of an ended call cannot charge more
        accounts[0].reserve(1, "x")
    worker.set_result(None)
    assert admission.inflight_bytes == 0

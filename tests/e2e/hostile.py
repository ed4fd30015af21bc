"""The hostile campaign (the memory and connection attacks of docs/security-testing.md) as
code: one function per numbered attack (`ATTACKS`, rows 1 to 10), each run against a live
server the way a hostile client would (raw gRPC calls of hand-built messages, a raw HTTP/2
connection that never opens its window, a shared-memory object shrunk under the server, many
idle sockets), while a `Monitor` polls the health service every 20 ms (from a process of its
own: a script that runs attacks needs the `if __name__ == "__main__":` guard of
multiprocessing's spawn) and the server's /proc memory figures. Each attack returns an
`Outcome`: how the server answered (status and message of the refused call, or "server
died"), how long it took to refuse, the server's peak resident memory (VmHWM, reset when the
attack starts), the slowest health check during the attack, whether legitimate calls still
succeed afterwards and whether the server is alive.

Every attack is bounded in count and in time and talks only to loopback. The sizes default
to the full ones (bench/hostile.py runs them in a memory cgroup); `SCALES["ci"]` holds the
sizes the regression test uses (tests/e2e/test_hostile.py), small enough that a server
that regressed fails the test by time or by memory without exhausting the machine.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import multiprocessing
import os
import resource
import select
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import unquote

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import numpy as np

from tensorops.kserve.v2 import inference_pb2 as kpb
from tensorops.v1 import tensor_pb2, tensorops_pb2

KSERVE = "/inference.GRPCInferenceService"
TENSOROPS = "/tensorops.v1.TensorOps"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
SHM_PREFIX = "tensorops_"  # the server's default --shared-memory-prefix
MAX_MESSAGE = 256 << 20
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_MESSAGE)]
# The tokens of the two callers of row 8 (the server runs with --auth-tokens of both).
TOKENS = ("hostile-caller-a", "hostile-caller-b")


@dataclass
class Target:
    address: str  # host:port of the gRPC server
    pid: int  # the server process, for /proc
    metrics_port: int | None = None
    token: str | None = None  # bearer token of the legitimate calls, if the server wants one


@dataclass
class Outcome:
    row: int
    request: str  # the attack, in words, with its sizes
    outcome: str = ""  # how the server answered
    refused_after: float | None = None  # seconds from the attack's request to its refusal
    peak_rss: int | None = None  # bytes: the server's VmHWM during the attack
    max_health_latency: float | None = None  # seconds
    legitimate_ok: bool | None = None
    alive: bool = True
    details: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# The server's process and health


def proc_status(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as a dict ({} when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except (FileNotFoundError, ProcessLookupError):
        return {}


def alive(pid: int) -> bool:
    state = proc_status(pid).get("State", "")
    return bool(state) and not state.startswith(("Z", "X"))


def kib_field(pid: int, name: str) -> int | None:
    value = proc_status(pid).get(name)
    return int(value.split()[0]) * 1024 if value else None


def open_descriptors(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def reset_peak_rss(pid: int) -> None:
    """Reset VmHWM to the current resident size (Linux clear_refs "5")."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def health_check(channel: grpc.Channel, timeout: float) -> None:
    channel.unary_unary(HEALTH_CHECK)(b"", timeout=timeout)


def watch_health(address: str, interval: float, timeout: float, conn) -> None:
    """Check health every `interval` seconds until told to stop on `conn`, then send back
    (slowest check, answered or not; checks; failed checks). Runs in a process of its own,
    so that what the attacking threads do to this process's GIL is not timed as the
    server's latency."""
    with grpc.insecure_channel(address) as channel:
        health_check(channel, timeout)  # connected before the attack starts
        conn.send("ready")
        slowest, checks, failures = 0.0, 0, 0
        while not conn.poll(interval):
            start = time.monotonic()
            try:
                health_check(channel, timeout)
            except grpc.RpcError:  # timed out, or cut off when the server died: as slow as it waited
                failures += 1
            slowest = max(slowest, time.monotonic() - start)
            checks += 1
    conn.send((slowest, checks, failures))


class Monitor:
    """While entered: a process checks health every `interval` seconds on a connection of
    its own (opened before the attack), and a thread samples the server's VmHWM as often,
    so that the peak is known even when the server dies or its event loop is blocked."""

    def __init__(self, target: Target, interval: float = 0.02, timeout: float = 10.0):
        self.target, self.interval, self.timeout = target, interval, timeout
        self.max_latency = 0.0
        self.checks = self.failures = 0
        self.peak_rss = 0
        self.started = self.died_at = None  # time.monotonic() of the attack's start, of the server's death
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample_memory, daemon=True)
        self._conn, child_conn = multiprocessing.Pipe()
        self._checker = multiprocessing.get_context("spawn").Process(
            target=watch_health, args=(target.address, interval, timeout, child_conn), daemon=True
        )

    def __enter__(self) -> Monitor:
        self._checker.start()
        if not self._conn.poll(30) or self._conn.recv() != "ready":
            self._checker.kill()
            raise RuntimeError("the health monitor did not start")
        reset_peak_rss(self.target.pid)
        self.started = time.monotonic()
        self._sampler.start()
        return self

    def _sample_memory(self) -> None:
        while not self._stop.wait(self.interval):
            if not alive(self.target.pid):
                self.died_at = time.monotonic()
                return
            self.peak_rss = max(self.peak_rss, kib_field(self.target.pid, "VmHWM") or 0)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._conn.send("stop")
        if self._conn.poll(self.timeout + 5):
            self.max_latency, self.checks, self.failures = self._conn.recv()
        self._checker.join(5)
        self._checker.kill()
        self._sampler.join(self.interval + 2)
        self.peak_rss = max(self.peak_rss, kib_field(self.target.pid, "VmHWM") or 0)


# ---------------------------------------------------------------------------------------
# Calls as a hostile client makes them: bytes in, bytes out


def channel_for(target: Target) -> grpc.Channel:
    return grpc.insecure_channel(target.address, options=CHANNEL_OPTIONS)


def metadata_for(token: str | None):
    return (("authorization", f"Bearer {token}"),) if token else None


@dataclass
class Answer:
    code: grpc.StatusCode
    details: str
    elapsed: float
    response: bytes | None = None

    def __str__(self) -> str:
        return "OK" if self.code is grpc.StatusCode.OK else f"{self.code.name}: {self.details}"


def call(channel: grpc.Channel, path: str, request: bytes, timeout: float, token: str | None = None) -> Answer:
    start = time.monotonic()
    try:
        response = channel.unary_unary(path)(request, timeout=timeout, metadata=metadata_for(token))
        return Answer(grpc.StatusCode.OK, "", time.monotonic() - start, response)
    except grpc.RpcError as exc:
        return Answer(exc.code(), exc.details() or "", time.monotonic() - start)


def short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fp32_tensor(values) -> tensor_pb2.Tensor:
    arr = np.asarray(values, "<f4")
    return tensor_pb2.Tensor(shape=arr.shape, dtype=tensor_pb2.DATA_TYPE_FP32, data=arr.tobytes())


def kserve_eltwise_sum(rows: np.ndarray) -> kpb.ModelInferRequest:
    """A well-formed KServe eltwise sum of the rows of `rows` (float32)."""
    rows = np.asarray(rows, "<f4")
    request = kpb.ModelInferRequest(model_name="eltwise", raw_input_contents=[rows.tobytes()])
    request.inputs.add(name="inputs", datatype="FP32", shape=rows.shape)
    request.parameters["op"].string_param = "sum"
    return request


def fresh_channel(target: Target) -> grpc.Channel:
    """A channel on a connection of its own (grpc shares connections between channels of
    one process by default; a new client must really connect)."""
    return grpc.insecure_channel(target.address, options=CHANNEL_OPTIONS + [("grpc.use_local_subchannel_pool", 1)])


def legitimate_failure(target: Target, timeout: float = 10.0) -> str | None:
    """None if a small tensorops.v1 Eltwise and a KServe eltwise, from a new client, both
    give the right result; else what went wrong."""
    if not alive(target.pid):
        return "server dead"
    a, b = np.arange(6, dtype=np.float32), np.full(6, 0.5, np.float32)
    with fresh_channel(target) as channel:
        v1 = call(
            channel,
            f"{TENSOROPS}/Eltwise",
            tensorops_pb2.EltwiseRequest(
                inputs=[fp32_tensor(a), fp32_tensor(b)], op=tensorops_pb2.ELTWISE_OP_SUM
            ).SerializeToString(),
            timeout,
            target.token,
        )
        kserve = call(
            channel,
            f"{KSERVE}/ModelInfer",
            kserve_eltwise_sum(np.stack([a, b])).SerializeToString(),
            timeout,
            target.token,
        )
    for answer in (v1, kserve):
        if answer.code is not grpc.StatusCode.OK:
            return short(str(answer))
    expected = (a + b).tobytes()
    if tensorops_pb2.TensorResponse.FromString(v1.response).y.data != expected or list(
        kpb.ModelInferResponse.FromString(kserve.response).raw_output_contents
    ) != [expected]:
        return "wrong result"
    return None


def attack(row: int, request: str, target: Target, body: Callable[[Outcome], None]) -> Outcome:
    """Run `body` under a Monitor and fill in what every attack measures."""
    out = Outcome(row, request)
    with Monitor(target) as monitor:
        body(out)
    out.peak_rss = monitor.peak_rss or None
    out.max_health_latency = monitor.max_latency
    out.details["health_checks"] = monitor.checks
    if monitor.died_at is not None:
        out.details["died_after"] = round(monitor.died_at - monitor.started, 2)
    failure = legitimate_failure(target)
    if failure:
        out.details["legitimate_failure"] = failure
    out.legitimate_ok = failure is None and out.legitimate_ok is not False
    out.alive = alive(target.pid)
    if not out.alive:
        out.outcome = f"server died; {out.outcome}" if out.outcome else "server died"
    return out


# Codes that are no answer from the server: the client's deadline, a lost connection.
NO_ANSWER = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


def refused(answer: Answer) -> bool:
    return answer.code is not grpc.StatusCode.OK and answer.code not in NO_ANSWER


def single(out: Outcome, answer: Answer) -> None:
    if answer.code is grpc.StatusCode.DEADLINE_EXCEEDED:
        out.outcome = f"no answer within {answer.elapsed:.0f} s (the client's deadline)"
    else:
        out.outcome = short(str(answer))
    out.details["code"] = answer.code.name
    if refused(answer):
        out.refused_after = answer.elapsed


# ---------------------------------------------------------------------------------------
# The attacks, rows 1 to 10 of the campaign's table


def row1_stacked_empty_operands(target: Target, operands: int = 1 << 32, timeout: float = 60) -> Outcome:
    """KServe eltwise whose stacked input has shape [N, 0] and no bytes: 48 bytes on the
    wire, N operands to the server."""
    request = kpb.ModelInferRequest(model_name="eltwise", raw_input_contents=[b""])
    request.inputs.add(name="inputs", datatype="FP32", shape=[operands, 0])
    request.parameters["op"].string_param = "sum"
    data = request.SerializeToString()

    def body(out):
        with channel_for(target) as channel:
            single(out, call(channel, f"{KSERVE}/ModelInfer", data, timeout))

    return attack(1, f"KServe eltwise, inputs [{operands}, 0], {len(data)} B", target, body)


def channel_sum_shape(side: int) -> list[int]:
    """An empty channel_sum input whose (side - 1, side) float32 result stays just under a
    per-tensor limit of side x side x 4 bytes (the server keeps some room for headers)."""
    return [side - 1, side, 0, 0]


def result_bytes(side: int) -> int:
    return (side - 1) * side * 4


def result_mib(side: int) -> int:
    return round(result_bytes(side) / (1 << 20))


def row2_repeated_outputs(target: Target, outputs: int = 1000, side: int = 1024, timeout: float = 60) -> Outcome:
    """KServe channel_sum of an empty input (a result of almost side x side float32)
    listing the output `y` `outputs` times."""
    request = kpb.ModelInferRequest(model_name="channel_sum", raw_input_contents=[b""])
    request.inputs.add(name="x", datatype="BF16", shape=channel_sum_shape(side))
    for _ in range(outputs):
        request.outputs.add(name="y")
    data = request.SerializeToString()

    def body(out):
        with channel_for(target) as channel:
            single(out, call(channel, f"{KSERVE}/ModelInfer", data, timeout))

    return attack(
        2,
        f"KServe channel_sum ({result_mib(side)} MiB result), output y x {outputs}, {len(data) >> 10} KB",
        target,
        body,
    )


def grpc_frame(message: bytes) -> bytes:
    return struct.pack(">BI", 0, len(message)) + message


class ZeroWindowClient:
    """A raw HTTP/2 client whose stream windows are 0 and that never updates them: the
    server can send headers (and trailers-only refusals) but no response data."""

    def __init__(self, address: str):
        host, port = address.rsplit(":", 1)
        self.authority = address
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0, h2.settings.SettingCodes.ENABLE_PUSH: 0},
        )
        self.conn.initiate_connection()
        self.flush()
        self.status: dict[int, tuple[str, str, float]] = {}  # stream -> (grpc-status, message, when)
        self.headers_seen: set[int] = set()
        self.closed = False

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def send_call(self, path: str, message: bytes) -> int:
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", self.authority),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        self.conn.send_data(stream, grpc_frame(message), end_stream=True)
        self.flush()
        return stream

    def pump(self, seconds: float) -> None:
        """Read what the server sends for `seconds` (without ever opening a window)."""
        deadline = time.monotonic() + seconds
        while not self.closed and time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, min(0.1, deadline - time.monotonic())))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                self.closed = True
                break
            if not data:
                self.closed = True
                break
            for event in self.conn.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    self.headers_seen.add(event.stream_id)
                    fields = dict(event.headers)
                    if "grpc-status" in fields:
                        self.status[event.stream_id] = (
                            fields["grpc-status"],
                            fields.get("grpc-message", ""),
                            time.monotonic(),
                        )
                elif isinstance(event, h2.events.ConnectionTerminated):
                    self.closed = True
            self.flush()

    def close(self) -> None:
        self.sock.close()


def row3_unread_responses(target: Target, calls: int = 32, side: int = 4096, wait: float = 5.0) -> Outcome:
    """`calls` tensorops.v1 ChannelSum calls of an empty input (a result of almost
    side x side float32 each) on one HTTP/2 connection that never reads: its stream
    windows stay 0, so every response waits in the server."""
    message = tensorops_pb2.ChannelSumRequest(
        x=tensor_pb2.Tensor(shape=channel_sum_shape(side), dtype=tensor_pb2.DATA_TYPE_BF16)
    ).SerializeToString()

    def body(out):
        client = ZeroWindowClient(target.address)
        try:
            start = time.monotonic()
            streams = [client.send_call(f"{TENSOROPS}/ChannelSum", message) for _ in range(calls)]
            client.pump(wait)
            refusals = {s: v for s, v in client.status.items() if v[0] != "0"}
            unanswered = [s for s in streams if s not in client.status]
            out.details.update(refused=len(refusals), unanswered=len(unanswered), connection_closed=client.closed)
            if refusals:
                first = min(refusals.values(), key=lambda v: v[2])
                code = grpc.StatusCode(next(c for c in grpc.StatusCode if str(c.value[0]) == first[0]))
                out.refused_after = first[2] - start
                out.details["code"] = code.name
                out.outcome = short(
                    f"{len(refusals)} of {calls} refused ({code.name}: "
                    f"{unquote(first[1])}); {len(unanswered)} held unsent"
                )
            else:
                out.outcome = f"0 of {calls} refused; {len(unanswered)} held unsent" + (
                    "; connection closed" if client.closed else ""
                )
            failure = legitimate_failure(target)  # while the responses still wait
            out.legitimate_ok = failure is None
            if failure:
                out.details["legitimate_failure_during"] = failure
        finally:
            client.close()

    return attack(
        3, f"{calls} ChannelSum of {len(message)} B ({result_mib(side)} MiB results), HTTP/2 window 0", target, body
    )


def row4_large_parameters(target: Target, calls: int = 12, nbytes: int = 20 << 20, timeout: float = 100) -> Outcome:
    """KServe normalize with a distinct `nbytes` compute_dtype (even calls) or axes (odd
    calls) parameter per call, each of which the operation refuses."""
    x = np.ones((1, 2, 2, 2), np.float32)

    def request(i: int) -> bytes:
        r = kpb.ModelInferRequest(model_name="normalize", raw_input_contents=[x.tobytes()])
        r.inputs.add(name="x", datatype="FP32", shape=x.shape)
        if i % 2 == 0:
            r.parameters["axes"].string_param = "2,3"
            r.parameters["compute_dtype"].string_param = f"{i:06d}" + "z" * (nbytes - 6)
        else:
            text = f"{i}," + "1," * (nbytes // 2)
            r.parameters["axes"].string_param = text[:nbytes].rstrip(",")
        return r.SerializeToString()

    def body(out):
        answers = []
        deadline = time.monotonic() + timeout
        with channel_for(target) as channel:
            for i in range(calls):
                answer = call(channel, f"{KSERVE}/ModelInfer", request(i), max(1.0, deadline - time.monotonic()))
                answers.append(answer)
                if not alive(target.pid) or time.monotonic() > deadline:
                    break
        refusals = [a for a in answers if refused(a)]
        out.details.update(sent=len(answers), refused=len(refusals), codes=sorted({a.code.name for a in answers}))
        if refusals:
            out.refused_after = max(a.elapsed for a in refusals)
            out.details["code"] = refusals[-1].code.name
        out.outcome = short(f"{len(refusals)} of {len(answers)} refused, last: {answers[-1]}")

    return attack(4, f"KServe normalize, {calls} distinct {nbytes >> 20} MB compute_dtype/axes", target, body)


# One empty FP32 operand of tensorops.v1 EltwiseRequest.inputs: 7 bytes on the wire.
EMPTY_OPERAND = (
    b"\x0a" + bytes([len(fp32_tensor(np.zeros(0)).SerializeToString())]) + fp32_tensor(np.zeros(0)).SerializeToString()
)


def row5_empty_operands(target: Target, nbytes: int = 63_000_000, timeout: float = 60) -> Outcome:
    """tensorops.v1 Eltwise (sum) of `nbytes` of 7-byte empty operands."""
    data = tensorops_pb2.EltwiseRequest(op=tensorops_pb2.ELTWISE_OP_SUM).SerializeToString() + EMPTY_OPERAND * (
        nbytes // len(EMPTY_OPERAND)
    )

    def body(out):
        with channel_for(target) as channel:
            single(out, call(channel, f"{TENSOROPS}/Eltwise", data, timeout))

    return attack(
        5, f"Eltwise of {nbytes // len(EMPTY_OPERAND)} empty operands, {len(data) / 1e6:.0f} MB", target, body
    )


class SharedObject:
    """A POSIX shared-memory object under the server's prefix (removed on close)."""

    def __init__(self, nbytes: int):
        self.name = f"{SHM_PREFIX}hostile_{uuid.uuid4().hex[:12]}"
        self.key = "/" + self.name
        self.nbytes = nbytes
        self.fd = os.open(f"/dev/shm/{self.name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(self.fd, nbytes)

    def close(self) -> None:
        os.close(self.fd)
        os.unlink(f"/dev/shm/{self.name}")


def register(channel, name: str, obj: SharedObject, byte_size: int, token: str | None = None) -> Answer:
    return call(
        channel,
        f"{KSERVE}/SystemSharedMemoryRegister",
        kpb.SystemSharedMemoryRegisterRequest(
            name=name, key=obj.key, offset=0, byte_size=byte_size
        ).SerializeToString(),
        10,
        token,
    )


def eltwise_from_region(region: str, nbytes: int) -> bytes:
    """KServe eltwise sum of two float32 operands read from `region` (nbytes in all)."""
    request = kpb.ModelInferRequest(model_name="eltwise")
    tensor = request.inputs.add(name="inputs", datatype="FP32", shape=[2, nbytes // 8])
    tensor.parameters["shared_memory_region"].string_param = region
    tensor.parameters["shared_memory_byte_size"].int64_param = nbytes
    request.parameters["op"].string_param = "sum"
    return request.SerializeToString()


def row6_shrunk_shared_memory(
    target: Target, sizes: tuple[int, ...] = (16 << 20, 64 << 10), duration: float = 10.0, timeout: float = 30
) -> Outcome:
    """Calls read shared-memory regions (one per size: the worker and the inline path)
    while another thread shrinks their objects to 0 and grows them back (ftruncate), for
    `duration` seconds. A region the server drops (NOT_FOUND) is registered again."""

    def body(out):
        objects = [SharedObject(n) for n in sizes]
        stop = threading.Event()
        answers: list[Answer] = []
        reregistered: list[str] = []

        def shrink():
            while not stop.wait(0.0005):  # a pause, so that this process's health checks get the GIL
                for obj in objects:
                    os.ftruncate(obj.fd, 0)
                    os.ftruncate(obj.fd, obj.nbytes)

        def calls(channel, name, obj):
            request = eltwise_from_region(name, obj.nbytes)
            while not stop.is_set() and alive(target.pid):
                answers.append(call(channel, f"{KSERVE}/ModelInfer", request, timeout))
                if answers[-1].code is grpc.StatusCode.NOT_FOUND:  # the server dropped the broken region
                    while not stop.is_set() and register(channel, name, obj, obj.nbytes).code is not grpc.StatusCode.OK:
                        pass  # refused while the object is shrunk: again
                    reregistered.append(name)

        try:
            with channel_for(target) as channel:
                names = [f"hostile{i}" for i in range(len(objects))]
                registered = [register(channel, n, o, o.nbytes) for n, o in zip(names, objects, strict=True)]
                if any(a.code is not grpc.StatusCode.OK for a in registered):
                    out.outcome = f"registration refused: {registered[0]}"
                    return
                threads = [threading.Thread(target=shrink)] + [
                    threading.Thread(target=calls, args=(channel, n, o)) for n, o in zip(names, objects, strict=True)
                ]
                for t in threads:
                    t.start()
                deadline = time.monotonic() + duration
                while time.monotonic() < deadline and alive(target.pid):
                    time.sleep(0.05)
                stop.set()
                for t in threads:
                    t.join(timeout + 5)
                if alive(target.pid):
                    call(
                        channel,
                        f"{KSERVE}/SystemSharedMemoryUnregister",
                        kpb.SystemSharedMemoryUnregisterRequest().SerializeToString(),
                        10,
                    )
        finally:
            stop.set()
            for obj in objects:
                obj.close()
        by_code: dict[str, int] = {}
        for a in answers:
            by_code[a.code.name] = by_code.get(a.code.name, 0) + 1
        refusals = [a for a in answers if refused(a)]
        out.details.update(calls=len(answers), codes=by_code, registered_again=len(reregistered))
        if refusals:
            out.refused_after = max(a.elapsed for a in refusals)
            out.details["code"] = refusals[0].code.name
        out.outcome = short(
            ", ".join(f"{n} {c}" for c, n in sorted(by_code.items())) + (f"; e.g. {refusals[0]}" if refusals else "")
        )

    return attack(
        6,
        f"ftruncate of shared-memory objects ({', '.join(f'{n >> 10} KB' for n in sizes)}) "
        f"under calls, {duration:.0f} s",
        target,
        body,
    )


def npy(arr: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, arr)
    return buffer.getvalue()


def session_load(name: str) -> bytes:
    """A valid RepositoryModelLoad of a small quantized inner-product session."""
    r = kpb.RepositoryModelLoadRequest(model_name=name)
    r.parameters["config"].string_param = json.dumps(dict(a_scale=0.05, a_zero=7, c_scale=0.6, c_zero=3))
    r.parameters["file:b"].bytes_param = npy(np.ones((4, 3), np.int8))
    r.parameters["file:b_scale"].bytes_param = npy(np.full(3, 0.01, np.float32))
    return r.SerializeToString()


def row7_long_model_names(target: Target, loads: int = 64, nbytes: int = 30 << 20, timeout: float = 90) -> Outcome:
    """`loads` RepositoryModelLoad of sessions with distinct `nbytes` names, then
    RepositoryIndex (which lists them)."""

    def body(out):
        answers = []
        deadline = time.monotonic() + timeout
        with channel_for(target) as channel:
            for i in range(loads):
                name = f"{i:05d}" + "m" * (nbytes - 5)
                answers.append(
                    call(
                        channel,
                        f"{KSERVE}/RepositoryModelLoad",
                        session_load(name),
                        max(1.0, deadline - time.monotonic()),
                    )
                )
                if not alive(target.pid) or time.monotonic() > deadline:
                    break
            index = (
                call(channel, f"{KSERVE}/RepositoryIndex", b"", max(1.0, deadline - time.monotonic()))
                if alive(target.pid)
                else None
            )
            if alive(target.pid):
                for i in range(len(answers)):  # unload what loaded, so that the server is as before
                    if answers[i].code is grpc.StatusCode.OK:
                        name = f"{i:05d}" + "m" * (nbytes - 5)
                        call(
                            channel,
                            f"{KSERVE}/RepositoryModelUnload",
                            kpb.RepositoryModelUnloadRequest(model_name=name).SerializeToString(),
                            30,
                        )
        refusals = [a for a in answers if refused(a)]
        loaded = sum(a.code is grpc.StatusCode.OK for a in answers)
        out.details.update(
            loads=len(answers),
            loaded=loaded,
            index=str(index) if index else None,
            index_bytes=len(index.response) if index and index.response is not None else None,
        )
        if refusals:
            out.refused_after = max(a.elapsed for a in refusals)
            out.details["code"] = refusals[0].code.name
        words = f"{loaded} of {len(answers)} loaded" + (f"; refused: {refusals[0]}" if refusals else "")
        if index is not None:
            words += "; index " + ("OK" if index.code is grpc.StatusCode.OK else str(index))
        out.outcome = short(words)

    return attack(7, f"{loads} RepositoryModelLoad with {nbytes >> 20} MB names, then RepositoryIndex", target, body)


def row8_region_monopoly(target: Target, attempts: int = 65) -> Outcome:
    """Caller A registers up to `attempts` regions (4 KB each, one object); then caller B
    registers one and reads it. The server runs with --auth-tokens of TOKENS (see run(),
    which makes B the target's caller)."""
    mallory, alice = TOKENS

    def body(out):
        obj = SharedObject(4096)
        try:
            with channel_for(target) as channel:
                answers = []
                start = time.monotonic()
                for i in range(attempts):
                    answers.append(register(channel, f"r{i}", obj, 4096, mallory))
                    if answers[-1].code is not grpc.StatusCode.OK:
                        break
                taken = sum(a.code is grpc.StatusCode.OK for a in answers)
                last = answers[-1]
                other = register(channel, "alice", obj, 4096, alice)
                read = (
                    call(channel, f"{KSERVE}/ModelInfer", eltwise_from_region("alice", 4096), 10, alice)
                    if other.code is grpc.StatusCode.OK
                    else None
                )
                out.legitimate_ok = (
                    other.code is grpc.StatusCode.OK and read is not None and read.code is grpc.StatusCode.OK
                )
                if last.code is not grpc.StatusCode.OK:
                    out.refused_after = last.elapsed
                    out.details["code"] = last.code.name
                out.details.update(registered=taken, other_caller=str(other), elapsed=time.monotonic() - start)
                a_words = short(str(last), 100) if last.code is not grpc.StatusCode.OK else "no refusal"
                b_words = "registered" if other.code is grpc.StatusCode.OK else short(str(other), 60)
                out.outcome = f"A: {taken} registered, then {a_words}; B: {b_words}"
                for token in TOKENS:
                    call(
                        channel,
                        f"{KSERVE}/SystemSharedMemoryUnregister",
                        kpb.SystemSharedMemoryUnregisterRequest().SerializeToString(),
                        10,
                        token,
                    )
        finally:
            obj.close()

    return attack(8, f"caller A registers {attempts} shared-memory regions, then caller B one", target, body)


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


def open_sockets(port: int, count: int, first_bytes: bytes = b"", within: float = 10.0) -> list[socket.socket]:
    """`count` connections opened at once (non-blocking connects), those established
    within `within` seconds, each sent `first_bytes`."""
    pending = []
    for _ in range(count):
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            break  # this process's descriptors are exhausted: as many as there are
        s.setblocking(False)
        if s.connect_ex(("127.0.0.1", port)) not in (0, errno.EINPROGRESS):
            s.close()
            break  # no more local ports
        pending.append(s)
    established = []
    by_fd = {s.fileno(): s for s in pending}
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLOUT)
    deadline = time.monotonic() + within
    while by_fd and time.monotonic() < deadline:
        for fd, _ in poller.poll(100):
            poller.unregister(fd)
            s = by_fd.pop(fd)
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                s.close()
                continue
            if first_bytes:
                try:
                    s.send(first_bytes)
                except OSError:
                    pass
            established.append(s)
    close_all(by_fd.values())
    return established


def closed_by_server(socks: list[socket.socket], closed: dict[int, float]) -> None:
    """Record (index -> when) the sockets the server has closed (EOF or reset)."""
    for i, s in enumerate(socks):
        if i in closed:
            continue
        try:
            data = s.recv(65536)
            if not data:
                closed[i] = time.monotonic()
        except BlockingIOError:
            pass
        except OSError:
            closed[i] = time.monotonic()


def hold_sockets(socks, seconds: float, sample: Callable[[], None]) -> dict[int, float]:
    closed: dict[int, float] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        closed_by_server(socks, closed)
        sample()
        time.sleep(0.1)
    return closed


def close_all(socks) -> None:
    for s in socks:
        s.close()


def metrics_answer(port: int, timeout: float) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            return r.status == 200 and b"tensorops" in r.read()
    except OSError:
        return False


def row9_slow_metrics_clients(target: Target, connections: int = 1000, hold: float = 20.0) -> Outcome:
    """`connections` HTTP clients to the metrics port that send half a request and wait
    for `hold` seconds; then all leave at once (health is watched while they do)."""

    def body(out):
        raise_fd_limit(connections + 256)
        threads = {"before": int(proc_status(target.pid).get("Threads", 0)), "peak": 0}
        fds = {"before": open_descriptors(target.pid), "peak": 0}

        def sample():
            threads["peak"] = max(threads["peak"], int(proc_status(target.pid).get("Threads", 0) or 0))
            fds["peak"] = max(fds["peak"], open_descriptors(target.pid))

        start = time.monotonic()
        socks = open_sockets(target.metrics_port, connections, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        try:
            time.sleep(0.5)
            legit = metrics_answer(target.metrics_port, 5)
            closed = hold_sockets(socks, hold, sample)
        finally:
            close_all(socks)
        time.sleep(1.0)  # the teardown, under the monitor
        out.legitimate_ok = legit
        out.details.update(
            opened=len(socks), closed_by_server=len(closed), threads=threads, descriptors=fds, metrics_ok=legit
        )
        if closed:
            out.refused_after = min(closed.values()) - start
        out.outcome = (
            f"{len(socks)} open, {len(closed)} closed by the server within {hold:.0f} s; threads "
            f"{threads['before']} -> {threads['peak']}, descriptors {fds['before']} -> {fds['peak']}; "
            f"/metrics {'answers' if legit else 'no answer'}"
        )

    return attack(9, f"{connections} slow HTTP connections to the metrics port, {hold:.0f} s", target, body)


def row10_silent_connections(target: Target, connections: int = 1100, hold: float = 10.0) -> Outcome:
    """`connections` TCP connections to the gRPC port that never speak, held `hold`
    seconds; every second a new client (a fresh connection) checks health meanwhile."""

    def body(out):
        raise_fd_limit(connections + 256)
        start = time.monotonic()
        socks = open_sockets(int(target.address.rsplit(":", 1)[1]), connections)
        fresh: list[float | None] = []

        def sample():
            if len(fresh) < (time.monotonic() - start):
                t0 = time.monotonic()
                try:
                    with fresh_channel(target) as channel:
                        health_check(channel, 2.0)
                    fresh.append(time.monotonic() - t0)
                except grpc.RpcError:
                    fresh.append(None)

        try:
            closed = hold_sockets(socks, hold, sample)
        finally:
            close_all(socks)
        answered = [t for t in fresh if t is not None]
        out.legitimate_ok = bool(fresh) and len(answered) == len(fresh)
        out.details.update(
            opened=len(socks), closed_by_server=len(closed), new_clients=len(fresh), new_clients_answered=len(answered)
        )
        if closed:
            out.refused_after = min(closed.values()) - start
        out.outcome = (
            f"{len(socks)} open, {len(closed)} closed by the server within {hold:.0f} s; new clients: "
            f"{len(answered)} of {len(fresh)} answered"
            + (f" (slowest {max(answered) * 1000:.0f} ms)" if answered else "")
        )

    return attack(10, f"{connections} silent TCP connections to the gRPC port, {hold:.0f} s", target, body)


ATTACKS: dict[int, Callable[..., Outcome]] = {
    1: row1_stacked_empty_operands,
    2: row2_repeated_outputs,
    3: row3_unread_responses,
    4: row4_large_parameters,
    5: row5_empty_operands,
    6: row6_shrunk_shared_memory,
    7: row7_long_model_names,
    8: row8_region_monopoly,
    9: row9_slow_metrics_clients,
    10: row10_silent_connections,
}

# Server flags each row needs besides the defaults.
ROW_FLAGS: dict[int, tuple[str, ...]] = {
    6: ("--allow-shared-memory", "true"),
    8: ("--allow-shared-memory", "true", "--auth-tokens", ",".join(TOKENS)),
}
# Row 10's server runs with the common 1024 soft limit on file descriptors.
ROW_FD_LIMIT = {10: 1024}

# Sizes per scale: "full" are the functions' defaults, large enough to kill an unprotected server; "ci" keeps the test
# short and a regressed server's memory far below the machine's.
SCALES: dict[str, dict[int, dict]] = {
    "full": {},
    "ci": {
        1: dict(operands=1 << 20, timeout=20),
        2: dict(outputs=100, side=1024, timeout=20),
        3: dict(calls=48, side=1024, wait=2.0),
        4: dict(calls=6, nbytes=2 << 20, timeout=20),
        5: dict(nbytes=7_000_000, timeout=20),
        6: dict(sizes=(4 << 20, 64 << 10), duration=3.0, timeout=10),
        7: dict(loads=8, nbytes=1 << 20, timeout=20),
        8: dict(attempts=65),
        9: dict(connections=300, hold=3.0),
        10: dict(connections=1100, hold=4.0),
    },
}


def run(row: int, target: Target, scale: str = "full") -> Outcome:
    if row == 8:  # the legitimate calls are caller B's
        target = dataclasses.replace(target, token=TOKENS[1])
    return ATTACKS[row](target, **SCALES[scale].get(row, {}))


def limit_fds(soft: int) -> Callable[[], None]:
    """A preexec_fn that sets the soft limit on file descriptors (for row 10's server)."""

    def apply():
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return apply

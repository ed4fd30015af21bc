"""Connections that hold resources without doing anything, against a live server: slow or
idle HTTP connections to the metrics port, silent TCP connections to the gRPC port with
the common 1024 file-descriptor limit, connections beyond the cap, and health Watch
streams beyond theirs. Each: refused or closed fast, threads flat, health under 100 ms
(measured from a process of its own), legitimate clients still served."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rpc_server import metric_value

HEALTH_PROBE = """
import json, sys, time, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
target, seconds = sys.argv[1], float(sys.argv[2])
times = []
with grpc.insecure_channel(target) as channel:
    stub = health_pb2_grpc.HealthStub(channel)
    stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
        times.append(time.perf_counter() - start)
        time.sleep(0.02)
print(json.dumps(sorted(times)), flush=True)
"""


class HealthProbe:
    """Health checks every 20 ms for `seconds`, from another process (this one's threads,
    busy opening and closing sockets, must not be timed as the server's latency). On a
    shared machine a single check may wait for a CPU whatever the server does, so the
    bound is on the 95th percentile, and the worst must stay well under a second."""

    def __init__(self, target: str, seconds: float):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HEALTH_PROBE, target, str(seconds)], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def check(self) -> None:
        out, _ = self.proc.communicate(timeout=60)
        times = json.loads(out.splitlines()[-1])
        assert times, "no health check ran"
        assert times[int(0.95 * (len(times) - 1))] < 0.1 and times[-1] < 0.5, (
            f"health checks took {times[len(times) // 2]:.3f} s (median), {times[-1]:.3f} s (worst)"
        )


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server closed the connection (what it sent before, such as its HTTP/2
    settings, is read and dropped)."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def wait_until_closed(socks, seconds: float) -> float:
    """Seconds until the server closed every socket (fails after `seconds`)."""
    start = time.monotonic()
    while not all(closed_by_peer(s) for s in socks):
        assert time.monotonic() - start < seconds, (
            f"{sum(not closed_by_peer(s) for s in socks)} of {len(socks)} connections still open"
        )
        time.sleep(0.1)
    return time.monotonic() - start


def health_wait(target: str, timeout: float = 30.0) -> float:
    """Seconds a new client waits for its first health answer."""
    start = time.monotonic()
    with grpc.insecure_channel(target) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=timeout, wait_for_ready=True
        )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    return time.monotonic() - start


def connect_all(port: int, count: int, send: bytes = b"") -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if send:
            sock.sendall(send)
        socks.append(sock)
    return socks


def close_all(socks) -> None:
    for sock in socks:
        sock.close()


# ---------------------------------------------------------------------------------------
# The metrics port


def test_slow_metrics_connections_hold_no_thread_and_are_closed(start_server):
    srv = start_server("--read-timeout", "2")
    threads_before = threads(srv.proc.pid)
    descriptors_before = descriptors(srv.proc.pid)
    probe = HealthProbe(srv.target, seconds=6)
    socks = connect_all(srv.metrics_port, 1000, send=b"GET /metrics HTTP/1.1\r\n")  # a request never finished
    try:
        assert threads(srv.proc.pid) <= threads_before + 1
        # the connections beyond the metrics endpoint's cap (32) are closed as they come
        assert descriptors(srv.proc.pid) <= descriptors_before + 32 + 8
        scrape = srv.metrics_text()  # a real scrape still works meanwhile
        version = next(e["version"] for e in srv.events() if e.get("event") == "serving")
        assert metric_value(scrape, "tensorops_server_info", version=version) == 1.0
        assert wait_until_closed(socks, seconds=10) < 8  # evicted by newer ones, or after --read-timeout
        assert threads(srv.proc.pid) <= threads_before + 1
    finally:
        close_all(socks)
    probe.check()


def test_metrics_endpoint_answers_http(start_server):
    srv = start_server()
    base = f"http://127.0.0.1:{srv.metrics_port}"
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        assert b"\ntensorops_server_info{" in r.read()
    request = urllib.request.Request(f"{base}/metrics", headers={"Accept": "application/openmetrics-text"})
    with urllib.request.urlopen(request, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        assert r.read().rstrip().endswith(b"# EOF")
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{base}/other", timeout=10)
    assert missing.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as posted:
        urllib.request.urlopen(f"{base}/metrics", data=b"x", timeout=10)
    assert posted.value.code == 405
    with socket.create_connection(("127.0.0.1", srv.metrics_port), timeout=10) as sock:
        sock.sendall(b"GET /" + b"a" * 20000)  # a request head larger than allowed: closed, no answer
        assert sock.recv(100) == b""


# ---------------------------------------------------------------------------------------
# The gRPC port: descriptors, the connection cap, the handshake timeout


def start_with_1024_descriptors(start_server, *flags):
    """A server started with the common soft limit of 1024 descriptors (it inherits this
    process's limit, which is set back at once: the test needs more)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard >= 4096, f"the hard descriptor limit ({hard}) is too low"
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        return start_server(*flags)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_silent_connections_past_the_1024_descriptors_do_not_lock_clients_out(start_server):
    srv = start_with_1024_descriptors(start_server, "--handshake-timeout", "1")
    raised = [e for e in srv.events() if e.get("event") == "file descriptor limit raised"]
    assert raised and raised[0]["before"] == 1024 and raised[0]["after"] > 2048
    probe = HealthProbe(srv.target, seconds=3)
    socks = connect_all(srv.port, 1100)  # connect and say nothing
    try:
        assert health_wait(srv.target) < 2.0
        assert wait_until_closed(socks, seconds=10) < 6  # the handshake timeout (1 s), timer granularity aside
    finally:
        close_all(socks)
    probe.check()
    assert health_wait(srv.target) < 2.0


def test_connections_beyond_the_cap_are_closed_at_once(start_server):
    srv = start_server("--max-connections", "20", "--handshake-timeout", "1")
    assert srv.events()[-1]["max_connections"] == 20
    socks = connect_all(srv.port, 50)
    try:
        time.sleep(0.5)
        assert sum(closed_by_peer(s) for s in socks) >= 30  # beyond the cap: closed as they arrived
        # Once the handshake timeout closes the silent ones, a real client gets in.
        assert health_wait(srv.target) < 5.0
        wait_until_closed(socks, seconds=10)
    finally:
        close_all(socks)


HTTP2_PREFACE_AND_SETTINGS = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def test_idle_http2_connections_at_the_cap_give_their_place_up(start_server):
    srv = start_server("--max-connections", "20", "--max-connection-idle", "1")
    socks = connect_all(srv.port, 20, send=HTTP2_PREFACE_AND_SETTINGS)  # handshake done, then nothing
    try:
        assert health_wait(srv.target) < 5.0  # the idle ones are sent away, a real client gets in
        wait_until_closed(socks, seconds=10)
    finally:
        close_all(socks)


# ---------------------------------------------------------------------------------------
# Health Watch streams


def watches(channel: grpc.Channel, count: int) -> list:
    """`count` Watch streams on one channel, each with its first status (or its refusal),
    accepted ones first (the server may see them in any order)."""
    stub = health_pb2_grpc.HealthStub(channel)
    calls = [stub.Watch(health_pb2.HealthCheckRequest(), timeout=60) for _ in range(count)]
    out = []
    for call in calls:
        try:
            out.append((call, next(call).status))
        except grpc.RpcError as exc:
            out.append((call, exc.code()))
    return sorted(out, key=lambda pair: isinstance(pair[1], grpc.StatusCode))


def firsts(calls) -> list:
    return [status for _, status in calls]


def test_health_watch_streams_are_capped_per_connection_and_in_all(start_server):
    from tensorops_server.config import HEALTH_WATCHES_PER_CONNECTION as PER_CONNECTION

    # one process: several share the cap out (docs/running.md, Workers)
    srv = start_server("--max-health-watches", str(PER_CONNECTION + 4), "--drain-delay", "1", "--workers", "1")
    serving, exhausted = health_pb2.HealthCheckResponse.SERVING, grpc.StatusCode.RESOURCE_EXHAUSTED
    with (
        grpc.insecure_channel(srv.target) as first,
        grpc.insecure_channel(srv.target, options=[("grpc.use_local_subchannel_pool", 1)]) as second,
    ):
        calls = watches(first, PER_CONNECTION + 2)
        assert firsts(calls) == [serving] * PER_CONNECTION + [exhausted] * 2  # per connection
        more = watches(second, 6)
        assert firsts(more) == [serving] * 4 + [exhausted] * 2  # all connections together
        answer = health_pb2_grpc.HealthStub(second).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == serving  # Check is not capped
        for call, _ in calls[:2]:
            call.cancel()
        time.sleep(0.5)
        again = watches(second, 1)
        assert firsts(again) == [serving]  # a closed Watch frees its place
        # Every open Watch hears the drain, including after others on the same service ended.
        srv.signal()
        for call, first_status in calls[2:] + more + again:
            if first_status == serving:
                assert next(call).status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert srv.wait() == 0


def test_health_of_unknown_services_is_answered_without_being_kept(start_server):
    srv = start_server()
    with grpc.insecure_channel(srv.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as unknown:
            stub.Check(health_pb2.HealthCheckRequest(service="x" * 100_000), timeout=10)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        call = stub.Watch(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert next(call).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        call.cancel()

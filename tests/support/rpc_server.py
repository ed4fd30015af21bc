"""A real `tensorops-server` in a subprocess on an ephemeral loopback port, helpers to read
its metrics and call its reflection service, and the fixtures that start one (imported by
the conftest of every folder that uses them)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2


def free_port() -> int:
    """A loopback port free right now (for a process that must be told its port up front)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(
        self, log_path: Path, *flags: str, env: dict | None = None, command: list[str] | None = None, preexec_fn=None
    ):
        """`command`: the server program (default: this interpreter's tensorops_server);
        `preexec_fn`: run in the child before it starts (limits, a cgroup)."""
        self.log_path = log_path
        self.flags = flags
        self.env = dict(os.environ, **(env or {}))
        self.command = command or [sys.executable, "-m", "tensorops_server"]
        self.preexec_fn = preexec_fn
        self.proc: subprocess.Popen | None = None
        self.port = self.metrics_port = None

    def start(self, port: int = 0, timeout: float = 30.0) -> ServerProcess:
        """Start and wait for the "serving" log line (which names the ports chosen)."""
        log = open(self.log_path, "a")  # noqa: SIM115 (the server's log while it runs)
        offset = self.log_path.stat().st_size
        cmd = [
            *self.command,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            "0",
            "--threads",
            "4",
            *self.flags,
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, preexec_fn=self.preexec_fn
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events(offset):
                if event.get("event") == "serving":
                    self.port, self.metrics_port = event["port"], event["metrics_port"]
                    return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"server did not start:\n{self.log_path.read_text()}")

    def events(self, offset: int = 0) -> list[dict]:
        text = self.log_path.read_text()[offset:]
        out = []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            return r.read().decode()

    def signal(self, signum=signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.signal(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def metric_value(text: str, name: str, **labels) -> float:
    """The sum of the samples of the Prometheus text format with these labels (and maybe
    others, such as the `worker` of a server of several processes); 0 if absent."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        if "{" in series:
            metric, label_text = series.split("{", 1)
            found = dict(part.split("=", 1) for part in label_text.rstrip("}").split(",") if part)
            found = {k: v.strip('"') for k, v in found.items()}
        else:
            metric, found = series, {}
        if metric == name and all(found.get(k) == str(v) for k, v in labels.items()):
            total += float(value)
    return total


# A ServerReflectionRequest, encoded by hand: list_services is field 7 (the same numbers in
# grpc.reflection.v1 and v1alpha).
LIST_SERVICES = b"\x3a\x00"


def reflection_call(target: str, service: str, requests: list[bytes]) -> list:
    """Raw ServerReflectionInfo exchange on `service`: request bytes built by the caller,
    responses parsed as v1alpha messages (v1 is wire-identical)."""
    with grpc.insecure_channel(target) as channel:
        call = channel.stream_stream(f"/{service}/ServerReflectionInfo")
        raw = list(call(iter(requests), timeout=10))
    return [reflection_pb2.ServerReflectionResponse.FromString(r) for r in raw]


# ---- fixtures


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """One server shared by the tests that do not restart or reconfigure it (stopped without
    the drain delay, which no test of it watches)."""
    proc = ServerProcess(tmp_path_factory.mktemp("server") / "server.log", "--drain-delay", "0").start()
    yield proc
    assert proc.stop() == 0


@pytest.fixture
def start_server(tmp_path):
    """Start a dedicated server with extra flags: start_server("--max-sessions", "2")."""
    started = []

    def start(*flags, env=None, port=0):
        proc = ServerProcess(tmp_path / f"server{len(started)}.log", *flags, env=env).start(port)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants: a server's supervisor and its workers."""
    pids = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                pids += [p for child in f.read().split() for p in process_tree(int(child))]
    except (FileNotFoundError, ProcessLookupError):  # it left meanwhile
        pass
    return pids


def resident_bytes(pid: int, field: str = "VmRSS") -> int:
    """Resident memory of a server: of the process and its workers together; field="VmHWM"
    sums their peaks so far (at least the server's peak: the workers peak at their own times)."""
    total = 0
    for member in process_tree(pid):
        try:
            with open(f"/proc/{member}/status") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith(f"{field}:"))
        except FileNotFoundError:  # a worker that left meanwhile
            pass
    return total


class LongCall:
    """A one-shot quantized inner product of rows x 16 Mi multiply-adds (by default 3.4 x
    10^10, a third of a second or more of a worker) on a thread of its own. Started, it waits
    until the server counts it in flight; `result`, `errors` and `finished_at` tell how it
    ended after join(), `shape` is the result's."""

    depth, columns = 4096, 4096  # b: 16 MiB; a and c: rows x 4 KiB

    def __init__(self, srv, rows: int = 2048):
        import numpy as np

        import tensorops

        self.rows = rows
        self.result, self.errors, self.finished_at = [], [], None
        self.shape = (self.rows, self.columns)
        a = np.full((self.rows, self.depth), 3, np.uint8)
        b = np.ones((self.depth, self.columns), np.int8)
        b_scale = np.full(self.columns, 0.01, np.float32)

        def call():
            try:
                with tensorops.Client(srv.target, timeout=60, max_attempts=1) as c:
                    self.result.append(
                        c.quantized_inner_product(a, b, b_scale=b_scale, a_scale=0.1, a_zero=0, c_scale=1.0, c_zero=0)
                    )
                    self.finished_at = time.monotonic()
            except Exception as exc:
                self.errors.append(exc)

        self.thread = threading.Thread(target=call)
        self.thread.start()
        deadline = time.monotonic() + 20
        while metric_value(srv.metrics_text(), "tensorops_requests_in_flight", operation="quantized_inner_product") < 1:
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.005)

    def join(self, timeout: float = 60) -> None:
        self.thread.join(timeout)

"""The supervisor of a server of several worker processes (`--workers N`, N > 1).

Each worker is a fresh interpreter (`python -m tensorops_server.worker`, spawned, not
forked): a grpc server must not be forked from a process whose grpc core runs, and this
process never imports grpc, so nothing of grpc's exists here to be inherited. Every worker
is a whole server (cli.serve) binding the same port with SO_REUSEPORT, and the kernel
spreads new connections over them; a client's connection stays with one worker.

The supervisor:
- resolves port 0 and holds the port with a bound, not listening, SO_REUSEPORT socket for
  as long as it runs, so that a restarted worker binds the same port and no other program
  takes it meanwhile (a socket that does not listen is given no connections);
- creates the state directory the workers share (statedir) and removes it at the end;
- gives each worker its share of the per-process caps (`shares`), so that the server as a
  whole holds no more than configured;
- replaces a worker that died within a second, and backs off when a worker keeps dying
  soon after its start (each death and restart is logged with the worker's id). One
  worker is kept in reserve, started and waiting for its assignment (worker.py), so that a
  replacement only has to bind the port: interpreter start-up and imports take about as
  long as the second allowed;
- serves /metrics for all workers (prometheus_client's multiprocess mode);
- forwards SIGTERM and SIGINT (each worker drains by the usual rules) and exits after the
  last worker, and forwards SIGHUP (each worker reloads its TLS files)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import tensorops_native  # its version and ISA level, as the workers report them (no grpc)

from . import logs, statedir
from .config import Config
from .metrics import SupervisorMetrics

log = logging.getLogger(logs.LOGGER)

# A worker that dies sooner than this after its start is crash-looping: its restarts back off,
# from BACKOFF_FIRST seconds doubling up to BACKOFF_MAX; one that ran longer restarts at once.
STABLE_SECONDS = 10.0
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
POLL_SECONDS = 0.1  # how often dead workers are looked for (a replacement starts within a second)
# Beyond its grace period a draining worker gets this long to leave before it is killed.
EXIT_MARGIN_SECONDS = 10.0

# Caps of one process that are the server's totals: each worker gets value // N, at least 1.
SHARED_CAPS = (
    "max_concurrent_rpcs",
    "max_inflight_bytes",
    "max_connections",
    "max_health_watches",
    "max_pending_requests",
)
UNLIMITED = {"max_concurrent_rpcs": 0}  # a value meaning "no limit" is no one's share


def shares(config: Config, port: int) -> Config:
    """The configuration of each worker: the port the supervisor holds, the shared caps
    divided among the workers, and no metrics endpoint of its own (the supervisor's
    serves every worker's values)."""
    n = config.workers
    divided = {
        name: getattr(config, name)
        if UNLIMITED.get(name) == getattr(config, name)
        else max(1, getattr(config, name) // n)
        for name in SHARED_CAPS
    }
    return dataclasses.replace(config, port=port, metrics_port=-1, **divided)


def assignment(worker_id: int, config: Config) -> str:
    """What a worker reads on its standard input (worker.main)."""
    return json.dumps({"worker": worker_id, "config": dataclasses.asdict(config)})


def backoff(crashes: int) -> float:
    """Seconds before restarting a worker that died `crashes` times in a row soon after its
    start: none for the first, then BACKOFF_FIRST doubling up to BACKOFF_MAX."""
    if crashes <= 1:
        return 0.0
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (crashes - 2))


def hold_port(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT, not listening: it resolves port 0 and
    keeps the port for the workers. OSError if the address cannot be used, also when another
    program listens on it with SO_REUSEPORT (the workers of another server): a bind without
    the option is tried first, so that two servers do not share a port."""
    family, kind, protocol, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    holder = socket.socket(family, kind, protocol)
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC sets on its own
        if port != 0:
            with socket.socket(family, kind, protocol) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(address)
    except OSError as exc:
        holder.close()
        raise OSError(f"cannot listen on {host}:{port}: {(exc.strerror or str(exc)).lower()}") from None
    return holder


@dataclasses.dataclass
class Worker:
    id: int
    process: subprocess.Popen | None = None
    started: float = 0.0
    crashes: int = 0  # deaths in a row, each soon after its start
    restart_at: float | None = None  # when a dead worker is started again


class Supervisor:
    def __init__(self, config: Config):
        self.config = config
        self.workers = [Worker(i) for i in range(1, config.workers + 1)]
        self.received: list[str] = []  # signals not yet acted on
        self.stopping: str | None = None  # the signal that began the drain
        self.state: statedir.StateDir | None = None
        self.metrics: SupervisorMetrics | None = None
        self.worker_config: Config | None = None
        self.environment: dict[str, str] = {}
        self.reserve: subprocess.Popen | None = None  # started, waiting for an assignment

    # ---- signals: recorded by the handler, acted on by the loop
    def install_signals(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda number, _frame: self.received.append(signal.Signals(number).name))

    def run(self) -> int:
        self.install_signals()  # from the start: the state directory and the workers are cleaned up
        try:
            holder = hold_port(self.config.host, self.config.port)
        except OSError as exc:
            log.error("cannot start", extra=logs.fields(error=str(exc)))
            return 1
        with holder:
            self.state = statedir.StateDir.create()
            try:
                return self._run(holder.getsockname()[1])
            finally:
                self._kill_all()
                if self.metrics is not None:
                    self.metrics.stop()
                self.state.remove()

    def _run(self, port: int) -> int:
        metrics_dir = self.state.file("metrics")
        os.makedirs(metrics_dir, exist_ok=True)
        self.metrics = self._metrics(metrics_dir)
        metrics_port = None
        if self.config.metrics_port >= 0:
            try:
                metrics_port = self.metrics.serve(
                    self.config.metrics_host, self.config.metrics_port, timeout=self.config.read_timeout
                )
            except OSError as exc:
                log.error(
                    "cannot start",
                    extra=logs.fields(error=f"cannot serve metrics on port {self.config.metrics_port}: {exc}"),
                )
                return 1
        self.worker_config = shares(self.config, port)
        self.environment = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=metrics_dir)
        for worker in self.workers:
            self._start(worker)
        for worker in self.workers:  # each tells when it serves, or exits
            if not self._wait_serving(worker):
                log.error("cannot start", extra=logs.fields(worker=worker.id, error="a worker did not start"))
                self._stop_all("SIGTERM")
                return 1
        self.metrics.running.set(len(self.workers))
        log.info(
            "serving",
            extra=logs.fields(
                host=self.config.host,
                port=port,
                metrics_port=metrics_port,
                workers=len(self.workers),
                pids=[w.process.pid for w in self.workers],
                state_dir=self.state.path,
                # the server's totals: the workers' shares together
                max_connections=self.worker_config.max_connections * len(self.workers),
                version=tensorops_native.__version__,
            ),
        )
        while self.stopping is None:
            self._act_on_signals()
            self._reap_and_restart()
            time.sleep(POLL_SECONDS)
        return self._drain()

    def _metrics(self, directory: str) -> SupervisorMetrics:
        return SupervisorMetrics(
            version=tensorops_native.__version__,
            isa=tensorops_native.isa(),
            workers=self.config.workers,
            threads=self.config.threads,
            directory=directory,
            totals=lambda: statedir.totals(self.state.path),
        )

    # ---- workers
    def _spawn(self) -> subprocess.Popen:
        """A worker process, importing the server, then waiting for its assignment."""
        return subprocess.Popen(
            [sys.executable, "-m", "tensorops_server.worker", self.state.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.environment,
            text=True,
        )

    def _start(self, worker: Worker) -> None:
        """Assign the reserve to `worker` (or a new process if there is none), and start
        the next reserve."""
        if self.reserve is None or self.reserve.poll() is not None:
            self.reserve = self._spawn()
        worker.process, self.reserve = self.reserve, None
        worker.started = time.monotonic()
        worker.restart_at = None
        try:
            worker.process.stdin.write(assignment(worker.id, self.worker_config))
            worker.process.stdin.close()
        except BrokenPipeError:  # it died meanwhile: seen dead at the next look, and replaced
            pass
        self.reserve = self._spawn()

    def _wait_serving(self, worker: Worker) -> bool:
        line = worker.process.stdout.readline()  # "serving", or nothing when it exits first
        worker.process.stdout.close()
        return line.strip() == "serving"

    def _reap_and_restart(self) -> None:
        now = time.monotonic()
        for worker in self.workers:
            if worker.restart_at is not None:
                if now >= worker.restart_at:
                    self._start(worker)
                    self.metrics.restarts.labels(str(worker.id)).inc()
                    self.metrics.running.inc()
                    log.info("worker restarted", extra=logs.fields(worker=worker.id, pid=worker.process.pid))
                continue
            code = worker.process.poll()
            if code is None:
                continue
            self.metrics.worker_died(worker.process.pid)
            self.metrics.running.dec()
            if worker.process.stdout and not worker.process.stdout.closed:
                worker.process.stdout.close()
            lived = now - worker.started
            worker.crashes = worker.crashes + 1 if lived < STABLE_SECONDS else 1
            delay = backoff(worker.crashes)
            worker.restart_at = now + delay
            log.error(
                "worker died",
                extra=logs.fields(
                    worker=worker.id,
                    pid=worker.process.pid,
                    **_exit_of(code),
                    lived_seconds=round(lived, 3),
                    crashes_in_a_row=worker.crashes,
                    restart_in_seconds=delay,
                ),
            )

    def _act_on_signals(self) -> None:
        while self.received:
            name = self.received.pop(0)
            if name == "SIGHUP":
                log.info("reloading", extra=logs.fields(signal=name))
                self._signal_all(signal.SIGHUP)
            else:
                self.stopping = name

    def _signal_all(self, signum: int) -> None:
        for worker in self.workers:
            if worker.restart_at is None and worker.process.poll() is None:
                worker.process.send_signal(signum)

    def _stop_all(self, name: str) -> None:
        self._signal_all(signal.Signals[name])
        deadline = time.monotonic() + self.config.grace + EXIT_MARGIN_SECONDS
        for worker in self.workers:
            if worker.restart_at is not None:
                continue
            if not self._wait_or_kill(worker.process, max(0.0, deadline - time.monotonic())):
                log.error("worker killed", extra=logs.fields(worker=worker.id, pid=worker.process.pid))

    def _drain(self) -> int:
        log.info(
            "draining",
            extra=logs.fields(
                signal=self.stopping,
                workers=len(self.workers),
                drain_delay_seconds=self.config.drain_delay,
                grace_seconds=self.config.grace,
            ),
        )
        self._stop_all(self.stopping)
        log.info("stopped")
        return 0

    def _kill_all(self) -> None:
        """Whatever still runs when the supervisor leaves: the reserve (which leaves at the
        end of its input), and the workers if it failed to start."""
        if self.reserve is not None:
            self.reserve.stdin.close()
            self._wait_or_kill(self.reserve, EXIT_MARGIN_SECONDS)
        for worker in self.workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait()

    @staticmethod
    def _wait_or_kill(process: subprocess.Popen, timeout: float) -> bool:
        """Whether `process` left within `timeout` seconds; if not, it is killed."""
        try:
            process.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return False


def _exit_of(code: int) -> dict:
    return {"signal": signal.Signals(-code).name} if code < 0 else {"exit_code": code}


def main(config: Config) -> int:
    logs.setup(config.log_level, config.log_format)
    return Supervisor(config).run()

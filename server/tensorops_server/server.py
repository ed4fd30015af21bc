"""The server process: a grpc.aio server with the TensorOps service (service.py) and the
KServe V2 inference service (kserve), both served through one call pipeline
(pipeline.py), health and reflection (v1 and v1alpha), the session store and its
sweeper, and the Prometheus endpoint.

The asyncio event loop runs on a thread of its own, so the server is started and stopped
with plain calls (`start()`, `stop()`) from the command line or from a test."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import resource
import socket
import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import tensorops_native
from tensorops.protocol import wire

from . import kserve, optable, reflection, shm, statedir, tls
from .config import Config
from .health import HealthService
from .logs import LOGGER, fields
from .metrics import MAX_CONNECTIONS as MAX_METRICS_CONNECTIONS
from .metrics import Metrics
from .pipeline import CallPipeline, add_handlers
from .service import Service
from .sessions import SessionStore, Sweeper

log = logging.getLogger(LOGGER)


class TensorOpsServer:
    def __init__(self, config: Config, *, qip_class=None, state_dir: str | None = None, worker_id: int = 1):
        """`state_dir`: the state directory of the supervisor this process is a worker of
        (worker `worker_id`); None: a server of one process, with a state directory of its own."""
        if state_dir is None:  # whatever the setting says, this server is one process
            config = dataclasses.replace(config, workers=1)
        self.config = config
        self.worker_id = worker_id
        self.table = optable.build_table()
        self.metrics = Metrics(
            version=tensorops_native.__version__,
            isa=tensorops_native.isa(),
            workers=config.workers,
            threads=config.threads,
            worker=None if state_dir is None else worker_id,  # a supervisor's worker counts for it
        )
        self.state = statedir.StateDir.create() if state_dir is None else statedir.StateDir.join(state_dir)
        qip_class = qip_class or getattr(tensorops_native, "QuantizedInnerProduct", None)
        self.store = SessionStore(
            self.state,
            attach=lambda memory, max_m: qip_class.attach(memory, max_m=max_m),
            max_sessions=config.max_sessions,
            max_bytes=config.max_session_bytes,
            max_sessions_per_owner=config.max_sessions_per_caller,
            max_bytes_per_owner=config.max_session_bytes_per_caller,
            ttl=config.session_ttl,
            on_evict=lambda reason: self.metrics.evictions.labels(reason).inc(),
        )
        self.metrics.watch_sessions(self.store)
        self.pipeline = CallPipeline(config, self.metrics, worker_id)  # every call of both endpoints
        self.service = Service(self.pipeline, self.store, self.table, qip_class)  # tensorops.v1
        self.shared_memory = shm.SharedMemory(
            self.state,
            allowed=config.allow_shared_memory,
            prefix=config.shared_memory_prefix,
            max_regions=config.max_shared_memory_regions,
            max_bytes=config.max_shared_memory_bytes,
            max_regions_per_caller=config.max_shared_memory_regions_per_caller,
            max_bytes_per_caller=config.max_shared_memory_bytes_per_caller,
        )
        # inference.GRPCInferenceService, on the same port and through the same pipeline
        self.kserve = kserve.KServe(self.pipeline, self.service, self.shared_memory)
        # Often: a session released through another worker is unmapped here at the next sweep.
        self._sweeper = Sweeper(
            (self.store.sweep, self.shared_memory.sweep, self.kserve.repository.flush_statistics),
            interval=min(config.session_ttl / 4, 1.0),
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tensorops-loop", daemon=True)
        self.grpc_server: grpc.aio.Server | None = None
        self.health: HealthService | None = None
        self.max_connections = config.max_connections  # lowered to fit the file-descriptor limit
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.tls: tls.CertificateFiles | None = None  # request_reload() on SIGHUP

    # ---- lifecycle, called from any thread but the loop's
    def start(self) -> None:
        """Listen and serve; returns once serving. OSError if the address cannot be used."""
        self.max_connections = fit_connections_to_file_limit(self.config)
        self._thread.start()
        try:
            self._on_loop(self._start())
        except OSError:
            self._close_loop()
            self._close_state()
            raise
        if self.config.metrics_port >= 0:
            try:
                self.metrics_port = self.metrics.serve(
                    self.config.metrics_host, self.config.metrics_port, timeout=self.config.read_timeout
                )
            except OSError as exc:
                self.stop(0)
                raise OSError(f"cannot serve metrics on port {self.config.metrics_port}: {exc}") from None
        self._sweeper.start()
        # A supervisor's worker says "worker serving": "serving" is the supervisor's, once all serve.
        log.info(
            "serving" if self.state.owned else "worker serving",
            extra=fields(
                host=self.config.host,
                port=self.port,
                metrics_port=self.metrics_port,
                workers=self.config.workers,
                threads=self.config.threads,
                max_connections=self.max_connections,
                isa=tensorops_native.isa(),
                operations=list(self.table),
                version=tensorops_native.__version__,
            ),
        )

    def stop(self, grace: float | None = None, drain_delay: float = 0.0) -> None:
        """Report NOT_SERVING on the health service, keep serving for `drain_delay` seconds
        (so that balancers polling the health service stop routing here before the port
        refuses calls), then stop taking calls, let the calls in flight finish within
        `grace` seconds (then cancel them), and release everything."""
        grace = self.config.grace if grace is None else grace
        if self.grpc_server is not None:
            self._on_loop(self._stop(grace, drain_delay))
        self._sweeper.stop()
        self._close_state()
        self.metrics.stop()
        self.pipeline.executor.shutdown()
        self._close_loop()

    def _close_state(self) -> None:
        """Unmap this process's sessions and regions; a server of one process ends them."""
        self.store.close()
        self.shared_memory.close()
        if self.state.owned:
            self.state.remove()

    def _on_loop(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _close_loop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    # ---- on the loop
    async def _start(self) -> None:
        c = self.config
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", c.max_message_bytes),
                ("grpc.max_send_message_length", c.max_message_bytes),
                # a supervisor's workers accept on the port it holds; a server of one process
                # refuses a port another program holds rather than share it
                ("grpc.so_reuseport", int(not self.state.owned)),
                # streams one connection may open at once (HTTP/2 SETTINGS)
                ("grpc.max_concurrent_streams", 2 * c.max_pending_requests),
                # connections beyond the cap are closed as they arrive; one that never
                # completes its handshake holds a descriptor only this long
                ("grpc.max_allowed_incoming_connections", self.max_connections),
                ("grpc.server_handshake_timeout_ms", max(1, round(c.handshake_timeout * 1000))),
                *connection_age_options(c),
            ]
        )
        add_handlers(server, wire.SERVICE_NAME, self.service.handlers())
        add_handlers(server, kserve.SERVICE_NAME, self.kserve.handlers())
        self.health = HealthService(c.max_health_watches)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        if c.reflection:
            reflection.enable(
                (wire.SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name),
                server,
                aliases=(kserve.reflection_file(),),
            )
        self.tls = tls.from_config(c)  # TLSConfigError (an OSError) when the files are not usable
        try:
            if self.tls is None:
                self.port = server.add_insecure_port(c.address)
            else:
                self.port = server.add_secure_port(c.address, self.tls.credentials())
        except RuntimeError:  # "Failed to bind to address": grpc logs the cause, and does not say it
            self.port = 0
        if not self.port:
            raise OSError(f"cannot listen on {c.address}: {bind_failure(c.host, c.port)}")
        await server.start()
        self.grpc_server = server
        for service in ("", wire.SERVICE_NAME, kserve.SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)

    async def _stop(self, grace: float, drain_delay: float) -> None:
        # NOT_SERVING first, while the port still answers: grpc's stop() refuses new calls,
        # health checks included, at once, and a balancer must see NOT_SERVING (or a
        # refused check) for the whole drain rather than route calls into a closing port.
        # The delay is part of the grace period: SIGTERM to exit never takes more than the
        # grace (plus the time a cancelled kernel needs to notice).
        self.kserve.ready = False  # KServe's ServerReady says the same
        await self.health.enter_graceful_shutdown()
        delay = min(drain_delay, grace)
        if delay > 0:
            await asyncio.sleep(delay)
        self.pipeline.begin_drain()  # calls from now on: UNAVAILABLE, retried elsewhere
        await self.grpc_server.stop(grace - delay)
        await self.service.batcher.wait_idle()
        self.pipeline.admission.close()


# Descriptors kept free for everything but client connections: the metrics endpoint's
# connections, shared-memory regions, files and the process's own.
_OTHER_DESCRIPTORS = 128


def fit_connections_to_file_limit(c: Config) -> int:
    """Raise the soft file-descriptor limit to the hard one (a process started with the
    common 1024 runs out of descriptors long before memory), and return the connection cap
    that leaves room under it for everything else."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and soft != resource.RLIM_INFINITY:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            log.info("file descriptor limit raised", extra=fields(before=soft, after=hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("file descriptor limit not raised", extra=fields(limit=soft, error=str(exc)))
    if soft == resource.RLIM_INFINITY:
        return c.max_connections
    room = soft - _OTHER_DESCRIPTORS - MAX_METRICS_CONNECTIONS - c.max_shared_memory_regions
    if room < c.max_connections:
        log.warning(
            "connection cap lowered to fit the file descriptor limit",
            extra=fields(max_connections=c.max_connections, lowered_to=max(1, room), limit=soft),
        )
        return max(1, room)
    return c.max_connections


def bind_failure(host: str, port: int) -> str:
    """Why gRPC could not listen on host:port, found by trying the same bind (gRPC only logs
    the reason): "address already in use", "cannot assign requested address", ..."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve {host!r}: {exc.strerror}"
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
            try:
                probe.bind(address)
            except OSError as exc:
                return (exc.strerror or str(exc)).lower()
    return "the address could be bound when tried again (see gRPC's log line before this one)"


def connection_age_options(c: Config) -> list[tuple[str, int]]:
    """gRPC's server-side idle limit and connection age (GOAWAY after the age, with +-10% jitter, then a
    grace period for the calls in flight): long-lived HTTP/2 connections of clients and
    balancers are re-established now and then, so replicas added later get their share."""
    options = []
    if c.max_connection_idle > 0:  # no call for that long: GOAWAY, so idle connections free their place
        options.append(("grpc.max_connection_idle_ms", max(1, round(c.max_connection_idle * 1000))))
    if c.max_connection_age > 0:
        options.append(("grpc.max_connection_age_ms", max(1, round(c.max_connection_age * 1000))))
        if c.max_connection_age_grace > 0:
            options.append(("grpc.max_connection_age_grace_ms", max(1, round(c.max_connection_age_grace * 1000))))
    return options

"""The server process: gRPC server with the TensorOps service, health and reflection, the
session store and its sweeper, and the Prometheus endpoint."""
from __future__ import annotations

import logging
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

import tensorops_native
from tensorops import _wire

from . import optable
from .config import Config
from .logs import LOGGER, fields
from .metrics import Metrics
from .service import Service
from .sessions import SessionStore, Sweeper

log = logging.getLogger(LOGGER)


class TensorOpsServer:
    def __init__(self, config: Config, *, qip_class=None):
        self.config = config
        self.table = optable.build_table()
        self.metrics = Metrics(version=tensorops_native.__version__, isa=tensorops_native.isa(),
                               workers=config.workers)
        self.store = SessionStore(max_sessions=config.max_sessions, max_bytes=config.max_session_bytes,
                                  ttl=config.session_ttl,
                                  on_evict=lambda reason: self.metrics.evictions.labels(reason).inc())
        self.metrics.watch_sessions(self.store)
        self.service = Service(config, self.metrics, self.store, self.table, qip_class)
        self._sweeper = Sweeper(self.store, interval=min(config.session_ttl / 4, 10.0))
        self._pool = futures.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="tensorops-worker")
        self.grpc_server = grpc.server(
            self._pool,
            options=[("grpc.max_receive_message_length", config.max_message_bytes),
                     ("grpc.max_send_message_length", config.max_message_bytes),
                     ("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=config.max_concurrent_rpcs or None)
        self.grpc_server.add_registered_method_handlers(_wire.SERVICE_NAME, self.service.handlers())
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc_server)
        reflection.enable_server_reflection(
            (_wire.SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            self.grpc_server)
        self.port = self.grpc_server.add_insecure_port(config.address)
        if not self.port:
            raise OSError(f"cannot listen on {config.address}")
        self.metrics_port: int | None = None

    def start(self) -> None:
        self.grpc_server.start()
        if self.config.metrics_port >= 0:
            self.metrics_port = self.metrics.serve(self.config.metrics_host or self.config.host,
                                                   self.config.metrics_port)
        self._sweeper.start()
        for service in ("", _wire.SERVICE_NAME):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving", extra=fields(
            host=self.config.host, port=self.port, metrics_port=self.metrics_port, workers=self.config.workers,
            isa=tensorops_native.isa(), operations=list(self.table), version=tensorops_native.__version__))

    def stop(self, grace: float | None = None) -> None:
        """Stop taking calls, let the calls in flight finish within `grace` seconds (then
        cancel them), and release everything."""
        grace = self.config.grace if grace is None else grace
        self.health.enter_graceful_shutdown()
        self.grpc_server.stop(grace).wait()
        self._sweeper.stop()
        self.store.close_all()
        self.metrics.stop()
        self._pool.shutdown(wait=False)


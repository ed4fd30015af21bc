"""Prometheus metrics of the server, in a registry of its own. Labels are the operation (the
Python name, or the RPC name for the session and info calls), the status code and a few
fixed words: never shapes, sizes or ids."""
from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)

disable_created_metrics()  # the *_created series only add noise to every scrape

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class Metrics:
    def __init__(self, *, version: str, isa: str, workers: int):
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.info = Info("tensorops_server", "Version and ISA level of the kernels in use", registry=r)
        self.info.info({"version": version, "isa": isa, "workers": str(workers)})
        self.request_duration = Histogram(
            "tensorops_request_duration_seconds", "Time from the start of the handler to its result",
            ["operation", "code"], buckets=_LATENCY_BUCKETS, registry=r)
        self.kernel_duration = Histogram(
            "tensorops_kernel_duration_seconds", "Time spent in tensorops_native (the kernel and its checks)",
            ["operation"], buckets=_LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("tensorops_requests_in_flight", "Calls being handled", ["operation"], registry=r)
        self.request_bytes = Counter("tensorops_request_bytes", "Bytes of request messages received",
                                     ["operation"], registry=r)
        self.response_bytes = Counter("tensorops_response_bytes", "Bytes of response messages sent",
                                      ["operation"], registry=r)
        self.errors = Counter("tensorops_errors", "Calls that ended with a status other than OK",
                              ["operation", "code"], registry=r)
        self.sessions = Gauge("tensorops_sessions_active", "Quantized inner-product sessions held", registry=r)
        self.session_bytes = Gauge("tensorops_session_bytes", "Bytes held by the sessions", registry=r)
        self.evictions = Counter("tensorops_session_evictions", "Sessions removed by the server",
                                 ["reason"], registry=r)
        self.batch_requests = Histogram(
            "tensorops_forward_batch_requests", "Session forwards merged into one kernel call",
            buckets=_BATCH_BUCKETS, registry=r)
        self.batch_rows = Histogram(
            "tensorops_forward_batch_rows", "Rows (M) of one session forward kernel call",
            buckets=_BATCH_BUCKETS, registry=r)
        self._http = None

    def observe_batch(self, requests: int, rows: int) -> None:
        self.batch_requests.observe(requests)
        self.batch_rows.observe(rows)

    def watch_sessions(self, store) -> None:
        self.sessions.set_function(lambda: len(store))
        self.session_bytes.set_function(lambda: store.nbytes)

    def serve(self, host: str, port: int) -> int:
        """Expose /metrics over HTTP; returns the port (useful with port 0)."""
        self._http, _ = start_http_server(port, addr=host, registry=self.registry)
        return self._http.server_port

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

"""Prometheus metrics of the server, in a registry of its own. Labels are the operation (the
Python name, or the RPC name for the session and info calls), the status code and a few
fixed words: never shapes, sizes or ids.

A server of several worker processes counts in prometheus_client's multiprocess mode: each
worker writes its values to files in PROMETHEUS_MULTIPROC_DIR (set by the supervisor before
the worker starts), and the supervisor serves them all, summed, from one endpoint
(`SupervisorMetrics`), with its own: restarts and running workers, and the shared store's
totals. Only the in-flight gauge and the restarts carry a `worker` label.

/metrics is served over HTTP/1.1 by an event loop on a thread of its own (`Endpoint`):
connections cost no thread, a request must arrive within the read timeout, and at most
MAX_CONNECTIONS are open (a new one closes the one that has waited longest for its
request, before the next is accepted), so idle or slow connections cannot hold threads,
more than MAX_CONNECTIONS + 1 descriptors, or the gRPC loop."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

disable_created_metrics()  # the *_created series only add noise to every scrape

_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
MAX_CONNECTIONS = 32  # open connections to /metrics (a scraper needs one)
EVICTION_REASONS = ("capacity", "ttl")  # why the server removes a session
_MAX_REQUEST_HEAD = 8192  # bytes of request line and headers


def _server_info(registry: CollectorRegistry, **labels: object) -> None:
    info = Info(
        "tensorops_server",
        "Version and ISA level of the kernels in use, worker processes and threads",
        registry=registry,
    )
    info.info({name: str(value) for name, value in labels.items()})


class StoreTotals:
    """tensorops_sessions_active and tensorops_session_bytes, read at each scrape from
    `totals()` (a dict with `sessions` and `session_bytes`): the process's own store, or in
    the supervisor the store all workers share."""

    def __init__(self, totals: Callable[[], dict]):
        self._totals = totals

    def collect(self):
        totals = self._totals()
        yield GaugeMetricFamily(
            "tensorops_sessions_active", "Quantized inner-product sessions held", value=totals["sessions"]
        )
        yield GaugeMetricFamily("tensorops_session_bytes", "Bytes held by the sessions", value=totals["session_bytes"])


class _OfWorker:
    """A metric with a `worker` label that its users label as if it had none."""

    def __init__(self, metric, worker: int):
        self._metric, self._worker = metric, str(worker)

    def labels(self, *values: str):
        return self._metric.labels(*values, self._worker)


class _Served:
    """A registry that can be served at /metrics."""

    registry: CollectorRegistry
    _endpoint: Endpoint | None = None

    def serve(self, host: str, port: int, timeout: float) -> int:
        """Expose /metrics over HTTP; returns the port (useful with port 0). OSError if the
        address cannot be used."""
        self._endpoint = Endpoint(self.registry, timeout)
        return self._endpoint.start(host, port)

    def stop(self) -> None:
        if self._endpoint is not None:
            self._endpoint.stop()
            self._endpoint = None


class Metrics(_Served):
    """The metrics of one server process. `worker`: its id among a supervisor's workers,
    whose values go to the multiprocess directory for the supervisor to serve; None for a
    server of one process, which serves its own registry."""

    def __init__(self, *, version: str, isa: str, workers: int, threads: int, worker: int | None = None):
        r = self.registry = CollectorRegistry()
        self.worker = worker
        if worker is None:  # the supervisor reports these for a server of several workers
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            _server_info(r, version=version, isa=isa, workers=workers, threads=threads)
        self.request_duration = Histogram(
            "tensorops_request_duration_seconds",
            "Time from the start of the handler to its result",
            ["operation", "code"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.kernel_duration = Histogram(
            "tensorops_kernel_duration_seconds",
            "Time spent in tensorops_native (the kernel and its checks)",
            ["operation"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        if worker is None:
            self.in_flight = Gauge("tensorops_requests_in_flight", "Calls being handled", ["operation"], registry=r)
        else:  # the live workers' values, each under its id (a dead worker's are dropped)
            in_flight = Gauge(
                "tensorops_requests_in_flight",
                "Calls being handled",
                ["operation", "worker"],
                registry=r,
                multiprocess_mode="livesum",
            )
            self.in_flight = _OfWorker(in_flight, worker)
        self.request_bytes = Counter(
            "tensorops_request_bytes", "Bytes of request messages received", ["operation"], registry=r
        )
        self.response_bytes = Counter(
            "tensorops_response_bytes", "Bytes of response messages sent", ["operation"], registry=r
        )
        self.errors = Counter(
            "tensorops_errors", "Calls that ended with a status other than OK", ["operation", "code"], registry=r
        )
        self.evictions = Counter(
            "tensorops_session_evictions", "Sessions removed by the server", ["reason"], registry=r
        )
        for reason in EVICTION_REASONS:  # at 0 from the start (a worker's series exist once set)
            self.evictions.labels(reason)
        self.batch_requests = Histogram(
            "tensorops_forward_batch_requests",
            "Session forwards merged into one kernel call",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.batch_rows = Histogram(
            "tensorops_forward_batch_rows",
            "Rows (M) of one session forward kernel call",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )

    def observe_batch(self, requests: int, rows: int) -> None:
        self.batch_requests.observe(requests)
        self.batch_rows.observe(rows)

    def watch_sessions(self, store) -> None:
        """Report the sessions `store` holds (a server of one process; a supervisor reports
        the shared store's for its workers)."""
        if self.worker is None:
            self.registry.register(StoreTotals(store.usage))  # one query a scrape


class SupervisorMetrics(_Served):
    """The one endpoint of a server of several workers: their values summed from the
    multiprocess directory (each call counted once, by the worker that handled it), the
    supervisor's own restarts and running workers, and the shared store's `totals()`."""

    def __init__(
        self, *, version: str, isa: str, workers: int, threads: int, directory: str, totals: Callable[[], dict]
    ):
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)  # the supervisor's own process
        PlatformCollector(registry=r)
        _server_info(r, version=version, isa=isa, workers=workers, threads=threads)
        multiprocess.MultiProcessCollector(r, path=directory)
        r.register(StoreTotals(totals))
        self.directory = directory
        self.restarts = Counter(
            "tensorops_worker_restarts", "Worker processes started again after they died", ["worker"], registry=r
        )
        self.running = Gauge("tensorops_workers_running", "Worker processes running", registry=r)

    def worker_died(self, pid: int) -> None:
        """Drop the dead process's live gauges (its in-flight calls ended with it); its
        counters stay: the calls it handled were made."""
        multiprocess.mark_process_dead(pid, self.directory)


class Endpoint:
    """A minimal HTTP/1.1 server of one registry: GET or HEAD of /metrics (or /), one
    response per connection, in the text format the scraper's Accept header asks for."""

    def __init__(self, registry: CollectorRegistry, timeout: float):
        self.registry = registry
        self.timeout = timeout
        # Open connections, oldest first: True while the request is arriving. One that loses
        # its place leaves at once, not when its task next runs, so that a burst of new
        # connections cannot pass the cap before the closed ones are counted out.
        self._connections: dict[asyncio.StreamWriter, bool] = {}
        self._tasks: set[asyncio.Task] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tensorops-metrics", daemon=True)
        self._listener: socket.socket | None = None

    def start(self, host: str, port: int) -> int:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        # A long listen queue costs no descriptor of ours: connections wait there until accepted.
        self._listener = socket.create_server((host, port), family=family, backlog=1024)
        self._listener.setblocking(False)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start_accepting(), self._loop).result()
        return self._listener.getsockname()[1]

    async def _start_accepting(self) -> None:
        self._keep(asyncio.get_running_loop().create_task(self._accept()))

    def _keep(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self) -> None:
        """Accept connections one at a time (not a backlog's worth at once, as asyncio's
        servers do), so that one beyond the cap is closed before the next is taken: the
        descriptors the endpoint holds stay at MAX_CONNECTIONS plus one."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(self._listener)
            except OSError:  # out of descriptors, or the peer left already: try again shortly
                await asyncio.sleep(0.05)
                continue
            if len(self._connections) >= MAX_CONNECTIONS:
                oldest = next((w for w, waiting in self._connections.items() if waiting), None)
                if oldest is None:  # every connection is being answered
                    sock.close()
                    continue
                del self._connections[oldest]  # the longest waiting loses its place
                oldest.transport.abort()
            reader, writer = await asyncio.open_connection(sock=sock, limit=_MAX_REQUEST_HEAD)
            self._connections[writer] = True
            self._keep(loop.create_task(self._serve(reader, writer)))

    def stop(self) -> None:
        async def close():
            for task in list(self._tasks):
                task.cancel()
            for writer in list(self._connections):
                writer.close()
            if self._listener is not None:
                self._listener.close()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout)
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            if writer not in self._connections:  # lost its place meanwhile
                return
            self._connections[writer] = False
            writer.write(self._response(head))
            await asyncio.wait_for(writer.drain(), self.timeout)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            self._connections.pop(writer, None)
            writer.close()

    def _response(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        method, _, rest = lines[0].partition(" ")
        path = rest.partition(" ")[0].partition("?")[0]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if method not in ("GET", "HEAD"):
            return _http(405, "Method Not Allowed", b"only GET and HEAD\n", "text/plain; charset=utf-8")
        if path not in ("/metrics", "/"):
            return _http(404, "Not Found", b"metrics are at /metrics\n", "text/plain; charset=utf-8")
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        body = encoder(self.registry)
        return _http(200, "OK", b"" if method == "HEAD" else body, content_type, length=len(body))


def _http(code: int, reason: str, body: bytes, content_type: str, length: int | None = None) -> bytes:
    head = (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body

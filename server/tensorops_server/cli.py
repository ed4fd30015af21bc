"""`tensorops-server`: run the service until SIGTERM or SIGINT, then drain and exit 0.
SIGHUP re-reads the TLS files at the next connection.

With `--workers 1` this process is the server. With more, it is their supervisor
(supervisor.py), which imports neither grpc nor the server: each worker is a fresh
interpreter (worker.py) that runs `serve()` as a server of one process would."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from . import config as config_module
from . import logs


def main(argv=None) -> int:
    config = config_module.load(argv)
    if config.workers > 1:
        from . import supervisor

        return supervisor.main(config)
    stderr = logs.StderrCapture(logging.getLogger(logs.LOGGER))  # gRPC core's own lines become JSON too
    log = logs.setup(config.log_level, config.log_format, stream=stderr.stream)
    try:
        return serve(config, log, stderr)
    finally:
        stderr.close()


def serve(config, log, stderr, *, on_serving=None, **server_options) -> int:
    """Serve until SIGTERM or SIGINT, drain, and leave the process. `on_serving()`: called
    once the server serves (a worker tells its supervisor); `server_options`: the
    TensorOpsServer keywords of a worker (its id, the shared state)."""
    from tensorops import retain_freed_buffers

    from .server import TensorOpsServer

    retained = retain_freed_buffers(config.max_message_bytes)
    log.debug("malloc tuned", extra=logs.fields(retain_freed_buffers=retained))
    try:
        server = TensorOpsServer(config, **server_options)
        if hasattr(signal, "SIGHUP"):  # before "serving"; only counts a request, served at the next TLS handshake
            signal.signal(signal.SIGHUP, lambda _signum, _frame: server.tls and server.tls.request_reload())
        server.start()
    except OSError as exc:
        log.error("cannot start", extra=logs.fields(error=str(exc)))
        return 1
    if on_serving is not None:
        on_serving()
    stop = threading.Event()
    received = []

    def on_signal(signum, _frame):
        received.append(signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    while not stop.wait(0.5):
        pass
    log.info(
        "draining",
        extra=logs.fields(signal=received[0], drain_delay_seconds=config.drain_delay, grace_seconds=config.grace),
    )
    server.stop(drain_delay=config.drain_delay)
    log.info("stopped")
    stderr.close()
    logging.shutdown()
    # A kernel still running on a worker thread (its call was cancelled at the end of the
    # grace period) must not hold the process: leave without waiting for it.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

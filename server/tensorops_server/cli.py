"""`tensorops-server`: run the service until SIGTERM or SIGINT, then drain and exit 0.
SIGHUP re-reads the TLS files at the next connection."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from tensorops import retain_freed_buffers

from . import config as config_module
from . import logs
from .server import TensorOpsServer


def main(argv=None) -> int:
    config = config_module.load(argv)
    stderr = logs.StderrCapture(logging.getLogger(logs.LOGGER))  # gRPC core's own lines become JSON too
    log = logs.setup(config.log_level, config.log_format, stream=stderr.stream)
    try:
        return serve(config, log, stderr)
    finally:
        stderr.close()


def serve(config, log, stderr) -> int:
    retained = retain_freed_buffers(config.max_message_bytes)
    log.debug("malloc tuned", extra=logs.fields(retain_freed_buffers=retained))
    try:
        server = TensorOpsServer(config)
        if hasattr(signal, "SIGHUP"):  # before "serving"; only counts a request, served at the next TLS handshake
            signal.signal(signal.SIGHUP, lambda _signum, _frame: server.tls and server.tls.request_reload())
        server.start()
    except OSError as exc:
        log.error("cannot start", extra=logs.fields(error=str(exc)))
        return 1
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

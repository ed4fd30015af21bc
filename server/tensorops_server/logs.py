"""Structured logs: one JSON object per line on stderr (or plain text for a terminal).

    log.info("serving", extra=fields(port=50051))
gives {"ts": "...", "level": "info", "logger": "tensorops_server", "event": "serving", "port": 50051}.

gRPC's C core writes its own lines to file descriptor 2, not through Python: the server
process routes that descriptor through the logger too (`StderrCapture`), so that every
line it prints is one of these objects.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import re
import sys
import threading
import time

LOGGER = "tensorops_server"
# Fields every record of this process carries: a worker's id among the supervisor's workers.
_PROCESS_FIELDS: dict = {}


def set_process_fields(**values) -> None:
    """Add `values` to every record this process logs from now on (a worker's `worker`)."""
    _PROCESS_FIELDS.update(values)


def _fields_of(record: logging.LogRecord) -> dict:
    return {**_PROCESS_FIELDS, **getattr(record, "fields", {})}


def fields(**values) -> dict:
    return {"fields": values}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update(_fields_of(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in _fields_of(record).items())
        line = f"{self.formatTime(record)} {record.levelname.lower():7} {record.getMessage()} {extra}".rstrip()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(level: str = "info", fmt: str = "json", stream=None) -> logging.Logger:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logger = logging.getLogger(LOGGER)
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
    return logger


# gRPC core's line format: severity letter, date, time, thread id, source file:line, message.
_GRPC_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+ +\d+ ([^\]\s]+)\] ?(.*)$")
_GRPC_LEVELS = {"I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}


class StderrCapture:
    """Everything written to file descriptor 2 (gRPC core's logs, Python's reports of
    uncaught errors) becomes one log record per line, at the level gRPC gave it (warning
    for other lines). The logger's own handler writes to the original stderr (`stream`);
    a crash report (faulthandler) goes there directly, since the process may not live
    long enough to forward it."""

    def __init__(self, logger: logging.Logger):
        self._logger = logger
        self._original = os.dup(2)
        self.stream = os.fdopen(os.dup(self._original), "w", buffering=1)
        faulthandler.enable(self.stream)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        self._thread = threading.Thread(target=self._forward, args=(read_end,), name="tensorops-stderr", daemon=True)
        self._thread.start()

    def _forward(self, read_end: int) -> None:
        with os.fdopen(read_end, "r", errors="replace") as lines:
            for line in lines:
                log_stderr_line(self._logger, line.rstrip("\n"))

    def close(self, timeout: float = 2.0) -> None:
        """Give descriptor 2 back to the original stderr and forward what is still in the pipe."""
        if not self._thread.is_alive():
            return
        sys.stderr.flush()
        os.dup2(self._original, 2)  # closes the pipe's last write end: the forwarder reads to its end
        self._thread.join(timeout)


def log_stderr_line(logger: logging.Logger, line: str) -> None:
    """One line written to stderr as a record of `logger`'s child "grpc" (gRPC core's lines,
    at their severity, with their source file) or "stderr" (anything else, a warning)."""
    if not line.strip():
        return
    match = _GRPC_LINE.match(line)
    if match:
        severity, source, message = match.groups()
        logger.getChild("grpc").log(_GRPC_LEVELS[severity], message, extra=fields(source=source))
    else:
        logger.getChild("stderr").warning(line)

"""One worker of a server of several processes, started by the supervisor as
`python -m tensorops_server.worker STATE_DIR`: a fresh interpreter that serves as a server
of one process would (cli.serve), on the port the supervisor holds, with the supervisor's
shared state.

It imports the server first, then waits for its assignment on standard input: its id and
its configuration, as JSON (never in its arguments, where any user of the machine could
read a token). So the supervisor keeps one started worker in reserve, and a worker that
dies is replaced by one that only has to bind the port. It writes `serving` to standard
output once it serves, then closes it. End of input without an assignment: it leaves."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time

from . import cli, logs
from . import server as _server  # noqa: F401 (imported before the assignment: a reserve starts at once)
from .config import Config

_PR_SET_PDEATHSIG = 1
ORPHAN_CHECK_SECONDS = 0.5


def drain_when_orphaned() -> None:
    """Have this worker drain and exit (SIGTERM to itself) if its supervisor dies, even by
    SIGKILL, so that no worker outlives it: the kernel's parent-death signal (Linux), and a
    thread that sees the parent change, for what that signal misses (a supervisor killed
    while this worker was between starting and serving lost a worker that way)."""
    supervisor = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(ORPHAN_CHECK_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="tensorops-orphan-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    state_dir = argv[0]
    drain_when_orphaned()
    # Until it serves, the supervisor's signals are the only ones that count: a terminal's
    # SIGINT reaches the whole process group, and SIGHUP would end a worker still starting.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    text = sys.stdin.read()
    sys.stdin.close()
    if not text:  # a reserve the supervisor no longer needs
        return 0
    message = json.loads(text)  # supervisor.assignment()
    worker_id, config = message["worker"], Config(**message["config"])
    status = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything printed goes where the logs go, not into the status pipe
    logs.set_process_fields(worker=worker_id)
    stderr = logs.StderrCapture(logging.getLogger(logs.LOGGER))
    log = logs.setup(config.log_level, config.log_format, stream=stderr.stream)

    def on_serving() -> None:
        status.write("serving\n")
        status.close()

    try:
        return cli.serve(config, log, stderr, on_serving=on_serving, state_dir=state_dir, worker_id=worker_id)
    finally:
        stderr.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The supervisor's own rules, without workers: each worker's share of the caps, the restart
delays of a crash loop, and the port it holds for its workers."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys

import pytest

from tensorops_server import supervisor
from tensorops_server.config import Config


def test_each_worker_gets_its_share_of_the_per_process_caps():
    config = Config(
        workers=3,
        max_concurrent_rpcs=10,
        max_inflight_bytes=1000,
        max_connections=2,
        max_health_watches=256,
        max_pending_requests=64,
        max_sessions=7,
        port=0,
        metrics_port=9100,
    )
    share = supervisor.shares(config, port=4321)
    assert (share.max_concurrent_rpcs, share.max_inflight_bytes, share.max_connections) == (3, 333, 1)
    assert (share.max_health_watches, share.max_pending_requests) == (85, 21)
    # what is not a per-process cap is left as it is; the port is the one held; no metrics endpoint
    assert (share.max_sessions, share.workers, share.port, share.metrics_port) == (7, 3, 4321, -1)
    # 0 (no limit) stays unlimited
    assert supervisor.shares(dataclasses.replace(config, max_concurrent_rpcs=0), 1).max_concurrent_rpcs == 0
    # every field of a share is a setting a worker reads back
    assert Config(**dataclasses.asdict(share)) == share


def test_crash_loop_restarts_back_off():
    delays = [supervisor.backoff(crashes) for crashes in range(1, 10)]
    assert delays == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_the_held_port_is_shared_with_reuseport_sockets_and_refused_to_others():
    with supervisor.hold_port("127.0.0.1", 0) as holder:
        port = holder.getsockname()[1]
        assert port > 0
        with socket.socket() as worker:  # as a worker's gRPC binds it
            worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            worker.bind(("127.0.0.1", port))
            worker.listen()
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass  # accepted by the listening worker: the holder only keeps the port
            with pytest.raises(OSError, match="address already in use"):
                supervisor.hold_port("127.0.0.1", port)  # another server of several workers cannot
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # another program without SO_REUSEPORT cannot
    with socket.socket() as listening:  # a port another program listens on is refused
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        taken = listening.getsockname()[1]
        with pytest.raises(OSError, match=f"^cannot listen on 127.0.0.1:{taken}: address already in use$"):
            supervisor.hold_port("127.0.0.1", taken)


def test_the_supervisor_imports_no_grpc():
    """Neither grpc nor the client package (which imports it): see also test_workers.py, which
    reads the running supervisor's memory maps."""
    code = (
        "import sys; from tensorops_server import cli, config, metrics, statedir, supervisor; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'tensorops')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"

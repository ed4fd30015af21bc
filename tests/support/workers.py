"""Two workers of one server in this process: two TensorOpsServers, each on a port of its
own, on one state directory (as the supervisor's workers are, which share one port). Calling
each worker through its own port says which worker serves what."""

from __future__ import annotations

import pytest

from tensorops_server.config import Config
from tensorops_server.server import TensorOpsServer
from tensorops_server.statedir import StateDir


class Workers:
    """Two workers on one state directory; `target(i)` is worker i's address."""

    def __init__(self, **overrides):
        self.state = StateDir.create()
        settings = dict(host="127.0.0.1", port=0, metrics_port=-1, threads=2, drain_delay=0.0, grace=1.0)
        config = Config(**dict(settings, **overrides))
        self.servers = []
        for worker in (1, 2):
            server = TensorOpsServer(config, state_dir=self.state.path, worker_id=worker)
            server.start()
            self.servers.append(server)

    def target(self, i: int) -> str:
        return f"127.0.0.1:{self.servers[i].port}"

    def stop_worker(self, i: int) -> None:
        if self.servers[i] is not None:
            self.servers[i].stop(0)
            self.servers[i] = None

    def stop(self):
        for i in range(len(self.servers)):
            self.stop_worker(i)
        self.state.remove()


@pytest.fixture
def workers():
    """Start two workers with the given settings (`workers(**settings)`); stopped after the test."""
    started = []

    def start(**overrides):
        started.append(Workers(**overrides))
        return started[-1]

    yield start
    for w in started:
        w.stop()

"""KServe V2 tests: tritonclient (sync and asyncio) against a real server on an ephemeral
loopback port, with the shared server fixtures and call cases (tests/support)."""

from __future__ import annotations

import pytest

from rpc_server import ServerProcess, server, start_server  # noqa: F401 (fixtures)

try:
    import tritonclient.grpc as tritonclient_grpc
except ImportError:  # tritonclient[grpc] comes with the test extra; without it, nothing here runs
    tritonclient_grpc = None
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture
def triton(server):
    client = tritonclient_grpc.InferenceServerClient(server.target)
    yield client
    client.close()


@pytest.fixture(scope="session")
def shm_server(tmp_path_factory):
    """A server that serves system shared memory."""
    proc = ServerProcess(tmp_path_factory.mktemp("shm") / "server.log", "--allow-shared-memory", "true").start()
    yield proc
    assert proc.stop() == 0

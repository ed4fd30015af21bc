"""KServe V2 tests: tritonclient (sync and asyncio) against a real server on an ephemeral
loopback port, sharing the end-to-end tests' server process and call cases."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from rpc_server import ServerProcess  # noqa: E402

tritonclient_grpc = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] comes with the test extra")


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("kserve") / "server.log").start()
    yield proc
    assert proc.stop() == 0


@pytest.fixture
def start_server(tmp_path):
    """A dedicated server with extra flags."""
    started = []

    def start(*flags):
        proc = ServerProcess(tmp_path / f"server{len(started)}.log", *flags).start()
        started.append(proc)
        return proc
    yield start
    for proc in started:
        proc.kill()


@pytest.fixture
def triton(server):
    client = tritonclient_grpc.InferenceServerClient(server.target)
    yield client
    client.close()

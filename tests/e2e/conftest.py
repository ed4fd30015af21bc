"""End-to-end fixtures: real servers in subprocesses on ephemeral loopback ports."""
from __future__ import annotations

import asyncio

import pytest

import tensorops
import tensorops.aio
from rpc_server import ServerProcess


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """One server shared by the tests that do not restart or reconfigure it."""
    proc = ServerProcess(tmp_path_factory.mktemp("server") / "server.log").start()
    yield proc
    assert proc.stop() == 0


@pytest.fixture
def start_server(tmp_path):
    """Start a dedicated server with extra flags: start_server("--max-sessions", "2")."""
    started = []

    def start(*flags, env=None, port=0):
        proc = ServerProcess(tmp_path / f"server{len(started)}.log", *flags, env=env).start(port)
        started.append(proc)
        return proc
    yield start
    for proc in started:
        proc.kill()


@pytest.fixture
def client(server):
    with tensorops.Client(server.target, timeout=60) as c:
        yield c


@pytest.fixture
def run_async():
    """Run a coroutine function with a fresh aio client: run_async(target, fn) -> fn's result."""
    def run(target, fn, **client_kwargs):
        async def main():
            async with tensorops.aio.Client(target, timeout=60, **client_kwargs) as c:
                return await fn(c)
        return asyncio.run(main())
    return run

"""End-to-end fixtures: real servers in subprocesses on ephemeral loopback ports."""

from __future__ import annotations

import asyncio

import pytest

import tensorops
import tensorops.aio
from rpc_server import server, start_server  # noqa: F401 (fixtures)


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

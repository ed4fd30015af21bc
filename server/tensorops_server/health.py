"""The gRPC health service (grpc.health.v1.Health) with a bounded number of Watch streams.

Each Watch stream holds a coroutine and a stream for as long as the client likes, so their
number is capped: `--max-health-watches` for all connections together and
HEALTH_WATCHES_PER_CONNECTION for one connection (so that one client cannot take them all).
More get RESOURCE_EXHAUSTED at once. The statuses are those of the fixed set of services
the server sets; a name it never set is answered (NOT_FOUND for Check, SERVICE_UNKNOWN for
Watch) without being stored, however long or many the names."""

from __future__ import annotations

import asyncio
import collections

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .config import HEALTH_WATCHES_PER_CONNECTION

ServingStatus = health_pb2.HealthCheckResponse.ServingStatus


class HealthService(health_pb2_grpc.HealthServicer):
    def __init__(self, max_watches: int, max_watches_per_connection: int = HEALTH_WATCHES_PER_CONNECTION):
        self.max_watches = max_watches
        self.max_watches_per_connection = max_watches_per_connection
        self._status: dict[str, ServingStatus] = {"": health_pb2.HealthCheckResponse.SERVING}
        self._changed = asyncio.Condition()  # one for every service: changes are rare
        self._draining = False
        self._watches_by_connection: collections.Counter[str] = collections.Counter()
        self.watches = 0

    async def Check(self, request, context):
        status = self._status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request, context):
        connection = context.peer()
        if self.watches >= self.max_watches:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"too many health Watch streams: {self.watches} open on this server, the most "
                f"allowed (--max-health-watches); use Check, or close a Watch",
            )
        if self._watches_by_connection[connection] >= self.max_watches_per_connection:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"too many health Watch streams on this connection: "
                f"{self.max_watches_per_connection} are open, the most allowed per connection",
            )
        self.watches += 1
        self._watches_by_connection[connection] += 1
        try:
            while True:
                sent = self._current(request.service)
                await context.write(health_pb2.HealthCheckResponse(status=sent))
                async with self._changed:  # a change made while the write waited is seen here
                    await self._changed.wait_for(lambda sent=sent: self._current(request.service) != sent)
        finally:
            self.watches -= 1
            self._watches_by_connection[connection] -= 1
            if not self._watches_by_connection[connection]:
                del self._watches_by_connection[connection]

    def _current(self, service: str) -> ServingStatus:
        return self._status.get(service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)

    async def set(self, service: str, status: ServingStatus) -> None:
        """Set a service's status (ignored once draining: NOT_SERVING stays)."""
        if not self._draining:
            await self._set(service, status)

    async def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING from now on."""
        self._draining = True
        for service in list(self._status):
            await self._set(service, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def _set(self, service: str, status: ServingStatus) -> None:
        self._status[service] = status
        async with self._changed:
            self._changed.notify_all()

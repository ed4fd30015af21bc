"""The asyncio client: the methods of tensorops.Client, awaited.

from tensorops.aio import Client
async with Client("localhost:50051") as c:
    y = await c.softmax(x)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Self, TypeVar, Unpack, cast, overload

import grpc
import grpc.aio
import numpy as np
import numpy.typing as npt

from ._client import (
    DEFAULT_TARGET,
    ClientBase,
    ClientOptions,
    ServerInfo,
    SessionBase,
    SessionInfo,
    encode,
    server_info,
    session_info,
)
from ._client import Client as BlockingClient
from ._errors import NotFoundError
from ._operations import (
    ArrayOf,
    DTypeChoice,
    Float32Array,
    Float32Pair,
    FloatArray,
    Metadata,
    NamedArray,
    Pairs,
    Scalar,
    Shape,
    Timeout,
    UInt8Array,
    UInt8Input,
    result_into,
)
from ._shared_memory import MIN_BYTES
from .protocol import wire
from .v1 import tensorops_pb2

__all__ = ["Client", "QuantizedInnerProductSession"]

T = TypeVar("T")


class Client(
    ClientBase[
        Awaitable[Float32Array],
        Awaitable[FloatArray],
        Awaitable[Float32Pair],
        Awaitable[UInt8Array],
        Awaitable["QuantizedInnerProductSession"],
    ]
):
    """asyncio client. Create it inside a running event loop; every operation method
    returns an awaitable. `await c.quantized_inner_product(b, ...)` opens a session.
    Takes the keyword arguments of tensorops.Client (TLS, mutual TLS, token: see
    ClientBase; shared memory: see tensorops.Client)."""

    _channel: grpc.aio.Channel

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        shared_memory: bool = False,
        shared_memory_prefix: str = "tensorops_",
        shared_memory_min_bytes: int = MIN_BYTES,
        **kwargs: Unpack[ClientOptions],
    ):
        super().__init__(target, **kwargs)
        self._channel = self._open_channel(self._options)
        # Shared memory (see tensorops.Client) through a blocking client of its own, whose
        # calls (a region copy and a small message) run on a thread.
        self._blocking: BlockingClient | None = None
        if shared_memory:
            self._blocking = BlockingClient(
                target,
                shared_memory=True,
                shared_memory_prefix=shared_memory_prefix,
                shared_memory_min_bytes=shared_memory_min_bytes,
                **kwargs,
            )
        self._shared = self._blocking._shared if self._blocking is not None else None

    def _open_channel(self, options: list[tuple[str, object]]) -> grpc.aio.Channel:
        if self._credentials is None:
            return grpc.aio.insecure_channel(self.target, options=options)
        return grpc.aio.secure_channel(self.target, self._credentials, options=options)

    def _session_transport(self) -> Self:
        transport = super()._session_transport()
        if transport is not self:
            transport._blocking = None  # the owner's shared-memory client stays the owner's
        return transport

    async def close(self) -> None:
        """As tensorops.Client.close."""
        if self._closed:
            return
        if self._blocking is not None:
            await asyncio.to_thread(self._blocking.close)
        if self._close_channel():
            await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _invoke(
        self, path: str, data: bytes, timeout: float | None = None, metadata: Pairs | None = None
    ) -> bytes:
        try:
            return await cast(Awaitable[bytes], self._method(path)(data, **self._call_options(timeout, metadata)))
        except (grpc.RpcError, grpc.aio.UsageError) as exc:  # UsageError: the channel closed
            raise self._failure(exc) from None

    @overload
    def shared_array(self, shape: Shape) -> Float32Array: ...

    @overload
    def shared_array(self, shape: Shape, dtype: type[Scalar] | np.dtype[Scalar]) -> ArrayOf[Scalar]: ...

    @overload
    def shared_array(self, shape: Shape, dtype: str) -> NamedArray: ...

    def shared_array(self, shape: Shape, dtype: DTypeChoice = "float32") -> npt.NDArray[Any]:
        """As tensorops.Client.shared_array (its one registration call blocks)."""
        self._check_open()
        if self._blocking is None:
            raise ValueError("shared_array: the client was made without shared_memory=True")
        return self._blocking.shared_array(shape, dtype)

    async def _call(self, name: str, arguments: dict[str, object], timeout: float | None, metadata: Pairs) -> object:
        out = cast("np.ndarray | None", arguments.pop("out", None))
        if self._shared is not None and self._shared.off_reason is None:
            result = await asyncio.to_thread(self._shared.call, name, arguments, timeout, metadata, out)
            if result is not NotImplemented:
                return result_into(out, result)
        op = wire.OPERATIONS[name]
        request = encode(op, arguments)
        raw = await self._invoke(op.path, request.data, timeout, metadata)
        return result_into(out, wire.decode_response(op, raw, request.bf16_bits))

    async def _open_session(
        self, arguments: dict[str, object], timeout: float | None, metadata: Pairs
    ) -> QuantizedInnerProductSession:
        session = QuantizedInnerProductSession(self, encode(wire.CREATE_SESSION, arguments).data)
        try:
            await session._create(timeout, session._metadata(metadata))
        except BaseException:
            await session._close_transport()
            raise
        return session

    async def info(self, *, timeout: Timeout = None, metadata: Metadata = None) -> ServerInfo:
        """As tensorops.Client.info."""
        checked_timeout, checked_metadata = self._begin(timeout, metadata)
        raw = await self._invoke(wire.method_path("GetServerInfo"), b"", checked_timeout, checked_metadata)
        return server_info(tensorops_pb2.ServerInfo.FromString(raw))

    async def list_sessions(self, *, timeout: Timeout = None, metadata: Metadata = None) -> list[SessionInfo]:
        """As tensorops.Client.list_sessions."""
        checked_timeout, checked_metadata = self._begin(timeout, metadata)
        raw = await self._invoke(wire.method_path("ListSessions"), b"", checked_timeout, checked_metadata)
        return [session_info(s) for s in tensorops_pb2.ListSessionsResponse.FromString(raw).sessions]


class QuantizedInnerProductSession(SessionBase):
    """The asyncio twin of tensorops.QuantizedInnerProductSession: `await s.forward(a)`,
    `await s.external_buffer_size_for(m)`, `await s.close()`, `async with`."""

    _client: Client

    def __init__(self, client: Client, create_request: bytes):
        super().__init__(client, create_request)
        self._lock = asyncio.Lock()

    async def _create(self, timeout: float | None, metadata: Pairs) -> None:
        raw = await self._client._invoke(wire.CREATE_SESSION.path, self._create_request, timeout, metadata)
        self._info = tensorops_pb2.SessionInfo.FromString(raw)

    async def _retrying(self, call: Callable[[], Awaitable[T]], timeout: float | None, metadata: Pairs) -> T:
        session_id = self._created.session_id
        try:
            return await call()
        except NotFoundError:
            async with self._lock:
                if self._created.session_id == session_id:
                    await self._create(timeout, metadata)
                    self._recreated += 1
            return await call()

    async def forward(self, a: UInt8Input, *, timeout: Timeout = None, metadata: Metadata = None) -> UInt8Array:
        """As tensorops.QuantizedInnerProductSession.forward."""
        checked_timeout, checked_metadata = self._begin(timeout, metadata)
        op = wire.FORWARD_SESSION

        async def call() -> UInt8Array:
            request = self._forward_request(a)
            raw = await self._client._invoke(op.path, request.data, checked_timeout, checked_metadata)
            return cast(UInt8Array, wire.decode_response(op, raw))

        return await self._retrying(call, checked_timeout, checked_metadata)

    async def describe(
        self, m: int | None = None, *, timeout: Timeout = None, metadata: Metadata = None
    ) -> SessionInfo:
        """As tensorops.QuantizedInnerProductSession.describe."""
        checked_timeout, checked_metadata = self._begin(timeout, metadata)

        async def call() -> SessionInfo:
            raw = await self._client._invoke(
                wire.method_path("DescribeSession"),
                self._describe_request(self._created.session_id, m),
                checked_timeout,
                checked_metadata,
            )
            return session_info(tensorops_pb2.SessionInfo.FromString(raw))

        return await self._retrying(call, checked_timeout, checked_metadata)

    async def external_buffer_size_for(self, m: int, *, timeout: Timeout = None, metadata: Metadata = None) -> int:
        return (await self.describe(m, timeout=timeout, metadata=metadata))["external_buffer_size"]

    async def close(self, *, timeout: Timeout = None, metadata: Metadata = None) -> None:
        if self._close_without_server():
            await self._close_transport()
        if self._closed:
            return
        checked_timeout, checked_metadata = self._begin(timeout, metadata)
        self._closed = True
        request = tensorops_pb2.ReleaseSessionRequest(session_id=self._created.session_id).SerializeToString()
        try:
            await self._client._invoke(wire.method_path("ReleaseSession"), request, checked_timeout, checked_metadata)
        except NotFoundError:
            pass
        finally:
            await self._close_transport()

    async def _close_transport(self) -> None:
        if self._client is not self._owner:
            await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

"""The handlers of tensorops.v1.TensorOps, produced from the op table, plus the session and
server-info calls. Every handler is a coroutine of the grpc.aio server and runs inside one
wrapper (`Instrumented`) that owns the cross-cutting concerns: metrics, logs, the mapping of
failures to status codes, and the refusal to start work for a call that was cancelled or
whose deadline passed. Where each computation runs (event loop or worker) is decided by
the Executor (see execution.py); session forwards go through the ForwardBatcher.

Requests and responses are bytes: the codec decodes the Tensor payloads in place and
writes the response payloads with one copy (see tensorops.protocol.codec). A request of up to
--inline-bytes is decoded by gRPC's deserializer on the event loop (fast); a larger one is
decoded on a worker after its call was admitted (`deferred`).

Every call has one memory account (admission.py) from its admission until gRPC has sent
its response, or the call ended: a unary call's is closed by the context's done
callback, which grpc.aio runs once the response and status were written to the
connection (a client that does not read keeps it until its connection closes); a stream
passes `send` so that each response is charged until it was written."""
from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import grpc
import numpy as np

import tensorops_native
from tensorops.protocol import codec, wire
from tensorops.v1 import tensorops_pb2

from . import errors, optable
from .batching import ForwardBatcher
from .config import Config
from .admission import Admission
from .auth import Authenticator
from .execution import RESPONSE_OVERHEAD, CallState, Executor, in_row_blocks, qip_rows_per_block, reserve_result
from .logs import LOGGER, fields
from .metrics import Metrics
from .sessions import SessionStore

log = logging.getLogger(LOGGER)



@dataclass
class Incoming:
    """A request as the deserializer leaves it: decoded, or the reason it could not be, or
    (`later`) still to be decoded, by calling it, on a worker."""
    decoded: codec.Decoded | None
    error: codec.WireError | None
    nbytes: int
    later: Callable[[], "Incoming"] | None = None


def deferred(decode: Callable[[bytes], Incoming], inline_bytes: int) -> Callable[[bytes], Incoming]:
    """A request deserializer that decodes at once (on the event loop) only requests of up
    to `inline_bytes`; larger ones are decoded by Instrumented on a worker, once admitted."""
    def deserialize(raw: bytes) -> Incoming:
        if len(raw) <= inline_bytes:
            return decode(raw)
        return Incoming(None, None, len(raw), functools.partial(decode, raw))
    return deserialize


def deserializer(message_codec: codec.MessageCodec) -> Callable[[bytes], Incoming]:
    name = message_codec.message_class.DESCRIPTOR.full_name

    def decode(raw: bytes) -> Incoming:
        try:
            return Incoming(message_codec.decode(raw), None, len(raw))
        except codec.WireError as exc:  # reported by the handler as INVALID_ARGUMENT
            if exc.field == "message" and exc.message.startswith("cannot parse"):  # the protobuf runtime's words
                exc = codec.WireError("message", f"the request is not a valid {name} message in the "
                                       "protobuf binary encoding")
            return Incoming(None, exc, len(raw))
    return decode


def add_handlers(server: grpc.aio.Server, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
    """Serve `handlers` (method name -> handler) as `service`: the one way the server adds
    its handlers (the TensorOps handlers of Service.handlers(), each an Instrumented
    stream-unary handler, and reflection's). The same handler objects are registered by
    method and also offered through a generic handler, as grpcio's generated code does:
    the asyncio server of grpcio 1.81 (the oldest release supported) never consults
    registered handlers, so without the generic one every call would be UNIMPLEMENTED."""
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)


class Instrumented:
    """The wrapper around every handler: receives the request (within the admission
    limits), admits the call, runs its behavior and records the outcome."""

    def __init__(self, label: str, behavior: Callable[[codec.Decoded, CallState, int], Awaitable[bytes]],
                 metrics: Metrics, admission: Admission, auth: Authenticator, max_response_bytes: int):
        self.label = label
        self.behavior = behavior
        self.admission = admission
        self.auth = auth
        self.max_response_bytes = max_response_bytes
        m = metrics
        self._in_flight = m.in_flight.labels(label)
        self._request_bytes = m.request_bytes.labels(label)
        self._response_bytes = m.response_bytes.labels(label)
        self._duration = m.request_duration
        self._duration_ok = m.request_duration.labels(label, "OK")
        self._errors = m.errors

    async def handle(self, requests, context: grpc.aio.ServicerContext) -> bytes:
        # Registered as a client-streaming method so that the request is read here, under
        # the admission limits; on the wire it is a plain unary call.
        response, status = await self.call(context)
        if status is None:
            return response
        await context.abort_with_status(status)

    async def call(self, context: grpc.aio.ServicerContext, incoming: Incoming | None = None,
                   identity: str | None = None,
                   send: Callable[[bytes], Awaitable[None]] | None = None) -> tuple[bytes | None, grpc.Status | None]:
        """One call: (the response, None), or (None, the status it failed with). Without
        `incoming`, the request is read here; a stream handler passes each request it read
        (and the caller's identity, established once for the stream), and `send`, which
        writes the response: the call's charge is held until it returns (without it, only
        until the response was computed). A unary call's charge is held until the call
        ended (the context's done callback, after gRPC wrote the response)."""
        start = time.perf_counter()
        code = grpc.StatusCode.OK
        status = None
        account = None
        nbytes = 0
        sending = False
        unary = incoming is None  # the context is this call's alone
        try:
            if identity is None:
                identity = self.auth.identify(context)  # before the request is read
            if incoming is None:
                incoming = await self.admission.receive(context)
            nbytes = incoming.nbytes
            self._request_bytes.inc(nbytes)
            if incoming.error is not None:
                raise errors.from_wire(incoming.error)
            call = CallState(context, identity)
            call.ensure_active()
            account = call.account = self.admission.admit(nbytes)
            self._in_flight.inc()
            try:
                if incoming.later is not None:  # a large request: decoded on a worker
                    incoming = await self.admission.executor.offload(call, incoming.later)
                    if incoming.error is not None:
                        raise errors.from_wire(incoming.error)
                response = await self.behavior(incoming.decoded, call, nbytes)
            finally:
                self._in_flight.dec()
                account.stop_running()
            if len(response) > self.max_response_bytes:
                raise errors.exhausted(f"the response of {len(response)} bytes exceeds the limit of "
                                       f"{self.max_response_bytes} bytes per message")
            if call.deadline is not None and time.monotonic() > call.deadline:  # the caller gets nothing
                code = grpc.StatusCode.DEADLINE_EXCEEDED
            self._response_bytes.inc(len(response))
            if send is not None:
                sending = True
                await send(response)
            elif unary:  # closed once grpc has written the response (or the call ended)
                context.add_done_callback(lambda _, account=account: account.close())
                account = None
            return response, None
        except errors.Failure as failure:
            code, status = failure.code, failure.status()
        except MemoryError:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED
            status = errors.Failure(code, "the server ran out of memory for this call").status()
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception:
            if sending:  # the peer went away: nobody to answer
                code = grpc.StatusCode.CANCELLED
                raise
            code = grpc.StatusCode.INTERNAL
            log.exception("call failed", extra=fields(operation=self.label, code=code.name, peer=context.peer()))
            status = errors.Failure(code, "internal error (logged by the server)").status()
        finally:
            if account is not None:
                account.close()
            elapsed = time.perf_counter() - start
            if code is grpc.StatusCode.OK:
                self._duration_ok.observe(elapsed)
            else:
                self._duration.labels(self.label, code.name).observe(elapsed)
                self._errors.labels(self.label, code.name).inc()
            # One line per call. INTERNAL (a server bug) was logged above with its traceback;
            # every other failure is a client's mistake or a refusal under load: one short
            # line at debug level, so that a flood of bad calls cannot flood the log.
            if code is not grpc.StatusCode.INTERNAL and log.isEnabledFor(logging.DEBUG):
                details = {} if status is None else {"message": status.details[:200]}
                log.debug("call" if code is grpc.StatusCode.OK else "call failed",
                          extra=fields(operation=self.label, code=code.name, seconds=round(elapsed, 6),
                                       request_bytes=nbytes, peer=context.peer(), **details))
        return None, status


class Service:
    """Handler behaviors. Each takes the decoded request, its CallState and the request's
    size, and returns the serialized response."""

    def __init__(self, config: Config, metrics: Metrics, store: SessionStore, table: dict[str, optable.Entry],
                 executor: Executor, auth: Authenticator, qip_class=None):
        self.config = config
        self.metrics = metrics
        self.store = store
        self.table = table
        self.executor = executor
        self.auth = auth
        self.admission = Admission(
            max_pending=config.max_pending_requests, read_timeout=config.read_timeout,
            max_concurrent=config.max_concurrent_rpcs, max_inflight_bytes=config.max_inflight_bytes,
            executor=executor)
        # The class of the session contexts: tensorops_native.QuantizedInnerProduct (tests
        # may give a stand-in with the same interface).
        self._qip_class = qip_class or getattr(tensorops_native, "QuantizedInnerProduct", None)
        # The largest result a call may produce: a tensor, within a response message.
        self.result_limit = min(config.max_tensor_bytes, config.max_message_bytes - RESPONSE_OVERHEAD)
        forward_timer = self._timer("quantized_inner_product_forward")
        self.batcher = ForwardBatcher(
            executor, max_rows=config.max_batch_rows, window=config.batch_window_us / 1e6,
            result_limit=self.result_limit, observe=metrics.observe_batch, time_kernel=forward_timer.observe)

    # ---- helpers
    @staticmethod
    def _run(timer, call: CallState, fn, *args, **kwargs):
        """Call tensorops_native: the kernel runs here (GIL released), timed by `timer`
        (a child of the kernel duration histogram)."""
        call.ensure_active()
        start = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except errors.NATIVE_ERRORS as exc:
            raise errors.from_native(exc) from None
        timer.observe(time.perf_counter() - start)
        return result

    def _timer(self, label: str):
        return self.metrics.kernel_duration.labels(label)

    @staticmethod
    def _encode(op: wire.Operation, result, fmt: int) -> bytes:
        out_fmt = fmt if op.layout and op.image_outputs else 0
        fields = op.response_fields
        if len(fields) == 1 and not isinstance(result, tuple):  # the common case: one array
            name = fields[0]
            return op.response_codec.encode(None, {name: codec.encode_tensor(result, name, out_fmt)})
        results = result if isinstance(result, tuple) else (result,)
        tensors = {name: codec.encode_tensor(arr, name, out_fmt) for name, arr in zip(fields, results)}
        return op.response_codec.encode(None, tensors)

    def _session_info(self, session, m: int | None = None) -> tensorops_pb2.SessionInfo:
        context = session.context
        info = tensorops_pb2.SessionInfo(
            session_id=session.id, info=str(context.info), internal_buffer_size=int(context.internal_buffer_size),
            n=session.shape[0], k=session.shape[1], bytes=session.nbytes,
            idle_seconds=max(0.0, time.monotonic() - session.last_used), forward_count=session.forward_count,
            max_m=int(getattr(context, "max_m", 1)))
        if m is not None:
            info.m = m
            info.external_buffer_size = int(context.external_buffer_size_for(m))
        return info

    # ---- stateless operations
    def operation(self, entry: optable.Entry, encode: Callable | None = None) -> Callable:
        """The behavior of a stateless operation. `encode(result, fmt)` makes the response
        (default: the tensorops.v1 response message)."""
        encode = encode or functools.partial(self._encode, entry.op)
        timer = self._timer(entry.name)
        # The one-shot quantized inner product can cost far more than its bytes (M x N x K):
        # never on the event loop.
        always_offload = entry.name == "quantized_inner_product"
        executor = self.executor

        def prepare(decoded: codec.Decoded, call: CallState, extra: dict | None) -> tuple[dict, int, int]:
            """The native arguments, the format and the result's bytes, charged to the call."""
            kwargs, fmt = entry.arguments(decoded, self.config.max_tensor_bytes, call.reserve)
            if extra:
                kwargs.update(extra)
            field, result_bytes = entry.result(kwargs)
            reserve_result(call, field, result_bytes, self.result_limit)
            return kwargs, fmt, result_bytes

        def run(call: CallState, kwargs: dict, fmt: int, result_bytes: int) -> bytes:
            if always_offload:
                result = self._run_quantized_inner_product(timer, call, entry.native, kwargs, result_bytes)
            else:
                result = self._run(timer, call, entry.native, **kwargs)
            return encode(result, fmt)

        def compute(decoded: codec.Decoded, call: CallState, extra: dict | None = None) -> bytes:
            return run(call, *prepare(decoded, call, extra))

        async def behavior(decoded: codec.Decoded, call: CallState, nbytes: int, extra: dict | None = None,
                           inline: bool | None = None):
            """`extra`: more native arguments (the KServe endpoint's `out` in shared memory);
            `inline`: whether to compute on the event loop (default: by the bytes of the
            request and of its result)."""
            if always_offload or not (executor.inline(nbytes) if inline is None else inline):
                return await executor.offload(call, compute, decoded, call, extra)
            prepared = prepare(decoded, call, extra)
            # A few bytes may ask for a large result (channel_sum over an empty spatial
            # size, a broadcast): writing and encoding it would hold the event loop.
            if inline is None and not executor.inline(nbytes + prepared[2]):
                return await executor.offload(call, run, call, *prepared)
            return run(call, *prepared)
        return behavior

    def _run_quantized_inner_product(self, timer, call: CallState, native, kwargs: dict, result_bytes: int):
        """The one-shot product, long work split into row blocks. Arguments the kernel will
        refuse go to it unchanged, to be named."""
        a, b = kwargs.get("a"), kwargs.get("b")
        if not (isinstance(a, np.ndarray) and a.ndim == 2 and isinstance(b, np.ndarray) and b.ndim == 2):
            return self._run(timer, call, native, **kwargs)
        n, k = (b.shape[0], b.shape[1]) if kwargs.get("trans_b") else (b.shape[1], b.shape[0])
        rest = {name: value for name, value in kwargs.items() if name != "a"}
        return self._run(timer, call, in_row_blocks, call, functools.partial(native, **rest), a,
                         qip_rows_per_block(k, n), result_bytes)

    # ---- sessions
    async def open_session(self, decoded: codec.Decoded, call: CallState):
        """A new session (in the store) from a CreateQuantizedInnerProduct request."""
        if self._qip_class is None:
            raise errors.Failure(grpc.StatusCode.UNIMPLEMENTED, "this build has no quantized inner product")
        entry = optable.Entry(wire.CREATE_SESSION, self._qip_class)
        kwargs, _ = entry.arguments(decoded, self.config.max_tensor_bytes, call.reserve)
        qip = await self.executor.offload(call, functools.partial(
            self._run, self._timer("create_quantized_inner_product"), call, self._qip_class, **kwargs))
        b = kwargs["b"]
        shape = (b.shape[0], b.shape[1]) if kwargs.get("trans_b") else (b.shape[1], b.shape[0])
        session = self.store.add(qip, int(qip.internal_buffer_size), shape, call.identity)
        log.info("session created", extra=fields(n=shape[0], k=shape[1], bytes=session.nbytes))
        return session

    async def forward(self, session_id: str, decoded: codec.Decoded, call: CallState):
        """The session's forward of the request's `a` (a QuantizedInnerProductForward
        request, or any whose tensors hold `a`)."""
        with self.store.use(session_id, call.identity, forward=True) as session:
            kwargs = optable.native_arguments(wire.FORWARD_SESSION, decoded, self.config.max_tensor_bytes,
                                              skip=("session_id",), reserve=call.reserve)
            return await self.batcher.forward(session, kwargs["a"], call)

    async def create_session(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        session = await self.open_session(decoded, call)
        return self._session_info(session, int(getattr(session.context, "max_m", 1))).SerializeToString()

    async def forward_session(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        result = await self.forward(decoded.message.session_id, decoded, call)
        return self._encode(wire.FORWARD_SESSION, result, 0)

    async def describe_session(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        request = decoded.message
        with self.store.use(request.session_id, call.identity) as session:
            m = request.m if request.HasField("m") else int(getattr(session.context, "max_m", 1))
            try:
                return self._session_info(session, m).SerializeToString()
            except errors.NATIVE_ERRORS as exc:
                raise errors.from_native(exc) from None

    async def release_session(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        self.store.release(decoded.message.session_id, call.identity)
        return b""

    async def list_sessions(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        sessions = [self._session_info(s) for s in self.store.snapshot(call.identity)]
        return tensorops_pb2.ListSessionsResponse(sessions=sessions).SerializeToString()

    # ---- server information
    async def server_info(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        native = tensorops_native.info()
        c = self.config
        limits = tensorops_pb2.ServerLimits(
            max_message_bytes=c.max_message_bytes, max_tensor_bytes=c.max_tensor_bytes, max_ndim=codec.MAX_NDIM,
            max_sessions=c.max_sessions, max_session_bytes=c.max_session_bytes, session_ttl_seconds=c.session_ttl)
        return tensorops_pb2.ServerInfo(
            version=native["version"], isa=native["isa"], cpu_features=native["cpu_features"],
            kernels=native["kernels"], limits=limits, operations=list(self.table), workers=c.workers,
            instance=c.instance_name or socket.gethostname(),
        ).SerializeToString()

    # ---- the handler table
    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """RPC name -> handler, for every operation in the table and the other calls."""
        behaviors: dict[str, tuple[str, Callable]] = {
            entry.op.rpc: (entry.name, self.operation(entry)) for entry in self.table.values()}
        behaviors.update({
            "CreateQuantizedInnerProduct": ("create_quantized_inner_product", self.create_session),
            "QuantizedInnerProductForward": ("quantized_inner_product_forward", self.forward_session),
            "DescribeSession": ("describe_session", self.describe_session),
            "ReleaseSession": ("release_session", self.release_session),
            "ListSessions": ("list_sessions", self.list_sessions),
            "GetServerInfo": ("get_server_info", self.server_info),
        })
        handlers = {}
        for rpc, (label, behavior) in behaviors.items():
            method = wire.SERVICE.methods_by_name[rpc]
            message_codec = codec.MessageCodec(wire.message_class(method.input_type))
            instrumented = Instrumented(label, behavior, self.metrics, self.admission, self.auth,
                                        self.config.max_message_bytes)
            handlers[rpc] = grpc.stream_unary_rpc_method_handler(
                instrumented.handle, request_deserializer=deferred(deserializer(message_codec), self.config.inline_bytes))
        return handlers

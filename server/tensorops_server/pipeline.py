"""The call pipeline: the one path every call takes, whichever endpoint serves it
(tensorops.v1 in service.py, KServe V2 in the kserve package). An endpoint only turns its
wire format into a behavior's arguments and its results into its response; everything
else about a call happens here, in this order:

1. auth: the caller's identity (auth.py), before the request is read;
2. receive: the request read under the admission's read timeout and pending places
   (admission.py); a request of up to --inline-bytes was decoded by gRPC's deserializer
   on the event loop, a larger one waits (`deferred`);
3. deadline and cancellation: a call already cancelled or past its deadline stops here,
   and again before each kernel (execution.CallState);
4. admission: the call is admitted or refused at once (load shedding), and gets its
   memory account, charged the request's bytes; a deferred request is now decoded on a
   worker (the executor);
5. the behavior computes the serialized response, on the loop or on the executor's
   workers as it chooses; a response beyond --max-message-bytes is refused;
6. status mapping: errors.Failure -> its status, MemoryError -> RESOURCE_EXHAUSTED,
   anything else -> INTERNAL (logged with its traceback);
7. metrics (request and response bytes, calls in flight, duration and errors per label
   and code) and one log line per call (debug level);
8. the account's end: a unary call's account is closed by the context's done callback,
   which grpc.aio runs once the response and status were written to the connection (a
   client that does not read keeps it until its connection closes); a stream's call
   passes `send`, and its account is held until `send` returned.

The shape endpoints use (kept stable):

    pipeline = CallPipeline(config, metrics)      # once per server; owns .admission,
                                                  # .auth, .executor, .metrics, .config
    behavior(decoded: codec.Decoded, call: execution.CallState, nbytes: int) -> Awaitable[bytes]
        # the serialized response; raise errors.Failure to fail the call
    decode(raw: bytes) -> Incoming                # the request deserializer of one RPC;
        # message_decoder(codec.MessageCodec) for a tensorops.v1 message

    pipeline.handler(label, behavior, decode) -> grpc.RpcMethodHandler
        # a unary RPC (on the wire; a client-streaming handler, so that the request is read
        # under admission); `label` names it in metrics and logs
    pipeline.stream_handler(label, behavior, decode, failed) -> grpc.RpcMethodHandler
        # a bidirectional stream: each request is one call of `behavior`, its response
        # written in order; a request that fails gets failed(status) (bytes) and the
        # stream goes on; the identity is established once, and the wait for each next
        # request is held to the read timeout and pending places like any request
    pipeline.rpc(label, behavior) -> Rpc
        # what those handlers run: `await rpc.call(context, incoming=None, identity=None,
        # send=None)` -> (response, None) or (None, grpc.Status): one call; without
        # `incoming` the request is read here
    add_handlers(server, service_name, {method name: handler})

Handlers outside the pipeline (health, KServe's liveness and readiness) are answered by
the event loop outside every limit and take no token.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from tensorops.protocol import codec

from . import errors
from .admission import Admission
from .auth import Authenticator
from .config import Config
from .execution import CallState, Executor
from .logs import LOGGER, fields
from .metrics import Metrics

log = logging.getLogger(LOGGER)

Behavior = Callable[[codec.Decoded, CallState, int], Awaitable[bytes]]


@dataclass
class Incoming:
    """A request as the deserializer leaves it: decoded, or the reason it could not be, or
    (`later`) still to be decoded, by calling it, on a worker."""

    decoded: codec.Decoded | None
    error: codec.WireError | None
    nbytes: int
    later: Callable[[], Incoming] | None = None


Decode = Callable[[bytes], Incoming]


def deferred(decode: Decode, inline: Callable[[int], bool]) -> Decode:
    """A request deserializer that decodes at once (on the event loop) only requests small
    enough to run there (`inline(nbytes)`, the executor's rule); larger ones are decoded by
    the pipeline on a worker, once admitted."""

    def deserialize(raw: bytes) -> Incoming:
        if inline(len(raw)):
            return decode(raw)
        return Incoming(None, None, len(raw), functools.partial(decode, raw))

    return deserialize


def message_decoder(message_codec: codec.MessageCodec) -> Decode:
    """The decoder of one tensorops.v1 request message (Tensor payloads in place)."""
    name = message_codec.message_class.DESCRIPTOR.full_name

    def decode(raw: bytes) -> Incoming:
        try:
            return Incoming(message_codec.decode(raw), None, len(raw))
        except codec.WireError as exc:  # reported by the call as INVALID_ARGUMENT
            if exc.field == "message" and exc.message.startswith("cannot parse"):  # the protobuf runtime's words
                exc = codec.WireError(
                    "message", f"the request is not a valid {name} message in the protobuf binary encoding"
                )
            return Incoming(None, exc, len(raw))

    return decode


def add_handlers(server: grpc.aio.Server, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
    """Serve `handlers` (method name -> handler) as `service`: the one way the server adds
    its handlers (the endpoints', and reflection's). The same handler objects are
    registered by method and also offered through a generic handler, as grpcio's generated
    code does: the asyncio server of grpcio 1.81 (the oldest release supported) never
    consults registered handlers, so without the generic one every call would be
    UNIMPLEMENTED."""
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)


class CallPipeline:
    """Auth, admission, the executor, metrics and logs of a server: built once, used by
    every endpoint to turn its behaviors into gRPC handlers."""

    def __init__(self, config: Config, metrics: Metrics, worker_id: int = 1):
        self.config = config
        self.metrics = metrics
        self.worker_id = worker_id  # which of the server's worker processes this is (1 alone)
        self.executor = Executor(config.threads, config.inline_bytes)
        self.auth = Authenticator(config.auth_tokens, config.auth_token_file, certificates=bool(config.tls_client_ca))
        self.admission = Admission(
            max_pending=config.max_pending_requests,
            read_timeout=config.read_timeout,
            max_concurrent=config.max_concurrent_rpcs,
            max_inflight_bytes=config.max_inflight_bytes,
        )

    def rpc(self, label: str, behavior: Behavior) -> Rpc:
        return Rpc(self, label, behavior)

    def handler(self, label: str, behavior: Behavior, decode: Decode) -> grpc.RpcMethodHandler:
        """The handler of a unary RPC. It is registered as client-streaming so that the
        request is read by the call, under the admission limits; on the wire it is unary."""
        return grpc.stream_unary_rpc_method_handler(
            self.rpc(label, behavior).handle, request_deserializer=deferred(decode, self.executor.inline)
        )

    def stream_handler(
        self, label: str, behavior: Behavior, decode: Decode, failed: Callable[[grpc.Status], bytes]
    ) -> grpc.RpcMethodHandler:
        """The handler of a stream of calls (see the module's description)."""
        rpc = self.rpc(label, behavior)

        async def stream(requests, context: grpc.aio.ServicerContext) -> None:
            await self._serve_stream(rpc, context, failed)

        return grpc.stream_stream_rpc_method_handler(
            stream, request_deserializer=deferred(decode, self.executor.inline)
        )

    async def _serve_stream(
        self, rpc: Rpc, context: grpc.aio.ServicerContext, failed: Callable[[grpc.Status], bytes]
    ) -> None:
        """Each request of the stream as one call of `rpc`, answered in order, until the
        client ends the stream. A failure to identify the caller or to receive a request
        (read timeout, pending place lost, drain) ends the stream with its status."""
        try:
            identity = self.auth.identify(context)
        except errors.Failure as failure:
            await context.abort_with_status(failure.status())
            return
        while True:
            try:
                incoming = await self.admission.receive(context, stream=True)
            except errors.Failure as failure:
                await context.abort_with_status(failure.status())
                return
            if incoming is grpc.aio.EOF:
                return
            # The response is written inside the call, so that its charge is held until
            # gRPC has sent it: a stream whose client does not read cannot pile them up.
            response, status = await rpc.call(context, incoming, identity, send=context.write)
            if status is not None:
                await context.write(failed(status))

    def begin_drain(self) -> None:
        """From now on, calls get UNAVAILABLE (see Admission.begin_drain)."""
        self.admission.begin_drain()


class Rpc:
    """One RPC as the pipeline runs it: its label, its behavior, and the metric series
    of its label (looked up once, not per call)."""

    def __init__(self, pipeline: CallPipeline, label: str, behavior: Behavior):
        self.label = label
        self.behavior = behavior
        # The pipeline's parts, held here: a call reaches each in one step.
        self.admission = pipeline.admission
        self.auth = pipeline.auth
        self.executor = pipeline.executor
        self.max_response_bytes = pipeline.config.max_message_bytes
        m = pipeline.metrics
        self._in_flight = m.in_flight.labels(label)
        self._request_bytes = m.request_bytes.labels(label)
        self._response_bytes = m.response_bytes.labels(label)
        self._duration = m.request_duration
        self._duration_ok = m.request_duration.labels(label, "OK")
        self._errors = m.errors

    async def handle(self, requests, context: grpc.aio.ServicerContext) -> bytes:
        response, status = await self.call(context)
        if status is None:
            return response
        await context.abort_with_status(status)

    async def call(
        self,
        context: grpc.aio.ServicerContext,
        incoming: Incoming | None = None,
        identity: str | None = None,
        send: Callable[[bytes], Awaitable[None]] | None = None,
    ) -> tuple[bytes | None, grpc.Status | None]:
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
                    incoming = await self.executor.offload(call, incoming.later)
                    if incoming.error is not None:
                        raise errors.from_wire(incoming.error)
                response = await self.behavior(incoming.decoded, call, nbytes)
            finally:
                self._in_flight.dec()
                account.stop_running()
            if len(response) > self.max_response_bytes:
                raise errors.exhausted(
                    f"the response of {len(response)} bytes exceeds the limit of "
                    f"{self.max_response_bytes} bytes per message"
                )
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
                log.debug(
                    "call" if code is grpc.StatusCode.OK else "call failed",
                    extra=fields(
                        operation=self.label,
                        code=code.name,
                        seconds=round(elapsed, 6),
                        request_bytes=nbytes,
                        peer=context.peer(),
                        **details,
                    ),
                )
        return None, status

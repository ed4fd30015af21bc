"""The handlers of tensorops.v1.TensorOps, produced from the op table, plus the session and
server-info calls. Every handler runs inside one wrapper (`Instrumented`) that owns the
cross-cutting concerns: metrics, logs, the mapping of failures to status codes, and the
refusal to start work for a call that was cancelled or whose deadline passed.

Requests and responses are bytes: the codec decodes the Tensor payloads in place and
writes the response payloads with one copy (see tensorops._codec)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import grpc

import tensorops_native
from tensorops import _codec, _wire
from tensorops.v1 import tensorops_pb2

from . import errors, optable
from .config import Config
from .logs import LOGGER, fields
from .metrics import Metrics
from .sessions import SessionStore

log = logging.getLogger(LOGGER)


@dataclass
class Incoming:
    """A request as the deserializer leaves it: decoded, or the reason it could not be."""
    decoded: _codec.Decoded | None
    error: _codec.WireError | None
    nbytes: int


def deserializer(codec: _codec.MessageCodec) -> Callable[[bytes], Incoming]:
    def decode(raw: bytes) -> Incoming:
        try:
            return Incoming(codec.decode(raw), None, len(raw))
        except _codec.WireError as exc:  # reported by the handler as INVALID_ARGUMENT
            return Incoming(None, exc, len(raw))
    return decode


def ensure_active(context: grpc.ServicerContext) -> None:
    """A call that was cancelled, or whose deadline passed (e.g. while it waited for a
    worker), does not start its kernel."""
    if context.time_remaining() <= 0:
        raise errors.Failure(grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed before the kernel started")
    if not context.is_active():
        raise errors.Failure(grpc.StatusCode.CANCELLED, "the call was cancelled before the kernel started")


class Instrumented:
    """The wrapper around every handler."""

    def __init__(self, label: str, behavior: Callable[[_codec.Decoded, Any], bytes], metrics: Metrics):
        self.label = label
        self.behavior = behavior
        m = metrics
        self._in_flight = m.in_flight.labels(label)
        self._request_bytes = m.request_bytes.labels(label)
        self._response_bytes = m.response_bytes.labels(label)
        self._duration = m.request_duration
        self._duration_ok = m.request_duration.labels(label, "OK")
        self._errors = m.errors

    def __call__(self, incoming: Incoming, context: grpc.ServicerContext) -> bytes:
        start = time.perf_counter()
        self._in_flight.inc()
        self._request_bytes.inc(incoming.nbytes)
        code = grpc.StatusCode.OK
        try:
            if incoming.error is not None:
                raise errors.from_wire(incoming.error)
            response = self.behavior(incoming.decoded, context)
            self._response_bytes.inc(len(response))
            return response
        except errors.Failure as failure:
            code = failure.code
            context.abort_with_status(failure.status())
        except MemoryError:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED
            context.abort(code, "the server ran out of memory for this call")
        except Exception:
            code = grpc.StatusCode.INTERNAL
            log.exception("handler failed", extra=fields(operation=self.label))
            context.abort(code, "internal error (logged by the server)")
        finally:
            elapsed = time.perf_counter() - start
            self._in_flight.dec()
            if code is grpc.StatusCode.OK:
                self._duration_ok.observe(elapsed)
            else:
                self._duration.labels(self.label, code.name).observe(elapsed)
                self._errors.labels(self.label, code.name).inc()
            if log.isEnabledFor(logging.DEBUG):
                log.debug("call", extra=fields(operation=self.label, code=code.name, seconds=round(elapsed, 6),
                                               request_bytes=incoming.nbytes, peer=context.peer()))


class Service:
    """Handler behaviors. Each takes the decoded request and the context and returns the
    serialized response."""

    def __init__(self, config: Config, metrics: Metrics, store: SessionStore, table: dict[str, optable.Entry],
                 qip_class=None):
        self.config = config
        self.metrics = metrics
        self.store = store
        self.table = table
        # The class of the session contexts: tensorops_native.QuantizedInnerProduct (tests
        # may give a stand-in with the same interface).
        self._qip_class = qip_class or getattr(tensorops_native, "QuantizedInnerProduct", None)

    # ---- helpers
    def _run(self, timer, context, fn, *args, **kwargs):
        """Call tensorops_native: the kernel runs here (GIL released), timed by `timer`
        (a child of the kernel duration histogram)."""
        ensure_active(context)
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
    def _encode(op: _wire.Operation, result, fmt: int) -> bytes:
        out_fmt = fmt if op.layout and op.image_outputs else 0
        fields = op.response_fields
        if len(fields) == 1 and not isinstance(result, tuple):  # the common case: one array
            name = fields[0]
            return op.response_codec.encode(None, {name: _codec.encode_tensor(result, name, out_fmt)})
        results = result if isinstance(result, tuple) else (result,)
        tensors = {name: _codec.encode_tensor(arr, name, out_fmt) for name, arr in zip(fields, results)}
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
    def operation(self, entry: optable.Entry) -> Callable:
        timer = self._timer(entry.name)

        def behavior(decoded: _codec.Decoded, context) -> bytes:
            kwargs, fmt = entry.arguments(decoded, self.config.max_tensor_bytes)
            result = self._run(timer, context, entry.native, **kwargs)
            return self._encode(entry.op, result, fmt)
        return behavior

    # ---- sessions
    def create_session(self, decoded: _codec.Decoded, context) -> bytes:
        if self._qip_class is None:
            raise errors.Failure(grpc.StatusCode.UNIMPLEMENTED, "this build has no quantized inner product")
        entry = optable.Entry(_wire.CREATE_SESSION, self._qip_class)
        kwargs, _ = entry.arguments(decoded, self.config.max_tensor_bytes)
        qip = self._run(self._timer("create_quantized_inner_product"), context, self._qip_class, **kwargs)
        b = kwargs["b"]
        shape = (b.shape[0], b.shape[1]) if kwargs.get("trans_b") else (b.shape[1], b.shape[0])
        session = self.store.add(qip, int(qip.internal_buffer_size), shape)
        log.info("session created", extra=fields(n=shape[0], k=shape[1], bytes=session.nbytes))
        return self._session_info(session, int(getattr(qip, "max_m", 1))).SerializeToString()

    def forward_session(self, decoded: _codec.Decoded, context) -> bytes:
        op = _wire.FORWARD_SESSION
        kwargs = optable.native_arguments(op, decoded, self.config.max_tensor_bytes, skip=("session_id",))
        with self.store.use(decoded.message.session_id, forward=True) as session:
            result = self._run(self._timer("quantized_inner_product_forward"), context, session.context.forward,
                              **kwargs)
        return self._encode(op, result, 0)

    def describe_session(self, decoded: _codec.Decoded, context) -> bytes:
        request = decoded.message
        with self.store.use(request.session_id) as session:
            m = request.m if request.HasField("m") else int(getattr(session.context, "max_m", 1))
            try:
                return self._session_info(session, m).SerializeToString()
            except errors.NATIVE_ERRORS as exc:
                raise errors.from_native(exc) from None

    def release_session(self, decoded: _codec.Decoded, context) -> bytes:
        self.store.release(decoded.message.session_id)
        return b""

    def list_sessions(self, decoded: _codec.Decoded, context) -> bytes:
        sessions = [self._session_info(s) for s in self.store.snapshot()]
        return tensorops_pb2.ListSessionsResponse(sessions=sessions).SerializeToString()

    # ---- server information
    def server_info(self, decoded: _codec.Decoded, context) -> bytes:
        native = tensorops_native.info()
        c = self.config
        limits = tensorops_pb2.ServerLimits(
            max_message_bytes=c.max_message_bytes, max_tensor_bytes=c.max_tensor_bytes, max_ndim=_codec.MAX_NDIM,
            max_sessions=c.max_sessions, max_session_bytes=c.max_session_bytes, session_ttl_seconds=c.session_ttl)
        return tensorops_pb2.ServerInfo(
            version=native["version"], isa=native["isa"], cpu_features=native["cpu_features"],
            kernels=native["kernels"], limits=limits, operations=list(self.table), workers=c.workers,
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
            method = _wire.SERVICE.methods_by_name[rpc]
            codec = _codec.MessageCodec(_wire.message_class(method.input_type))
            handlers[rpc] = grpc.unary_unary_rpc_method_handler(
                Instrumented(label, behavior, self.metrics), request_deserializer=deserializer(codec))
        return handlers

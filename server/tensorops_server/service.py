"""The tensorops.v1.TensorOps servicer: the behaviors of its RPCs (one per operation of the
op table, the session calls and GetServerInfo) and its handler table, built through the
call pipeline (pipeline.py), which owns everything else about a call (auth, admission,
deadline, metrics, logs, status mapping, the memory account). Each behavior takes the
decoded request, its CallState and the request's size, and returns the serialized
response. Where each computation runs (event loop or worker) is decided with the
Executor (see execution.py); session forwards go through the ForwardBatcher.

Requests and responses are bytes: the codec decodes the Tensor payloads in place and
writes the response payloads with one copy (see tensorops.protocol.codec)."""

from __future__ import annotations

import functools
import logging
import socket
import time
from collections.abc import Callable

import grpc
import numpy as np

import tensorops_native
from tensorops.protocol import codec, wire
from tensorops.v1 import tensorops_pb2

from . import errors, optable
from .batching import ForwardBatcher
from .execution import RESPONSE_OVERHEAD, CallState, in_row_blocks, qip_rows_per_block, reserve_result
from .logs import LOGGER, fields
from .pipeline import CallPipeline, message_decoder
from .sessions import SessionStore

log = logging.getLogger(LOGGER)


class Service:
    """The tensorops.v1 servicer: its behaviors, and their handlers (`handlers()`), served
    through `pipeline`."""

    def __init__(self, pipeline: CallPipeline, store: SessionStore, table: dict[str, optable.Entry], qip_class=None):
        self.pipeline = pipeline
        self.config = config = pipeline.config
        self.metrics = metrics = pipeline.metrics
        self.executor = executor = pipeline.executor
        self.store = store
        self.table = table
        # The class of the session contexts: tensorops_native.QuantizedInnerProduct (tests
        # may give a stand-in with the same interface).
        self._qip_class = qip_class or getattr(tensorops_native, "QuantizedInnerProduct", None)
        # The largest result a call may produce: a tensor, within a response message.
        self.result_limit = min(config.max_tensor_bytes, config.max_message_bytes - RESPONSE_OVERHEAD)
        forward_timer = self._timer("quantized_inner_product_forward")
        self.batcher = ForwardBatcher(
            executor,
            max_rows=config.max_batch_rows,
            window=config.batch_window_us / 1e6,
            result_limit=self.result_limit,
            observe=metrics.observe_batch,
            time_kernel=forward_timer.observe,
        )

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
        fields = op.outputs
        if len(fields) == 1 and not isinstance(result, tuple):  # the common case: one array
            name = fields[0]
            return op.response_codec.encode(None, {name: codec.encode_tensor(result, name, out_fmt)})
        results = result if isinstance(result, tuple) else (result,)
        tensors = {name: codec.encode_tensor(arr, name, out_fmt) for name, arr in zip(fields, results, strict=True)}
        return op.response_codec.encode(None, tensors)

    def _session_info(self, session, m: int | None = None) -> tensorops_pb2.SessionInfo:
        """What a session holds; with `m`, the scratch a forward of m rows needs (the session
        must then be in use: its context answers)."""
        info = tensorops_pb2.SessionInfo(
            session_id=session.id,
            info=session.info,
            internal_buffer_size=session.nbytes,
            n=session.shape[0],
            k=session.shape[1],
            bytes=session.nbytes,
            idle_seconds=max(0.0, time.monotonic() - session.last_used),
            forward_count=session.forward_count,
            max_m=session.max_m,
        )
        if m is not None:
            info.m = m
            info.external_buffer_size = int(session.context.external_buffer_size_for(m))
        return info

    # ---- stateless operations
    def operation(self, entry: optable.Entry, encode: Callable | None = None) -> Callable:
        """The behavior of a stateless operation. `encode(result, fmt)` makes the response
        (default: the tensorops.v1 response message)."""
        encode = encode or functools.partial(self._encode, entry.op)
        timer = self._timer(entry.name)
        always_offload = entry.op.offload  # costs far more than its bytes: never on the event loop
        executor = self.executor

        def prepare(decoded: codec.Decoded, call: CallState, extra: dict | None) -> tuple[dict, int, int]:
            """The native arguments, the format and the result's bytes, charged to the call."""
            kwargs, fmt = entry.arguments(decoded, self.config.max_tensor_bytes, call.reserve)
            if extra:
                kwargs.update(extra)
            field, result_bytes = entry.op.result_bytes(kwargs)
            reserve_result(call, field, result_bytes, self.result_limit)
            return kwargs, fmt, result_bytes

        def run(call: CallState, kwargs: dict, fmt: int, result_bytes: int) -> bytes:
            if entry.op.row_split:
                result = self._run_in_row_blocks(timer, call, entry, kwargs, result_bytes)
            else:
                result = self._run(timer, call, entry.native, **kwargs)
            return encode(result, fmt)

        def compute(decoded: codec.Decoded, call: CallState, extra: dict | None = None) -> bytes:
            return run(call, *prepare(decoded, call, extra))

        async def behavior(
            decoded: codec.Decoded, call: CallState, nbytes: int, extra: dict | None = None, inline: bool | None = None
        ):
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

    def _run_in_row_blocks(self, timer, call: CallState, entry: optable.Entry, kwargs: dict, result_bytes: int):
        """An operation whose result rows depend on the same rows of one input (the table's
        `row_split`: the one-shot quantized inner product, M x K by K x N), computed in
        blocks of rows so that a long call checks its deadline between them. Arguments the
        kernel will refuse go to it unchanged, to be named."""
        name = entry.op.row_split
        rows, shapes = kwargs.get(name), entry.op.result_shapes(kwargs)
        if shapes is None or not isinstance(rows, np.ndarray) or rows.ndim != 2:
            return self._run(timer, call, entry.native, **kwargs)
        rest = {key: value for key, value in kwargs.items() if key != name}
        return self._run(
            timer,
            call,
            in_row_blocks,
            call,
            functools.partial(entry.native, **rest),
            rows,
            qip_rows_per_block(rows.shape[1], shapes[0][0][1]),
            result_bytes,
        )

    # ---- sessions
    async def open_session(self, decoded: codec.Decoded, call: CallState):
        """A new session (in the store) from a CreateQuantizedInnerProduct request."""
        if self._qip_class is None:
            raise errors.Failure(grpc.StatusCode.UNIMPLEMENTED, "this build has no quantized inner product")
        entry = optable.Entry(wire.CREATE_SESSION, self._qip_class)
        kwargs, _ = entry.arguments(decoded, self.config.max_tensor_bytes, call.reserve)
        timer = self._timer("create_quantized_inner_product")

        def make(allocate):  # the context packs B straight into the store's shared memory
            return self._run(timer, call, self._qip_class, state=allocate, **kwargs)

        # packing B costs far more than its bytes: always on a worker
        session = await self.executor.offload(call, functools.partial(self.store.create, make, call.identity))
        log.info("session created", extra=fields(n=session.shape[0], k=session.shape[1], bytes=session.nbytes))
        return session

    async def forward(self, session_id: str, decoded: codec.Decoded, call: CallState):
        """The session's forward of the request's `a` (a QuantizedInnerProductForward
        request, or any whose tensors hold `a`)."""
        with self.store.use(session_id, call.identity, forward=True) as session:
            kwargs = optable.native_arguments(
                wire.FORWARD_SESSION, decoded, self.config.max_tensor_bytes, skip=("session_id",), reserve=call.reserve
            )
            return await self.batcher.forward(session, kwargs["a"], call)

    async def create_session(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        session = await self.open_session(decoded, call)
        return self._session_info(session, session.max_m).SerializeToString()

    async def forward_session(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        result = await self.forward(decoded.message.session_id, decoded, call)
        return self._encode(wire.FORWARD_SESSION, result, 0)

    async def describe_session(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        request = decoded.message
        with self.store.use(request.session_id, call.identity) as session:
            m = request.m if request.HasField("m") else session.max_m
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
            max_message_bytes=c.max_message_bytes,
            max_tensor_bytes=c.max_tensor_bytes,
            max_ndim=codec.MAX_NDIM,
            max_sessions=c.max_sessions,
            max_session_bytes=c.max_session_bytes,
            session_ttl_seconds=c.session_ttl,
        )
        return tensorops_pb2.ServerInfo(
            version=native["version"],
            isa=native["isa"],
            cpu_features=native["cpu_features"],
            kernels=native["kernels"],
            limits=limits,
            operations=list(self.table),
            workers=c.workers,
            worker=self.pipeline.worker_id,
            threads=c.threads,
            instance=c.instance_name or socket.gethostname(),
        ).SerializeToString()

    # ---- the handler table
    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """RPC name -> handler, for every operation in the table and the other calls."""
        behaviors: dict[str, tuple[str, Callable]] = {
            entry.op.rpc: (entry.name, self.operation(entry)) for entry in self.table.values()
        }
        # the rows' request codecs; a codec of its own for each RPC outside the table
        codecs = {
            op.rpc: op.request_codec for op in (*wire.OPERATIONS.values(), wire.CREATE_SESSION, wire.FORWARD_SESSION)
        }
        behaviors.update(
            {
                "CreateQuantizedInnerProduct": ("create_quantized_inner_product", self.create_session),
                "QuantizedInnerProductForward": ("quantized_inner_product_forward", self.forward_session),
                "DescribeSession": ("describe_session", self.describe_session),
                "ReleaseSession": ("release_session", self.release_session),
                "ListSessions": ("list_sessions", self.list_sessions),
                "GetServerInfo": ("get_server_info", self.server_info),
            }
        )
        handlers = {}
        for rpc, (label, behavior) in behaviors.items():
            request_codec = codecs.get(rpc) or codec.MessageCodec(
                wire.message_class(wire.SERVICE.methods_by_name[rpc].input_type)
            )
            handlers[rpc] = self.pipeline.handler(label, behavior, message_decoder(request_codec))
        return handlers

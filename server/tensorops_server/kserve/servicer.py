"""The handlers of inference.GRPCInferenceService: each RPC's behavior, made a handler by the
call pipeline that serves tensorops.v1 too (pipeline.py: auth, admission, deadline,
metrics, logs, status mapping), over the models (models.py), the conversions
(conversion.py) and the model repository (repository.py)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import grpc

import tensorops_native
from tensorops.kserve import SERVICE_NAME
from tensorops.kserve.v2 import inference_pb2 as pb
from tensorops.protocol import codec
from tensorops.protocol.codec import WireError

from .. import errors
from ..execution import CallState
from ..pipeline import CallPipeline, Incoming
from ..reflection import renamed
from ..service import Service
from ..shm import SharedMemory
from . import models
from .conversion import infer_request, infer_response, output_in_region, requested_outputs
from .models import PLATFORM, Model
from .repository import Repository

EXTENSIONS = ("model_configuration", "model_repository", "statistics")

_RAW_INPUTS = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number
_STREAM_RESPONSE_FIELD = pb.ModelStreamInferResponse.DESCRIPTOR.fields_by_name["infer_response"].number


def reflection_file():
    """The messages and service as reflection describes them: under package `inference`,
    the name clients call (see reflection.py)."""
    package, _, _ = SERVICE_NAME.rpartition(".")
    return renamed(pb.DESCRIPTOR, "inference/grpc_service.proto", package)


# The most bytes of a ModelInferRequest outside its raw_input_contents: names, shapes,
# parameters and typed contents. The protobuf runtime can take several times their size
# (8 bytes for each 1-byte dimension or int64 element), and typed contents are converted
# element by element; raw contents take neither.
MAX_DESCRIPTION_BYTES = 256 * 1024


def deserializer(message_class, raw_field: int | None = None) -> Callable[[bytes], Incoming]:
    """Parse a request; with `raw_field`, that bytes field stays in the received bytes
    (views, no copy) and lands in `Decoded.tensors["raw"]`. A large message is walked
    first, within the codec's field limit, so that the protobuf runtime never builds an
    object per field of millions."""
    name = f"inference.{message_class.DESCRIPTOR.name}"

    def decode(raw: bytes) -> Incoming:
        try:
            if len(raw) <= codec.SMALL_MESSAGE:
                message = message_class.FromString(raw)
                raws = list(getattr(message, "raw_input_contents", ()))
            elif raw_field is not None:
                rest, raws = codec.split_field(raw, raw_field)
                size = sum(part.nbytes for part in rest)
                if size > MAX_DESCRIPTION_BYTES:  # refused before it is copied out
                    return Incoming(
                        None,
                        WireError(
                            "message",
                            f"{size} bytes besides raw_input_contents, "
                            f"more than the limit of {MAX_DESCRIPTION_BYTES}: send large "
                            "tensors as raw contents",
                        ),
                        len(raw),
                    )
                message = message_class.FromString(b"".join(rest))
            else:
                codec.check_fields(raw)
                message = message_class.FromString(raw)
                raws = []
            return Incoming(codec.Decoded(message, {"raw": raws}, len(raw)), None, len(raw))
        except codec.TooManyFields as exc:  # said as it is
            return Incoming(None, exc, len(raw))
        except Exception:
            return Incoming(None, _not_the_message(name), len(raw))

    return decode


def _stream_error(status: grpc.Status) -> bytes:
    return pb.ModelStreamInferResponse(error_message=f"{status.code.name}: {status.details}").SerializeToString()


def _not_the_message(name: str) -> WireError:
    return WireError("message", f"the request is not a valid {name} message in the protobuf binary encoding")


WORKER_HEADER = "tensorops-worker"
WORKERS_HEADER = "tensorops-workers"


def _with_initial_metadata(handler: grpc.RpcMethodHandler, metadata: tuple) -> grpc.RpcMethodHandler:
    """`handler` (a pipeline's) whose responses start with `metadata`."""
    inner = handler.stream_unary

    async def handle(requests, context: grpc.aio.ServicerContext):
        await context.send_initial_metadata(metadata)
        return await inner(requests, context)

    return grpc.stream_unary_rpc_method_handler(
        handle, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


class KServe:
    """The behaviors of inference.GRPCInferenceService over a tensorops Service."""

    def __init__(self, pipeline: CallPipeline, service: Service, shm: SharedMemory):
        self.pipeline = pipeline
        self.service = service
        self.shm = shm
        self.repository = Repository(service)
        # The behaviors of the operations, taking converted requests and returning the
        # result arrays (not a message).
        self._compute = {
            name: service.operation(entry, encode=lambda result, fmt: result) for name, entry in service.table.items()
        }
        self.ready = True

    def model(self, name: str, version: str, identity: str) -> Model:
        return self.repository.model(name, version, identity)

    async def _run(
        self, model: Model, request: codec.Decoded, call: CallState, nbytes: int, shared_bytes: int, extra: dict
    ):
        if model.entry is None:  # a session: its forward takes `a` (a session model has no parameters)
            return await self.repository.forward(model, request, call)
        # In shared memory, the kernel is the call's only work on its tensors: a short
        # one runs on the loop, where a thread hand-off would cost more than it.
        inline = None
        if shared_bytes:
            limit = self.pipeline.config.inline_shared_memory_bytes
            inline = self.pipeline.executor.inline(nbytes) and shared_bytes <= limit
        return await self._compute[model.name](request, call, nbytes + shared_bytes, extra, inline)

    # ---- inference
    async def infer(self, decoded: codec.Decoded, call: CallState, nbytes: int, wrap: int | None = None) -> bytes:
        """ModelInfer's response; with `wrap`, as that field of an enclosing message."""
        request = decoded.message
        model = self.model(request.model_name, request.model_version, call.identity)
        errors.check_length("id", request.id)  # echoed in the response
        start = time.perf_counter_ns()
        ok = False
        regions = self.shm.for_call(call.identity)
        try:
            outputs = requested_outputs(model, request)
            converted = infer_request(model, request, decoded.tensors["raw"], regions.view)
            out = output_in_region(model, converted, outputs, regions.view)
            extra = {} if out is None else {"out": out}
            result = await self._run(model, converted, call, nbytes, regions.nbytes, extra)
            response = infer_response(
                model,
                request,
                outputs,
                result,
                self.pipeline.config.max_message_bytes,
                regions.view,
                written=out,
                wrap=wrap,
            )
            regions.check_intact()  # an object shrunk meanwhile voids what was read or written there
            ok = True
            return response
        finally:
            regions.close()
            self.repository.record(model, call.identity, ok, time.perf_counter_ns() - start)

    # ---- health and metadata
    async def model_ready(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        request = decoded.message
        try:
            model = self.model(request.name, request.version, call.identity)
        except errors.Failure:
            return pb.ModelReadyResponse(ready=False).SerializeToString()
        return pb.ModelReadyResponse(ready=self.repository.ready(model, call.identity)).SerializeToString()

    async def server_metadata(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        extensions = EXTENSIONS + (("system_shared_memory",) if self.shm.allowed else ())
        return pb.ServerMetadataResponse(
            name=PLATFORM, version=tensorops_native.__version__, extensions=extensions
        ).SerializeToString()

    async def model_metadata(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        request = decoded.message
        return models.metadata(self.model(request.name, request.version, call.identity)).SerializeToString()

    async def model_config(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        request = decoded.message
        config = models.config(self.model(request.name, request.version, call.identity))
        return pb.ModelConfigResponse(config=config).SerializeToString()

    async def model_statistics(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        request = decoded.message
        if request.name:
            listed = [self.model(request.name, request.version, call.identity)]
        else:
            listed = self.repository.visible(call.identity)
        return self.repository.statistics(listed, call.identity).SerializeToString()

    # ---- repository: sessions as models
    async def repository_index(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        return self.repository.index(call.identity, decoded.message.ready).SerializeToString()

    async def load(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        await self.repository.load(decoded.message, call)
        return b""

    async def unload(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        self.repository.unload(decoded.message.model_name, call.identity)
        return b""

    # ---- system shared memory
    async def shm_register(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        r = decoded.message
        self.shm.register(call.identity, r.name, r.key, r.offset, r.byte_size)
        return b""

    async def shm_status(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.shm.status(call.identity, decoded.message.name):
            response.regions[region.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=region.name, key=region.key, offset=region.offset, byte_size=region.byte_size
                )
            )
        return response.SerializeToString()

    async def shm_unregister(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        self.shm.unregister(call.identity, decoded.message.name)
        return b""

    # ---- the handler table
    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        behaviors = {
            "ModelReady": ("kserve_model_ready", self.model_ready, pb.ModelReadyRequest),
            "ServerMetadata": ("kserve_server_metadata", self.server_metadata, pb.ServerMetadataRequest),
            "ModelMetadata": ("kserve_model_metadata", self.model_metadata, pb.ModelMetadataRequest),
            "ModelInfer": ("kserve_model_infer", self.infer, pb.ModelInferRequest),
            "ModelConfig": ("kserve_model_config", self.model_config, pb.ModelConfigRequest),
            "ModelStatistics": ("kserve_model_statistics", self.model_statistics, pb.ModelStatisticsRequest),
            "RepositoryIndex": ("kserve_repository_index", self.repository_index, pb.RepositoryIndexRequest),
            "RepositoryModelLoad": ("kserve_repository_model_load", self.load, pb.RepositoryModelLoadRequest),
            "RepositoryModelUnload": ("kserve_repository_model_unload", self.unload, pb.RepositoryModelUnloadRequest),
            "SystemSharedMemoryRegister": (
                "kserve_shared_memory_register",
                self.shm_register,
                pb.SystemSharedMemoryRegisterRequest,
            ),
            "SystemSharedMemoryStatus": (
                "kserve_shared_memory_status",
                self.shm_status,
                pb.SystemSharedMemoryStatusRequest,
            ),
            "SystemSharedMemoryUnregister": (
                "kserve_shared_memory_unregister",
                self.shm_unregister,
                pb.SystemSharedMemoryUnregisterRequest,
            ),
        }
        pipeline = self.pipeline
        handlers = {}
        for rpc, (label, behavior, message_class) in behaviors.items():
            raw = _RAW_INPUTS if message_class is pb.ModelInferRequest else None
            handlers[rpc] = pipeline.handler(label, behavior, deserializer(message_class, raw))
        # ServerMetadataResponse has no field for them: which worker answered and how many
        # serve, as the response's initial metadata (GetServerInfo's worker and workers).
        worker = pipeline.worker_id
        handlers["ServerMetadata"] = _with_initial_metadata(
            handlers["ServerMetadata"],
            ((WORKER_HEADER, str(worker)), (WORKERS_HEADER, str(pipeline.config.workers))),
        )
        # ModelStreamInfer: each request of the stream answered in order, its response the
        # ModelInferResponse inside a ModelStreamInferResponse, assembled as such in one
        # copy; a request that fails gets its error in `error_message`, and the stream goes on.
        handlers["ModelStreamInfer"] = pipeline.stream_handler(
            "kserve_model_stream_infer",
            functools.partial(self.infer, wrap=_STREAM_RESPONSE_FIELD),
            deserializer(pb.ModelInferRequest, _RAW_INPUTS),
            _stream_error,
        )
        # Liveness and readiness: like the health service, outside admission and auth.
        handlers["ServerLive"] = grpc.unary_unary_rpc_method_handler(
            self._live,
            request_deserializer=deserializer(pb.ServerLiveRequest),
            response_serializer=pb.ServerLiveResponse.SerializeToString,
        )
        handlers["ServerReady"] = grpc.unary_unary_rpc_method_handler(
            self._ready,
            request_deserializer=deserializer(pb.ServerReadyRequest),
            response_serializer=pb.ServerReadyResponse.SerializeToString,
        )
        return handlers

    @staticmethod
    async def _refuse_undecodable(incoming: Incoming, context: grpc.aio.ServicerContext) -> None:
        """INVALID_ARGUMENT for a request that is not the message (gRPC itself would answer
        UNKNOWN for a deserializer's exception)."""
        if incoming.error is not None:
            await context.abort_with_status(errors.from_wire(incoming.error).status())

    async def _live(self, incoming: Incoming, context) -> pb.ServerLiveResponse:
        await self._refuse_undecodable(incoming, context)
        return pb.ServerLiveResponse(live=True)

    async def _ready(self, incoming: Incoming, context) -> pb.ServerReadyResponse:
        await self._refuse_undecodable(incoming, context)
        return pb.ServerReadyResponse(ready=self.ready)

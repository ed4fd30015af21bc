"""The models of the KServe endpoint: what each takes and gives, its statistics, and its
self-description (ModelMetadata, ModelConfig)."""
from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

from tensorops.kserve import DATATYPES
from tensorops.kserve.v2 import inference_pb2 as pb
from tensorops.protocol import wire

from .. import optable

PLATFORM = "tensorops"
VERSION = "1"  # every model has this one version
FORMAT_PARAMETER = "format"  # the layout of an operation's image tensors

_CONFIG_TYPES = {name: pb.DataType.Value(f"TYPE_{name}") for name in DATATYPES}  # ModelConfig's enum


@dataclass(frozen=True)
class TensorInfo:
    name: str
    spec: optable.TensorSpec
    optional: bool = False


@dataclass
class Model:
    """What a model takes and gives, for inference and for its self-description."""

    name: str
    op: wire.Operation              # the tensorops.v1 request/response its requests become
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    parameters: dict[str, str]       # name -> description
    entry: optable.Entry | None = None   # a stateless operation
    session_id: str | None = None        # a session
    stats: "Statistics" = field(default_factory=lambda: Statistics())

    # What every request of the model needs, computed once.
    @cached_property
    def input_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.inputs)

    @cached_property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    @cached_property
    def all_outputs(self) -> tuple[tuple[str, None], ...]:
        """What a request that names no output gets: every output, in the message."""
        return tuple((name, None) for name in self.output_names)

    @cached_property
    def response_head(self) -> bytes:
        """The fields every response of the model starts with (model_name, model_version)."""
        return pb.ModelInferResponse(model_name=self.name, model_version=VERSION).SerializeToString()

    @cached_property
    def arguments_cache(self) -> dict:
        """Request parameters (as received) -> their conversion (see infer_request)."""
        return {}


@dataclass
class Statistics:
    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    last_inference_ms: int = 0

    def record(self, ok: bool, ns: int) -> None:
        if ok:
            self.success_count += 1
            self.success_ns += ns
        else:
            self.fail_count += 1
            self.fail_ns += ns
        self.last_inference_ms = int(time.time() * 1000)


def _field_kind(f) -> str:
    """How a non-tensor request field travels as an InferParameter, in words."""
    if f.enum_type is not None:
        names = ", ".join(wire.enum_names(f.enum_type)[n] for n in sorted(wire.enum_names(f.enum_type)))
        return f"string, one of {names}"
    if f.message_type is not None:
        return "string: a name, or name(p1, p2, ...) with the parameters"
    if f.is_repeated:
        return "string of comma-separated integers"
    return {f.TYPE_DOUBLE: "double", f.TYPE_INT64: "int64", f.TYPE_BOOL: "bool", f.TYPE_STRING: "string"}[f.type]


def _describe_parameters(op: wire.Operation, native: Callable) -> dict[str, str]:
    signature = inspect.signature(native).parameters
    out = {}
    for name, (kind, detail) in op.request_plan.items():
        if kind in (wire.TENSOR, wire.TENSORS):
            continue
        f = op.request_class.DESCRIPTOR.fields_by_name[name]
        default = signature[name].default if name in signature else None
        needed = "required" if default is inspect.Parameter.empty else f"optional, default {default!r}"
        extra = " (or an int64 bitmask of the axes)" if op.name == "normalize" and name == "axes" else ""
        out[name] = f"{_field_kind(f)}{extra}; {needed}"
    if op.layout:
        out[FORMAT_PARAMETER] = f"string, nchw or nhwc: the layout of {' and '.join(op.layout)}; optional, default 'nchw'"
    return out


def operation_model(entry: optable.Entry) -> Model:
    op = entry.op
    message_codec = op.request_codec
    inputs = tuple(TensorInfo(name, entry.spec(name), name in entry.defaults) for name in message_codec.numbers)
    outputs = tuple(TensorInfo(name, entry.spec(name)) for name in op.response_fields)
    return Model(entry.name, op, inputs, outputs, _describe_parameters(op, entry.native), entry=entry)


def session_model(name: str, session_id: str, n: int, k: int) -> Model:
    qip = optable.QIP_TENSORS
    inputs = (TensorInfo("a", optable.TensorSpec(qip["a"].datatypes, (-1, k))),)
    outputs = (TensorInfo("c", optable.TensorSpec(qip["c"].datatypes, (-1, n))),)
    return Model(name, wire.FORWARD_SESSION, inputs, outputs, {}, session_id=session_id)


# ---------------------------------------------------------------------------------------
# Self-descriptions

def metadata(model: Model) -> pb.ModelMetadataResponse:
    Tensor = pb.ModelMetadataResponse.TensorMetadata

    def describe(t: TensorInfo, stacked: bool = False):
        dims = (-1,) if t.spec.dims is None else t.spec.dims
        return Tensor(name=t.name, datatype=t.spec.datatypes[0], shape=((-1,) + dims) if stacked else dims)
    message_codec = model.op.request_codec
    return pb.ModelMetadataResponse(
        name=model.name, versions=[VERSION], platform=PLATFORM,
        inputs=[describe(t, t.name in message_codec.repeated) for t in model.inputs],
        outputs=[describe(t) for t in model.outputs])


def config(model: Model) -> pb.ModelConfig:
    message_codec = model.op.request_codec
    config = pb.ModelConfig(name=model.name, platform=PLATFORM, backend=PLATFORM, max_batch_size=0)
    for t in model.inputs:
        dims = (-1,) if t.spec.dims is None else t.spec.dims
        if t.name in message_codec.repeated:
            dims = (-1,) + dims
        layout = pb.ModelInput.FORMAT_NONE
        config.input.add(name=t.name, data_type=_CONFIG_TYPES[t.spec.datatypes[0]], format=layout, dims=dims,
                         optional=t.optional)
        config.parameters[f"input {t.name}"].string_value = _tensor_words(t, t.name in message_codec.repeated)
    for t in model.outputs:
        dims = (-1,) if t.spec.dims is None else t.spec.dims
        config.output.add(name=t.name, data_type=_CONFIG_TYPES[t.spec.datatypes[0]], dims=dims)
        config.parameters[f"output {t.name}"].string_value = _tensor_words(t)
    for name, words in model.parameters.items():
        config.parameters[name].string_value = words
    return config


def _tensor_words(t: TensorInfo, stacked: bool = False) -> str:
    dims = t.spec.dims
    rank = "any number of dimensions" if dims is None else f"{len(dims)} dimension{'s' * (len(dims) != 1)}"
    words = f"{' or '.join(t.spec.datatypes)}; {rank}"
    if stacked:
        words += "; the operands stacked along a new first dimension"
    return words + ("; optional" if t.optional else "")


def statistics(models: list[Model]) -> pb.ModelStatisticsResponse:
    response = pb.ModelStatisticsResponse()
    for model in models:
        s = model.stats
        stats = response.model_stats.add(name=model.name, version=VERSION, last_inference=s.last_inference_ms,
                                         inference_count=s.success_count, execution_count=s.success_count)
        stats.inference_stats.success.count, stats.inference_stats.success.ns = s.success_count, s.success_ns
        stats.inference_stats.fail.count, stats.inference_stats.fail.ns = s.fail_count, s.fail_ns
    return response

"""The models of the KServe endpoint: what each takes and gives, its statistics, and its
self-description (ModelMetadata, ModelConfig)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property

from tensorops.kserve.v2 import inference_pb2 as pb
from tensorops.protocol import dtypes, table, wire

from .. import optable

PLATFORM = "tensorops"
VERSION = "1"  # every model has this one version
FORMAT_PARAMETER = "format"  # the layout of an operation's image tensors

_CONFIG_TYPES = {d.kserve: pb.DataType.Value(f"TYPE_{d.kserve}") for d in dtypes.DTYPES}  # ModelConfig's enum


@dataclass(frozen=True)
class TensorInfo:
    name: str
    spec: table.TensorSpec
    optional: bool = False
    stacked: bool = False  # a list of operands (eltwise's), stacked along a new first dimension


@dataclass
class Model:
    """What a model takes and gives, for inference and for its self-description."""

    name: str
    op: table.Operation  # the operation (its row of the table) its requests run
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    parameters: dict[str, str]  # name -> description: the request parameters it takes
    entry: optable.Entry | None = None  # a stateless operation
    session_id: str | None = None  # a session

    # What every request of the model needs, computed once.
    @cached_property
    def input_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.inputs)

    @cached_property
    def stacked_names(self) -> frozenset[str]:
        """The inputs that hold several operands stacked (eltwise's `inputs`)."""
        return frozenset(t.name for t in self.inputs if t.stacked)

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


@dataclass
class Statistics:
    """A model's inference counts and times (of one worker since its last report, or of the
    whole server)."""

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


def _field_kind(f: table.Field) -> str:
    """How an attribute travels as an InferParameter, in words."""
    if f.kind is table.Kind.ENUM:
        names = wire.enum_names(f.enum)
        return f"string, one of {', '.join(names[n] for n in sorted(names))}"
    if f.kind is table.Kind.MESSAGE:
        return "string: a name, or name(p1, p2, ...) with the parameters"
    if f.kind is table.Kind.REPEATED:
        return "string of comma-separated integers"
    d = f.descriptor
    return {d.TYPE_DOUBLE: "double", d.TYPE_INT64: "int64", d.TYPE_BOOL: "bool", d.TYPE_STRING: "string"}[d.type]


def _describe_parameters(op: table.Operation) -> dict[str, str]:
    out = {}
    for attribute in op.attributes:
        needed = "required" if attribute.required else f"optional, default {attribute.default!r}"
        extra = f" ({op.notes[attribute.name]})" if attribute.name in op.notes else ""
        out[attribute.name] = f"{_field_kind(attribute)}{extra}; {needed}"
    if op.layout:
        out[FORMAT_PARAMETER] = (
            f"string, nchw or nhwc: the layout of {' and '.join(op.layout)}; optional, default 'nchw'"
        )
    return out


def operation_model(entry: optable.Entry) -> Model:
    op = entry.op
    inputs = tuple(TensorInfo(f.name, op.spec(f.name), not f.required, f.kind is table.Kind.TENSORS) for f in op.inputs)
    outputs = tuple(TensorInfo(name, op.spec(name)) for name in op.outputs)
    return Model(op.name, op, inputs, outputs, _describe_parameters(op), entry=entry)


def session_model(name: str, session_id: str, n: int, k: int) -> Model:
    """A loaded session: its forward's `a` (M, K) gives `c` (M, N); no parameters."""
    op = table.FORWARD_SESSION
    inputs = (TensorInfo("a", table.TensorSpec(op.spec("a").datatypes, (-1, k))),)
    outputs = (TensorInfo("c", table.TensorSpec(op.spec("c").datatypes, (-1, n))),)
    return Model(name, op, inputs, outputs, {}, session_id=session_id)


# ---------------------------------------------------------------------------------------
# Self-descriptions


def metadata(model: Model) -> pb.ModelMetadataResponse:
    Tensor = pb.ModelMetadataResponse.TensorMetadata

    def describe(t: TensorInfo):
        return Tensor(name=t.name, datatype=t.spec.datatypes[0], shape=_dims(t))

    return pb.ModelMetadataResponse(
        name=model.name,
        versions=[VERSION],
        platform=PLATFORM,
        inputs=[describe(t) for t in model.inputs],
        outputs=[describe(t) for t in model.outputs],
    )


def config(model: Model) -> pb.ModelConfig:
    config = pb.ModelConfig(name=model.name, platform=PLATFORM, backend=PLATFORM, max_batch_size=0)
    for t in model.inputs:
        config.input.add(
            name=t.name,
            data_type=_CONFIG_TYPES[t.spec.datatypes[0]],
            format=pb.ModelInput.FORMAT_NONE,
            dims=_dims(t),
            optional=t.optional,
        )
        config.parameters[f"input {t.name}"].string_value = _tensor_words(t)
    for t in model.outputs:
        config.output.add(name=t.name, data_type=_CONFIG_TYPES[t.spec.datatypes[0]], dims=_dims(t))
        config.parameters[f"output {t.name}"].string_value = _tensor_words(t)
    for name, words in model.parameters.items():
        config.parameters[name].string_value = words
    return config


def _dims(t: TensorInfo) -> tuple[int, ...]:
    """The dimensions as KServe says them: -1 for any size, and for any number of them."""
    dims = (-1,) if t.spec.dims is None else t.spec.dims
    return (-1,) + dims if t.stacked else dims


def _tensor_words(t: TensorInfo) -> str:
    dims = t.spec.dims
    rank = "any number of dimensions" if dims is None else f"{len(dims)} dimension{'s' * (len(dims) != 1)}"
    words = f"{' or '.join(t.spec.datatypes)}; {rank}"
    if t.stacked:
        words += "; the operands stacked along a new first dimension"
    return words + ("; optional" if t.optional else "")


def statistics(models: list[tuple[Model, Statistics]]) -> pb.ModelStatisticsResponse:
    response = pb.ModelStatisticsResponse()
    for model, s in models:
        stats = response.model_stats.add(
            name=model.name,
            version=VERSION,
            last_inference=s.last_inference_ms,
            inference_count=s.success_count,
            execution_count=s.success_count,
        )
        stats.inference_stats.success.count, stats.inference_stats.success.ns = s.success_count, s.success_ns
        stats.inference_stats.fail.count, stats.inference_stats.fail.ns = s.fail_count, s.fail_ns
    return response

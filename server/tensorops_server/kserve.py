"""The KServe V2 / Triton inference protocol, `inference.GRPCInferenceService`, on the port
of tensorops.v1, so that Triton's clients (tritonclient and the C++, Go and Java ones)
call the kernels unchanged. docs/kserve.md is the user's guide.

Models:

- every operation of the op table is a model of the same name (`softmax`, ...), version
  "1", always ready. Its tensor arguments (the Tensor fields of its tensorops.v1 request)
  are its inputs; its other arguments are request parameters of the same names; its
  outputs are the Tensor fields of its response (`y`, `y0`/`y1`, `c`). eltwise's operands
  travel as one input `inputs`, stacked along a new first dimension.
- a quantized inner-product session is a model named by the caller: RepositoryModelLoad
  creates it (the constructor's scalar arguments in the JSON `config`, its tensors as
  .npy files `file:b`, `file:b_scale`, `file:bias`), ModelInfer with input `a` runs its
  forward (output `c`), RepositoryModelUnload releases it. Like every session it belongs
  to its caller (auth.py) and expires or is evicted as the session store decides.

A request is converted into the tensorops.v1 request of the operation (a `codec.Decoded`)
and computed by the very code that serves tensorops.v1 (Service.operation and its
sessions), inside the same Instrumented wrapper: one place for arguments, limits, errors
and metrics. Raw tensor contents are used in place (views of the received message), and
results are written once into the response's `raw_output_contents`.

The messages come from proto/tensorops/kserve/v2 (package tensorops.kserve.v2, wire-
identical to Triton's `inference` package; that .proto says why the package differs).
"""
from __future__ import annotations

import functools
import inspect
import io
import json
import math
import re
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

import grpc
import numpy as np

import tensorops_native
from tensorops.protocol import codec, wire
from tensorops.protocol.codec import WireError
from tensorops.kserve import BYTE_SIZE as _BYTE_SIZE
from tensorops.kserve import DATATYPES, SERVICE_NAME  # noqa: F401 (SERVICE_NAME, for server.py)
from tensorops.kserve import OFFSET as _OFFSET
from tensorops.kserve import REGION as _REGION
from tensorops.kserve.v2 import inference_pb2 as pb
from tensorops.v1 import tensor_pb2

from . import errors, optable
from .execution import CallState
from .reflection import renamed
from .service import Incoming, Instrumented, Service, deferred
from .shm import SharedMemory

PLATFORM = "tensorops"
VERSION = "1"  # every model has this one version
EXTENSIONS = ("model_configuration", "model_repository", "statistics")

# Request parameters Triton's clients set on their own (sequences, priority, queue
# timeout, HTTP options): accepted and ignored, as a server without those features does.
IGNORED_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
                                "binary_data_output"})

_CONFIG_TYPES = {name: pb.DataType.Value(f"TYPE_{name}") for name in DATATYPES}  # ModelConfig's enum
_DATATYPE_OF = {dtype: name for name, (_, dtype) in DATATYPES.items()}
_WIRE_DTYPES = {code: dtype for code, dtype in DATATYPES.values()}
# Typed contents: the field of InferTensorContents each datatype reads (16-bit floats: raw only).
_CONTENTS = {"FP32": "fp32_contents", "FP64": "fp64_contents", "INT8": "int_contents", "INT32": "int_contents",
             "INT64": "int64_contents", "UINT8": "uint_contents"}

_RAW_INPUTS = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number
_RAW_OUTPUTS = pb.ModelInferResponse.DESCRIPTOR.fields_by_name["raw_output_contents"].number
_STREAM_RESPONSE_FIELD = pb.ModelStreamInferResponse.DESCRIPTOR.fields_by_name["infer_response"].number
_FORMAT_PARAMETER = "format"
_REGION_PARAMETERS = frozenset((_REGION, _BYTE_SIZE, _OFFSET))


# ---------------------------------------------------------------------------------------
# Models

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
        out[_FORMAT_PARAMETER] = f"string, nchw or nhwc: the layout of {' and '.join(op.layout)}; optional, default 'nchw'"
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
# Requests -> the tensorops.v1 request of the operation

def _parameter_value(name: str, p) -> Any:
    choice = p.WhichOneof("parameter_choice")
    if choice is None:
        raise errors.invalid(name, f"parameter `{name}` has no value")
    return getattr(p, choice)


def _choice_name(value) -> str:
    return {bool: "bool_param", int: "int64_param", float: "double_param", str: "string_param",
            bytes: "bytes_param"}.get(type(value), type(value).__name__)


_ACTIVATION = re.compile(r"^\s*([A-Za-z_]+)\s*(?:\((.*)\))?\s*$")


def _argument(op: wire.Operation, name: str, value) -> Any:
    """An InferParameter's value (or a JSON value of a load config) as the Python API's
    argument, refused in the protocol's terms when its type cannot be the argument's."""
    kind, detail = op.request_plan[name]

    def wrong(expected: str):
        return errors.invalid(name, f"expected {expected}, got {_choice_name(value)} {value!r}")
    integer = isinstance(value, int) and not isinstance(value, bool)
    if kind == wire.ENUM:
        if not (isinstance(value, str) or integer):
            raise wrong("a string_param (the name)")
        return value
    if kind == wire.MESSAGE:  # normalize's activation: "name" or "name(p1, p2)"
        match = _ACTIVATION.match(value) if isinstance(value, str) else None
        if match is None:
            raise wrong("a string_param: a name, or name(p1, p2, ...)")
        try:
            params = [float(p) for p in match.group(2).split(",") if p.strip()] if match.group(2) else []
        except ValueError:
            raise errors.invalid(name, f"the parameters of {value!r} must be numbers") from None
        return (match.group(1), *params)
    if kind == wire.REPEATED:
        if integer:
            return value  # normalize's axes as a bitmask; elsewhere refused by the operation
        if not isinstance(value, str):
            raise wrong("a string_param of comma-separated integers")
        try:
            return [int(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise errors.invalid(name, f"expected comma-separated integers, got {value!r}") from None
    f = detail
    if f.type == f.TYPE_DOUBLE:
        if not (integer or isinstance(value, float)):
            raise wrong("a double_param")
        return float(value)
    if f.type == f.TYPE_INT64:
        if not integer:
            raise wrong("an int64_param")
        return value
    if f.type == f.TYPE_BOOL:
        if not isinstance(value, bool):
            raise wrong("a bool_param")
        return value
    if not isinstance(value, str):
        raise wrong("a string_param")
    return value


def _check_parameter_name(model: Model, name: str) -> None:
    """Refuse a name that is none of the model's parameters."""
    kind = model.op.request_plan.get(name)
    if kind is None or kind[0] in (wire.TENSOR, wire.TENSORS) or name == "session_id":
        errors.check_length("parameters.name", name)
        known = ", ".join(model.parameters) or "none"
        raise errors.invalid(name, f"model {model.name} has no parameter `{name}` (its parameters: {known})")


def request_message(model: Model, arguments: dict[str, Any]):
    """The tensorops.v1 request message (without tensors) holding the arguments, encoded
    as a tensorops client would encode them (so that they are checked in one place)."""
    op = model.op
    converted = {}
    for name, value in arguments.items():
        _check_parameter_name(model, name)
        converted[name] = _argument(op, name, value)
    try:
        return op.request_class.FromString(wire.build_request(op, converted).data)
    except WireError as exc:
        raise errors.from_wire(exc) from None


def _typed_contents(name: str, datatype: str, contents, count: int) -> bytes:
    field_name = _CONTENTS.get(datatype)
    if field_name is None:
        raise errors.invalid(f"{name}.contents", f"{datatype} travels only as raw contents (raw_input_contents)")
    values = getattr(contents, field_name)
    if len(values) != count:
        raise errors.invalid(f"{name}.contents", f"expected {count} elements in {field_name}, got {len(values)}")
    dtype = DATATYPES[datatype][1]
    arr = np.asarray(values, dtype=np.float64 if dtype.kind == "f" else np.int64)
    if dtype.kind in "iu" and arr.size:
        info = np.iinfo(dtype)
        if arr.min() < info.min or arr.max() > info.max:
            raise errors.invalid(f"{name}.contents", f"a value of {field_name} is outside the range of {datatype}")
    return arr.astype(dtype).astype(dtype.newbyteorder("<"), copy=False).tobytes()


# Opens a part of a registered region for the call: (region, offset, byte_size, field) ->
# a view (shm.CallRegions.view).
Regions = Callable[[str, int, int, str], memoryview]


def region_parameters(where: str, parameters) -> tuple[str, int, int] | None:
    """(region, offset, byte_size) of an input or output placed in shared memory, or None.
    Other tensor parameters are refused (binary_data_size, an HTTP one, is ignored)."""
    if not parameters:
        return None
    values = {}
    for key, p in parameters.items():
        if key not in _REGION_PARAMETERS:
            if key == "binary_data_size":
                continue
            errors.check_length(f"{where}.parameters.name", key)
            raise errors.invalid(f"{where}.{key}", f"unknown tensor parameter `{key}`")
        choice = p.WhichOneof("parameter_choice")
        if choice is None:
            raise errors.invalid(f"{where}.{key}", f"parameter `{key}` has no value")
        values[key] = getattr(p, choice)
    if not values:
        return None
    if _REGION not in values or _BYTE_SIZE not in values:
        missing = _REGION if _REGION not in values else _BYTE_SIZE
        raise errors.invalid(f"{where}.{missing}", f"required with {', '.join(values)}")
    region, size, offset = values[_REGION], values[_BYTE_SIZE], values.get(_OFFSET, 0)
    if not isinstance(region, str):
        raise errors.invalid(f"{where}.{_REGION}", f"expected a string_param, got {_choice_name(region)}")
    errors.check_length(f"{where}.{_REGION}", region)
    for key, value in ((_BYTE_SIZE, size), (_OFFSET, offset)):
        if type(value) is not int or value < 0:  # noqa: E721 - bool (a bool_param) is refused too
            raise errors.invalid(f"{where}.{key}", f"expected a non-negative int64_param, got {value!r}")
    return region, offset, size


def input_tensors(model: Model, request, raws: list, fmt: int, regions: Regions | None) -> dict[str, Any]:
    """The inputs of a ModelInferRequest as the tensorops.v1 codec's WireTensors: from raw
    contents (one buffer per input not in shared memory, in order), typed contents or a
    shared-memory region."""
    inputs = request.inputs
    input_names = model.input_names
    given = set()
    for tensor in inputs:  # every input is the model's, once: their count is bounded by the model's
        name = tensor.name
        if name not in input_names:
            errors.check_length("inputs.name", name)
            known = ", ".join(t.name for t in model.inputs)
            raise errors.invalid(name, f"model {model.name} has no input `{name}` (its inputs: {known})")
        if name in given:
            raise errors.invalid(name, f"input `{name}` is given twice")
        given.add(name)
    placed = [region_parameters(t.name, t.parameters) for t in inputs]
    in_messages = placed.count(None)
    if raws and len(raws) != in_messages:
        raise errors.invalid("raw_input_contents", f"expected one buffer per input not in shared memory "
                                                   f"({in_messages}), got {len(raws)}")
    j = 0  # the next raw buffer
    layout = model.op.layout
    repeated = model.op.request_codec.repeated
    tensors: dict[str, Any] = {name: [] for name in repeated}  # as the tensorops.v1 codec leaves them
    for tensor, where in zip(inputs, placed):
        name = tensor.name
        datatype = tensor.datatype
        found = DATATYPES.get(datatype)
        if found is None:
            errors.check_length(f"{name}.datatype", datatype)
            raise errors.invalid(f"{name}.datatype", f"expected one of {', '.join(DATATYPES)}, got {datatype!r}")
        code, dtype = found
        if len(tensor.shape) > codec.MAX_NDIM:  # before the dimensions are copied out of the message
            raise errors.invalid(f"{name}.shape", f"at most {codec.MAX_NDIM} dimensions, got {len(tensor.shape)}")
        shape = tensor.shape[:]  # a list, built faster than list(shape) by the protobuf runtime
        count = (math.prod(shape) if min(shape) >= 0 else -1) if shape else 1
        if where is not None:
            if tensor.HasField("contents"):
                raise errors.invalid(f"{name}.contents", "the input is in shared memory: no contents")
            region, offset, size = where
            if regions is None:
                raise errors.invalid(f"{name}.{_REGION}", "shared memory is not available to this call")
            data = regions(region, offset, size, f"{name}.{_REGION}")
        elif raws:
            if tensor.HasField("contents"):
                raise errors.invalid(f"{name}.contents", "raw_input_contents is used: no input may have contents")
            data = raws[j]
            j += 1
        else:
            if count < 0:
                raise errors.invalid(f"{name}.shape", f"dimensions must be non-negative, got {shape}")
            data = _typed_contents(name, datatype, tensor.contents, count)
        if count >= 0 and len(data) != count * dtype.itemsize:
            if where is not None:
                source = f"{_BYTE_SIZE} is {where[2]}"
            elif raws:
                source = f"raw_input_contents[{j - 1}] holds {len(data)} bytes"
            else:
                source = ""
            raise errors.invalid(name, f"{source}; {shape} of {datatype} takes {count * dtype.itemsize}")
        image = fmt if name in layout else 0
        if name in repeated:  # the operands stacked along the first dimension
            if not shape or count < 0:
                raise errors.invalid(f"{name}.shape", "expected the operands stacked along a first dimension, "
                                                      f"got shape {shape}")
            if shape[0] > codec.MAX_OPERANDS:  # each costs objects of its own, even when empty
                raise errors.invalid(f"{name}.shape", f"at most {codec.MAX_OPERANDS} operands (the first "
                                                      f"dimension, the limit), got {shape[0]}")
            size = len(data) // shape[0] if shape[0] else 0
            view = memoryview(data)
            tensors[name] = [codec.WireTensor(shape[1:], code, image, view[k * size:(k + 1) * size])
                             for k in range(shape[0])]
        else:
            tensors[name] = codec.WireTensor(shape, code, image, data)
    return tensors


# Conversions of request parameters kept per model (the same few recur call after call);
# beyond this many, new ones are converted on every call. An entry holds at most one value
# of MAX_NAME_CHARS per parameter of the model.
ARGUMENTS_CACHE_SIZE = 64


def request_arguments(model: Model, parameters) -> tuple[Any, int]:
    """The tensorops.v1 request message (without tensors) holding a request's parameters,
    and the format of its image tensors (wire enum). Parameters seen before, with values of
    the same types, reuse their conversion (read only, like every decoded message): they
    were converted then, and conversion depends on nothing else. Names and value sizes are
    checked first, so that only the model's parameters, with short values, are converted
    or kept."""
    received = []
    for name, p in parameters.items():
        ignored = name in IGNORED_PARAMETERS
        if not ignored and (name != _FORMAT_PARAMETER or not model.op.layout):
            _check_parameter_name(model, name)
        choice = p.WhichOneof("parameter_choice")
        if choice is None:
            raise errors.invalid(name, f"parameter `{name}` has no value")
        value = getattr(p, choice)
        if isinstance(value, (str, bytes)):
            errors.check_length(name, value)
        if not ignored:
            received.append((name, choice, value))
    key = tuple(received)
    cache = model.arguments_cache
    converted = cache.get(key)
    if converted is None:
        arguments = {}
        fmt = 0
        for name, _, value in received:
            if name == _FORMAT_PARAMETER and model.op.layout:
                try:
                    fmt = wire.encode_format(value)
                except WireError as exc:
                    raise errors.from_wire(exc) from None
                continue
            arguments[name] = value
        converted = request_message(model, arguments), fmt
        if len(cache) < ARGUMENTS_CACHE_SIZE:
            cache[key] = converted
    return converted


def infer_request(model: Model, request, raws: list, regions: Regions | None = None) -> codec.Decoded:
    """A ModelInferRequest as the tensorops.v1 request of the model's operation."""
    message, fmt = request_arguments(model, request.parameters)
    return codec.Decoded(message, input_tensors(model, request, raws, fmt, regions))


def requested_outputs(model: Model, request) -> tuple[tuple[str, tuple | None], ...]:
    """The outputs to answer with, in order, each with its shared-memory placement (or None)."""
    if not request.outputs:
        return model.all_outputs
    names = model.output_names
    wanted = {}
    for o in request.outputs:  # each of the model's outputs at most once: as many as it has
        name = o.name
        if name not in names:
            errors.check_length("outputs.name", name)
            raise errors.invalid(f"outputs.{name}", f"model {model.name} has no output `{name}` "
                                                    f"(its outputs: {', '.join(names)})")
        if name in wanted:
            raise errors.invalid(f"outputs.{name}", f"output `{name}` is listed twice")
        wanted[name] = None
    return tuple((o.name, region_parameters(f"outputs.{o.name}", o.parameters)) for o in request.outputs)


_ID = pb.ModelInferResponse.DESCRIPTOR.fields_by_name["id"].number
_OUTPUTS = pb.ModelInferResponse.DESCRIPTOR.fields_by_name["outputs"].number
_EMPTY_RAW_OUTPUT = b"".join(codec.bytes_field(_RAW_OUTPUTS, memoryview(b"")))


def _message_field(number: int, data: bytes) -> bytes:
    return b"".join(codec.bytes_field(number, memoryview(data)))


def infer_response(model: Model, request, outputs: tuple, result, limit: int, regions: Regions | None = None,
                   written: np.ndarray | None = None, wrap: int | None = None) -> bytes:
    """The ModelInferResponse: output descriptions, then the results as raw contents, each
    copied once into the message, or into its shared-memory region (its raw contents then
    empty, so that every output keeps its index among the raw contents). `written`: a
    result the kernel wrote into its region already. The message is assembled from its
    fields (the model's head, id, outputs, raw contents), which protobuf reads as the
    message serialized at once, once its size is checked against `limit`. (Each result was
    charged to the call with its copy in a response before it was computed, and a request
    names each output at most once.) `wrap`: the message is the field of that number of
    an enclosing message (ModelStreamInferResponse), written in the same one copy."""
    results = result if isinstance(result, tuple) else (result,)
    names = model.output_names
    parts = [model.response_head]
    if request.id:
        parts.append(_message_field(_ID, request.id.encode()))
    payloads = []
    for name, placed in outputs:
        value = results[names.index(name)]
        arr, _ = codec.wire_array(value, name)
        out = pb.ModelInferResponse.InferOutputTensor(name=name, datatype=_DATATYPE_OF[arr.dtype], shape=arr.shape)
        if placed is not None:
            region, offset, size = placed
            nbytes = arr.nbytes
            if nbytes > size:
                raise errors.invalid(f"outputs.{name}.{_BYTE_SIZE}", f"the result takes {nbytes} bytes, "
                                                                     f"more than the {size} given")
            if value is not written:
                regions(region, offset, nbytes, f"outputs.{name}.{_REGION}")[:] = codec.array_bytes(arr)
            out.parameters[_REGION].string_param = region
            out.parameters[_BYTE_SIZE].int64_param = nbytes
            if offset:
                out.parameters[_OFFSET].int64_param = offset
            payloads.append(_EMPTY_RAW_OUTPUT)
        else:
            payloads += codec.bytes_field(_RAW_OUTPUTS, codec.array_bytes(arr))
        parts.append(_message_field(_OUTPUTS, out.SerializeToString()))
    nbytes = sum(len(p) for p in parts) + sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in payloads)
    if wrap is not None:
        parts.insert(0, codec.field_header(wrap, nbytes))
        nbytes += len(parts[0])
    if nbytes > limit:
        raise errors.exhausted(f"the response would take {nbytes} bytes, beyond the limit of {limit} bytes per "
                               "message", field="outputs")
    return b"".join(parts + payloads)


# ---------------------------------------------------------------------------------------
# Sessions as models: RepositoryModelLoad

_CONFIG = "config"
_FILE = "file:"


# The largest `config` of RepositoryModelLoad: a JSON object of a few scalars.
MAX_CONFIG_CHARS = 4096


def npy_tensor(key: str, data: bytes, call: CallState) -> codec.WireTensor:
    """A .npy file's array as a WireTensor over its bytes, without trusting its header
    (the size is checked against the bytes there are, later, by the codec). An array of
    the other byte order is swapped into a copy (charged to the call)."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(stream)
    except Exception:  # ValueError and the like, in NumPy's words
        raise errors.invalid(key, "expected the bytes of a .npy file (numpy.save)") from None
    if fortran_order and len(shape) > 1:
        raise errors.invalid(key, "expected an array in C order (numpy.save of a C-contiguous array)")
    try:
        _, code = codec.wire_array(np.empty(0, dtype), key)
    except WireError as exc:
        raise errors.from_wire(exc) from None
    payload = memoryview(data)[stream.tell():]
    if not dtype.isnative and len(payload) == math.prod(shape) * dtype.itemsize:  # else the codec names it
        call.reserve(len(payload), key)
        payload = memoryview(np.frombuffer(payload, dtype).astype(dtype.newbyteorder("=")).view(np.uint8))
    return codec.WireTensor(list(shape), code, 0, payload)


def _config_arguments(value) -> dict[str, Any]:
    """The constructor's scalar arguments from the JSON object `config`."""
    if not isinstance(value, str):
        raise errors.invalid(_CONFIG, f"expected a string_param holding a JSON object, got {_choice_name(value)}")
    errors.check_length(_CONFIG, value, MAX_CONFIG_CHARS)
    try:
        config = json.loads(value)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        raise errors.invalid(_CONFIG, "expected a JSON object of scalars, got text that is not JSON or is nested "
                                      "too deep") from None
    if not isinstance(config, dict):
        raise errors.invalid(_CONFIG, f"expected a JSON object, got {type(config).__name__}")
    for name, item in config.items():
        if isinstance(item, (dict, list)):
            errors.check_length(f"{_CONFIG}.name", name)
            raise errors.invalid(name, f"expected a number, a string or a bool, got a JSON "
                                       f"{'object' if isinstance(item, dict) else 'array'}")
    return config


def load_request(request, call: CallState) -> codec.Decoded:
    """A RepositoryModelLoadRequest as the CreateQuantizedInnerProduct request."""
    op = wire.CREATE_SESSION
    model = Model(request.model_name, op, (), (), {name: "" for name, (kind, _) in op.request_plan.items()
                                                   if kind not in (wire.TENSOR, wire.TENSORS)})
    arguments: dict[str, Any] = {}
    tensors: dict[str, Any] = {}
    tensor_names = op.request_codec.numbers
    for key, p in request.parameters.items():
        errors.check_length("parameters.name", key)
        value = _parameter_value(key, p)
        if key == _CONFIG:
            arguments.update(_config_arguments(value))
        elif key.startswith(_FILE):
            name = key[len(_FILE):].removesuffix(".npy")
            if name not in tensor_names:
                raise errors.invalid(key, f"expected the files {', '.join(_FILE + n for n in tensor_names)}")
            if not isinstance(value, bytes):
                raise errors.invalid(key, f"expected a bytes_param, got {_choice_name(value)}")
            tensors[name] = npy_tensor(key, value, call)
        else:
            raise errors.invalid(key, f"unknown parameter `{key}`: expected `config` and `file:<tensor>`")
    return codec.Decoded(request_message(model, arguments), tensors)


# ---------------------------------------------------------------------------------------
# The service

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
                    return Incoming(None, WireError("message", f"{size} bytes besides raw_input_contents, "
                                                    f"more than the limit of {MAX_DESCRIPTION_BYTES}: send large "
                                                    "tensors as raw contents"), len(raw))
                message = message_class.FromString(b"".join(rest))
            else:
                codec.check_fields(raw)
                message = message_class.FromString(raw)
                raws = []
            return Incoming(codec.Decoded(message, {"raw": raws}, len(raw)), None, len(raw))
        except codec.TooManyFields as exc:  # said as it is
            return Incoming(None, exc, len(raw))
        except Exception:  # noqa: BLE001 - DecodeError
            return Incoming(None, _not_the_message(name), len(raw))
    return decode


def _not_the_message(name: str) -> WireError:
    return WireError("message", f"the request is not a valid {name} message in the protobuf binary encoding")


class KServe:
    """The behaviors of inference.GRPCInferenceService over a tensorops Service."""

    def __init__(self, service: Service, shm: SharedMemory):
        self.service = service
        self.shm = shm
        self.models = {name: operation_model(entry) for name, entry in service.table.items()}
        # The behaviors of the operations, returning the result arrays (not a message).
        self._compute = {name: service.operation(entry, encode=lambda result, fmt: result)
                         for name, entry in service.table.items()}
        self.sessions: dict[tuple[str, str], Model] = {}  # (owner, model name) -> session model
        self.ready = True

    # ---- models
    def model(self, name: str, version: str, identity: str) -> Model:
        errors.check_length("model_name", name)
        if version not in ("", VERSION):
            errors.check_length("model_version", version)
            raise errors.not_found(f"model {name} has no version {version!r} (its only version is {VERSION})",
                                   field="model_version")
        model = self.models.get(name) or self.sessions.get((identity, name))
        if model is None:
            raise errors.not_found(f"no model named {name!r}: the models are the operations "
                                   f"({', '.join(self.models)}) and the sessions loaded with RepositoryModelLoad",
                                   field="model_name")
        return model

    async def _run(self, model: Model, decoded: codec.Decoded, call: CallState, nbytes: int, shared_bytes: int,
                   extra: dict):
        if model.entry is not None:
            # In shared memory, the kernel is the call's only work on its tensors: a short
            # one runs on the loop, where a thread hand-off would cost more than it.
            inline = None if not shared_bytes else (self.service.executor.inline(nbytes) and
                                                    shared_bytes <= self.service.config.inline_shared_memory_bytes)
            return await self._compute[model.name](decoded, call, nbytes + shared_bytes, extra, inline)
        try:
            return await self.service.forward(model.session_id, decoded, call)
        except errors.Failure as failure:
            if failure.code is grpc.StatusCode.NOT_FOUND:
                self.sessions.pop((call.identity, model.name), None)
                raise errors.not_found(f"model {model.name}: its session expired, was evicted or released, or "
                                       "the server restarted; load it again", field="model_name") from None
            raise

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
            request_in = infer_request(model, request, decoded.tensors["raw"], regions.view)
            extra = {}
            out = self._output_in_region(model, request_in, outputs, regions.view)
            if out is not None:
                extra["out"] = out
            result = await self._run(model, request_in, call, nbytes, regions.nbytes, extra)
            response = infer_response(model, request, outputs, result, self.service.config.max_message_bytes,
                                      regions.view, written=out, wrap=wrap)
            regions.check_intact()  # an object shrunk meanwhile voids what was read or written there
            ok = True
            return response
        finally:
            regions.close()
            model.stats.record(ok, time.perf_counter_ns() - start)

    @staticmethod
    def _output_in_region(model: Model, decoded: codec.Decoded, outputs: tuple, regions: Regions):
        """The array in its shared-memory region that the kernel writes the result into
        (tensorops_native's `out=`), when the operation takes one, its one result's shape
        follows from its first input (that input's shape and dtype; channel_sum: (batch,
        channels) float32), and the request places that output there; None otherwise (the
        result is then copied into the region)."""
        entry = model.entry
        if entry is None or "out" not in entry.parameters or len(model.outputs) != 1 or outputs[0][1] is None:
            return None
        first = decoded.tensors.get(model.inputs[0].name)
        if isinstance(first, list):  # eltwise's operands
            first = first[0] if first else None
        dtype = _WIRE_DTYPES.get(first.dtype) if first is not None else None
        if dtype is None or min(first.shape, default=0) < 0:
            return None  # the operation refuses the input, naming it
        shape = tuple(first.shape)
        if model.name == "channel_sum":
            if len(shape) < 2:
                return None
            shape, dtype = (shape[0], shape[-1] if first.format == tensor_pb2.FORMAT_NHWC else shape[1]), \
                np.dtype(np.float32)
        nbytes = math.prod(shape) * dtype.itemsize
        region, offset, size = outputs[0][1]
        if nbytes > size:
            return None  # refused after the call, with the result's size
        out = np.frombuffer(regions(region, offset, nbytes, f"outputs.{outputs[0][0]}.{_REGION}"), dtype)
        return out.reshape(shape) if out.flags.aligned else None

    async def stream_infer(self, instrumented: Instrumented, context: grpc.aio.ServicerContext) -> None:
        """ModelStreamInfer: each request of the stream answered in order; a request that
        fails gets its error in `error_message`, and the stream goes on. Waiting for the
        next request, the stream is held to the admission's read timeout and pending places
        like any call whose request is arriving (DEADLINE_EXCEEDED or RESOURCE_EXHAUSTED
        then ends it)."""
        try:
            identity = instrumented.auth.identify(context)
        except errors.Failure as failure:
            await context.abort_with_status(failure.status())
            return
        while True:
            try:
                incoming = await instrumented.admission.receive(context, stream=True)
            except errors.Failure as failure:
                await context.abort_with_status(failure.status())
                return
            if incoming is grpc.aio.EOF:
                return
            # The response is written inside the call, so that its charge is held until
            # gRPC has sent it: a stream whose client does not read cannot pile them up.
            response, status = await instrumented.call(context, incoming, identity, send=context.write)
            if status is not None:
                await context.write(pb.ModelStreamInferResponse(
                    error_message=f"{status.code.name}: {status.details}").SerializeToString())

    # ---- health and metadata
    async def model_ready(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        request = decoded.message
        try:
            model = self.model(request.name, request.version, call.identity)
        except errors.Failure:
            return pb.ModelReadyResponse(ready=False).SerializeToString()
        ready = model.entry is not None or self._session_alive(model, call.identity)
        return pb.ModelReadyResponse(ready=ready).SerializeToString()

    def _session_alive(self, model: Model, identity: str) -> bool:
        return any(s.id == model.session_id for s in self.service.store.snapshot(identity))

    async def server_metadata(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        extensions = EXTENSIONS + (("system_shared_memory",) if self.shm.allowed else ())
        return pb.ServerMetadataResponse(name=PLATFORM, version=tensorops_native.__version__,
                                         extensions=extensions).SerializeToString()

    async def model_metadata(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        request = decoded.message
        model = self.model(request.name, request.version, call.identity)
        Tensor = pb.ModelMetadataResponse.TensorMetadata

        def describe(t: TensorInfo, stacked: bool = False):
            dims = (-1,) if t.spec.dims is None else t.spec.dims
            return Tensor(name=t.name, datatype=t.spec.datatypes[0], shape=((-1,) + dims) if stacked else dims)
        message_codec = model.op.request_codec
        return pb.ModelMetadataResponse(
            name=model.name, versions=[VERSION], platform=PLATFORM,
            inputs=[describe(t, t.name in message_codec.repeated) for t in model.inputs],
            outputs=[describe(t) for t in model.outputs]).SerializeToString()

    async def model_config(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        request = decoded.message
        model = self.model(request.name, request.version, call.identity)
        message_codec = model.op.request_codec
        config = pb.ModelConfig(name=model.name, platform=PLATFORM, backend=PLATFORM, max_batch_size=0)
        for t in model.inputs:
            dims = (-1,) if t.spec.dims is None else t.spec.dims
            if t.name in message_codec.repeated:
                dims = (-1,) + dims
            layout = pb.ModelInput.FORMAT_NONE
            config.input.add(name=t.name, data_type=_CONFIG_TYPES[t.spec.datatypes[0]], format=layout, dims=dims,
                             optional=t.optional)
            config.parameters[f"input {t.name}"].string_value = self._tensor_words(t, t.name in message_codec.repeated)
        for t in model.outputs:
            dims = (-1,) if t.spec.dims is None else t.spec.dims
            config.output.add(name=t.name, data_type=_CONFIG_TYPES[t.spec.datatypes[0]], dims=dims)
            config.parameters[f"output {t.name}"].string_value = self._tensor_words(t)
        for name, words in model.parameters.items():
            config.parameters[name].string_value = words
        return pb.ModelConfigResponse(config=config).SerializeToString()

    @staticmethod
    def _tensor_words(t: TensorInfo, stacked: bool = False) -> str:
        dims = t.spec.dims
        rank = "any number of dimensions" if dims is None else f"{len(dims)} dimension{'s' * (len(dims) != 1)}"
        words = f"{' or '.join(t.spec.datatypes)}; {rank}"
        if stacked:
            words += "; the operands stacked along a new first dimension"
        return words + ("; optional" if t.optional else "")

    async def model_statistics(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        request = decoded.message
        if request.name:
            models = [self.model(request.name, request.version, call.identity)]
        else:
            models = list(self.models.values()) + [m for (owner, _), m in self.sessions.items()
                                                   if owner == call.identity]
        response = pb.ModelStatisticsResponse()
        for model in models:
            s = model.stats
            stats = response.model_stats.add(name=model.name, version=VERSION, last_inference=s.last_inference_ms,
                                             inference_count=s.success_count, execution_count=s.success_count)
            stats.inference_stats.success.count, stats.inference_stats.success.ns = s.success_count, s.success_ns
            stats.inference_stats.fail.count, stats.inference_stats.fail.ns = s.fail_count, s.fail_ns
        return response.SerializeToString()

    # ---- repository: sessions as models
    async def repository_index(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        response = pb.RepositoryIndexResponse()
        for name in self.models:
            response.models.add(name=name, version=VERSION, state="READY")
        live = {s.id for s in self.service.store.snapshot(call.identity)}
        for (owner, name), model in list(self.sessions.items()):
            if owner != call.identity:
                continue
            if model.session_id in live:
                response.models.add(name=name, version=VERSION, state="READY")
            elif not decoded.message.ready:
                response.models.add(name=name, version=VERSION, state="UNAVAILABLE",
                                    reason="the session expired, was evicted or released")
        return response.SerializeToString()

    async def load(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        request = decoded.message
        name = request.model_name
        if not name:
            raise errors.invalid("model_name", "required: the name the session will be called by")
        errors.check_length("model_name", name)  # kept while the session lives, listed by RepositoryIndex
        if name in self.models:
            raise errors.invalid("model_name", f"{name!r} is an operation; choose another name for the session")
        session = await self.service.open_session(load_request(request, call), call)
        live = {s.id for s in self.service.store.snapshot(call.identity)}
        for key in [k for k, m in self.sessions.items() if k[0] == call.identity and m.session_id not in live]:
            del self.sessions[key]  # sessions gone meanwhile
        previous = self.sessions.get((call.identity, name))
        self.sessions[(call.identity, name)] = session_model(name, session.id, *session.shape)
        if previous is not None and previous.session_id in live:  # a reload replaces the session
            self.service.store.release(previous.session_id, call.identity)
        return b""

    async def unload(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        name = decoded.message.model_name
        errors.check_length("model_name", name)
        if name in self.models:
            raise errors.invalid("model_name", f"{name!r} is an operation: only sessions are loaded and unloaded")
        model = self.sessions.pop((call.identity, name), None)
        if model is None:
            raise errors.not_found(f"no session model named {name!r}", field="model_name")
        try:
            self.service.store.release(model.session_id, call.identity)
        except errors.Failure:
            pass  # it expired or was evicted meanwhile: unloaded all the same
        return b""

    # ---- system shared memory
    async def shm_register(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        r = decoded.message
        self.shm.register(call.identity, r.name, r.key, r.offset, r.byte_size)
        return b""

    async def shm_status(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.shm.status(call.identity, decoded.message.name):
            response.regions[region.name].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(
                name=region.name, key=region.key, offset=region.offset, byte_size=region.byte_size))
        return response.SerializeToString()

    async def shm_unregister(self, decoded: codec.Decoded, call: CallState, nbytes: int) -> bytes:
        self.shm.unregister(call.identity, decoded.message.name)
        return b""

    # ---- the handler table
    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        s = self.service
        behaviors = {
            "ModelReady": ("kserve_model_ready", self.model_ready, pb.ModelReadyRequest),
            "ServerMetadata": ("kserve_server_metadata", self.server_metadata, pb.ServerMetadataRequest),
            "ModelMetadata": ("kserve_model_metadata", self.model_metadata, pb.ModelMetadataRequest),
            "ModelInfer": ("kserve_model_infer", self.infer, pb.ModelInferRequest),
            "ModelConfig": ("kserve_model_config", self.model_config, pb.ModelConfigRequest),
            "ModelStatistics": ("kserve_model_statistics", self.model_statistics, pb.ModelStatisticsRequest),
            "RepositoryIndex": ("kserve_repository_index", self.repository_index, pb.RepositoryIndexRequest),
            "RepositoryModelLoad": ("kserve_repository_model_load", self.load, pb.RepositoryModelLoadRequest),
            "RepositoryModelUnload": ("kserve_repository_model_unload", self.unload,
                                      pb.RepositoryModelUnloadRequest),
            "SystemSharedMemoryRegister": ("kserve_shared_memory_register", self.shm_register,
                                           pb.SystemSharedMemoryRegisterRequest),
            "SystemSharedMemoryStatus": ("kserve_shared_memory_status", self.shm_status,
                                         pb.SystemSharedMemoryStatusRequest),
            "SystemSharedMemoryUnregister": ("kserve_shared_memory_unregister", self.shm_unregister,
                                             pb.SystemSharedMemoryUnregisterRequest),
        }
        handlers = {}
        inline_bytes = s.config.inline_bytes  # larger requests are decoded on a worker, once admitted
        for rpc, (label, behavior, message_class) in behaviors.items():
            instrumented = Instrumented(label, behavior, s.metrics, s.admission, s.auth, s.config.max_message_bytes)
            raw = _RAW_INPUTS if message_class is pb.ModelInferRequest else None
            handlers[rpc] = grpc.stream_unary_rpc_method_handler(
                instrumented.handle, request_deserializer=deferred(deserializer(message_class, raw), inline_bytes))
        # Each stream response is the ModelInferResponse inside a ModelStreamInferResponse,
        # assembled as such in one copy.
        stream_response = functools.partial(self.infer, wrap=_STREAM_RESPONSE_FIELD)
        streaming = Instrumented("kserve_model_stream_infer", stream_response, s.metrics, s.admission, s.auth,
                                 s.config.max_message_bytes)
        async def stream(requests, context):
            await self.stream_infer(streaming, context)
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            stream,
            request_deserializer=deferred(deserializer(pb.ModelInferRequest, _RAW_INPUTS), inline_bytes))
        # Liveness and readiness: like the health service, outside admission and auth.
        handlers["ServerLive"] = grpc.unary_unary_rpc_method_handler(
            self._live, request_deserializer=deserializer(pb.ServerLiveRequest),
            response_serializer=pb.ServerLiveResponse.SerializeToString)
        handlers["ServerReady"] = grpc.unary_unary_rpc_method_handler(
            self._ready, request_deserializer=deserializer(pb.ServerReadyRequest),
            response_serializer=pb.ServerReadyResponse.SerializeToString)
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

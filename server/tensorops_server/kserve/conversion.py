"""KServe requests and responses <-> what the operations take and give: the parameters and
inputs of a ModelInferRequest as the operation's native arguments (raw contents used in
place, typed contents, shared-memory regions), the results as a ModelInferResponse (each
written once, into the message or its region), and the tensors of a RepositoryModelLoad as
.npy files.

A request parameter becomes its attribute in two steps: its KServe form (names, lists and
activations travel as strings: "exp", "1,2,3", "relu(0.1)") is read as the Python API's
value, which wire.attribute_value then checks and canonicalizes as the client's encoder
does. The inputs become arrays, and the attributes a request leaves out their defaults, by
the function that serves tensorops.v1 (optable.native_arguments): both endpoints make the
same native call from the same arguments, converted once per call.
"""

from __future__ import annotations

import functools
import io
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from tensorops.kserve import BYTE_SIZE as _BYTE_SIZE
from tensorops.kserve import OFFSET as _OFFSET
from tensorops.kserve import REGION as _REGION
from tensorops.kserve.v2 import inference_pb2 as pb
from tensorops.protocol import codec, dtypes, table, wire
from tensorops.protocol.codec import WireError
from tensorops.protocol.table import Kind

from .. import errors, optable
from ..execution import CallState
from .models import FORMAT_PARAMETER, Model

# Request parameters Triton's clients set on their own (sequences, priority, queue
# timeout, HTTP options): accepted and ignored, as a server without those features does.
IGNORED_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output"}
)

# Typed contents: the field of InferTensorContents each datatype reads (16-bit floats: raw only).
_CONTENTS = {
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "INT8": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
}

_RAW_OUTPUTS = pb.ModelInferResponse.DESCRIPTOR.fields_by_name["raw_output_contents"].number
_REGION_PARAMETERS = frozenset((_REGION, _BYTE_SIZE, _OFFSET))


def parameter_value(name: str, p) -> Any:
    choice = p.WhichOneof("parameter_choice")
    if choice is None:
        raise errors.invalid(name, f"parameter `{name}` has no value")
    return getattr(p, choice)


def choice_name(value) -> str:
    return {
        bool: "bool_param",
        int: "int64_param",
        float: "double_param",
        str: "string_param",
        bytes: "bytes_param",
    }.get(type(value), type(value).__name__)


_ACTIVATION = re.compile(r"^\s*([A-Za-z_]+)\s*(?:\((.*)\))?\s*$")


def _api_value(f: table.Field, value) -> Any:
    """An InferParameter's value (or a JSON value of a load's config) as the Python API's
    value of the attribute, refused in the protocol's terms when its type cannot be it."""
    name = f.name

    def wrong(expected: str):
        return errors.invalid(name, f"expected {expected}, got {choice_name(value)} {value!r}")

    integer = isinstance(value, int) and not isinstance(value, bool)
    if f.kind is Kind.ENUM:
        if not (isinstance(value, str) or integer):
            raise wrong("a string_param (the name)")
        return value
    if f.kind is Kind.MESSAGE:  # normalize's activation: "name" or "name(p1, p2)"
        match = _ACTIVATION.match(value) if isinstance(value, str) else None
        if match is None:
            raise wrong("a string_param: a name, or name(p1, p2, ...)")
        try:
            params = [float(p) for p in match.group(2).split(",") if p.strip()] if match.group(2) else []
        except ValueError:
            raise errors.invalid(name, f"the parameters of {value!r} must be numbers") from None
        return (match.group(1), *params)
    if f.kind is Kind.REPEATED:
        if integer:
            return value  # a bitmask where the operation takes one (its notes say so); else refused
        if not isinstance(value, str):
            raise wrong("a string_param of comma-separated integers")
        try:
            return [int(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise errors.invalid(name, f"expected comma-separated integers, got {value!r}") from None
    d = f.descriptor
    if d.type == d.TYPE_DOUBLE:
        if not (integer or isinstance(value, float)):
            raise wrong("a double_param")
        return float(value)
    if d.type == d.TYPE_INT64:
        if not integer:
            raise wrong("an int64_param")
        return value
    if d.type == d.TYPE_BOOL:
        if not isinstance(value, bool):
            raise wrong("a bool_param")
        return value
    if not isinstance(value, str):
        raise wrong("a string_param")
    return value


def attribute(op: table.Operation, name: str, value) -> Any:
    """The value of attribute `name` as the native function takes it, checked and made
    canonical by wire.attribute_value (the client's encoder's one place for it too)."""
    try:
        return wire.attribute_value(op, name, _api_value(op.field(name), value))
    except WireError as exc:
        raise errors.from_wire(exc) from None


def unknown_parameter(model_name: str, name: str, known) -> errors.Failure:
    errors.check_length("parameters.name", name)
    return errors.invalid(
        name, f"model {model_name} has no parameter `{name}` (its parameters: {', '.join(known) or 'none'})"
    )


def converted_attributes(model_name: str, op: table.Operation, values: dict[str, Any]) -> dict[str, Any]:
    """Attributes in their KServe forms (a session's `config`) as the native function takes
    them, each checked and made canonical as the client's encoder does it
    (wire.attribute_value)."""
    converted = {}
    for name, value in values.items():
        f = op.fields_by_name.get(name)
        if f is None or f.is_tensor:
            raise unknown_parameter(model_name, name, [a.name for a in op.attributes])
        converted[name] = attribute(op, name, value)
    return converted


def _typed_contents(name: str, datatype: str, contents, count: int) -> bytes:
    field_name = _CONTENTS.get(datatype)
    if field_name is None:
        raise errors.invalid(f"{name}.contents", f"{datatype} travels only as raw contents (raw_input_contents)")
    values = getattr(contents, field_name)
    if len(values) != count:
        raise errors.invalid(f"{name}.contents", f"expected {count} elements in {field_name}, got {len(values)}")
    dtype = dtypes.BY_KSERVE[datatype].numpy
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
        raise errors.invalid(f"{where}.{_REGION}", f"expected a string_param, got {choice_name(region)}")
    errors.check_length(f"{where}.{_REGION}", region)
    for key, value in ((_BYTE_SIZE, size), (_OFFSET, offset)):
        if type(value) is not int or value < 0:
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
        raise errors.invalid(
            "raw_input_contents", f"expected one buffer per input not in shared memory ({in_messages}), got {len(raws)}"
        )
    j = 0  # the next raw buffer
    layout = model.op.layout
    stacked = model.stacked_names
    tensors: dict[str, Any] = {name: [] for name in stacked}  # as the tensorops.v1 codec leaves them
    for tensor, where in zip(inputs, placed, strict=True):
        name = tensor.name
        datatype = tensor.datatype
        found = dtypes.BY_KSERVE.get(datatype)
        if found is None:
            errors.check_length(f"{name}.datatype", datatype)
            raise errors.invalid(f"{name}.datatype", f"expected one of {', '.join(dtypes.BY_KSERVE)}, got {datatype!r}")
        code, dtype = found.wire, found.numpy
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
        if name in stacked:  # the operands stacked along the first dimension
            if not shape or count < 0:
                raise errors.invalid(
                    f"{name}.shape", f"expected the operands stacked along a first dimension, got shape {shape}"
                )
            if shape[0] > codec.MAX_OPERANDS:  # each costs objects of its own, even when empty
                raise errors.invalid(
                    f"{name}.shape",
                    f"at most {codec.MAX_OPERANDS} operands (the first dimension, the limit), got {shape[0]}",
                )
            size = len(data) // shape[0] if shape[0] else 0
            view = memoryview(data)
            tensors[name] = [
                codec.WireTensor(shape[1:], code, image, view[k * size : (k + 1) * size]) for k in range(shape[0])
            ]
        else:
            tensors[name] = codec.WireTensor(shape, code, image, data)
    return tensors


def request_attributes(model: Model, parameters) -> tuple[dict[str, Any], int]:
    """A request's parameters as the attributes the native function takes, and the format of
    its image tensors (wire enum). Every name and value length is checked before any value
    is converted. An empty list is not given, as an empty repeated field of tensorops.v1."""
    received = []
    for name, p in parameters.items():
        ignored = name in IGNORED_PARAMETERS
        if not ignored and name not in model.parameters:
            raise unknown_parameter(model.name, name, model.parameters)
        value = parameter_value(name, p)
        if isinstance(value, (str, bytes)):
            errors.check_length(name, value)
        if not ignored:
            received.append((name, value))
    op = model.op
    attributes = {}
    fmt = 0
    for name, value in received:
        if name == FORMAT_PARAMETER and op.layout:
            try:
                fmt = wire.encode_format(value)
            except WireError as exc:
                raise errors.from_wire(exc) from None
            continue
        value = attribute(op, name, value)
        if not (isinstance(value, list) and not value):
            attributes[name] = value
    return attributes, fmt


def shaped_arguments(op: table.Operation, request: codec.Decoded) -> dict[str, Any]:
    """The native keyword arguments of a converted request with each input as an array
    of its shape and dtype that holds no memory (zero strides): what the table's
    result_shapes reads, before the inputs are converted. None for an input the operation
    will refuse."""
    kwargs: dict[str, Any] = {
        name: [_shaped(o) for o in t] if isinstance(t, list) else _shaped(t) for name, t in request.tensors.items()
    }
    kwargs.update(request.attributes)
    fmt = optable.request_format(op, request)
    if fmt:
        kwargs["format"] = dtypes.FORMAT_NAMES[fmt]
    return kwargs


@functools.cache
def empty_message(request_class):
    """A request with no field set, one per class: only read."""
    return request_class()


def _shaped(tensor: codec.WireTensor) -> np.ndarray | None:
    found = dtypes.BY_WIRE.get(tensor.dtype)
    if found is None or len(tensor.shape) > codec.MAX_NDIM or min(tensor.shape, default=0) < 0:
        return None
    try:
        return np.broadcast_to(np.empty((), found.numpy), tuple(tensor.shape))
    except ValueError:  # more elements than NumPy describes: the codec refuses the tensor
        return None


def infer_request(model: Model, request, raws: list, regions: Regions | None = None) -> codec.Decoded:
    """A ModelInferRequest as a request of the model's operation: its inputs as tensors
    (the image ones in the format the parameters say), its attributes converted, no
    tensorops.v1 field set."""
    attributes, fmt = request_attributes(model, request.parameters)
    tensors = input_tensors(model, request, raws, fmt, regions)
    return codec.Decoded(empty_message(model.op.request_class), tensors, attributes=attributes)


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
            raise errors.invalid(
                f"outputs.{name}", f"model {model.name} has no output `{name}` (its outputs: {', '.join(names)})"
            )
        if name in wanted:
            raise errors.invalid(f"outputs.{name}", f"output `{name}` is listed twice")
        wanted[name] = None
    return tuple((o.name, region_parameters(f"outputs.{o.name}", o.parameters)) for o in request.outputs)


_ID = pb.ModelInferResponse.DESCRIPTOR.fields_by_name["id"].number
_OUTPUTS = pb.ModelInferResponse.DESCRIPTOR.fields_by_name["outputs"].number
_EMPTY_RAW_OUTPUT = b"".join(codec.bytes_field(_RAW_OUTPUTS, memoryview(b"")))


def _message_field(number: int, data: bytes) -> bytes:
    return b"".join(codec.bytes_field(number, memoryview(data)))


def infer_response(
    model: Model,
    request,
    outputs: tuple,
    result,
    limit: int,
    regions: Regions | None = None,
    written: np.ndarray | None = None,
    wrap: int | None = None,
) -> bytes:
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
        arr, code = codec.wire_array(value, name)
        out = pb.ModelInferResponse.InferOutputTensor(name=name, datatype=dtypes.BY_WIRE[code].kserve, shape=arr.shape)
        if placed is not None:
            region, offset, size = placed
            nbytes = arr.nbytes
            if nbytes > size:
                raise errors.invalid(
                    f"outputs.{name}.{_BYTE_SIZE}", f"the result takes {nbytes} bytes, more than the {size} given"
                )
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
        raise errors.exhausted(
            f"the response would take {nbytes} bytes, beyond the limit of {limit} bytes per message", field="outputs"
        )
    return b"".join(parts + payloads)


def npy_tensor(key: str, data: bytes, call: CallState) -> codec.WireTensor:
    """A .npy file's array as a WireTensor over its bytes, without trusting its header
    (the size is checked against the bytes there are, later, by the codec). An array of
    the other byte order is swapped into a copy (charged to the call)."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(stream)
    except Exception:  # ValueError and the like, in NumPy's words
        raise errors.invalid(key, "expected the bytes of a .npy file (numpy.save)") from None
    if fortran_order and len(shape) > 1:
        raise errors.invalid(key, "expected an array in C order (numpy.save of a C-contiguous array)")
    try:
        _, code = codec.wire_array(np.empty(0, dtype), key)
    except WireError as exc:
        raise errors.from_wire(exc) from None
    payload = memoryview(data)[stream.tell() :]
    if not dtype.isnative and len(payload) == math.prod(shape) * dtype.itemsize:  # else the codec names it
        call.reserve(len(payload), key)
        payload = memoryview(np.frombuffer(payload, dtype).astype(dtype.newbyteorder("=")).view(np.uint8))
    return codec.WireTensor(list(shape), code, 0, payload)


def output_in_region(model: Model, request: codec.Decoded, outputs: tuple, regions: Regions) -> np.ndarray | None:
    """The array in its shared-memory region that the kernel writes the result into
    (tensorops_native's `out=`), when the operation takes one, has one result whose shape
    and dtype the table gives from the arguments (result_shapes), and the request places
    that output there; None otherwise (the result is then copied into the region)."""
    entry = model.entry
    if entry is None or "out" not in entry.parameters or len(model.outputs) != 1 or outputs[0][1] is None:
        return None
    shapes = model.op.result_shapes(shaped_arguments(model.op, request))
    if shapes is None:
        return None  # the operation refuses the arguments, naming them
    ((shape, dtype),) = shapes
    nbytes = math.prod(shape) * dtype.itemsize
    region, offset, size = outputs[0][1]
    if nbytes > size:
        return None  # refused after the call, with the result's size
    out = np.frombuffer(regions(region, offset, nbytes, f"outputs.{outputs[0][0]}.{_REGION}"), dtype)
    return out.reshape(shape) if out.flags.aligned else None

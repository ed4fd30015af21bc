"""Python API calls as KServe V2 requests: tensor arguments become inputs, the others
request parameters, as docs/kserve.md describes (written here independently of the
server's conversion, from the tensorops.v1 request fields)."""

from __future__ import annotations

import inspect
import io
import json

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException

import tensorops_native as tn
from tensorops.protocol import wire

BF16 = np.dtype(ml_dtypes.bfloat16)
DATATYPES = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
    np.dtype(np.float16): "FP16",
    BF16: "BF16",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
}


def infer_input(name: str, value) -> tc.InferInput:
    arr = np.asarray(value)
    datatype = DATATYPES[arr.dtype]
    tensor = tc.InferInput(name, list(arr.shape), datatype)
    tensor.set_data_from_numpy(arr)  # BF16: ml_dtypes.bfloat16 arrays, as tensorops_native takes
    return tensor


def refused(call, *args, **kwargs) -> tuple[str, str]:
    """(status, message) of a call tritonclient reports as failed."""
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    return info.value.status(), info.value.message()


def parameter(value):
    if isinstance(value, (tuple, list)):
        return ",".join(str(int(v)) for v in value)
    if isinstance(value, (np.integer,)):
        return int(value)
    return value


def arguments(op: str, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """({input name: array}, {parameter name: value}) of a call of tensorops_native.<op>."""
    bound = inspect.signature(getattr(tn, op)).bind(*args, **kwargs)
    tensor_fields = wire.OPERATIONS[op].request_codec.numbers
    arrays, parameters = {}, {}
    for name, value in bound.arguments.items():
        if value is None:
            continue
        if name == "inputs":
            arrays[name] = np.stack(value)
        elif name in tensor_fields:
            arrays[name] = np.asarray(value)
        else:
            parameters[name] = parameter(value)
    return arrays, parameters


def request(op: str, args: tuple, kwargs: dict) -> tuple[list, dict]:
    """(inputs, parameters) of a call of tensorops_native.<op>, for tritonclient."""
    arrays, parameters = arguments(op, args, kwargs)
    return [infer_input(name, arr) for name, arr in arrays.items()], parameters


def infer_request(op: str, args: tuple, kwargs: dict):
    """The ModelInferRequest of a call, raw contents in the message, and its raw contents."""
    from tensorops.kserve.v2 import inference_pb2

    arrays, parameters = arguments(op, args, kwargs)
    message = inference_pb2.ModelInferRequest(model_name=op)
    for name, arr in arrays.items():
        message.inputs.add(name=name, datatype=DATATYPES[arr.dtype], shape=arr.shape)
        message.raw_input_contents.append(np.ascontiguousarray(arr).tobytes())
    for name, value in parameters.items():
        choice = {bool: "bool_param", int: "int64_param", float: "double_param", str: "string_param"}[type(value)]
        setattr(message.parameters[name], choice, value)
    return message, list(message.raw_input_contents)


# ---- quantized inner-product sessions as models

PARAMS = dict(a_scale=0.05, a_zero=7, c_scale=0.6, c_zero=3)


def npy(arr) -> bytes:
    out = io.BytesIO()
    np.save(out, arr)
    return out.getvalue()


def qip_problem(seed: int, k: int = 24, n: int = 10):
    """(a, b, b_scale, bias) of a session with K = k, N = n, and 5 rows of A."""
    rng = np.random.default_rng(seed)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    b_scale = (rng.random(n) * 0.02 + 0.001).astype(np.float32)
    bias = rng.integers(-2000, 2000, n, dtype=np.int32)
    a = rng.integers(0, 256, (5, k), dtype=np.uint8)
    return a, b, b_scale, bias


def load_session(client, name, b, b_scale, bias=None, headers=None, **params):
    """tritonclient's load_model of a session: the scalars in `config`, the tensors as .npy files."""
    files = {"file:b": npy(b), "file:b_scale": npy(b_scale)}
    if bias is not None:
        files["file:bias"] = npy(bias)
    client.load_model(name, config=json.dumps(params or PARAMS), files=files, headers=headers)


def session_forward(a, b, b_scale, bias=None, **params):
    """The in-process result of the session's forward."""
    with tn.QuantizedInnerProduct(b, b_scale=b_scale, bias=bias, **(params or PARAMS)) as qip:
        return qip.forward(a)

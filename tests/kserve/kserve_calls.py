"""Python API calls as KServe V2 requests: tensor arguments become inputs, the others
request parameters, as docs/kserve.md describes (written here independently of the
server's conversion, from the tensorops.v1 request fields)."""
from __future__ import annotations

import inspect

import ml_dtypes
import numpy as np
import tritonclient.grpc as tc

import tensorops_native as tn
from tensorops import _wire

BF16 = np.dtype(ml_dtypes.bfloat16)
DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64", np.dtype(np.float16): "FP16",
             BF16: "BF16", np.dtype(np.uint8): "UINT8", np.dtype(np.int8): "INT8", np.dtype(np.int32): "INT32",
             np.dtype(np.int64): "INT64"}


def infer_input(name: str, value) -> tc.InferInput:
    arr = np.asarray(value)
    datatype = DATATYPES[arr.dtype]
    tensor = tc.InferInput(name, list(arr.shape), datatype)
    tensor.set_data_from_numpy(arr)  # BF16: ml_dtypes.bfloat16 arrays, as tensorops_native takes
    return tensor


def parameter(value):
    if isinstance(value, (tuple, list)):
        return ",".join(str(int(v)) for v in value)
    if isinstance(value, (np.integer,)):
        return int(value)
    return value


def request(op: str, args: tuple, kwargs: dict) -> tuple[list, dict]:
    """(inputs, parameters) of a call of tensorops_native.<op>."""
    bound = inspect.signature(getattr(tn, op)).bind(*args, **kwargs)
    tensor_fields = _wire.OPERATIONS[op].request_codec.numbers
    inputs, parameters = [], {}
    for name, value in bound.arguments.items():
        if value is None:
            continue
        if name == "inputs":
            inputs.append(infer_input(name, np.stack(value)))
        elif name in tensor_fields:
            inputs.append(infer_input(name, value))
        else:
            parameters[name] = parameter(value)
    return inputs, parameters


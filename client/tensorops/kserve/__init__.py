"""The KServe V2 / Triton inference protocol as tensorops serves it (server:
tensorops_server.kserve; messages: tensorops.kserve.v2, from proto/tensorops/kserve/v2).
What both ends share: the service name clients call, the datatypes and the names of the
shared-memory parameters."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..v1 import tensor_pb2

# The name Triton's clients call (not the .proto's package: see inference.proto).
SERVICE_NAME = "inference.GRPCInferenceService"

# KServe datatype -> (tensorops.v1 DataType, NumPy dtype), for the datatypes served.
DATATYPES = {
    "FP32": (tensor_pb2.DATA_TYPE_FP32, np.dtype(np.float32)),
    "FP16": (tensor_pb2.DATA_TYPE_FP16, np.dtype(np.float16)),
    "BF16": (tensor_pb2.DATA_TYPE_BF16, np.dtype(ml_dtypes.bfloat16)),
    "UINT8": (tensor_pb2.DATA_TYPE_UINT8, np.dtype(np.uint8)),
    "INT8": (tensor_pb2.DATA_TYPE_INT8, np.dtype(np.int8)),
    "INT32": (tensor_pb2.DATA_TYPE_INT32, np.dtype(np.int32)),
    "INT64": (tensor_pb2.DATA_TYPE_INT64, np.dtype(np.int64)),
    "FP64": (tensor_pb2.DATA_TYPE_FP64, np.dtype(np.float64)),
}

# Parameters of an input or requested output placed in a system shared-memory region.
REGION, BYTE_SIZE, OFFSET = "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"


def method_path(rpc: str) -> str:
    return f"/{SERVICE_NAME}/{rpc}"

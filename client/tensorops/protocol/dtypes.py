"""The one table of the datatypes tensors travel in, and of the image layouts.

Each row ties a tensorops.v1 DataType to its KServe V2 name and its NumPy dtype; every other
view (wire code -> dtype, KServe name -> wire code, element sizes) is derived from it here.
A uint16 array is sent as BF16: it holds BF16 bits (see docs/protocol.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..v1 import tensor_pb2


@dataclass(frozen=True)
class DType:
    wire: int  # tensorops.v1 DataType
    kserve: str  # the KServe V2 / Triton datatype name
    numpy: np.dtype

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @property
    def name(self) -> str:
        """The lowercase name callers read in messages ("fp32")."""
        return self.kserve.lower()


DTYPES: tuple[DType, ...] = (
    DType(tensor_pb2.DATA_TYPE_FP32, "FP32", np.dtype(np.float32)),
    DType(tensor_pb2.DATA_TYPE_FP16, "FP16", np.dtype(np.float16)),
    DType(tensor_pb2.DATA_TYPE_BF16, "BF16", np.dtype(ml_dtypes.bfloat16)),
    DType(tensor_pb2.DATA_TYPE_UINT8, "UINT8", np.dtype(np.uint8)),
    DType(tensor_pb2.DATA_TYPE_INT8, "INT8", np.dtype(np.int8)),
    DType(tensor_pb2.DATA_TYPE_INT32, "INT32", np.dtype(np.int32)),
    DType(tensor_pb2.DATA_TYPE_INT64, "INT64", np.dtype(np.int64)),
    DType(tensor_pb2.DATA_TYPE_FP64, "FP64", np.dtype(np.float64)),
)

BY_WIRE: dict[int, DType] = {d.wire: d for d in DTYPES}
BY_KSERVE: dict[str, DType] = {d.kserve: d for d in DTYPES}
# What an array of each NumPy dtype is sent as: its own row, and uint16 as BF16 bits.
BY_NUMPY: dict[np.dtype, DType] = {d.numpy: d for d in DTYPES}
WIRE_OF_NUMPY: dict[np.dtype, int] = {
    **{d.numpy: d.wire for d in DTYPES},
    np.dtype(np.uint16): tensor_pb2.DATA_TYPE_BF16,
}

# Image layouts: the tensorops.v1 Format of each `format` argument of the Python API.
FORMATS: dict[str, int] = {"nchw": tensor_pb2.FORMAT_NCHW, "nhwc": tensor_pb2.FORMAT_NHWC}
FORMAT_NAMES: dict[int, str] = {code: name for name, code in FORMATS.items()}

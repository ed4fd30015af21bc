from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DATA_TYPE_UNSPECIFIED: _ClassVar[DataType]
    DATA_TYPE_FP32: _ClassVar[DataType]
    DATA_TYPE_BF16: _ClassVar[DataType]
    DATA_TYPE_FP16: _ClassVar[DataType]
    DATA_TYPE_UINT8: _ClassVar[DataType]
    DATA_TYPE_INT8: _ClassVar[DataType]
    DATA_TYPE_INT32: _ClassVar[DataType]
    DATA_TYPE_FP64: _ClassVar[DataType]
    DATA_TYPE_INT64: _ClassVar[DataType]

class Format(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FORMAT_UNSPECIFIED: _ClassVar[Format]
    FORMAT_NCHW: _ClassVar[Format]
    FORMAT_NHWC: _ClassVar[Format]
DATA_TYPE_UNSPECIFIED: DataType
DATA_TYPE_FP32: DataType
DATA_TYPE_BF16: DataType
DATA_TYPE_FP16: DataType
DATA_TYPE_UINT8: DataType
DATA_TYPE_INT8: DataType
DATA_TYPE_INT32: DataType
DATA_TYPE_FP64: DataType
DATA_TYPE_INT64: DataType
FORMAT_UNSPECIFIED: Format
FORMAT_NCHW: Format
FORMAT_NHWC: Format

class Tensor(_message.Message):
    __slots__ = ("shape", "dtype", "format", "data")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: DataType
    format: Format
    data: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DataType, str]] = ..., format: _Optional[_Union[Format, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

from tensorops.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EltwiseOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ELTWISE_OP_UNSPECIFIED: _ClassVar[EltwiseOp]
    ELTWISE_OP_PRODUCT: _ClassVar[EltwiseOp]
    ELTWISE_OP_SUM: _ClassVar[EltwiseOp]
    ELTWISE_OP_MAX: _ClassVar[EltwiseOp]
    ELTWISE_OP_MIN: _ClassVar[EltwiseOp]

class ShuffleType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHUFFLE_TYPE_UNSPECIFIED: _ClassVar[ShuffleType]
    SHUFFLE_TYPE_SPLIT: _ClassVar[ShuffleType]
    SHUFFLE_TYPE_INTERLEAVE: _ClassVar[ShuffleType]

class UnaryOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNARY_OP_UNSPECIFIED: _ClassVar[UnaryOp]
    UNARY_OP_ABS: _ClassVar[UnaryOp]
    UNARY_OP_CEIL: _ClassVar[UnaryOp]
    UNARY_OP_COS: _ClassVar[UnaryOp]
    UNARY_OP_ERF: _ClassVar[UnaryOp]
    UNARY_OP_EXP: _ClassVar[UnaryOp]
    UNARY_OP_FLOOR: _ClassVar[UnaryOp]
    UNARY_OP_LOG: _ClassVar[UnaryOp]
    UNARY_OP_NEG: _ClassVar[UnaryOp]
    UNARY_OP_NOT: _ClassVar[UnaryOp]
    UNARY_OP_RCP: _ClassVar[UnaryOp]
    UNARY_OP_ROUND: _ClassVar[UnaryOp]
    UNARY_OP_RSQRT: _ClassVar[UnaryOp]
    UNARY_OP_SIGN: _ClassVar[UnaryOp]
    UNARY_OP_SIN: _ClassVar[UnaryOp]
    UNARY_OP_SQRT: _ClassVar[UnaryOp]
    UNARY_OP_TANH: _ClassVar[UnaryOp]
    UNARY_OP_ZERO: _ClassVar[UnaryOp]

class Activation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTIVATION_UNSPECIFIED: _ClassVar[Activation]
    ACTIVATION_IDENTITY: _ClassVar[Activation]
    ACTIVATION_LINEAR: _ClassVar[Activation]
    ACTIVATION_RELU: _ClassVar[Activation]
    ACTIVATION_LEAKY_RELU: _ClassVar[Activation]
    ACTIVATION_PARAMETRIC_SOFTPLUS: _ClassVar[Activation]
    ACTIVATION_ELU: _ClassVar[Activation]
    ACTIVATION_CELU: _ClassVar[Activation]
    ACTIVATION_SCALED_ELU: _ClassVar[Activation]
    ACTIVATION_SIGMOID: _ClassVar[Activation]
    ACTIVATION_HARD_SIGMOID: _ClassVar[Activation]
    ACTIVATION_TANH: _ClassVar[Activation]
    ACTIVATION_SCALED_TANH: _ClassVar[Activation]
    ACTIVATION_SOFTPLUS: _ClassVar[Activation]
    ACTIVATION_SOFTSIGN: _ClassVar[Activation]
    ACTIVATION_THRESHOLDED_RELU: _ClassVar[Activation]
    ACTIVATION_SHRINK: _ClassVar[Activation]
    ACTIVATION_GELU: _ClassVar[Activation]
ELTWISE_OP_UNSPECIFIED: EltwiseOp
ELTWISE_OP_PRODUCT: EltwiseOp
ELTWISE_OP_SUM: EltwiseOp
ELTWISE_OP_MAX: EltwiseOp
ELTWISE_OP_MIN: EltwiseOp
SHUFFLE_TYPE_UNSPECIFIED: ShuffleType
SHUFFLE_TYPE_SPLIT: ShuffleType
SHUFFLE_TYPE_INTERLEAVE: ShuffleType
UNARY_OP_UNSPECIFIED: UnaryOp
UNARY_OP_ABS: UnaryOp
UNARY_OP_CEIL: UnaryOp
UNARY_OP_COS: UnaryOp
UNARY_OP_ERF: UnaryOp
UNARY_OP_EXP: UnaryOp
UNARY_OP_FLOOR: UnaryOp
UNARY_OP_LOG: UnaryOp
UNARY_OP_NEG: UnaryOp
UNARY_OP_NOT: UnaryOp
UNARY_OP_RCP: UnaryOp
UNARY_OP_ROUND: UnaryOp
UNARY_OP_RSQRT: UnaryOp
UNARY_OP_SIGN: UnaryOp
UNARY_OP_SIN: UnaryOp
UNARY_OP_SQRT: UnaryOp
UNARY_OP_TANH: UnaryOp
UNARY_OP_ZERO: UnaryOp
ACTIVATION_UNSPECIFIED: Activation
ACTIVATION_IDENTITY: Activation
ACTIVATION_LINEAR: Activation
ACTIVATION_RELU: Activation
ACTIVATION_LEAKY_RELU: Activation
ACTIVATION_PARAMETRIC_SOFTPLUS: Activation
ACTIVATION_ELU: Activation
ACTIVATION_CELU: Activation
ACTIVATION_SCALED_ELU: Activation
ACTIVATION_SIGMOID: Activation
ACTIVATION_HARD_SIGMOID: Activation
ACTIVATION_TANH: Activation
ACTIVATION_SCALED_TANH: Activation
ACTIVATION_SOFTPLUS: Activation
ACTIVATION_SOFTSIGN: Activation
ACTIVATION_THRESHOLDED_RELU: Activation
ACTIVATION_SHRINK: Activation
ACTIVATION_GELU: Activation

class TensorResponse(_message.Message):
    __slots__ = ("y",)
    Y_FIELD_NUMBER: _ClassVar[int]
    y: _tensor_pb2.Tensor
    def __init__(self, y: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class NormalizeL2Request(_message.Message):
    __slots__ = ("x", "scale", "eps", "across_spatial")
    X_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    ACROSS_SPATIAL_FIELD_NUMBER: _ClassVar[int]
    x: _tensor_pb2.Tensor
    scale: _tensor_pb2.Tensor
    eps: float
    across_spatial: bool
    def __init__(self, x: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., scale: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., eps: _Optional[float] = ..., across_spatial: _Optional[bool] = ...) -> None: ...

class LayerNormChannelsRequest(_message.Message):
    __slots__ = ("x", "scale", "shift", "eps")
    X_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    SHIFT_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    x: _tensor_pb2.Tensor
    scale: _tensor_pb2.Tensor
    shift: _tensor_pb2.Tensor
    eps: float
    def __init__(self, x: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., scale: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., shift: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., eps: _Optional[float] = ...) -> None: ...

class LayerNormSpatialRequest(_message.Message):
    __slots__ = ("x", "scale", "shift", "eps")
    X_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    SHIFT_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    x: _tensor_pb2.Tensor
    scale: _tensor_pb2.Tensor
    shift: _tensor_pb2.Tensor
    eps: float
    def __init__(self, x: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., scale: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., shift: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., eps: _Optional[float] = ...) -> None: ...

class ChannelNormRequest(_message.Message):
    __slots__ = ("x", "scale", "shift", "eps")
    X_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    SHIFT_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    x: _tensor_pb2.Tensor
    scale: _tensor_pb2.Tensor
    shift: _tensor_pb2.Tensor
    eps: float
    def __init__(self, x: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., scale: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., shift: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., eps: _Optional[float] = ...) -> None: ...

class ChannelSumRequest(_message.Message):
    __slots__ = ("x",)
    X_FIELD_NUMBER: _ClassVar[int]
    x: _tensor_pb2.Tensor
    def __init__(self, x: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class EltwiseRequest(_message.Message):
    __slots__ = ("inputs", "op", "weights")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    op: EltwiseOp
    weights: _tensor_pb2.Tensor
    def __init__(self, inputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., op: _Optional[_Union[EltwiseOp, str]] = ..., weights: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class LrnCrossChannelsRequest(_message.Message):
    __slots__ = ("x", "half", "k")
    X_FIELD_NUMBER: _ClassVar[int]
    HALF_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    x: _tensor_pb2.Tensor
    half: int
    k: _tensor_pb2.Tensor
    def __init__(self, x: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., half: _Optional[int] = ..., k: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class ShuffleRequest(_message.Message):
    __slots__ = ("x0", "x1", "type", "channels")
    X0_FIELD_NUMBER: _ClassVar[int]
    X1_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    x0: _tensor_pb2.Tensor
    x1: _tensor_pb2.Tensor
    type: ShuffleType
    channels: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, x0: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., x1: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., type: _Optional[_Union[ShuffleType, str]] = ..., channels: _Optional[_Iterable[int]] = ...) -> None: ...

class ShuffleResponse(_message.Message):
    __slots__ = ("y0", "y1")
    Y0_FIELD_NUMBER: _ClassVar[int]
    Y1_FIELD_NUMBER: _ClassVar[int]
    y0: _tensor_pb2.Tensor
    y1: _tensor_pb2.Tensor
    def __init__(self, y0: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., y1: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class SoftmaxRequest(_message.Message):
    __slots__ = ("x", "axis")
    X_FIELD_NUMBER: _ClassVar[int]
    AXIS_FIELD_NUMBER: _ClassVar[int]
    x: _tensor_pb2.Tensor
    axis: int
    def __init__(self, x: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., axis: _Optional[int] = ...) -> None: ...

class TiledScale2DRequest(_message.Message):
    __slots__ = ("x", "ver", "hor")
    X_FIELD_NUMBER: _ClassVar[int]
    VER_FIELD_NUMBER: _ClassVar[int]
    HOR_FIELD_NUMBER: _ClassVar[int]
    x: _tensor_pb2.Tensor
    ver: _tensor_pb2.Tensor
    hor: _tensor_pb2.Tensor
    def __init__(self, x: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., ver: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., hor: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class UnaryRequest(_message.Message):
    __slots__ = ("x", "op")
    X_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    x: _tensor_pb2.Tensor
    op: UnaryOp
    def __init__(self, x: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., op: _Optional[_Union[UnaryOp, str]] = ...) -> None: ...

class FusedActivation(_message.Message):
    __slots__ = ("type", "params")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    type: Activation
    params: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, type: _Optional[_Union[Activation, str]] = ..., params: _Optional[_Iterable[float]] = ...) -> None: ...

class NormalizeRequest(_message.Message):
    __slots__ = ("x", "scale", "bias", "axes", "num_groups", "eps", "normalize_variance", "activation", "compute_dtype")
    X_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    AXES_FIELD_NUMBER: _ClassVar[int]
    NUM_GROUPS_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_VARIANCE_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    x: _tensor_pb2.Tensor
    scale: _tensor_pb2.Tensor
    bias: _tensor_pb2.Tensor
    axes: _containers.RepeatedScalarFieldContainer[int]
    num_groups: int
    eps: float
    normalize_variance: bool
    activation: FusedActivation
    compute_dtype: str
    def __init__(self, x: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., scale: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., bias: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., axes: _Optional[_Iterable[int]] = ..., num_groups: _Optional[int] = ..., eps: _Optional[float] = ..., normalize_variance: _Optional[bool] = ..., activation: _Optional[_Union[FusedActivation, _Mapping]] = ..., compute_dtype: _Optional[str] = ...) -> None: ...

class QuantizedInnerProductRequest(_message.Message):
    __slots__ = ("a", "b", "b_scale", "a_scale", "a_zero", "c_scale", "c_zero", "bias", "trans_b", "algorithm")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    B_SCALE_FIELD_NUMBER: _ClassVar[int]
    A_SCALE_FIELD_NUMBER: _ClassVar[int]
    A_ZERO_FIELD_NUMBER: _ClassVar[int]
    C_SCALE_FIELD_NUMBER: _ClassVar[int]
    C_ZERO_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    TRANS_B_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    a: _tensor_pb2.Tensor
    b: _tensor_pb2.Tensor
    b_scale: _tensor_pb2.Tensor
    a_scale: float
    a_zero: int
    c_scale: float
    c_zero: int
    bias: _tensor_pb2.Tensor
    trans_b: bool
    algorithm: str
    def __init__(self, a: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., b: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., b_scale: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., a_scale: _Optional[float] = ..., a_zero: _Optional[int] = ..., c_scale: _Optional[float] = ..., c_zero: _Optional[int] = ..., bias: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., trans_b: _Optional[bool] = ..., algorithm: _Optional[str] = ...) -> None: ...

class QuantizedInnerProductResponse(_message.Message):
    __slots__ = ("c",)
    C_FIELD_NUMBER: _ClassVar[int]
    c: _tensor_pb2.Tensor
    def __init__(self, c: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class CreateQuantizedInnerProductRequest(_message.Message):
    __slots__ = ("b", "b_scale", "a_scale", "a_zero", "c_scale", "c_zero", "bias", "trans_b", "max_m", "algorithm")
    B_FIELD_NUMBER: _ClassVar[int]
    B_SCALE_FIELD_NUMBER: _ClassVar[int]
    A_SCALE_FIELD_NUMBER: _ClassVar[int]
    A_ZERO_FIELD_NUMBER: _ClassVar[int]
    C_SCALE_FIELD_NUMBER: _ClassVar[int]
    C_ZERO_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    TRANS_B_FIELD_NUMBER: _ClassVar[int]
    MAX_M_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    b: _tensor_pb2.Tensor
    b_scale: _tensor_pb2.Tensor
    a_scale: float
    a_zero: int
    c_scale: float
    c_zero: int
    bias: _tensor_pb2.Tensor
    trans_b: bool
    max_m: int
    algorithm: str
    def __init__(self, b: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., b_scale: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., a_scale: _Optional[float] = ..., a_zero: _Optional[int] = ..., c_scale: _Optional[float] = ..., c_zero: _Optional[int] = ..., bias: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., trans_b: _Optional[bool] = ..., max_m: _Optional[int] = ..., algorithm: _Optional[str] = ...) -> None: ...

class QuantizedInnerProductForwardRequest(_message.Message):
    __slots__ = ("session_id", "a")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    A_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    a: _tensor_pb2.Tensor
    def __init__(self, session_id: _Optional[str] = ..., a: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "info", "internal_buffer_size", "external_buffer_size", "m", "n", "k", "bytes", "idle_seconds", "forward_count", "max_m")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_BUFFER_SIZE_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_BUFFER_SIZE_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_M_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    info: str
    internal_buffer_size: int
    external_buffer_size: int
    m: int
    n: int
    k: int
    bytes: int
    idle_seconds: float
    forward_count: int
    max_m: int
    def __init__(self, session_id: _Optional[str] = ..., info: _Optional[str] = ..., internal_buffer_size: _Optional[int] = ..., external_buffer_size: _Optional[int] = ..., m: _Optional[int] = ..., n: _Optional[int] = ..., k: _Optional[int] = ..., bytes: _Optional[int] = ..., idle_seconds: _Optional[float] = ..., forward_count: _Optional[int] = ..., max_m: _Optional[int] = ...) -> None: ...

class DescribeSessionRequest(_message.Message):
    __slots__ = ("session_id", "m")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    m: int
    def __init__(self, session_id: _Optional[str] = ..., m: _Optional[int] = ...) -> None: ...

class ReleaseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ReleaseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerLimits(_message.Message):
    __slots__ = ("max_message_bytes", "max_tensor_bytes", "max_ndim", "max_sessions", "max_session_bytes", "session_ttl_seconds")
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TENSOR_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_NDIM_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSION_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSION_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    max_message_bytes: int
    max_tensor_bytes: int
    max_ndim: int
    max_sessions: int
    max_session_bytes: int
    session_ttl_seconds: float
    def __init__(self, max_message_bytes: _Optional[int] = ..., max_tensor_bytes: _Optional[int] = ..., max_ndim: _Optional[int] = ..., max_sessions: _Optional[int] = ..., max_session_bytes: _Optional[int] = ..., session_ttl_seconds: _Optional[float] = ...) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("version", "isa", "cpu_features", "kernels", "limits", "operations", "workers", "instance", "worker", "threads")
    class KernelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ISA_FIELD_NUMBER: _ClassVar[int]
    CPU_FEATURES_FIELD_NUMBER: _ClassVar[int]
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    version: str
    isa: str
    cpu_features: _containers.RepeatedScalarFieldContainer[str]
    kernels: _containers.ScalarMap[str, str]
    limits: ServerLimits
    operations: _containers.RepeatedScalarFieldContainer[str]
    workers: int
    instance: str
    worker: int
    threads: int
    def __init__(self, version: _Optional[str] = ..., isa: _Optional[str] = ..., cpu_features: _Optional[_Iterable[str]] = ..., kernels: _Optional[_Mapping[str, str]] = ..., limits: _Optional[_Union[ServerLimits, _Mapping]] = ..., operations: _Optional[_Iterable[str]] = ..., workers: _Optional[int] = ..., instance: _Optional[str] = ..., worker: _Optional[int] = ..., threads: _Optional[int] = ...) -> None: ...

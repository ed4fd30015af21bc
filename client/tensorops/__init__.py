"""tensorops: the NumPy client of the tensorops gRPC service.

    from tensorops import Client
    with Client("localhost:50051") as c:
        y = c.layer_norm_channels(x, scale, shift, eps=1e-5, format="nhwc")

`tensorops.aio.Client` is the asyncio twin and `LocalClient` runs the same methods
in-process through tensorops_native. Failures raise TensorOpsError subclasses, one per
gRPC status code (InvalidArgumentError names the offending field). A call on a closed
client raises ClientClosedError (a ValueError).
"""

from ._client import SESSION_KEY_HEADER, Client, QuantizedInnerProductSession, SessionClosedError
from ._errors import (
    CancelledError,
    ClientClosedError,
    DeadlineExceededError,
    FieldViolation,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    TensorOpsError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)
from ._local import LocalClient
from ._memory import retain_freed_buffers

__all__ = [
    "CancelledError",
    "Client",
    "ClientClosedError",
    "DeadlineExceededError",
    "FieldViolation",
    "InternalError",
    "InvalidArgumentError",
    "LocalClient",
    "NotFoundError",
    "PermissionDeniedError",
    "QuantizedInnerProductSession",
    "ResourceExhaustedError",
    "SESSION_KEY_HEADER",
    "SessionClosedError",
    "TensorOpsError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "retain_freed_buffers",
]

"""One exception hierarchy for every failure of a tensorops call, remote or local.

Each gRPC status code maps to one class; all derive from TensorOpsError, and the common
ones also from the matching built-in exception (InvalidArgumentError is a ValueError,
DeadlineExceededError a TimeoutError, ...), so code written against the in-process
library keeps working. INVALID_ARGUMENT errors carry the google.rpc.BadRequest field
violations the server sent: `err.field` names the offending argument (e.g. "x",
"inputs[1].data") and `err.field_violations` lists them all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import grpc

# The trailing metadata of a failed call as gRPC gives it (a tuple of (key, value) pairs,
# grpc.aio's Metadata): values are bytes under keys ending in "-bin", str otherwise.
TrailingMetadata = Iterable[tuple[str, str | bytes]]

_DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


class TensorOpsError(Exception):
    """A failed call. `code` is the grpc.StatusCode, `details` the server's message."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        details: str,
        *,
        code: grpc.StatusCode | None = None,
        field_violations: Iterable[FieldViolation] = (),
        trailing_metadata: TrailingMetadata | None = None,
    ):
        super().__init__(details)
        if code is not None:
            self.code = code
        self.details = details
        self.field_violations = tuple(field_violations)
        self.trailing_metadata = trailing_metadata

    @property
    def field(self) -> str | None:
        """The first offending field, if the server named one."""
        return self.field_violations[0].field if self.field_violations else None

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"


class InvalidArgumentError(TensorOpsError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(TensorOpsError, LookupError):
    code = grpc.StatusCode.NOT_FOUND


class ResourceExhaustedError(TensorOpsError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceededError(TensorOpsError, TimeoutError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class CancelledError(TensorOpsError):
    code = grpc.StatusCode.CANCELLED


class UnavailableError(TensorOpsError, ConnectionError):
    code = grpc.StatusCode.UNAVAILABLE


class UnauthenticatedError(TensorOpsError, PermissionError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(TensorOpsError, PermissionError):
    code = grpc.StatusCode.PERMISSION_DENIED


class UnimplementedError(TensorOpsError, NotImplementedError):
    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(TensorOpsError):
    code = grpc.StatusCode.INTERNAL


_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        ResourceExhaustedError,
        DeadlineExceededError,
        CancelledError,
        UnavailableError,
        UnauthenticatedError,
        PermissionDeniedError,
        UnimplementedError,
        InternalError,
    )
}


def error_for(
    code: grpc.StatusCode,
    details: str,
    field_violations: Iterable[FieldViolation] = (),
    trailing_metadata: TrailingMetadata | None = None,
) -> TensorOpsError:
    cls = _BY_CODE.get(code, TensorOpsError)
    return cls(details, code=code, field_violations=field_violations, trailing_metadata=trailing_metadata)


def _field_violations(trailing_metadata: TrailingMetadata | None) -> tuple[FieldViolation, ...]:
    for key, value in trailing_metadata or ():
        if key != _DETAILS_KEY:
            continue
        from google.rpc import error_details_pb2, status_pb2

        status = status_pb2.Status.FromString(cast(bytes, value))  # a "-bin" key's value
        violations: list[FieldViolation] = []
        for detail in status.details:
            bad = error_details_pb2.BadRequest()
            if detail.Unpack(bad):  # False for details of other types
                violations.extend(FieldViolation(v.field, v.description) for v in bad.field_violations)
        return tuple(violations)
    return ()


def from_rpc_error(exc: grpc.RpcError) -> TensorOpsError:
    """The TensorOpsError for a failed call (grpc.RpcError or grpc.aio.AioRpcError)."""
    code, details = exc.code(), exc.details() or ""
    # The stubs declare namedtuple-like items without their tuple nature: they are pairs.
    metadata = cast(TrailingMetadata, exc.trailing_metadata())
    return error_for(code, details, _field_violations(metadata), metadata)


class ClientClosedError(ValueError):
    """A call on a client after its close() (or the end of its `with` block), or on a
    session or shared array helper whose client is closed."""

    def __init__(self, message: str = "the client is closed"):
        super().__init__(message)


# How gRPC's details begin when the channel never reached a server (pick_first, round_robin).
_CONNECTION_LEVEL = ("failed to connect to all addresses", "connections to all backends failing")
# Connection-level failures whose gRPC wording hides a likely configuration mistake, by
# whether the channel is TLS: (what the details contain, what is probably wrong).
_CONNECTION_HINTS = {
    False: (
        (
            "Socket closed",
            "the server closed the connection before answering: it probably requires TLS, "
            "which this plaintext client does not speak (pass root_certificates= or "
            "credentials=)",
        ),
    ),
    True: (
        (
            "WRONG_VERSION_NUMBER",
            "the server did not answer the TLS handshake in TLS: it probably is a "
            "plaintext server (no --tls-cert); connect without root_certificates= "
            "and credentials=, or give the server a certificate",
        ),
        (
            "CERTIFICATE_VERIFY_FAILED",
            "the server's certificate does not chain to the trusted CAs "
            "(root_certificates=, or the system's when none was given)",
        ),
        (
            "Hostname Verification",
            "the server's certificate does not name the host of the target (server_name_override= checks another name)",
        ),
        (
            "Socket closed",
            "the server closed the connection during the TLS handshake: it probably "
            "requires a client certificate (certificate_chain= and private_key=) that it "
            "trusts, and this client gave none or another",
        ),
    ),
}


def explain_connection_failure(error: TensorOpsError, secure: bool) -> TensorOpsError:
    """`error`, or when it is a connection failure with a likely cause (a plaintext client
    and a TLS server, or the reverse, or a certificate the client does not trust), the same
    error with that cause first and gRPC's own details after it."""
    if error.code != grpc.StatusCode.UNAVAILABLE or not error.details.startswith(_CONNECTION_LEVEL):
        return error
    for marker, cause in _CONNECTION_HINTS[secure]:
        if marker in error.details:
            return error_for(
                error.code, f"{cause} [gRPC: {error.details}]", error.field_violations, error.trailing_metadata
            )
    return error


def invalid_argument(field: str, description: str) -> InvalidArgumentError:
    """The error a call raises before sending anything, for an argument it cannot encode
    (the server would have named the same field)."""
    return InvalidArgumentError(f"{field}: {description}", field_violations=(FieldViolation(field, description),))

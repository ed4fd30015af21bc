"""Failures of a call and their gRPC status: one exception type, turned into the status (with
google.rpc.BadRequest field violations for INVALID_ARGUMENT) by the wrapper every handler
runs in."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

import tensorops_native
from tensorops.protocol.codec import WireError
from tensorops.protocol.wire import MAX_NAME_CHARS

# Longest status message sent back ("<field>: <description>"): messages may echo values the
# caller sent, and status details travel in HTTP/2 trailers, which clients cap at a few KB.
MAX_MESSAGE_CHARS = 1000
# Longest field name in it: a field may hold a name the caller chose (an input, a parameter),
# which the description often repeats.
MAX_FIELD_CHARS = 200


def _bounded(text: str, limit: int) -> str:
    """`text`, cut to at most `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    keep = limit
    while True:  # the note takes room too: what it counts includes that room
        note = f"... ({len(text) - keep} more characters)"
        if keep + len(note) == limit:
            return text[:keep] + note
        keep = limit - len(note)


class Failure(Exception):
    """A call ends with `code`; `field` (if any) is reported as a BadRequest violation."""

    def __init__(self, code: grpc.StatusCode, message: str, field: str | None = None):
        field = None if field is None else _bounded(field, MAX_FIELD_CHARS)
        message = _bounded(message, MAX_MESSAGE_CHARS - (0 if field is None else len(field) + 2))
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field

    def status(self) -> grpc.Status:
        details = []
        if self.field is not None:
            violation = error_details_pb2.BadRequest.FieldViolation(field=self.field, description=self.message)
            detail = any_pb2.Any()
            detail.Pack(error_details_pb2.BadRequest(field_violations=[violation]))
            details.append(detail)
        text = f"{self.field}: {self.message}" if self.field else self.message
        return rpc_status.to_status(status_pb2.Status(code=self.code.value[0], message=text, details=details))


def invalid(field: str, message: str) -> Failure:
    return Failure(grpc.StatusCode.INVALID_ARGUMENT, message, field)


def not_found(message: str, field: str = "session_id") -> Failure:
    return Failure(grpc.StatusCode.NOT_FOUND, message, field)


def exhausted(message: str, field: str | None = None) -> Failure:
    return Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, message, field)


def unauthenticated(message: str) -> Failure:
    return Failure(grpc.StatusCode.UNAUTHENTICATED, message)


def check_length(field: str, text: str | bytes, limit: int = MAX_NAME_CHARS) -> None:
    """Refuse a name or value longer than `limit` (a name the caller chose, by default)
    without echoing it."""
    if len(text) > limit:
        raise invalid(field, f"at most {limit} characters, got {len(text)}")


def from_wire(exc: WireError) -> Failure:
    return Failure(getattr(grpc.StatusCode, exc.code), exc.message, exc.field)


def from_native(exc: tensorops_native.ArgumentError | tensorops_native.ArgumentTypeError) -> Failure:
    """Validation of tensorops_native: its message starts with the argument's name."""
    message = str(exc)
    prefix = f"{exc.argument}: "
    return invalid(exc.argument, message[len(prefix) :] if message.startswith(prefix) else message)


NATIVE_ERRORS = (tensorops_native.ArgumentError, tensorops_native.ArgumentTypeError)

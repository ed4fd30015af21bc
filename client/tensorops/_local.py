"""The same methods in-process, through tensorops_native (imported on first use, so the
client package itself never needs the native extension).

    from tensorops import LocalClient
    with LocalClient() as c:            # instead of Client("localhost:50051")
        y = c.softmax(x)

Argument errors surface as InvalidArgumentError naming the argument, like the server's,
so error handling does not change either. `timeout` and `metadata` are checked as the
remote clients check them, and otherwise ignored. After close(), the client and its
sessions raise ClientClosedError, as the remote clients do.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Protocol, cast

from ._errors import invalid_argument
from ._operations import (
    Float32Array,
    Float32Pair,
    FloatArray,
    Metadata,
    Operations,
    Pairs,
    Timeout,
    UInt8Array,
    UInt8Input,
)
from .protocol.table import OPERATIONS


def _native() -> ModuleType:
    return importlib.import_module("tensorops_native")


@contextlib.contextmanager
def _argument_errors() -> Iterator[None]:
    native = _native()
    try:
        yield
    except (native.ArgumentError, native.ArgumentTypeError) as exc:
        raise invalid_argument(exc.argument, str(exc).split(": ", 1)[-1]) from None


class LocalClient(Operations[Float32Array, FloatArray, Float32Pair, UInt8Array, "LocalSession"]):
    """In-process client with the methods of tensorops.Client."""

    def __init__(self, *_: object, **__: object):
        _native()

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, name: str, arguments: dict[str, object], timeout: float | None, metadata: Pairs) -> object:
        with _argument_errors():
            return getattr(_native(), OPERATIONS[name].native_name)(**arguments)

    def _open_session(self, arguments: dict[str, object], timeout: float | None, metadata: Pairs) -> LocalSession:
        if arguments.get("max_m") is None:  # quantized_inner_product(b) leaves it to the native default
            arguments.pop("max_m", None)
        with _argument_errors():
            return LocalSession(self, _native().QuantizedInnerProduct(**arguments))

    def info(self, *, timeout: Timeout = None, metadata: Metadata = None) -> dict[str, object]:
        """tensorops_native.info(): version, ISA level, CPU features, kernels, limits and
        operations of this process."""
        self._begin(timeout, metadata)
        return cast(dict[str, object], _native().info())


class LocalSession:
    """tensorops_native.QuantizedInnerProduct with the session methods of the clients."""

    def __init__(self, owner: LocalClient, context: object):
        self._owner = owner
        self._context = context  # tensorops_native.QuantizedInnerProduct (imported on first use)

    @property
    def _native_session(self) -> _NativeSession:
        return cast(_NativeSession, self._context)

    @property
    def info(self) -> str:
        return self._native_session.info

    @property
    def internal_buffer_size(self) -> int:
        return self._native_session.internal_buffer_size

    def external_buffer_size_for(self, m: int, *, timeout: Timeout = None, metadata: Metadata = None) -> int:
        self._owner._begin(timeout, metadata)
        with _argument_errors():
            return self._native_session.external_buffer_size_for(m)

    def forward(self, a: UInt8Input, *, timeout: Timeout = None, metadata: Metadata = None) -> UInt8Array:
        self._owner._begin(timeout, metadata)
        with _argument_errors():
            return self._native_session.forward(a)

    def close(self, *, timeout: Timeout = None, metadata: Metadata = None) -> None:
        self._native_session.close()

    def __enter__(self) -> LocalSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _NativeSession(Protocol):
    """What LocalSession uses of tensorops_native.QuantizedInnerProduct (untyped)."""

    info: str
    internal_buffer_size: int

    def external_buffer_size_for(self, m: int) -> int: ...

    def forward(self, a: UInt8Input) -> UInt8Array: ...

    def close(self) -> None: ...

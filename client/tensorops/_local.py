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

from ._errors import invalid_argument
from ._operations import Operations


def _native():
    return importlib.import_module("tensorops_native")


@contextlib.contextmanager
def _argument_errors():
    native = _native()
    try:
        yield
    except (native.ArgumentError, native.ArgumentTypeError) as exc:
        raise invalid_argument(exc.argument, str(exc).split(": ", 1)[-1]) from None


class LocalClient(Operations):
    """In-process client with the methods of tensorops.Client."""

    def __init__(self, *_, **__):
        _native()

    def close(self) -> None:
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, name: str, arguments: dict, timeout, metadata):
        with _argument_errors():
            return getattr(_native(), name)(**arguments)

    def _open_session(self, arguments: dict, timeout, metadata) -> "LocalSession":
        if arguments.get("max_m") is None:  # quantized_inner_product(b) leaves it to the native default
            arguments.pop("max_m", None)
        with _argument_errors():
            return LocalSession(self, _native().QuantizedInnerProduct(**arguments))

    def info(self, *, timeout=None, metadata=None) -> dict:
        self._begin(timeout, metadata)
        return _native().info()


class LocalSession:
    """tensorops_native.QuantizedInnerProduct with the session methods of the clients."""

    def __init__(self, owner: LocalClient, context):
        self._owner = owner
        self._context = context

    @property
    def info(self) -> str:
        return self._context.info

    @property
    def internal_buffer_size(self) -> int:
        return self._context.internal_buffer_size

    def external_buffer_size_for(self, m: int, *, timeout=None, metadata=None) -> int:
        self._owner._begin(timeout, metadata)
        with _argument_errors():
            return self._context.external_buffer_size_for(m)

    def forward(self, a, *, timeout=None, metadata=None):
        self._owner._begin(timeout, metadata)
        with _argument_errors():
            return self._context.forward(a)

    def close(self, *, timeout=None, metadata=None) -> None:
        self._context.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

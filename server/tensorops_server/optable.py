"""The op table: one entry per operation served, and the generic conversion of a request into
the native function's arguments.

An entry names the operation (its RPC, request and response messages come from the wire
table tensorops._wire.OPERATIONS) and the tensorops_native function that computes it. The
request's fields are the function's arguments by name:

- Tensor fields become read-only arrays over the request bytes (codec.to_array checks the
  wire form: dtype, shape, payload length, size limit);
- enum fields become the API names ("exp", "sum", "split");
- an unset optional field, an UNSPECIFIED enum or an empty repeated field means "not
  given": the argument is left out when the function has a default, else passed as None so
  that the function's own validation names it;
- the Format of the operation's image tensors becomes its `format` argument.

Nothing here checks what an operation accepts: tensorops_native does, and its
ArgumentError / ArgumentTypeError become INVALID_ARGUMENT naming the argument.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, Callable

import numpy as np

import tensorops_native
from tensorops import _codec, _wire
from tensorops.v1 import tensor_pb2

from . import errors


@dataclass(frozen=True)
class Entry:
    """One served operation: the wire operation and the native callable."""

    op: _wire.Operation
    native: Callable[..., Any]
    # Extra conversion of the arguments for operations the generic rules do not cover.
    adapt: Callable[[dict], dict] | None = field(default=None, compare=False)
    # For an operation whose result can be larger than its request: the result's size as
    # (field named, rows, columns, bytes per value), computed from the arguments so that
    # the server refuses a result over its limit before allocating it (None when the
    # operation will refuse the arguments itself).
    result_size: Callable[[dict], tuple[str, int, int, int] | None] | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        return self.op.name

    @cached_property
    def defaults(self) -> frozenset[str]:
        params = inspect.signature(self.native).parameters.values()
        return frozenset(p.name for p in params if p.default is not inspect.Parameter.empty)

    @cached_property
    def parameters(self) -> frozenset[str]:
        return frozenset(inspect.signature(self.native).parameters)

    def arguments(self, decoded: _codec.Decoded, max_tensor_bytes: int | None) -> tuple[dict, int]:
        """The native keyword arguments of a request, and the request's format (wire enum)."""
        kwargs = native_arguments(self.op, decoded, max_tensor_bytes, self.defaults)
        fmt = request_format(self.op, decoded)
        if fmt:
            kwargs["format"] = _codec.FORMAT_NAMES[fmt]
        if self.adapt is not None:
            kwargs = self.adapt(kwargs)
        return kwargs, fmt


_TENSOR, _TENSORS, _ENUM, _REPEATED, _OPTIONAL, _PLAIN = range(6)


@lru_cache(maxsize=None)
def _plan(message_class) -> tuple:
    """How each field of a request message becomes an argument: (name, kind, enum names)."""
    codec = _codec.MessageCodec(message_class)
    plan = []
    for f in message_class.DESCRIPTOR.fields:
        if f.name in codec.numbers:
            kind = _TENSORS if f.is_repeated else _TENSOR
        elif f.enum_type is not None:
            kind = _ENUM
        elif f.is_repeated:
            kind = _REPEATED
        else:
            kind = _OPTIONAL if f.has_presence else _PLAIN
        plan.append((f.name, kind, _wire.enum_names(f.enum_type) if kind == _ENUM else None))
    return tuple(plan)


def native_arguments(op: _wire.Operation, decoded: _codec.Decoded, max_tensor_bytes: int | None,
                     defaults: frozenset[str] = frozenset(), skip: tuple[str, ...] = ()) -> dict:
    message, tensors = decoded.message, decoded.tensors
    kwargs: dict[str, Any] = {}
    for name, kind, names in _plan(op.request_class):
        if name in skip:
            continue
        try:
            if kind == _TENSOR:
                wire = tensors.get(name)
                value = None if wire is None else _codec.to_array(wire, name, max_bytes=max_tensor_bytes)
            elif kind == _TENSORS:
                value = [_codec.to_array(t, f"{name}[{i}]", max_bytes=max_tensor_bytes)
                         for i, t in enumerate(tensors[name])]
            elif kind == _ENUM:
                value = names.get(getattr(message, name))  # UNSPECIFIED or unknown: not given
            elif kind == _REPEATED:
                value = list(getattr(message, name)) or None
            elif kind == _OPTIONAL:
                value = getattr(message, name) if message.HasField(name) else None
            else:
                value = getattr(message, name)
        except _codec.WireError as exc:
            raise errors.from_wire(exc) from None
        if value is None and name in defaults:
            continue
        kwargs[name] = value
    return kwargs


def request_format(op: _wire.Operation, decoded: _codec.Decoded) -> int:
    """The Format shared by the operation's image tensors (UNSPECIFIED ones agree with any)."""
    fmt, source = 0, None
    for name in op.layout:
        wire = decoded.tensors.get(name)
        if wire is None or not wire.format:
            continue
        if wire.format not in _codec.FORMAT_NAMES:
            raise errors.invalid(f"{name}.format", f"unknown format {wire.format}")
        if fmt and wire.format != fmt:
            raise errors.invalid(f"{name}.format", f"{tensor_pb2.Format.Name(wire.format)} differs from "
                                 f"{source}.format {tensor_pb2.Format.Name(fmt)}")
        fmt, source = wire.format, name
    return fmt


def _normalize_arguments(kwargs: dict) -> dict:
    """normalize(): the FusedActivation message becomes (name, *parameters); an activation
    number this side does not know keeps a name that the operation refuses, naming it."""
    activation = kwargs.get("activation")
    if activation is not None:
        name = _wire.decode_enum(activation.DESCRIPTOR.fields_by_name["type"].enum_type, activation.type)
        kwargs["activation"] = (name or f"<activation number {activation.type}>", *activation.params)
    return kwargs


def _channel_sum_result(kwargs: dict) -> tuple[str, int, int, int] | None:
    """channel_sum's result is (batch, channels) float32 whatever the spatial size: an
    empty x of shape (2**24, 4, 0) has no bytes and a 256 MiB result."""
    x = kwargs.get("x")
    if not isinstance(x, np.ndarray) or x.ndim < 2:
        return None
    channels = x.shape[-1] if kwargs.get("format") == "nhwc" else x.shape[1]
    return "x", x.shape[0], channels, 4


def _entry(name: str, native_name: str | None = None, **kwargs) -> Entry | None:
    native = getattr(tensorops_native, native_name or name, None)
    return None if native is None else Entry(_wire.OPERATIONS[name], native, **kwargs)


def build_table() -> dict[str, Entry]:
    """Every operation of the wire table that this tensorops_native provides."""
    entries = (
        _entry("normalize_l2"),
        _entry("layer_norm_channels"),
        _entry("layer_norm_spatial"),
        _entry("channel_norm"),
        _entry("channel_sum", result_size=_channel_sum_result),
        _entry("eltwise"),
        _entry("lrn_cross_channels"),
        _entry("shuffle"),
        _entry("softmax"),
        _entry("tiled_scale_2d"),
        _entry("unary"),
        _entry("normalize", adapt=_normalize_arguments),
        _entry("quantized_inner_product"),
    )
    return {e.name: e for e in entries if e is not None}

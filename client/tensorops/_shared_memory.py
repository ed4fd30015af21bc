"""Operations through system shared memory, for clients on the server's host
(`Client(target, shared_memory=True)`).

The tensors of a call go into a POSIX shared-memory region the client created and
registered with the server's KServe endpoint; the call is a KServe ModelInfer whose
inputs and output refer to the region, so only a small message crosses the socket. The
result is copied out of the region into a new array (or into `out=`), as every result is
new.

Zero copy: `Client.shared_array()` makes an array in a region of its own (registered once).
An input that lies in such an array is referred to where it is, not copied; an `out=` that
is such an array receives the result from the kernel itself.

Whenever shared memory cannot serve, the call goes over the wire instead, unchanged:

- the server refuses to register a region (off: UNIMPLEMENTED; another host: the object
  is not found; a key outside its prefix; limits): shared memory is off for this client
  from then on, and `Client.shared_memory` says why;
- calls with little data (below `min_bytes`), arguments this path does not express
  (eltwise operands of different shapes, unusual argument types: the wire path names
  the error), a result larger than the room left for it, or all regions busy.

Regions: one per concurrent call at most (up to MAX_REGIONS), each grown to fit; they are
unregistered and unlinked by close().
"""

from __future__ import annotations

import mmap
import numbers
import os
import secrets
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import grpc
import numpy as np
import numpy.typing as npt

from . import _operations
from ._operations import Pairs
from .kserve import BYTE_SIZE, OFFSET, REGION, method_path
from .kserve.v2 import inference_pb2 as pb
from .protocol import dtypes, wire
from .protocol.codec import WireError, array_bytes, bytes_field, wire_array

MIN_BYTES = 64 << 10
SMALL_TENSOR = 16 << 10  # tensors smaller than this travel in the message (raw_input_contents)
_IN_MESSAGE = ("", -1)
MIN_REGION = 1 << 20
MAX_REGIONS = 8
MAX_REQUESTS = 64  # requests kept serialized, for calls that recur (beyond: serialized each time)
ALIGNMENT = 64
# Refusals of a region that mean "not for this client": shared memory goes off.
_OFF_CODES = (
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED,
)


# (path, request bytes, timeout, metadata) -> response bytes: the blocking client's _invoke.
Invoke: TypeAlias = "Callable[[str, bytes, float | None, Pairs | None], bytes]"
# A request parameter: the field of its InferParameter's oneof and its value.
Parameter: TypeAlias = "tuple[str, bool | int | float | str]"
# Where an input is: (region, byte size, offset), or None for the message itself.
Place: TypeAlias = "tuple[str, int, int] | None"


class _Unsupported(Exception):
    """This call goes over the wire."""


@dataclass(eq=False)
class _Region:
    name: str
    size: int
    map: mmap.mmap


def _aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _parameter(value: object) -> Parameter:
    """A Python argument as an InferParameter, as the KServe endpoint reads it: the field
    of the parameter's oneof and its value."""
    if isinstance(value, (bool, np.bool_)):
        return "bool_param", bool(value)
    if isinstance(value, numbers.Integral):
        return "int64_param", int(value)
    if isinstance(value, numbers.Real):
        return "double_param", float(value)
    if isinstance(value, str):
        return "string_param", value
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return "string_param", np.dtype(value).name
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], str):  # an activation and its parameters
        if not all(isinstance(p, numbers.Real) and not isinstance(p, bool) for p in value[1:]):
            raise _Unsupported
        return "string_param", f"{value[0]}({', '.join(repr(float(p)) for p in value[1:])})"
    if isinstance(value, (tuple, list, np.ndarray)):
        items = list(value)
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in items):
            raise _Unsupported
        return "string_param", ",".join(str(int(v)) for v in items)
    raise _Unsupported


class SharedMemoryTransport:
    def __init__(self, invoke: Invoke, prefix: str = "tensorops_", min_bytes: int = MIN_BYTES):
        self._invoke = invoke  # (path, request bytes, timeout, metadata) -> response bytes
        self.prefix = prefix
        self.min_bytes = min_bytes
        self.off_reason: str | None = None
        self._lock = threading.Lock()
        self._free: list[_Region] = []
        self._count = 0
        # shared_array()'s regions: name -> (start address, end address, weak reference to the map)
        self._pinned: dict[str, tuple[int, int, weakref.ref[mmap.mmap]]] = {}
        self._gone: list[str] = []  # pinned regions whose arrays are gone: unregistered at the next call
        # The requests of calls made before, without the tensors in the message: what they
        # hold (operation, parameters, tensor descriptions and places) -> serialized.
        self._requests: dict[tuple[object, ...], bytes] = {}

    # ---- regions
    def _acquire(self, nbytes: int, timeout: float | None, metadata: Pairs | None) -> _Region | None:
        with self._lock:
            fitting = [r for r in self._free if r.size >= nbytes]
            if fitting:
                best = min(fitting, key=lambda r: r.size)
                self._free.remove(best)
                return best
            smallest: _Region | None = None
            if self._count >= MAX_REGIONS:
                if not self._free:
                    return None  # every region is busy: over the wire
                smallest = min(self._free, key=lambda r: r.size)
                self._free.remove(smallest)
                self._count -= 1
            self._count += 1
        if smallest is not None:
            self._drop(smallest.name, smallest.map, timeout, metadata)
        region: _Region | None = None
        try:
            region = self._create(max(MIN_REGION, 1 << (nbytes - 1).bit_length()), timeout, metadata)
            return region
        finally:
            if region is None:
                with self._lock:
                    self._count -= 1

    # ---- arrays in regions of their own
    def shared_array(
        self, shape: int | Iterable[int], dtype: npt.DTypeLike, timeout: float | None, metadata: Pairs | None
    ) -> npt.NDArray[Any]:
        dtype = np.dtype(dtype)
        dims = (int(shape),) if isinstance(shape, (int, numbers.Integral)) else tuple(int(n) for n in shape)
        if dtype not in dtypes.WIRE_OF_NUMPY:
            raise TypeError(f"dtype: expected one of {', '.join(str(d) for d in dtypes.BY_NUMPY)}, got {dtype}")
        if any(n < 0 for n in dims):
            raise ValueError(f"shape: dimensions must be non-negative, got {dims}")
        nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
        self._forget_gone(timeout, metadata)
        region = self._create(max(nbytes, 1), timeout, metadata) if self.off_reason is None else None
        if region is None:
            raise ValueError(f"shared_array: shared memory is off for this client ({self.off_reason})")
        start = np.frombuffer(region.map, np.uint8).ctypes.data
        with self._lock:
            self._pinned[region.name] = (start, start + region.size, weakref.ref(region.map))
        weakref.finalize(region.map, self._gone.append, region.name)
        return np.frombuffer(region.map, dtype, int(np.prod(dims, dtype=np.int64))).reshape(dims)

    def _forget_gone(self, timeout: float | None = None, metadata: Pairs | None = None) -> None:
        while self._gone:
            name = self._gone.pop()
            with self._lock:
                self._pinned.pop(name, None)
            self._drop(name, None, timeout, metadata)

    def _placed(self, arr: np.ndarray) -> tuple[str, int] | None:
        """(region, offset) of an array lying in a shared_array's region, contiguous."""
        if not self._pinned or arr.base is None or not arr.flags.c_contiguous:  # base None: owns its memory
            return None
        address = arr.ctypes.data
        for name, (start, end, ref) in list(self._pinned.items()):
            if start <= address and address + arr.nbytes <= end and ref() is not None:
                return name, address - start
        return None

    def _create(self, size: int, timeout: float | None, metadata: Pairs | None) -> _Region | None:
        name = f"{self.prefix}{os.getpid()}_{secrets.token_hex(6)}"
        path = f"/dev/shm/{name}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            mapped = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        region = _Region(name, size, mapped)
        request = pb.SystemSharedMemoryRegisterRequest(name=name, key=f"/{name}", byte_size=size)
        try:
            self._invoke(method_path("SystemSharedMemoryRegister"), request.SerializeToString(), timeout, metadata)
        except Exception as exc:
            self._release_memory(name, mapped)
            code = getattr(exc, "code", None)
            if code in _OFF_CODES:
                self.off_reason = f"the server refused a region: {exc}"
            return None
        return region

    def _release(self, region: _Region) -> None:
        with self._lock:
            self._free.append(region)

    def _drop(
        self, name: str, mapped: mmap.mmap | None, timeout: float | None = None, metadata: Pairs | None = None
    ) -> None:
        """Unregister the region `name` and release its memory (`mapped`: its map, if this
        transport still holds it)."""
        try:
            request = pb.SystemSharedMemoryUnregisterRequest(name=name)
            self._invoke(method_path("SystemSharedMemoryUnregister"), request.SerializeToString(), timeout, metadata)
        except Exception:  # the server unmaps it at shutdown anyway
            pass
        self._release_memory(name, mapped)

    @staticmethod
    def _release_memory(name: str, mapped: mmap.mmap | None) -> None:
        try:
            if mapped is not None:
                mapped.close()
        except BufferError:
            pass
        try:
            os.unlink(f"/dev/shm/{name}")
        except FileNotFoundError:
            pass

    def close(self) -> None:
        with self._lock:
            regions, self._free = self._free, []
            self._count = 0
            pinned, self._pinned = list(self._pinned), {}
        self._gone.clear()
        # a shared_array still in use keeps its mapping, unregistered
        for name, mapped in [(r.name, r.map) for r in regions] + [(name, None) for name in pinned]:
            self._drop(name, mapped, 5.0)

    # ---- calls
    def call(
        self,
        name: str,
        arguments: dict[str, object],
        timeout: float | None,
        metadata: Pairs | None,
        out: np.ndarray | None = None,
    ) -> object:
        """The result (`out` when the server wrote it there), or NotImplemented when this
        call goes over the wire."""
        if self.off_reason is not None:
            return NotImplemented
        if self._gone:
            self._forget_gone(timeout, metadata)
        try:
            tensors, parameters, bits = self._split(name, arguments)
        except _Unsupported:
            return NotImplemented
        op = wire.OPERATIONS[name]
        if len(op.outputs) != 1:
            return NotImplemented
        placed = {key: self._placed(arr) for key, arr in tensors.items()}
        out_placed = self._placed(out) if out is not None else None
        in_bytes = sum(_aligned(arr.nbytes) for arr in tensors.values())
        if in_bytes < self.min_bytes and not any(placed.values()) and out_placed is None:
            return NotImplemented
        for key, arr in tensors.items():  # small ones (scale, shift, ...) travel in the message
            if placed[key] is None and arr.nbytes < SMALL_TENSOR:
                placed[key] = _IN_MESSAGE
        copied = sum(_aligned(arr.nbytes) for key, arr in tensors.items() if placed[key] is None)
        room = 0 if out_placed is not None else in_bytes + ALIGNMENT  # for the result
        region = None
        if copied + room:
            region = self._acquire(copied + room, timeout, metadata)
            if region is None:
                return NotImplemented
        try:
            return self._infer(
                region, op, tensors, placed, out, out_placed, parameters, bits, copied, timeout, metadata
            )
        finally:
            if region is not None:
                self._release(region)

    def _split(
        self, name: str, arguments: dict[str, object]
    ) -> tuple[dict[str, np.ndarray], dict[str, Parameter], bool]:
        op = wire.OPERATIONS[name]
        message_codec = op.request_codec
        tensors: dict[str, np.ndarray] = {}
        parameters: dict[str, Parameter] = {}
        bits = False
        for key, value in arguments.items():
            if value is None:
                continue
            if key in message_codec.numbers:
                if key in message_codec.repeated:  # eltwise's operands travel stacked
                    items = [wire_array(v, f"{key}[{i}]")[0] for i, v in enumerate(cast(Iterable[object], value))]
                    if not items or len({(a.dtype, a.shape) for a in items}) != 1:
                        raise _Unsupported
                    arr = np.stack(items)
                else:
                    try:
                        arr, _ = wire_array(value, key)
                    except WireError:
                        raise _Unsupported from None
                if arr.dtype == np.uint16:  # BF16 bits
                    bits = True
                    arr = arr.view(dtypes.BY_KSERVE["BF16"].numpy)
                if arr.dtype not in dtypes.BY_NUMPY:
                    raise _Unsupported
                tensors[key] = arr
            else:
                parameters[key] = _parameter(value)
        return tensors, parameters, bits

    def _infer(
        self,
        region: _Region | None,
        op: wire.Operation,
        tensors: dict[str, np.ndarray],
        placed: dict[str, tuple[str, int] | None],
        out: np.ndarray | None,
        out_placed: tuple[str, int] | None,
        parameters: dict[str, Parameter],
        bits: bool,
        copied: int,
        timeout: float | None,
        metadata: Pairs | None,
    ) -> object:
        view = np.frombuffer(region.map, np.uint8) if region is not None else None
        offset = 0
        inputs: list[tuple[str, str, tuple[int, ...], Place]] = []  # name, datatype, shape, place of each input
        in_message = []
        for key, arr in tensors.items():
            where: tuple[str, int] | None
            where = placed[key]
            if where is _IN_MESSAGE:
                in_message.append(arr)
                inputs.append((key, dtypes.BY_NUMPY[arr.dtype].kserve, arr.shape, None))
                continue
            if where is None:  # copied into the call's region (acquired for what is copied)
                assert region is not None and view is not None
                view[offset : offset + arr.nbytes] = arr.reshape(-1).view(np.uint8)
                where = (region.name, offset)
                offset += _aligned(arr.nbytes)
            inputs.append((key, dtypes.BY_NUMPY[arr.dtype].kserve, arr.shape, (where[0], arr.nbytes, where[1])))
        if out is not None and out_placed is not None:  # the kernel writes into the caller's array
            output = (out_placed[0], out.nbytes, out_placed[1])
        else:
            assert region is not None  # acquired with room for the result
            output = (region.name, region.size - copied, copied)
        request_key = (op.name, tuple(parameters.items()), tuple(inputs), output)
        head = self._requests.get(request_key)
        if head is None:
            head = _request_head(op, parameters, inputs, output)
            if len(self._requests) < MAX_REQUESTS:
                self._requests[request_key] = head
        data = b"".join([head, *(part for arr in in_message for part in bytes_field(_RAW_INPUTS, array_bytes(arr)))])
        try:
            raw = self._invoke(method_path("ModelInfer"), data, timeout, metadata)
        except Exception as exc:
            field = getattr(exc, "field", None) or ""
            if field.startswith("outputs.") and out_placed is not None:
                raise ValueError(f"out: the result does not fit: {exc}") from None
            if field.startswith("outputs.") or field.endswith(REGION):
                return NotImplemented  # no room for the result, or the region went: over the wire
            raise
        described = pb.ModelInferResponse.FromString(raw).outputs[0]
        dtype = dtypes.BY_KSERVE[described.datatype].numpy
        if bits and described.datatype == "BF16":
            dtype = np.dtype(np.uint16)
        shape = tuple(described.shape)
        if out is not None and out_placed is not None:
            if out.dtype != dtype:
                raise TypeError(f"out: expected dtype {dtype} (the result's), got {out.dtype}")
            if out.shape != shape:
                raise ValueError(f"out: expected shape {shape} (the result's), got {out.shape}")
            return out
        assert region is not None
        result = np.frombuffer(region.map, dtype, int(np.prod(shape, dtype=np.int64)), copied).reshape(shape)
        if out is not None:
            return _operations.result_into(out, result)
        return result.copy()


_RAW_INPUTS = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number


def _request_head(
    op: wire.Operation,
    parameters: dict[str, Parameter],
    inputs: list[tuple[str, str, tuple[int, ...], Place]],
    output: tuple[str, int, int],
) -> bytes:
    """The ModelInferRequest of a call without its raw contents (appended after it, as
    fields of the same message)."""
    request = pb.ModelInferRequest(model_name=op.name)
    for key, (choice, value) in parameters.items():
        setattr(request.parameters[key], choice, value)
    for name, datatype, shape, where in inputs:
        tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
        if where is not None:
            _place(tensor.parameters, *where)
    _place(request.outputs.add(name=op.outputs[0]).parameters, *output)
    return request.SerializeToString()


def _place(parameters: Any, region: str, byte_size: int, offset: int) -> None:
    parameters[REGION].string_param = region
    parameters[BYTE_SIZE].int64_param = byte_size
    parameters[OFFSET].int64_param = offset

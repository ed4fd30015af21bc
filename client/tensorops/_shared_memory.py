"""Operations through system shared memory, for clients on the server's host
(`Client(target, shared_memory=True)`).

The tensors of a call go into a POSIX shared-memory region the client created and
registered with the server's KServe endpoint; the call is a KServe ModelInfer whose
inputs and output refer to the region, so only a small message crosses the socket. The
result is copied out of the region into a new array, as every result is new.

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
from dataclasses import dataclass

import grpc
import numpy as np

from . import _wire
from ._codec import WireError, wire_array
from .kserve import BYTE_SIZE, DATATYPES, OFFSET, REGION, method_path
from .kserve.v2 import inference_pb2 as pb

MIN_BYTES = 64 << 10
MIN_REGION = 1 << 20
MAX_REGIONS = 8
ALIGNMENT = 64
# Refusals of a region that mean "not for this client": shared memory goes off.
_OFF_CODES = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND,
              grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED)


class _Unsupported(Exception):
    """This call goes over the wire."""


@dataclass(eq=False)
class _Region:
    name: str
    size: int
    map: mmap.mmap


def _aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _parameter(value) -> pb.InferParameter:
    """A Python argument as an InferParameter, as the KServe endpoint reads it."""
    if isinstance(value, (bool, np.bool_)):
        return pb.InferParameter(bool_param=bool(value))
    if isinstance(value, numbers.Integral):
        return pb.InferParameter(int64_param=int(value))
    if isinstance(value, numbers.Real):
        return pb.InferParameter(double_param=float(value))
    if isinstance(value, str):
        return pb.InferParameter(string_param=value)
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return pb.InferParameter(string_param=np.dtype(value).name)
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], str):  # an activation and its parameters
        if not all(isinstance(p, numbers.Real) and not isinstance(p, bool) for p in value[1:]):
            raise _Unsupported
        return pb.InferParameter(string_param=f"{value[0]}({', '.join(repr(float(p)) for p in value[1:])})")
    if isinstance(value, (tuple, list, np.ndarray)):
        items = list(value)
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in items):
            raise _Unsupported
        return pb.InferParameter(string_param=",".join(str(int(v)) for v in items))
    raise _Unsupported


class SharedMemoryTransport:
    def __init__(self, invoke, prefix: str = "tensorops_", min_bytes: int = MIN_BYTES):
        self._invoke = invoke  # (path, request bytes, timeout, metadata) -> response bytes
        self.prefix = prefix
        self.min_bytes = min_bytes
        self.off_reason: str | None = None
        self._lock = threading.Lock()
        self._free: list[_Region] = []
        self._count = 0

    # ---- regions
    def _acquire(self, nbytes: int, timeout, metadata) -> _Region | None:
        with self._lock:
            fitting = [r for r in self._free if r.size >= nbytes]
            if fitting:
                region = min(fitting, key=lambda r: r.size)
                self._free.remove(region)
                return region
            if self._count >= MAX_REGIONS:
                if not self._free:
                    return None  # every region is busy: over the wire
                smallest = min(self._free, key=lambda r: r.size)
                self._free.remove(smallest)
                self._count -= 1
            else:
                smallest = None
            self._count += 1
        if smallest is not None:
            self._drop(smallest, timeout, metadata)
        region = None
        try:
            region = self._create(max(MIN_REGION, 1 << (nbytes - 1).bit_length()), timeout, metadata)
            return region
        finally:
            if region is None:
                with self._lock:
                    self._count -= 1

    def _create(self, size: int, timeout, metadata) -> _Region | None:
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
            self._release_memory(region)
            code = getattr(exc, "code", None)
            if code in _OFF_CODES:
                self.off_reason = f"the server refused a region: {exc}"
            return None
        return region

    def _release(self, region: _Region) -> None:
        with self._lock:
            self._free.append(region)

    def _drop(self, region: _Region, timeout=None, metadata=None) -> None:
        try:
            request = pb.SystemSharedMemoryUnregisterRequest(name=region.name)
            self._invoke(method_path("SystemSharedMemoryUnregister"), request.SerializeToString(), timeout, metadata)
        except Exception:  # noqa: BLE001 - the server unmaps it at shutdown anyway
            pass
        self._release_memory(region)

    @staticmethod
    def _release_memory(region: _Region) -> None:
        try:
            region.map.close()
        except BufferError:
            pass
        try:
            os.unlink(f"/dev/shm/{region.name}")
        except FileNotFoundError:
            pass

    def close(self) -> None:
        with self._lock:
            regions, self._free = self._free, []
            self._count = 0
        for region in regions:
            self._drop(region, 5.0)

    # ---- calls
    def call(self, name: str, arguments: dict, timeout, metadata):
        """The result, or NotImplemented when this call goes over the wire."""
        if self.off_reason is not None:
            return NotImplemented
        try:
            tensors, parameters, bits = self._split(name, arguments)
        except _Unsupported:
            return NotImplemented
        op = _wire.OPERATIONS[name]
        in_bytes = sum(_aligned(arr.nbytes) for arr in tensors.values())
        if in_bytes < self.min_bytes or len(op.response_fields) != 1:
            return NotImplemented
        out_room = in_bytes + ALIGNMENT
        region = self._acquire(in_bytes + out_room, timeout, metadata)
        if region is None:
            return NotImplemented
        try:
            return self._infer(region, op, tensors, parameters, bits, in_bytes, region.size - in_bytes,
                               timeout, metadata)
        finally:
            self._release(region)

    def _split(self, name: str, arguments: dict):
        op = _wire.OPERATIONS[name]
        codec = op.request_codec
        tensors, parameters, bits = {}, {}, False
        for key, value in arguments.items():
            if value is None:
                continue
            if key in codec.numbers:
                if key in codec.repeated:  # eltwise's operands travel stacked
                    items = [wire_array(v, f"{key}[{i}]")[0] for i, v in enumerate(value)]
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
                    arr = arr.view(DATATYPES["BF16"][1])
                if arr.dtype not in _DATATYPE_NAMES:
                    raise _Unsupported
                tensors[key] = arr
            else:
                parameters[key] = _parameter(value)
        return tensors, parameters, bits

    def _infer(self, region: _Region, op, tensors, parameters, bits, in_bytes, out_room, timeout, metadata):
        request = pb.ModelInferRequest(model_name=op.name)
        for key, p in parameters.items():
            request.parameters[key].CopyFrom(p)
        view = np.frombuffer(region.map, np.uint8)
        offset = 0
        for key, arr in tensors.items():
            view[offset:offset + arr.nbytes] = arr.reshape(-1).view(np.uint8)
            tensor = request.inputs.add(name=key, datatype=_DATATYPE_NAMES[arr.dtype], shape=arr.shape)
            tensor.parameters[REGION].string_param = region.name
            tensor.parameters[BYTE_SIZE].int64_param = arr.nbytes
            tensor.parameters[OFFSET].int64_param = offset
            offset += _aligned(arr.nbytes)
        output = request.outputs.add(name=op.response_fields[0])
        output.parameters[REGION].string_param = region.name
        output.parameters[BYTE_SIZE].int64_param = out_room
        output.parameters[OFFSET].int64_param = in_bytes
        try:
            raw = self._invoke(method_path("ModelInfer"), request.SerializeToString(), timeout, metadata)
        except Exception as exc:
            field = getattr(exc, "field", None) or ""
            if field.startswith("outputs.") or field.endswith(REGION):
                return NotImplemented  # no room for the result, or the region went: over the wire
            raise
        out = pb.ModelInferResponse.FromString(raw).outputs[0]
        dtype = DATATYPES[out.datatype][1]
        count = int(np.prod(out.shape, dtype=np.int64))
        result = np.frombuffer(region.map, dtype, count, in_bytes).reshape(tuple(out.shape)).copy()
        return result.view(np.uint16) if bits and out.datatype == "BF16" else result


_DATATYPE_NAMES = {dtype: name for name, (_, dtype) in DATATYPES.items()}

"""System shared memory (the KServe / Triton extension) for co-located callers: a caller
registers a POSIX shared-memory object (its key, an offset and a size) under a region
name, then inputs and outputs of ModelInfer refer to parts of the region instead of
travelling in the messages.

The server maps what callers hand it, so every step is checked:

- off unless --allow-shared-memory; keys must start with --shared-memory-prefix (after
  leading slashes, which name the same object) and name an object directly in /dev/shm;
- a cap on the regions registered and on their bytes, all callers together;
- a region belongs to the caller that registered it (auth.py's identity), as sessions do:
  others do not see it;
- every use checks offset + size against the region, and the region against the object's
  size *now* (one fstat per region per call, see CallRegions), so that an object shrunk
  after registration is refused instead of faulting. (A caller that shrinks its object while a call reads or writes it can still
  fault the process with SIGBUS: POSIX offers no way to pin the size of a shared-memory
  object. pread/pwrite through the descriptor would make that a clean error but cost two
  copies, about 0.6 ms at 4 MB, more than the rest of such a call's overhead; so regions
  stay mapped and shared memory is for callers trusted with the process, see
  docs/kserve.md.)
- a region unregistered while calls use it is unmapped when the last of them ends;
  every region is unmapped on Unregister and at shutdown.
"""
from __future__ import annotations

import mmap
import os
import stat
import threading
from dataclasses import dataclass

import grpc

from . import errors

SHM_DIR = "/dev/shm"


@dataclass(eq=False)
class Region:
    name: str
    owner: str
    key: str
    offset: int
    byte_size: int
    fd: int
    map: mmap.mmap
    users: int = 0
    retired: bool = False

    def close(self) -> None:
        os.close(self.fd)
        try:
            self.map.close()
        except BufferError:  # arrays still view it: unmapped when the last of them goes
            pass


def unavailable(field: str | None = None) -> errors.Failure:
    return errors.Failure(grpc.StatusCode.UNIMPLEMENTED,
                          "system shared memory is off on this server (tensorops-server --allow-shared-memory)", field)


class SharedMemory:
    def __init__(self, *, allowed: bool, prefix: str, max_regions: int, max_bytes: int):
        self.allowed = allowed
        self.prefix = prefix
        self.max_regions = max_regions
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._regions: dict[tuple[str, str], Region] = {}
        self._bytes = 0

    def _check_allowed(self) -> None:
        if not self.allowed:
            raise unavailable()

    def _object_name(self, key: str) -> str:
        name = key.lstrip("/")
        if not name or "/" in name or name in (".", ".."):
            raise errors.invalid("key", "expected the name of a POSIX shared-memory object, like "
                                        f"'/{self.prefix}input'")
        if not name.startswith(self.prefix):
            raise errors.Failure(grpc.StatusCode.PERMISSION_DENIED,
                                 f"this server maps only the shared-memory objects whose names start with "
                                 f"{self.prefix!r}", "key")
        return name

    # ---- the calls
    def register(self, owner: str, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_allowed()
        if not name:
            raise errors.invalid("name", "required: the region's name")
        if byte_size <= 0:
            raise errors.invalid("byte_size", f"must be > 0, got {byte_size}")
        object_name = self._object_name(key)
        with self._lock:
            if (owner, name) in self._regions:
                raise errors.Failure(grpc.StatusCode.ALREADY_EXISTS, f"region {name!r} is registered already; "
                                     "unregister it first", "name")
            if len(self._regions) >= self.max_regions:
                raise errors.exhausted(f"{len(self._regions)} regions are registered, the server's limit", "name")
            if self._bytes + byte_size > self.max_bytes:
                raise errors.exhausted(f"the regions registered hold {self._bytes} bytes; {byte_size} more exceed "
                                       f"the server's limit of {self.max_bytes}", "byte_size")
        try:
            fd = os.open(os.path.join(SHM_DIR, object_name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise errors.not_found("no shared-memory object of that name", field="key") from None
        except OSError:
            raise errors.invalid("key", "the shared-memory object cannot be opened for reading and writing") \
                from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise errors.invalid("key", "not a shared-memory object")
            if info.st_size < offset + byte_size:
                raise errors.invalid("byte_size", f"offset {offset} + byte_size {byte_size} exceed the object's "
                                                  f"{info.st_size} bytes")
            mapped = mmap.mmap(fd, offset + byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        region = Region(name, owner, key, offset, byte_size, fd, mapped)
        with self._lock:  # checked again: another call may have registered meanwhile
            if (owner, name) in self._regions or len(self._regions) >= self.max_regions or \
                    self._bytes + byte_size > self.max_bytes:
                region.close()
                raise errors.exhausted("the regions registered meanwhile reached a limit; try again", "name")
            self._regions[(owner, name)] = region
            self._bytes += byte_size

    def status(self, owner: str, name: str) -> list[Region]:
        self._check_allowed()
        with self._lock:
            regions = [r for (o, n), r in self._regions.items() if o == owner and (not name or n == name)]
        if name and not regions:
            raise errors.not_found(f"no region named {name!r}", field="name")
        return regions

    def unregister(self, owner: str, name: str) -> None:
        """Unregister `name`, or every region of the caller for ""."""
        self._check_allowed()
        with self._lock:
            keys = [k for k in self._regions if k[0] == owner and (not name or k[1] == name)]
            closing = [self._retire_locked(k) for k in keys]
        for region in closing:
            if region is not None:
                region.close()

    def close_all(self) -> None:
        with self._lock:
            closing = [self._retire_locked(k) for k in list(self._regions)]
        for region in closing:
            if region is not None:
                region.close()

    def _retire_locked(self, key) -> Region | None:
        region = self._regions.pop(key)
        self._bytes -= region.byte_size
        region.retired = True
        return region if region.users == 0 else None

    # ---- inference
    def for_call(self, owner: str) -> "CallRegions":
        """The regions of one call (close() it when the call ends)."""
        return CallRegions(self, owner)

    def _hold(self, owner: str, name: str, field: str) -> tuple[Region, int]:
        """The caller's region `name`, held for a call (release with _let_go), and its
        object's size now."""
        if not self.allowed:
            raise unavailable(field)
        with self._lock:
            region = self._regions.get((owner, name))
            if region is not None:
                region.users += 1
        if region is None:
            raise errors.not_found(f"no shared-memory region named {name!r} is registered", field=field)
        try:
            return region, os.fstat(region.fd).st_size
        except BaseException:
            self._let_go(region)
            raise

    def _let_go(self, region: Region) -> None:
        with self._lock:
            region.users -= 1
            last = region.retired and region.users == 0
        if last:
            region.close()


class CallRegions:
    """The parts of regions one call reads and writes. Each region is looked up, held
    (an Unregister meanwhile unmaps it only when the call ends) and checked against its
    object's size (fstat) once per call, at its first use, however many of the call's
    inputs and outputs lie in it; every part is checked against the region and that size."""

    __slots__ = ("_shm", "_owner", "_held", "_views", "nbytes")

    def __init__(self, shm: SharedMemory, owner: str):
        self._shm = shm
        self._owner = owner
        self._held: dict[str, tuple[Region, int]] = {}  # name -> (region, its object's size)
        self._views: list[memoryview] = []
        self.nbytes = 0  # the bytes of the parts opened so far

    def view(self, name: str, offset: int, byte_size: int, field: str) -> memoryview:
        """A view of `byte_size` bytes at `offset` in the caller's region `name`, valid
        until close(). `field` names the parameter in errors."""
        held = self._held.get(name)
        if held is None:
            held = self._held[name] = self._shm._hold(self._owner, name, field)
        region, object_size = held
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise errors.invalid(field, f"offset {offset} + byte_size {byte_size} exceed the region's "
                                        f"{region.byte_size} bytes")
        start = region.offset + offset
        if object_size < start + byte_size:
            raise errors.invalid(field, f"the shared-memory object of region {name!r} shrank below what was "
                                        "registered; register it again")
        view = memoryview(region.map)[start:start + byte_size]
        self._views.append(view)
        self.nbytes += byte_size
        return view

    def close(self) -> None:
        for view in self._views:
            try:
                view.release()
            except BufferError:  # arrays over it outlive the call: it goes with them
                pass
        self._views.clear()
        held, self._held = self._held, {}
        for region, _ in held.values():
            self._shm._let_go(region)

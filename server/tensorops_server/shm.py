"""System shared memory (the KServe / Triton extension) for co-located callers: a caller
registers a POSIX shared-memory object (its key, an offset and a size) under a region
name, then inputs and outputs of ModelInfer refer to parts of the region instead of
travelling in the messages.

The server maps what callers hand it, so every step is checked:

- off unless --allow-shared-memory; keys must start with --shared-memory-prefix (after
  leading slashes, which name the same object) and name an object directly in /dev/shm;
- the object is judged by what it is, not by its name: opened without following a
  symbolic link, it must be a regular file of /dev/shm's file system with exactly one name
  (a hard link would let an allowed name stand for an object outside the prefix);
- caps on the regions registered and on their bytes, per caller and all callers together;
- a region belongs to the caller that registered it (auth.py's identity), as sessions do:
  others do not see it;
- registrations live in the server's shared state (statedir.py), so a region registered
  through one worker process is used, listed and unregistered through any other, and the
  caps hold for all workers together. Each worker maps a region at its first use there and
  checks that the name still leads to the object registered (device and inode): an object
  replaced under the same name since is refused, not mapped;
- every use checks offset + size against the region, and the region against the object's
  size *now* (one fstat per region before the call's work and one after it, see
  CallRegions), so that an object shrunk before a call is refused before any work;
- an object shrunk *while* a call reads or writes it cannot kill the process: regions are
  mapped by tensorops_native's GuardedMapping, where the SIGBUS of such an access turns the
  mapping into zero pages instead (native/src/guard.c). The call then fails naming the
  region, which is unregistered: it no longer shows the object;
- a region unregistered while calls use it is unmapped when the last of them ends (on
  other workers: at their next use of the name or their next sweep); every region is
  unmapped on Unregister and at shutdown.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import threading
from dataclasses import dataclass

import grpc

from tensorops_native._guard import GuardedMapping

from . import errors
from .statedir import REGION_USAGE, Connections, StateDir, transaction

SHM_DIR = "/dev/shm"


@dataclass(eq=False)
class Region:
    name: str
    owner: str
    key: str
    offset: int
    byte_size: int
    fd: int
    mapping: GuardedMapping | None
    serial: str = ""  # of the registration this worker mapped
    users: int = 0
    retired: bool = False

    def close(self) -> None:
        os.close(self.fd)
        self.mapping = None  # unmapped now, or when the last array over it goes


def unavailable(field: str | None = None) -> errors.Failure:
    return errors.Failure(
        grpc.StatusCode.UNIMPLEMENTED,
        "system shared memory is off on this server (tensorops-server --allow-shared-memory)",
        field,
    )


def shrank_during_call(name: str, field: str) -> errors.Failure:
    return errors.invalid(
        field,
        f"the shared-memory object of region {name!r} shrank while the call used it; "
        "the region is unregistered: register it again",
    )


def _map(fd: int, size: int) -> GuardedMapping:
    try:
        return GuardedMapping(fd, size)
    except OSError as exc:
        if exc.errno == errno.ENOTSUP:  # unguarded, a shrink would kill the server: no mapping at all
            raise errors.Failure(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this server process cannot guard shared "
                "memory against a shrinking object (another SIGBUS handler is locked in)",
            ) from None
        if exc.errno == errno.ENOSPC:
            raise errors.exhausted(
                "the server maps as many regions as it can (unregistered ones stay mapped while "
                "calls still use them); try again",
                "name",
            ) from None
        raise errors.exhausted(f"the region cannot be mapped: {exc.strerror}", "byte_size") from None


_ROW = "key, offset, byte_size, device, inode, serial"


class SharedMemory:
    def __init__(
        self,
        state: StateDir,
        *,
        allowed: bool,
        prefix: str,
        max_regions: int,
        max_bytes: int,
        max_regions_per_caller: int,
        max_bytes_per_caller: int,
    ):
        self.allowed = allowed
        self.prefix = prefix
        self.max_regions = max_regions
        self.max_bytes = max_bytes
        self.max_regions_per_caller = max_regions_per_caller
        self.max_bytes_per_caller = max_bytes_per_caller
        self._db = Connections(state)
        self._lock = threading.Lock()
        self._regions: dict[tuple[str, str], Region] = {}  # the regions this worker has mapped
        # The file system the objects must be on: compared by identity, not by path.
        self._shm_device = os.stat(SHM_DIR).st_dev if allowed else None

    def _check_allowed(self) -> None:
        if not self.allowed:
            raise unavailable()

    def _object_name(self, key: str) -> str:
        errors.check_length("key", key)
        name = key.lstrip("/")
        if not name or "/" in name or "\0" in name or name in (".", ".."):
            raise errors.invalid(
                "key",
                "expected the name of a POSIX shared-memory object (no NUL, no '/' after "
                f"the leading ones), like '/{self.prefix}input'",
            )
        if not name.startswith(self.prefix):
            raise errors.Failure(
                grpc.StatusCode.PERMISSION_DENIED,
                f"this server maps only the shared-memory objects whose names start with {self.prefix!r}",
                "key",
            )
        return name

    def _open_object(self, object_name: str) -> tuple[int, os.stat_result]:
        """A descriptor of the object and its status, once it is known to be one that only its
        allowed name reaches: not a symbolic link, not a hard link, a regular file of /dev/shm."""
        try:
            fd = os.open(os.path.join(SHM_DIR, object_name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise errors.not_found("no shared-memory object of that name", field="key") from None
        except OSError as exc:
            reason = (
                "is a symbolic link"
                if os.path.islink(os.path.join(SHM_DIR, object_name))
                else f"cannot be opened for reading and writing ({os.strerror(exc.errno)})"
            )
            raise errors.invalid("key", f"the shared-memory object {reason}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_dev != self._shm_device:
                raise errors.invalid("key", f"not a shared-memory object (a regular file of {SHM_DIR})")
            if info.st_nlink != 1:
                raise errors.invalid(
                    "key",
                    f"the object has {info.st_nlink} names (hard links); only objects with "
                    "one name are mapped, so that the name's prefix says what is mapped",
                )
        except BaseException:
            os.close(fd)
            raise
        return fd, info

    def _check_room(self, db, owner: str, name: str, byte_size: int) -> None:
        """In a transaction: is there room for one more region of `byte_size` bytes?"""
        if db.execute("select 1 from regions where owner = ? and name = ?", (owner, name)).fetchone():
            raise errors.Failure(
                grpc.StatusCode.ALREADY_EXISTS, f"region {name!r} is registered already; unregister it first", "name"
            )
        regions, nbytes = db.execute(REGION_USAGE + " where owner = ?", (owner,)).fetchone()
        if regions >= self.max_regions_per_caller:
            raise errors.exhausted(
                f"this caller has {regions} regions registered, the limit per caller; unregister some first",
                "name",
            )
        if nbytes + byte_size > self.max_bytes_per_caller:
            raise errors.exhausted(
                f"this caller's regions hold {nbytes} bytes; {byte_size} more exceed the "
                f"limit of {self.max_bytes_per_caller} per caller",
                "byte_size",
            )
        regions, nbytes = db.execute(REGION_USAGE).fetchone()
        if regions >= self.max_regions:
            raise errors.exhausted(f"{regions} regions are registered, the server's limit", "name")
        if nbytes + byte_size > self.max_bytes:
            raise errors.exhausted(
                f"the regions registered hold {nbytes} bytes; {byte_size} more "
                f"exceed the server's limit of {self.max_bytes}",
                "byte_size",
            )

    # ---- the calls
    def register(self, owner: str, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_allowed()
        if not name:
            raise errors.invalid("name", "required: the region's name")
        errors.check_length("name", name)
        if byte_size <= 0:
            raise errors.invalid("byte_size", f"must be > 0, got {byte_size}")
        object_name = self._object_name(key)
        db = self._db.get()
        with transaction(db):  # checked before the object is opened, and again when it is added
            self._check_room(db, owner, name, byte_size)
        fd, info = self._open_object(object_name)
        try:
            if info.st_size < offset + byte_size:
                raise errors.invalid(
                    "byte_size", f"offset {offset} + byte_size {byte_size} exceed the object's {info.st_size} bytes"
                )
            mapping = _map(fd, offset + byte_size)
        except BaseException:
            os.close(fd)
            raise
        region = Region(name, owner, key, offset, byte_size, fd, mapping, secrets.token_hex(8))
        try:
            with transaction(db):
                self._check_room(db, owner, name, byte_size)
                db.execute(
                    f"insert into regions (owner, name, {_ROW}) values (?, ?, ?, ?, ?, ?, ?, ?)",
                    (owner, name, key, offset, byte_size, info.st_dev, info.st_ino, region.serial),
                )
        except BaseException:
            region.close()
            raise
        self._keep(region)

    def status(self, owner: str, name: str) -> list[Region]:
        self._check_allowed()
        errors.check_length("name", name)
        query = "select name, key, offset, byte_size from regions where owner = ?"
        rows = self._db.get().execute(
            query + (" and name = ?" if name else " order by name"), (owner, name) if name else (owner,)
        )
        regions = [Region(n, owner, k, o, b, -1, None) for n, k, o, b in rows]
        if name and not regions:
            raise errors.not_found(f"no region named {name!r}", field="name")
        return regions

    def unregister(self, owner: str, name: str) -> None:
        """Unregister `name`, or every region of the caller for ""."""
        self._check_allowed()
        errors.check_length("name", name)
        db = self._db.get()
        with transaction(db):
            if name:
                gone = db.execute("delete from regions where owner = ? and name = ? returning name", (owner, name))
            else:
                gone = db.execute("delete from regions where owner = ? returning name", (owner,))
            names = [n for (n,) in gone]
        self._retire([(owner, n) for n in names])

    def sweep(self) -> None:
        """Unmap the regions of this worker that were unregistered through another."""
        live = {(o, n, serial) for o, n, serial in self._db.get().execute("select owner, name, serial from regions")}
        with self._lock:
            gone = [k for k, r in self._regions.items() if (*k, r.serial) not in live]
        self._retire(gone)

    def close(self) -> None:
        """Unmap this worker's regions (they stay registered for the other workers)."""
        with self._lock:
            keys = list(self._regions)
        self._retire(keys)
        self._db.close()

    def _keep(self, region: Region) -> None:
        with self._lock:
            stale = self._regions.get((region.owner, region.name))
            self._regions[(region.owner, region.name)] = region
        if stale is not None:
            self._retire_region(stale)

    def _retire(self, keys) -> None:
        """Unmap these regions of this worker (now, or when the last call using them ends)."""
        with self._lock:
            regions = [r for r in (self._regions.pop(k, None) for k in keys) if r is not None]
        for region in regions:
            self._retire_region(region)

    def _retire_region(self, region: Region) -> None:
        with self._lock:
            region.retired = True
            idle = region.users == 0
        if idle:
            region.close()

    def _retire_broken(self, region: Region) -> None:
        """Unregister a region whose mapping broke (its object shrank under an access), if
        it is still the registration it was; the calls holding it close it when they end."""
        db = self._db.get()
        with transaction(db):
            db.execute(
                "delete from regions where owner = ? and name = ? and serial = ?",
                (region.owner, region.name, region.serial),
            )
        with self._lock:
            if self._regions.get((region.owner, region.name)) is region:
                del self._regions[(region.owner, region.name)]
        self._retire_region(region)

    # ---- inference
    def for_call(self, owner: str) -> CallRegions:
        """The regions of one call (close() it when the call ends)."""
        return CallRegions(self, owner)

    def _mapped(self, owner: str, name: str, field: str) -> Region:
        """This worker's mapping of the caller's region `name`, mapped now at its first use
        here (or after it was registered again), held for a call (release with _let_go)."""
        row = (
            self._db.get().execute(f"select {_ROW} from regions where owner = ? and name = ?", (owner, name)).fetchone()
        )
        if row is None:
            self._retire([(owner, name)])
            raise errors.not_found(f"no shared-memory region named {name!r} is registered", field=field)
        key, offset, byte_size, device, inode, serial = row
        with self._lock:
            region = self._regions.get((owner, name))
            if region is not None and region.serial == serial and not region.retired:
                region.users += 1
                return region
        fd, info = self._open_object(self._object_name(key))
        try:
            if (info.st_dev, info.st_ino) != (device, inode):
                raise errors.invalid(
                    field,
                    f"the shared-memory object named by region {name!r} is not the one registered (it was "
                    "replaced since); register it again",
                )
            if info.st_size < offset + byte_size:
                raise errors.invalid(
                    field,
                    f"the shared-memory object of region {name!r} shrank below what was registered; register it again",
                )
            mapping = _map(fd, offset + byte_size)
        except BaseException:
            os.close(fd)
            raise
        region = Region(name, owner, key, offset, byte_size, fd, mapping, serial, users=1)
        self._keep(region)
        return region

    def _hold(self, owner: str, name: str, field: str) -> tuple[Region, int]:
        """The caller's region `name`, held for a call (release with _let_go), and its
        object's size now."""
        if not self.allowed:
            raise unavailable(field)
        region = self._mapped(owner, name, field)
        try:
            if region.mapping.broken:  # by a call that has not ended yet
                self._retire_broken(region)
                raise shrank_during_call(name, field)
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


@dataclass(eq=False)
class Held:
    """A region as one call holds it."""

    region: Region
    object_size: int  # the object's size at the call's first use of the region
    field: str  # the parameter of that first use, named in errors about the region
    end: int = 0  # the end of the furthest part of the object the call uses


class CallRegions:
    """The parts of regions one call reads and writes. Each region is looked up, held
    (an Unregister meanwhile unmaps it only when the call ends) and checked against its
    object's size (fstat) once per call, at its first use, however many of the call's
    inputs and outputs lie in it; every part is checked against the region and that size.
    After the call's work, check_intact() fails the call if an object shrank meanwhile."""

    __slots__ = ("_shm", "_owner", "_held", "_views", "nbytes")

    def __init__(self, shm: SharedMemory, owner: str):
        self._shm = shm
        self._owner = owner
        self._held: dict[str, Held] = {}
        self._views: list[memoryview] = []
        self.nbytes = 0  # the bytes of the parts opened so far

    def view(self, name: str, offset: int, byte_size: int, field: str) -> memoryview:
        """A view of `byte_size` bytes at `offset` in the caller's region `name`, valid
        until close(). `field` names the parameter in errors."""
        held = self._held.get(name)
        if held is None:
            held = self._held[name] = Held(*self._shm._hold(self._owner, name, field), field)
        region = held.region
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise errors.invalid(
                field, f"offset {offset} + byte_size {byte_size} exceed the region's {region.byte_size} bytes"
            )
        start = region.offset + offset
        if held.object_size < start + byte_size:
            raise errors.invalid(
                field,
                f"the shared-memory object of region {name!r} shrank below what was registered; register it again",
            )
        held.end = max(held.end, start + byte_size)
        view = region.mapping.memory[start : start + byte_size]
        self._views.append(view)
        self.nbytes += byte_size
        return view

    def check_intact(self) -> None:
        """Fail the call if the object of a region it used shrank while it ran: an access
        past the new end turned the mapping into zeros (the region is then unregistered),
        or none did but the object now ends before a part the call used (within the last
        page, past the end reads as zeros without a fault). Either way, what the call read
        or wrote there is not the caller's data."""
        for name, held in self._held.items():
            if held.region.mapping.broken:
                self._shm._retire_broken(held.region)
                raise shrank_during_call(name, held.field)
            if os.fstat(held.region.fd).st_size < held.end:
                raise errors.invalid(
                    held.field, f"the shared-memory object of region {name!r} shrank while the call used it"
                )

    def close(self) -> None:
        for view in self._views:
            try:
                view.release()
            except BufferError:  # arrays over it outlive the call: it goes with them
                pass
        self._views.clear()
        held, self._held = self._held, {}
        for h in held.values():
            self._shm._let_go(h.region)

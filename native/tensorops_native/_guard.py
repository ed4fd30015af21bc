"""Shared mappings of files that a SIGBUS cannot turn into a crash (native/src/guard.c).

A file mapped and then shrunk by another process faults every access past its new end with
SIGBUS, which kills the process. In a GuardedMapping, such a fault instead replaces the
whole mapping with zero pages, and `broken` becomes true: whatever was reading or writing
it finishes on zeros, and the owner checks `broken` afterwards to discard that work.
"""

from __future__ import annotations

import os

from ._native import ffi, lib


class GuardedMapping:
    """`size` bytes of the file open as `fd`, from its start, shared, readable and
    writable. The memory stays mapped while this object or any view of `memory` (or array
    over one) lives, and is unmapped when the last of them goes, on whatever thread."""

    __slots__ = ("_slot", "memory")

    def __init__(self, fd: int, size: int):
        address = ffi.new("void **")
        slot = lib.TnGuardedMap(fd, size, address)
        if slot < 0:
            raise OSError(-slot, os.strerror(-slot))
        self._slot = slot
        # The owning pointer unmaps when collected; the buffer and every view sliced from
        # it keep it alive, so no view can outlive the mapping.
        owner = ffi.gc(ffi.cast("char *", address[0]), lambda _, slot=slot: lib.TnGuardedUnmap(slot), size)
        self.memory = memoryview(ffi.buffer(owner, size))

    @property
    def broken(self) -> bool:
        """True once the file shrank under an access: the mapping holds zeros since."""
        return bool(lib.TnGuardedBroken(self._slot))

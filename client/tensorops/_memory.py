"""Process-level memory tuning for moving large tensors."""

from __future__ import annotations

import ctypes

_GLIBC_MMAP_THRESHOLD_MAX = 32 << 20


def retain_freed_buffers(largest: int = _GLIBC_MMAP_THRESHOLD_MAX) -> bool:
    """Ask glibc malloc to keep freed blocks of up to `largest` bytes (at most 32 MiB) for
    reuse instead of unmapping them.

    By default glibc serves big blocks with fresh mmap'd pages and returns them on free, so
    every message, result and response of a few MB costs thousands of page faults, which
    on a VM take longer than copying the data. tensorops-server calls this at startup; a
    client process that sends or receives large tensors gains from it too. The cost is
    memory: freed blocks stay mapped (up to four times `largest` at the top of each heap).
    Returns False where mallopt is unavailable (the call then changes nothing)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    largest = max(0, min(int(largest), _GLIBC_MMAP_THRESHOLD_MAX))
    return bool(mallopt(m_mmap_threshold, largest)) and bool(mallopt(m_trim_threshold, 4 * largest))

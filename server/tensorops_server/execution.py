"""Where the work of a call runs: on the event loop, or on a worker thread.

The server is a grpc.aio server: a call costs no thread while its request is arriving,
and the event loop answers health checks and small calls without a thread hand-off.
Work that may take long (large requests, session creation, batched forwards) runs on a
pool of worker threads; the kernels release the GIL there.

A call's deadline and cancellation are checked right before its kernel starts, on either
side: a call cancelled or expired while it waited for a worker never runs its kernel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
import numpy as np

from . import errors


class CallState:
    """What a worker thread may ask about its call: whether it still wants its result.
    (The grpc.aio context belongs to the event loop; this holds plain values.)"""

    __slots__ = ("deadline", "cancelled", "identity", "account")

    def __init__(self, context: grpc.aio.ServicerContext, identity: str):
        remaining = context.time_remaining()
        self.deadline = None if remaining is None else time.monotonic() + remaining
        self.cancelled = False
        self.identity = identity  # who is calling (auth.py): the owner of its sessions
        self.account = None  # the call's memory charge (admission.py), when it has one

    def reserve(self, nbytes: int, field: str | None = None) -> None:
        """Charge `nbytes` more to this call before they are allocated (outputs, copies,
        conversions); RESOURCE_EXHAUSTED naming `field` when the server's limit would be
        passed. Safe from any thread. Released with the rest of the call's charge."""
        if self.account is not None:
            self.account.reserve(nbytes, field)

    def ensure_active(self) -> None:
        """Raise unless the call still wants its result (before a kernel starts)."""
        if self.cancelled:
            raise errors.Failure(grpc.StatusCode.CANCELLED, "the call was cancelled before the kernel started")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise errors.Failure(grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed before the kernel started")


class Executor:
    """Runs a call's computation inline or on the worker pool."""

    def __init__(self, workers: int, inline_bytes: int):
        self.inline_bytes = inline_bytes
        self.pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tensorops-worker")

    def inline(self, nbytes: int) -> bool:
        return nbytes <= self.inline_bytes

    async def offload(self, call: CallState, fn: Callable[..., Any], *args) -> Any:
        """fn(*args) on a worker. If the call is cancelled meanwhile, a task still queued
        never starts, and one that started finds `call.cancelled` set; the call's account
        stays charged until that worker is done with what it allocated."""
        work = self.pool.submit(fn, *args)
        future = asyncio.wrap_future(work)
        try:
            return await future
        except asyncio.CancelledError:
            call.cancelled = True
            work.cancel()  # when still queued
            if call.account is not None:
                call.account.hold_until(work)
            raise
        finally:
            # An exception fn raised references this frame (its traceback), and the future
            # references the exception: without this, that cycle would keep the call's
            # arguments (the request's buffers) until the cyclic collector runs.
            del future, work

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


# Multiply-adds of one kernel call of a quantized inner product (about 0.1 s of one
# core): its cost is not bounded by the request's bytes (M x N x K for M x K + K x N
# bytes in), so longer work is split into row blocks with the call's deadline and
# cancellation checked between them.
QIP_BLOCK_MACS = 1 << 28


def qip_rows_per_block(k: int, n: int) -> int:
    return max(1, QIP_BLOCK_MACS // max(1, k * n))


def in_row_blocks(call: CallState, fn: Callable[[Any], Any], a, rows: int, result_bytes: int):
    """fn(a) computed `rows` rows at a time (rows of the result depend on the same rows of
    a only), stopping between blocks if the call no longer wants its result. The blocks
    are joined into one more result of `result_bytes`, charged to the call first."""
    if a.shape[0] <= rows:
        return fn(a)
    call.reserve(result_bytes, "a")
    blocks = []
    for start in range(0, a.shape[0], rows):
        call.ensure_active()
        blocks.append(fn(a[start : start + rows]))
    return np.concatenate(blocks)


# Bytes of a response message beyond its tensors' data (field keys, shape, alignment).
RESPONSE_OVERHEAD = 1024


def reserve_result(call: CallState, field: str, nbytes: int, limit: int) -> None:
    """Before a result of `nbytes` is allocated: refuse it beyond `limit` bytes (the largest
    result a response carries), else charge it and its copy in the encoded response to
    the call (RESOURCE_EXHAUSTED naming `field` either way)."""
    if nbytes > limit:
        raise errors.exhausted(f"the result of {nbytes} bytes would exceed the limit of {limit} bytes", field=field)
    call.reserve(2 * nbytes + RESPONSE_OVERHEAD, field)

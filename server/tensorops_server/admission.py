"""Admission of calls: what a call may hold before and while it runs.

- While its request is arriving, a call holds no worker and no admission slot, only a
  place among the `max_pending` calls still receiving, for at most `read_timeout`
  seconds: a client that stalls mid-message is cut off then (DEADLINE_EXCEEDED). A
  stream (KServe's ModelStreamInfer) waiting for its next request is such a call too: an
  idle stream is closed after `read_timeout` seconds, or earlier when its place is needed. When
  all places are taken, the call that has waited longest for its request loses its
  place (RESOURCE_EXHAUSTED): a complete request is read at once, so streams held open
  on purpose are the ones that go, and they cannot lock out anybody else.
- Once its request has arrived, a call is admitted if fewer than `max_concurrent` calls
  run (0: no limit) and the bytes held by the calls in flight stay within
  `max_inflight_bytes`: a call holds its request and, until it is sent, its response
  (counted as large as the request, the common case; larger results are refused up
  front by the output limits). Beyond either limit the call is refused at once
  (RESOURCE_EXHAUSTED) instead of queueing without bound: load shedding.

Health checks never pass through here: they are served on the event loop, outside
every limit. Everything here runs on the event loop, so plain counters suffice.
"""
from __future__ import annotations

import asyncio

import grpc

from . import errors


class Admission:
    def __init__(self, *, max_pending: int, read_timeout: float, max_concurrent: int, max_inflight_bytes: int):
        self.max_pending = max_pending
        self.read_timeout = read_timeout
        self.max_concurrent = max_concurrent
        self.max_inflight_bytes = max_inflight_bytes
        self._pending: dict[_Waiting, _Waiting] = {}  # oldest first
        self._sweeper: asyncio.Task | None = None
        self.running = 0
        self.inflight_bytes = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def receive(self, context: grpc.aio.ServicerContext, stream: bool = False):
        """The call's request message, read within the read timeout. `stream`: the next
        request of a stream (the same timeout applies to an idle stream; grpc.aio.EOF when
        the client ends it)."""
        if len(self._pending) >= self.max_pending:
            self._pending.pop(next(iter(self._pending))).evict("place")
        loop = asyncio.get_running_loop()
        waiting = _Waiting(asyncio.current_task(), loop.time())
        self._pending[waiting] = waiting
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep())
        try:
            request = await context.read()
        except asyncio.CancelledError:
            if waiting.evicted is None:  # the call itself was cancelled
                raise
            waiting.task.uncancel()
            if waiting.evicted == "place":
                raise errors.exhausted(f"{self.max_pending} other requests were arriving (the server's limit) "
                                       "and this one had waited longest") from None
            if stream:
                raise errors.Failure(grpc.StatusCode.DEADLINE_EXCEEDED,
                                     f"no request arrived on the stream within {self.read_timeout:g} s (the "
                                     "server's read timeout): the stream is closed") from None
            raise errors.Failure(grpc.StatusCode.DEADLINE_EXCEEDED,
                                 f"the request did not arrive within {self.read_timeout:g} s") from None
        finally:
            self._pending.pop(waiting, None)
        if request is grpc.aio.EOF and not stream:
            raise errors.invalid("request", "the call carried no request message")
        return request

    async def _sweep(self) -> None:
        """Cut off the calls whose request has taken longer than the read timeout. (One
        task for all calls: a timer per call would cost more than the rest of a small
        call's admission.)"""
        loop = asyncio.get_running_loop()
        interval = min(1.0, self.read_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            expired = loop.time() - self.read_timeout
            while self._pending:
                oldest = next(iter(self._pending))
                if oldest.since > expired:
                    break
                self._pending.pop(oldest).evict("timeout")

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def admit(self, nbytes: int) -> int:
        """Take a slot for a call of `nbytes`; returns the bytes charged (give them back
        with release())."""
        if self.max_concurrent and self.running >= self.max_concurrent:
            raise errors.exhausted(f"{self.running} calls are running (the server's limit); try again")
        charge = 2 * nbytes
        if self.inflight_bytes + charge > self.max_inflight_bytes and self.running:
            raise errors.exhausted(
                f"the calls in flight hold {self.inflight_bytes} bytes; this one needs {charge} more, beyond the "
                f"server's limit of {self.max_inflight_bytes}; try again")
        self.running += 1
        self.inflight_bytes += charge
        return charge

    def release(self, charge: int) -> None:
        self.running -= 1
        self.inflight_bytes -= charge


class _Waiting:
    """A call whose request is arriving."""

    __slots__ = ("task", "since", "evicted")

    def __init__(self, task: asyncio.Task, since: float):
        self.task = task
        self.since = since
        self.evicted: str | None = None  # why it lost its place: "place" or "timeout"

    def evict(self, reason: str) -> None:
        self.evicted = reason
        self.task.cancel()  # its read ends now

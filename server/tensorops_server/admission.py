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
  run (0: no limit) and its request fits within `max_inflight_bytes` beside what the
  other calls hold; beyond either limit it is refused at once (RESOURCE_EXHAUSTED)
  instead of queueing without bound: load shedding.
- An admitted call has one memory account (`Account`) from then until gRPC has sent its
  response or the call ended (and no worker computes for it any more): its request (and
  a copy made while decoding it, if any), then, before they are allocated, its result and
  its encoded response (the result's size comes from the decoded arguments:
  optable.Entry.result). A reservation that would pass `max_inflight_bytes` is refused
  at once, naming the argument that asks for it. An unsent response keeps its charge:
  responses waiting for a client that does not read count like any other. grpcio's
  asyncio server cannot cut one call off while its response waits for the peer's flow
  control; the connection carrying it is closed, and its responses freed, at the latest
  `max_connection_age` (+10% jitter) + `max_connection_age_grace` seconds after it
  opened (with either set to 0, only when the client goes away: the memory bound holds
  all the same, but such a client keeps its share of the limit).

The memory bound: the accounts together never hold more than `max_inflight_bytes`, and
every buffer of a call that grows with its data is charged before it exists, so the
server's resident memory stays within

    max_inflight_bytes
    + the requests still arriving: up to `max_pending` messages of `max_message_bytes`
      in gRPC's buffers, and one more being copied out of them on the event loop (the
      copy is charged, or refused and freed, before the loop runs anything else)
    + the session store's `max_session_bytes`
    + CONNECTION_BYTES per open connection (gRPC's buffers; at most `max_connections`)
    + a fixed overhead: the process at rest (about 75 MiB: interpreter, NumPy, gRPC,
      the kernels, thread stacks) and what malloc keeps for reuse (up to
      4 x min(max_message_bytes, 32 MiB) at the top of each heap:
      tensorops.retain_freed_buffers).

There is no exception for a large call when nothing else runs: a call that needs more
than the limit is refused even then.

A call that arrives once the server began to drain (`begin_drain()`, on SIGTERM) is
refused with UNAVAILABLE, so that its client retries on another instance.

Health checks never pass through here: they are served on the event loop, outside
every limit. Receiving and admission run on the event loop; accounts are also charged
from worker threads, so the byte count is guarded by a lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import grpc

from . import errors

# Resident memory of one open, idle client connection (measured: about 21 KB once its
# HTTP/2 handshake is done, 14 KB while silent), in the memory bound stated above.
CONNECTION_BYTES = 20 << 10


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
        self._lock = threading.Lock()  # inflight_bytes, charged from worker threads too
        self.draining = False

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def receive(self, context: grpc.aio.ServicerContext, stream: bool = False):
        """The call's request message, read within the read timeout. `stream`: the next
        request of a stream (the same timeout applies to an idle stream; grpc.aio.EOF when
        the client ends it)."""
        if self.draining:
            raise draining()
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
            if waiting.evicted == "drain":
                raise draining() from None
            if waiting.evicted == "place":
                raise errors.exhausted(
                    f"{self.max_pending} other requests were arriving (the server's limit) "
                    "and this one had waited longest"
                ) from None
            if stream:
                raise errors.Failure(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"no request arrived on the stream within {self.read_timeout:g} s (the "
                    "server's read timeout): the stream is closed",
                ) from None
            raise errors.Failure(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"the request did not arrive within {self.read_timeout:g} s"
            ) from None
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

    def admit(self, nbytes: int) -> Account:
        """Admit a call whose request takes `nbytes`: its account, charged those bytes.
        Close it when the response was sent (or the call ended)."""
        if self.draining:
            raise draining()
        if self.max_concurrent and self.running >= self.max_concurrent:
            raise errors.exhausted(f"{self.running} calls are running (the server's limit); try again")
        account = Account(self)
        account.reserve(nbytes, None, "the request")
        self.running += 1
        account.running = True
        return account

    def _charge(self, nbytes: int, field: str | None, what: str) -> None:
        with self._lock:
            if self.inflight_bytes + nbytes > self.max_inflight_bytes:
                held = self.inflight_bytes
            else:
                self.inflight_bytes += nbytes
                return
        raise errors.exhausted(
            f"{what} needs {nbytes} bytes; the calls in flight hold {held}, and the server's limit is "
            f"{self.max_inflight_bytes} (--max-inflight-bytes); try again",
            field=field,
        )

    def _refund(self, nbytes: int) -> None:
        with self._lock:
            self.inflight_bytes -= nbytes

    def begin_drain(self) -> None:
        """From now on, calls get UNAVAILABLE: those still receiving their request at once,
        new ones as they arrive."""
        self.draining = True
        while self._pending:
            self._pending.pop(next(iter(self._pending))).evict("drain")


def draining() -> errors.Failure:
    return errors.Failure(
        grpc.StatusCode.UNAVAILABLE, "the server is shutting down; retry the call on another instance"
    )


class Account:
    """The bytes one call holds, from its admission until its response was sent or the
    call ended (and no worker still computes for it). reserve() may be called from any
    thread; close() gives everything back once nothing holds it any more."""

    __slots__ = ("_admission", "_lock", "nbytes", "running", "closed", "_holds")

    def __init__(self, admission: Admission):
        self._admission = admission
        self._lock = threading.Lock()
        self.nbytes = 0
        self.running = False  # counted among the running calls (max_concurrent)
        self.closed = False
        self._holds = 0  # workers still computing for the ended call

    def reserve(self, nbytes: int, field: str | None = None, what: str = "this call") -> None:
        """Charge `nbytes` more before allocating them; RESOURCE_EXHAUSTED naming `field`
        beyond the server's limit."""
        if nbytes <= 0:
            return
        with self._lock:
            if self.closed:  # the call ended meanwhile (a worker still finishing): stop it there
                raise errors.Failure(grpc.StatusCode.CANCELLED, "the call ended")
            self._admission._charge(nbytes, field, what)
            self.nbytes += nbytes

    def stop_running(self) -> None:
        """The call's computation is over (its response may still be unsent). On the loop."""
        if self.running:
            self.running = False
            self._admission.running -= 1

    def hold_until(self, work: concurrent.futures.Future) -> None:
        """Keep the charge after close() until `work` (a worker of the cancelled call,
        which may still hold what it allocated) is done."""
        with self._lock:
            self._holds += 1
        work.add_done_callback(lambda _: self._release_hold())

    def _release_hold(self) -> None:
        with self._lock:
            self._holds -= 1
        self._refund_if_done()

    def close(self) -> None:
        """The call ended: give its bytes back (at once, or when the last hold ends)."""
        self.stop_running()
        with self._lock:
            self.closed = True
        self._refund_if_done()

    def _refund_if_done(self) -> None:
        with self._lock:
            if not self.closed or self._holds:
                return
            nbytes, self.nbytes = self.nbytes, 0
        self._admission._refund(nbytes)


class _Waiting:
    """A call whose request is arriving."""

    __slots__ = ("task", "since", "evicted")

    def __init__(self, task: asyncio.Task, since: float):
        self.task = task
        self.since = since
        self.evicted: str | None = None  # why it lost its place: "place", "timeout" or "drain"

    def evict(self, reason: str) -> None:
        self.evicted = reason
        self.task.cancel()  # its read ends now

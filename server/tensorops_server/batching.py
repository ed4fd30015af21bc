"""Dynamic batching of quantized inner-product forwards.

Concurrent Forward calls on one session are merged into one kernel call: their rows are
stacked (M = the sum of their rows), the kernel runs once on a worker, and each caller
gets its own rows back. Rows of a quantized inner product are independent and computed
exactly (integer accumulation, one fp32 requantization per element), so every caller's
result is bit-identical to a separate call.

Per session, one batch runs at a time. A forward that arrives while it runs waits in the
session's queue; when the batch ends, everything queued (up to `max_rows` rows) forms
the next batch. So a lone caller never waits for company, and under load a batch grows
to the number of callers. `window` adds a fixed wait before each batch for more rows.

Each caller keeps its own fate: one whose deadline passed or who cancelled before its
batch started is left out of it, and a session released while forwards wait fails
those forwards with NOT_FOUND. A request that is not plainly batchable (more rows than
`max_rows`, or an array the kernel will refuse) runs alone and gets its own error.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from . import errors
from .execution import CallState, Executor, in_row_blocks, qip_rows_per_block, reserve_result


@dataclass(eq=False)
class _Waiting:
    a: np.ndarray
    call: CallState
    result: asyncio.Future
    work: Future | None = None  # the kernel call of its batch, once started


@dataclass(eq=False)
class SessionQueue:
    """Forwards waiting for the running batch of one session."""

    waiting: collections.deque = field(default_factory=collections.deque)
    draining: bool = False


class ForwardBatcher:
    def __init__(
        self,
        executor: Executor,
        *,
        max_rows: int,
        window: float,
        result_limit: int,
        observe: Callable[[int, int], None],
        time_kernel: Callable[[float], None],
    ):
        self.executor = executor
        self.max_rows = max_rows
        self.window = window
        self.result_limit = result_limit
        self._observe = observe  # (requests, rows) of each kernel call
        self._time_kernel = time_kernel  # seconds of each kernel call
        self._drains: set[asyncio.Task] = set()

    async def forward(self, session, a: np.ndarray, call: CallState) -> np.ndarray:
        """The session's forward of `a`, batched with concurrent forwards when possible.
        Its result (and response) is charged to the call first; a batched forward also
        its rows' share of the stacked input."""
        if a.ndim == 2:
            reserve_result(call, "a", a.shape[0] * session.shape[0], self.result_limit)
        if self.max_rows == 1 or not self._batchable(session, a):
            return await self.executor.offload(call, self._alone, session, a, call)
        call.reserve(a.nbytes, "a")
        if session.queue is None:
            session.queue = SessionQueue()
        queue = session.queue
        waiting = _Waiting(a, call, asyncio.get_running_loop().create_future())
        queue.waiting.append(waiting)
        if not queue.draining:
            queue.draining = True
            task = asyncio.create_task(self._drain(session, queue))
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)
        try:
            return await waiting.result
        except asyncio.CancelledError:
            call.cancelled = True  # left out of a batch that has not started
            if waiting.work is not None and call.account is not None:  # its rows are being computed
                call.account.hold_until(waiting.work)
            raise

    def _batchable(self, session, a) -> bool:
        return a.dtype == np.uint8 and a.ndim == 2 and 0 < a.shape[0] < self.max_rows and a.shape[1] == session.shape[1]

    def _alone(self, session, a, call: CallState) -> np.ndarray:
        call.ensure_active()
        if a.ndim == 2:
            n, k = session.shape
            result = in_row_blocks(
                call, lambda rows: self._kernel(session, rows), a, qip_rows_per_block(k, n), a.shape[0] * n
            )
        else:  # refused by the kernel, naming it
            result = self._kernel(session, a)
        self._observe(1, a.shape[0])
        return result

    def _kernel(self, session, a) -> np.ndarray:
        start = time.perf_counter()
        try:
            result = session.context.forward(a)
        except errors.NATIVE_ERRORS as exc:
            raise errors.from_native(exc) from None
        self._time_kernel(time.perf_counter() - start)
        return result

    async def _drain(self, session, queue: SessionQueue) -> None:
        try:
            while queue.waiting:
                if self.window:
                    await asyncio.sleep(self.window)
                batch = self._take(queue)
                if session.retired:
                    self._fail_all(batch, queue)
                    return
                if batch:
                    await self._run(session, batch)
        finally:
            queue.draining = False

    def _take(self, queue: SessionQueue) -> list[_Waiting]:
        """The next batch: callers still waiting, in arrival order, up to max_rows rows."""
        batch, rows = [], 0
        while queue.waiting and rows + queue.waiting[0].a.shape[0] <= self.max_rows:
            waiting = queue.waiting.popleft()
            if waiting.result.done():  # cancelled meanwhile
                continue
            try:
                waiting.call.ensure_active()
            except errors.Failure as failure:
                waiting.result.set_exception(failure)
                continue
            batch.append(waiting)
            rows += waiting.a.shape[0]
        return batch

    @staticmethod
    def _fail_all(batch: list[_Waiting], queue: SessionQueue) -> None:
        lost = errors.not_found("the quantized inner-product session was released while this forward waited")
        for waiting in (*batch, *queue.waiting):
            if not waiting.result.done():
                waiting.result.set_exception(lost)
        queue.waiting.clear()

    async def _run(self, session, batch: list[_Waiting]) -> None:
        loop = asyncio.get_running_loop()
        a = batch[0].a if len(batch) == 1 else np.concatenate([w.a for w in batch])
        work = self.executor.pool.submit(self._kernel, session, a)
        for waiting in batch:
            waiting.work = work
        try:
            c = await asyncio.wrap_future(work)
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0], exception=exc)
                return
            # Unexpected for validated rows (e.g. out of memory): run each caller alone so
            # that a failure reaches only the caller it belongs to.
            for waiting in batch:
                try:
                    _settle(
                        waiting, result=await loop.run_in_executor(self.executor.pool, self._kernel, session, waiting.a)
                    )
                except Exception as alone:
                    _settle(waiting, exception=alone)
            return
        self._observe(len(batch), a.shape[0])
        row = 0
        for waiting in batch:
            rows = waiting.a.shape[0]
            _settle(waiting, result=c[row : row + rows])
            row += rows

    async def wait_idle(self) -> None:
        """Wait for the batches under way (used when the server stops)."""
        if self._drains:
            await asyncio.gather(*self._drains, return_exceptions=True)


def _settle(waiting: _Waiting, *, result=None, exception=None) -> None:
    if waiting.result.done():  # the caller went away while its batch ran
        return
    if exception is not None:
        waiting.result.set_exception(exception)
    else:
        waiting.result.set_result(result)

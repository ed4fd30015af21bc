"""Steady load for the failure scenarios (tests/e2e/test_balancer.py with processes,
tests/deploy with containers): client threads calling at a fixed rate, each result checked
bit for bit against the in-process kernels, every failure and latency recorded."""

from __future__ import annotations

import threading
import time

import numpy as np

import tensorops
import tensorops_native as tn


def stateless_cases():
    """(call, expected) pairs of cheap operations, checked bit for bit."""
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((2, 4, 64)).astype(np.float32)
    img = rng.standard_normal((2, 4, 4, 8)).astype(np.float32)
    scale, shift = rng.standard_normal((2, 8)).astype(np.float32)
    return [
        (lambda c: c.softmax(x), tn.softmax(x)),
        (
            lambda c: c.layer_norm_channels(img, scale, shift, format="nhwc"),
            tn.layer_norm_channels(img, scale, shift, format="nhwc"),
        ),
        (lambda c: c.unary(x, "exp"), tn.unary(x, "exp")),
        (lambda c: c.eltwise([x, y], "sum"), tn.eltwise([x, y], "sum")),
    ]


class Load:
    """`threads` threads, each with a client of its own (its own connection), calling at
    `rate` calls/s until stopped (at most `limit` seconds) and checking every result:
    stateless operations, or, with `session=(b, params, a, expected)`, the forwards of one
    session per thread."""

    def __init__(
        self, target: str, threads: int, rate: float, *, max_attempts: int = 1, session=None, limit: float = 90.0
    ):
        self.target, self.rate, self.max_attempts, self.session, self.limit = target, rate, max_attempts, session, limit
        self.cases = stateless_cases()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.calls = self.wrong = 0
        self.failures: list[str] = []
        self.latencies: list[float] = []
        self.recreated: list[int] = []
        self.opened = threading.Semaphore(0)
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)
        assert not any(t.is_alive() for t in self.threads)

    def wait_opened(self, timeout: float = 20.0) -> None:
        for _ in self.threads:
            assert self.opened.acquire(timeout=timeout), "a load thread could not start"

    def _run(self) -> None:
        with tensorops.Client(self.target, timeout=10, max_attempts=self.max_attempts) as c:
            if self.session is None:
                calls, session = self.cases, None
            else:
                b, p, a, expected = self.session
                session = c.quantized_inner_product(b, **p)
                calls = [(lambda _c: session.forward(a), expected)]
            self.opened.release()
            start, n = time.monotonic(), 0
            while not self.stopping.is_set() and time.monotonic() < start + self.limit:
                call, expected = calls[n % len(calls)]
                began = time.monotonic()
                try:
                    ok, failure = bool(np.array_equal(call(c), expected)), None
                except tensorops.TensorOpsError as exc:
                    ok, failure = False, f"{type(exc).__name__}: {exc}"
                with self.lock:
                    self.calls += 1
                    self.latencies.append(time.monotonic() - began)
                    if failure is not None:
                        self.failures.append(failure)
                    elif not ok:
                        self.wrong += 1
                n += 1
                self.stopping.wait(max(0.0, start + n / self.rate - time.monotonic()))
            if session is not None:
                with self.lock:
                    self.recreated.append(session.recreated)
                session.close()

    def summary(self) -> str:
        worst = max(self.latencies, default=0.0)
        return (
            f"{self.calls} calls, {len(self.failures)} failed, {self.wrong} wrong, worst latency {worst * 1000:.0f} ms"
        )

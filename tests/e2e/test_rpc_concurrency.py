"""8 client threads x mixed operations against one server: every result correct."""

from __future__ import annotations

import threading

import numpy as np

import tensorops
import tensorops_native as tn
from rpc_cases import cases, same


def test_eight_threads_mixed_operations(server):
    runnable = [c for c in cases(seed=1) if not c.missing()]
    empty = [
        ("softmax", (np.zeros((0, 7), np.float32),), {}),
        ("unary", (np.zeros((3, 0), np.float32), "sqrt"), {}),
        ("eltwise", ([np.zeros((0, 2), np.float32)] * 2, "max"), {}),
    ]
    calls = [(c.op, c.args, c.kwargs) for c in runnable] + empty
    expected = [getattr(tn, op)(*args, **kwargs) for op, args, kwargs in calls]
    failures, errors = [], []
    with tensorops.Client(server.target, timeout=60) as client:  # one channel shared by the threads

        def worker(t):
            try:
                for i in range(t, t + 3 * len(calls)):
                    op, args, kwargs = calls[i % len(calls)]
                    if not same(expected[i % len(calls)], getattr(client, op)(*args, **kwargs)):
                        failures.append((t, op))
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(repr(exc))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == [] and failures == []

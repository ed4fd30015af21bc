"""SIGTERM: the server stops taking calls, finishes the call in flight, and exits 0."""
from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

import tensorops
from rpc_server import metric_value


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_call_in_flight_completes_and_exit_is_clean(start_server, signum):
    srv = start_server("--grace", "30", "--workers", "2")
    result, errors, done = [], [], []
    n = 120_000  # many empty inputs: a worker stays busy on decoding and checks, no kernel needed

    def call():
        try:
            with tensorops.Client(srv.target, timeout=60, max_attempts=1) as c:
                result.append(c.eltwise([np.zeros(0, np.float32)] * n, "sum"))
                done.append(time.monotonic())
        except Exception as exc:
            errors.append(exc)
    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 20
    while metric_value(srv.metrics_text(), "tensorops_requests_in_flight", operation="eltwise") < 1:
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.005)
    signalled = time.monotonic()
    srv.signal(signum)
    thread.join(60)
    assert errors == [] and len(result) == 1 and result[0].shape == (0,)
    assert done[0] > signalled  # the call was still running when the signal arrived
    assert srv.wait(30) == 0
    events = [e["event"] for e in srv.events()]
    assert events[-2:] == ["draining", "stopped"]
    with tensorops.Client(srv.target, timeout=2, max_attempts=1) as c:  # gone: UNAVAILABLE
        with pytest.raises(tensorops.UnavailableError):
            c.softmax(np.zeros(1, np.float32))

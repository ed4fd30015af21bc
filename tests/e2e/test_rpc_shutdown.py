"""SIGTERM: the server stops taking calls, finishes the call in flight, and exits 0."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

import tensorops
from rpc_server import LongCall


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_call_in_flight_completes_and_exit_is_clean(start_server, signum):
    srv = start_server("--grace", "30", "--threads", "2")
    long_call = LongCall(srv)
    signalled = time.monotonic()
    srv.signal(signum)
    long_call.join()
    assert long_call.errors == [] and len(long_call.result) == 1 and long_call.result[0].shape == long_call.shape
    assert long_call.finished_at > signalled  # the call was still running when the signal arrived
    assert srv.wait(30) == 0
    events = [e["event"] for e in srv.events() if "worker" not in e]  # the server's, not each worker's
    assert events[-2:] == ["draining", "stopped"]
    with tensorops.Client(srv.target, timeout=2, max_attempts=1) as c:  # gone: UNAVAILABLE
        with pytest.raises(tensorops.UnavailableError):
            c.softmax(np.zeros(1, np.float32))

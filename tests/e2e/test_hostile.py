"""The hostile campaign (tests/e2e/hostile.py) at the "ci" sizes, each row
against a fresh live server with small explicit caps: the attack is refused at once
(RESOURCE_EXHAUSTED or INVALID_ARGUMENT, or the row's documented behavior), the server's
peak resident memory stays within its caps plus a fixed overhead, health answers quickly
during the attack, legitimate calls still succeed and the server is alive.

bench/hostile.py runs the same attacks at their full sizes, in a memory cgroup. With
HOSTILE_SERVER=/path/to/tensorops-server, these tests run against that build instead (an
older one fails them)."""

from __future__ import annotations

import os

import grpc
import pytest

import hostile
from rpc_server import ServerProcess

MiB = 1 << 20
INFLIGHT = 64 * MiB
# The caps of every server here: small, so that what an attack could hold beyond them shows.
# One worker: the probe reads one process's peak memory, descriptors and health against the
# caps and this process's overhead (several workers split the caps; see test_workers.py).
CAPS = (
    "--workers",
    "1",
    "--max-inflight-bytes",
    str(INFLIGHT),
    "--max-message-bytes",
    str(16 * MiB),
    "--max-tensor-bytes",
    str(16 * MiB),
    "--max-session-bytes",
    str(32 * MiB),
)
# What an idle server holds (interpreter, NumPy, grpc, the kernels, worker threads) plus
# allocator slack: measured near 75 MiB idle; peaks beyond the caps stay under this.
OVERHEAD = 160 * MiB
# Health during an attack must stay under 100 ms: measured at most 45 ms here (a check takes
# about 1 ms on an idle server; the rest is the attack's load on a 2-core machine), while
# the attacks blocked the event loop for seconds before.
HEALTH = 0.1
# While the server accepts and closes hundreds of connections on its event loop (rows 9
# and 10) health was measured up to 85 ms; before, the metrics threads delayed it past 1 s.
HEALTH_UNDER_CONNECTIONS = 0.25
REFUSE = 1.0  # seconds

REFUSALS = {grpc.StatusCode.RESOURCE_EXHAUSTED.name, grpc.StatusCode.INVALID_ARGUMENT.name}


@pytest.fixture
def attack(tmp_path):
    """attack(row) -> the row's Outcome against a fresh server with CAPS and the row's
    flags (and file-descriptor limit)."""
    servers = []

    def run(row: int) -> hostile.Outcome:
        preexec = hostile.limit_fds(hostile.ROW_FD_LIMIT[row]) if row in hostile.ROW_FD_LIMIT else None
        command = [os.environ["HOSTILE_SERVER"]] if os.environ.get("HOSTILE_SERVER") else None
        srv = ServerProcess(
            tmp_path / f"row{row}.log", *CAPS, *hostile.ROW_FLAGS.get(row, ()), command=command, preexec_fn=preexec
        )
        servers.append(srv.start())
        out = hostile.run(row, hostile.Target(srv.target, srv.proc.pid, srv.metrics_port), "ci")
        print(out)  # with -s: the measurements
        return out

    yield run
    for srv in servers:
        srv.kill()


def assert_survived(out: hostile.Outcome, health: float = HEALTH) -> None:
    assert out.alive, out
    assert out.legitimate_ok, out
    assert out.max_health_latency < health, out
    assert out.peak_rss <= INFLIGHT + OVERHEAD, out


def assert_refused_at_once(out: hostile.Outcome) -> None:
    assert out.details.get("code") in REFUSALS, out
    assert out.refused_after is not None and out.refused_after < REFUSE, out
    assert_survived(out)


def test_row1_stacked_operands_of_no_bytes_are_counted_before_any_work(attack):
    assert_refused_at_once(attack(1))


def test_row2_an_output_listed_twice_is_refused(attack):
    assert_refused_at_once(attack(2))


def test_row3_responses_a_client_does_not_read_stay_within_the_inflight_cap(attack):
    """Results waiting for a window that never opens hold their charge: once the cap is
    reached, further calls are refused (their trailers need no window)."""
    out = attack(3)
    assert out.details["code"] == grpc.StatusCode.RESOURCE_EXHAUSTED.name, out
    held = out.details["unanswered"]  # admitted, their results waiting in the server
    assert held * hostile.result_bytes(hostile.SCALES["ci"][3]["side"]) <= INFLIGHT, out
    assert_refused_at_once(out)


def test_row4_large_parameter_values_are_refused_before_conversion(attack):
    out = attack(4)
    assert out.details["refused"] == out.details["sent"], out
    assert_refused_at_once(out)


def test_row5_millions_of_empty_operands_are_refused(attack):
    assert_refused_at_once(attack(5))


def test_row6_a_shared_memory_object_shrunk_under_calls_fails_those_calls_only(attack):
    """Such a call fails with INVALID_ARGUMENT and the server drops the region (NOT_FOUND
    until the attacker registers it again); every other call is served."""
    out = attack(6)
    codes = out.details["codes"]
    assert set(codes) <= {"OK", "INVALID_ARGUMENT", "NOT_FOUND"}, out
    assert codes.get("OK", 0) > 0 and codes.get("INVALID_ARGUMENT", 0) > 0, out
    assert out.refused_after is None or out.refused_after < REFUSE, out
    assert_survived(out)


def test_row7_long_model_names_are_refused(attack):
    out = attack(7)
    assert out.details["loaded"] == 0, out
    assert_refused_at_once(out)


def test_row8_one_caller_cannot_take_every_shared_memory_region(attack):
    """Caller A reaches its own cap, below the server's (64 regions by default); caller B
    still registers a region and reads it (legitimate_ok)."""
    out = attack(8)
    assert out.details["registered"] < 64, out
    assert_refused_at_once(out)


def test_row9_slow_metrics_clients_take_no_thread_each(attack):
    out = attack(9)
    threads = out.details["threads"]
    assert threads["peak"] - threads["before"] < 64, out
    assert out.details["metrics_ok"], out
    assert_survived(out, HEALTH_UNDER_CONNECTIONS)


def test_row10_silent_connections_do_not_lock_new_clients_out(attack):
    out = attack(10)
    assert out.details["new_clients_answered"] == out.details["new_clients"] > 0, out
    assert_survived(out, HEALTH_UNDER_CONNECTIONS)

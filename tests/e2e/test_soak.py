"""A bounded soak run: 4 client threads, two callers (tokens) with two threads each, call
one real server for TENSOROPS_SOAK_SECONDS (60 by default), mixing operations of 1 KB -
1 MB with results checked bit for bit against tensorops_native in-process, quantized
inner-product sessions created, used, described, listed and released (more than the
server lets a caller keep, so some are evicted and re-created by the client), and calls
that must fail (a wrong dtype, no token). The server's resident memory is sampled every
second: after the warm-up it must not keep growing. At the end neither caller has a
session, the metrics count none and no INTERNAL or UNKNOWN answer, and the server stops
cleanly.

docs/fuzz-and-soak.md tells how to run it longer and what it checks.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

import grpc
import ml_dtypes
import numpy as np
import pytest

import tensorops
import tensorops_native as tn
from rpc_cases import qip_params, same
from rpc_server import metric_value, resident_bytes

SECONDS = float(os.environ.get("TENSOROPS_SOAK_SECONDS", "60"))
TOKENS = ("soak-alpha-token", "soak-beta-token")
THREADS = 4  # thread i calls as TOKENS[i % 2]
MAX_SESSIONS = 8  # the server's cap
PER_CALLER = 3  # the server's cap per caller (its own least recently used evicted)
SESSIONS_PER_THREAD = 2  # 2 threads x 2 = 4 wanted per caller against 3: evictions, re-creations
WARM_UP = 0.2  # the first 20% of the run: memory may grow (allocator pools, caches)
CALL_TIMEOUT = 30.0
# Resident memory of the server may rise by at most this much from the peak of the second
# third of the run to the peak of the last third. What the server holds in steady state
# does not grow with time: 4 clients have at most 4 calls in flight, each holding its
# request and result (< 3 MB), plus at most 8 small sessions (< 1 MB each), and glibc keeps
# freed blocks for reuse (the server raises its trim threshold: retain_freed_buffers), so
# once warm the heaps sit at their high-water mark and the RSS moves by a few MiB. 64 MiB
# is far above that noise and below what a leak costs over a minute: losing one 1 MB
# buffer per hundred calls, or 10 KB per call (several thousand calls a minute), passes it.
RSS_GROWTH_BOUND = 64 << 20
BF16 = ml_dtypes.bfloat16


class Soak:
    """The counts of one run, shared by the client threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls: Counter = Counter()  # kind -> calls that returned the right result
        self.errors: Counter = Counter()  # status code -> failed calls (expected or not)
        self.problems: list[str] = []  # wrong results and unexpected errors
        self.recreated = 0

    def count(self, kind: str, n: int = 1) -> None:
        with self.lock:
            self.calls[kind] += n

    def failed(self, code: grpc.StatusCode) -> None:
        with self.lock:
            self.errors[code.name] += 1

    def problem(self, kind: str, what: str) -> None:
        with self.lock:
            if len(self.problems) < 50:
                self.problems.append(f"{kind}: {what}")


def elements(rng) -> int:
    """float32 elements of a payload between 1 KB and 1 MB (log-uniform)."""
    return max(1, int(np.exp(rng.uniform(np.log(1 << 10), np.log(1 << 20)))) // 4)


def stateless_call(rng, kind: str):
    """(remote call on a client, expected result) of one random call of `kind`."""
    n = elements(rng)
    if kind == "layer_norm_channels":
        c = int(rng.choice([8, 16, 32, 64, 128]))
        fmt = str(rng.choice(["nchw", "nhwc"]))
        spatial = max(1, n // c)
        x = rng.standard_normal((1, c, spatial) if fmt == "nchw" else (1, spatial, c)).astype(np.float32)
        if rng.random() < 0.25:
            x = x.astype(BF16)
        scale, shift = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
        return (lambda cl: cl.layer_norm_channels(x, scale, shift, format=fmt)), tn.layer_norm_channels(
            x, scale, shift, format=fmt
        )
    if kind == "softmax":
        cols = int(rng.choice([8, 64, 333, 1024]))
        x = (rng.standard_normal((max(1, n // cols), cols)) * 4).astype(np.float32)
        axis = int(rng.choice([-1, 0]))
        return (lambda cl: cl.softmax(x, axis=axis)), tn.softmax(x, axis=axis)
    if kind == "unary":
        x = (rng.standard_normal(n) * 3).astype(np.float32)
        op = str(rng.choice(list(tn.UNARY_OPS)))
        return (lambda cl: cl.unary(x, op)), tn.unary(x, op)
    if kind == "eltwise":
        inputs = [rng.standard_normal(n).astype(np.float32) for _ in range(int(rng.integers(2, 4)))]
        op = str(rng.choice(list(tn.ELTWISE_OPS)))
        weights = list(rng.standard_normal(len(inputs))) if op == "sum" and rng.random() < 0.5 else None
        return (lambda cl: cl.eltwise(inputs, op, weights)), tn.eltwise(inputs, op, weights)
    if kind == "normalize":
        c = int(rng.choice([4, 8, 32]))
        x = rng.standard_normal((2, c, max(1, n // (2 * c)))).astype(np.float32)
        groups = int(rng.choice([1, 2, 4]))
        scale, bias = (
            rng.standard_normal((1, c, 1)).astype(np.float32),
            rng.standard_normal((1, c, 1)).astype(np.float32),
        )
        kwargs = dict(axes=[1, 2], num_groups=groups, eps=1e-5, activation=str(rng.choice(["relu", "gelu", "tanh"])))
        return (lambda cl: cl.normalize(x, scale, bias, **kwargs)), tn.normalize(x, scale, bias, **kwargs)
    raise AssertionError(kind)


STATELESS = ("layer_norm_channels", "softmax", "unary", "eltwise", "normalize")


def failing_call(rng, anonymous: tensorops.Client):
    """(remote call, the status and field it must fail with) of a call that must fail: a
    wrong dtype, or no token (on a client without one)."""
    x = rng.standard_normal(int(rng.integers(1, 4096)))
    choice = int(rng.integers(4))
    if choice == 0:
        return (lambda cl: cl.softmax(x)), grpc.StatusCode.INVALID_ARGUMENT, "x"  # float64
    if choice == 1:
        return (lambda cl: cl.unary(x.astype(np.int32), "abs")), grpc.StatusCode.INVALID_ARGUMENT, "x"
    if choice == 2:
        scale = np.ones(4, np.int8).astype(BF16)
        return (
            (lambda cl: cl.layer_norm_channels(np.ones((1, 4, 2), np.float32), scale, scale)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "scale",
        )
    x32 = x.astype(np.float32)
    return (lambda cl: anonymous.softmax(x32)), grpc.StatusCode.UNAUTHENTICATED, None


class Sessions:
    """One thread's quantized inner-product sessions, each with its in-process twin."""

    def __init__(self, client: tensorops.Client, soak: Soak, rng):
        self.client, self.soak, self.rng = client, soak, rng
        self.open: list[tuple] = []

    def step(self) -> None:
        rng = self.rng
        if len(self.open) < SESSIONS_PER_THREAD and (not self.open or rng.random() < 0.4):
            k, n = int(rng.choice([16, 64, 256, 1024])), int(rng.choice([8, 32, 128]))
            b = rng.integers(-128, 128, (k, n), dtype=np.int8)
            params = qip_params(rng, n)
            self.open.append(
                (
                    self.client.quantized_inner_product(b, **params, timeout=CALL_TIMEOUT),
                    tn.QuantizedInnerProduct(b, **params),
                    k,
                )
            )
            self.soak.count("session create")
        i = int(rng.integers(len(self.open)))
        session, local, k = self.open[i]
        recreated = session.recreated
        for _ in range(int(rng.integers(1, 5))):
            a = rng.integers(0, 256, (int(rng.integers(1, 65)), k), dtype=np.uint8)
            got = session.forward(a, timeout=CALL_TIMEOUT)  # re-creates the session if it was evicted
            if same(local.forward(a), got):
                self.soak.count("session forward")
            else:
                self.soak.problem("session forward", f"wrong result for a of shape {a.shape}")
        if rng.random() < 0.2:
            described = session.describe(timeout=CALL_TIMEOUT)
            if (described["n"], described["k"]) == (local.n, local.k):
                self.soak.count("session describe")
            else:
                self.soak.problem("session describe", f"{described} for n={local.n}, k={local.k}")
        with self.soak.lock:
            self.soak.recreated += session.recreated - recreated
        if rng.random() < 0.3:
            self.close(i)

    def close(self, i: int) -> None:
        session, local, _ = self.open.pop(i)
        session.close(timeout=CALL_TIMEOUT)  # an evicted session counts as released
        local.close()
        self.soak.count("session release")

    def close_all(self) -> None:
        while self.open:
            self.close(0)


def client_thread(target: str, token: str, soak: Soak, seed: int, deadline: float) -> None:
    rng = np.random.default_rng(seed)
    with (
        tensorops.Client(target, timeout=CALL_TIMEOUT, token=token, allow_insecure_token=True) as client,
        tensorops.Client(target, timeout=CALL_TIMEOUT, max_attempts=1) as anonymous,
    ):
        sessions = Sessions(client, soak, rng)
        try:
            while time.monotonic() < deadline:
                draw = rng.random()
                kind = (
                    STATELESS[int(rng.integers(len(STATELESS)))]
                    if draw < 0.72
                    else "session"
                    if draw < 0.92
                    else "list sessions"
                    if draw < 0.95
                    else "must fail"
                )
                try:
                    if kind == "session":
                        sessions.step()
                    elif kind == "list sessions":  # its own only: the other caller's would pass the cap
                        listed = client.list_sessions()
                        soak.count(kind)
                        if len(listed) > PER_CALLER:
                            soak.problem(kind, f"{len(listed)} sessions listed, more than the cap {PER_CALLER}")
                    elif kind == "must fail":
                        call, code, field = failing_call(rng, anonymous)
                        try:
                            call(client)
                            soak.problem(kind, "the call succeeded")
                        except tensorops.TensorOpsError as exc:
                            soak.failed(exc.code)
                            if exc.code is not code or exc.field != field:
                                soak.problem(kind, f"{exc} (field {exc.field}); expected {code.name}, {field}")
                    else:
                        call, expected = stateless_call(rng, kind)
                        got = call(client)
                        if same(expected, got):
                            soak.count(kind)
                        else:
                            soak.problem(kind, f"wrong result of shape {got.shape}")
                except tensorops.TensorOpsError as exc:
                    soak.failed(exc.code)
                    soak.problem(kind, str(exc))
                except Exception as exc:
                    soak.problem(kind, f"{type(exc).__name__}: {exc}")
        finally:
            try:
                sessions.close_all()
            except Exception as exc:
                soak.problem("session release", f"{type(exc).__name__}: {exc}")


@pytest.mark.long
def test_soak(start_server, capsys):
    srv = start_server(
        "--max-sessions",
        str(MAX_SESSIONS),
        "--max-sessions-per-caller",
        str(PER_CALLER),
        env={"TENSOROPS_AUTH_TOKENS": ",".join(TOKENS)},
    )
    pid = srv.proc.pid
    soak = Soak()
    samples: list[tuple[float, int]] = []  # (seconds since the start, resident bytes)
    start = time.monotonic()
    deadline = start + SECONDS
    threads = [
        threading.Thread(target=client_thread, args=(srv.target, TOKENS[i % 2], soak, i, deadline))
        for i in range(THREADS)
    ]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        samples.append((time.monotonic() - start, resident_bytes(pid)))
        time.sleep(1.0)
    for t in threads:
        t.join()
    samples.append((time.monotonic() - start, resident_bytes(pid)))
    listed = {}
    for token in TOKENS:
        with tensorops.Client(srv.target, timeout=CALL_TIMEOUT, token=token, allow_insecure_token=True) as c:
            listed[token] = c.list_sessions()
    text = srv.metrics_text()

    # Memory after the warm-up: the peak of the last third against the peak of the second.
    middle = [rss for t, rss in samples if max(WARM_UP, 1 / 3) * SECONDS <= t < 2 * SECONDS / 3]
    last = [rss for t, rss in samples if t >= 2 * SECONDS / 3]
    rss = [r for _, r in samples]
    mib = 1 << 20
    evicted = metric_value(text, "tensorops_session_evictions_total", reason="capacity")
    unexpected_codes = [
        line
        for line in text.splitlines()
        if line.startswith("tensorops_errors_total")
        and any(f'code="{c}"' in line for c in ("INTERNAL", "UNKNOWN", "DEADLINE_EXCEEDED"))
    ]
    with capsys.disabled():  # shown without -s too
        print(
            f"\nsoak {SECONDS:g} s, {THREADS} threads: {sum(soak.calls.values())} calls "
            f"{dict(sorted(soak.calls.items()))}; errors by code {dict(soak.errors)}; problems "
            f"{len(soak.problems)}; sessions evicted {evicted:g}, re-created {soak.recreated}; server RSS "
            f"start {rss[0] / mib:.0f} MiB, peak {max(rss) / mib:.0f} MiB, end {rss[-1] / mib:.0f} MiB "
            f"(peak of the second third {max(middle) / mib:.0f} MiB, of the last third {max(last) / mib:.0f} MiB)"
        )

    assert not soak.problems, soak.problems
    assert all(soak.calls[kind] > 0 for kind in (*STATELESS, "session create", "session forward")), soak.calls
    assert soak.errors["INVALID_ARGUMENT"] and soak.errors["UNAUTHENTICATED"], soak.errors
    assert set(soak.errors) <= {"INVALID_ARGUMENT", "UNAUTHENTICATED"}, soak.errors
    assert max(last) - max(middle) <= RSS_GROWTH_BOUND, (
        f"server memory grew {(max(last) - max(middle)) / mib:.1f} MiB after the warm-up: {samples}"
    )
    assert listed == {token: [] for token in TOKENS}, listed  # every session released
    assert metric_value(text, "tensorops_sessions_active") == 0
    assert not unexpected_codes, unexpected_codes
    assert srv.stop() == 0

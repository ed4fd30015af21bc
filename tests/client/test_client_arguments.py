"""The clients' own arguments: metadata, timeout and target mistakes are refused before a
call starts, with an error naming the argument (never Python's internals or INTERNAL), the
same for the blocking, asyncio and in-process clients; the forms that are right reach a
real server."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

import tensorops
import tensorops.aio
from rpc_server import ServerProcess
from tensorops._client import normalize_target
from tensorops._operations import check_metadata

X = np.arange(6, dtype=np.float32).reshape(2, 3)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("arguments") / "server.log").start()
    yield proc
    proc.kill()


def call_with(kind: str, target: str, client_kwargs=None, **call_kwargs):
    """softmax(X) through a client of `kind` made with client_kwargs, with call_kwargs."""
    client_kwargs = dict(client_kwargs or {}, max_attempts=1)
    if kind == "sync":
        with tensorops.Client(target, **client_kwargs) as c:
            return c.softmax(X, **call_kwargs)
    if kind == "local":
        with tensorops.LocalClient() as c:
            return c.softmax(X, **call_kwargs)

    async def main():
        async with tensorops.aio.Client(target, **client_kwargs) as c:
            return await c.softmax(X, **call_kwargs)

    return asyncio.run(main())


KINDS = pytest.mark.parametrize("kind", ["sync", "aio", "local"])

GOOD_METADATA = [
    {"x-request-id": "42", "x-trace-bin": b"\x00\xff"},
    [("x-request-id", "42"), ("x-request-id", "43")],
    (("x-a.b_c", "printable ~ ascii"),),
    [["x-request-id", "42"]],
    {},
    None,
]

BAD_METADATA = [
    ({"X-Request-Id": "42"}, "key 'X-Request-Id': expected lowercase"),
    ([("x a", "1")], "key 'x a': expected lowercase"),
    ({"grpc-timeout": "1S"}, "'grpc-' prefix is reserved"),
    ({"x-trace-bin": "text"}, "a '-bin' key takes bytes, got str"),
    ({"x-a": b"bytes"}, "bytes only under keys ending in '-bin'"),
    ({"x-a": "line\nbreak"}, "printable ASCII"),
    ({"x-a": "caf\u00e9"}, "printable ASCII"),
    ({"x-a": 5}, "expected a str value"),
    ([("x-a", "1", "extra")], "item 0: expected a (key, value) pair"),
    (["x-a"], "item 0: expected a (key, value) pair"),
    ("x-a=1", "expected a mapping or (key, value) pairs, got str"),
    (42, "expected a mapping or (key, value) pairs, got int"),
    ({"": "1"}, "key '': expected lowercase"),
]


@KINDS
@pytest.mark.parametrize("metadata", GOOD_METADATA, ids=range(len(GOOD_METADATA)))
def test_metadata_as_mapping_or_pairs_reaches_the_server(server, kind, metadata):
    expected = tensorops.LocalClient().softmax(X)
    assert np.array_equal(call_with(kind, server.target, {"timeout": 30}, metadata=metadata), expected)
    assert np.array_equal(call_with(kind, server.target, {"timeout": 30, "metadata": metadata}), expected)


@KINDS
@pytest.mark.parametrize("metadata,reason", BAD_METADATA, ids=range(len(BAD_METADATA)))
def test_bad_metadata_is_named(server, kind, metadata, reason):
    with pytest.raises(tensorops.InvalidArgumentError) as err:
        call_with(kind, server.target, {"timeout": 30}, metadata=metadata)
    assert err.value.field == "metadata" and reason in str(err.value)
    if kind != "local":
        with pytest.raises(tensorops.InvalidArgumentError, match="metadata: ") as err:
            call_with(kind, server.target, {"metadata": metadata})


def test_checked_metadata_keeps_order_and_duplicates():
    assert check_metadata([("x-a", "1"), ("x-a", "2"), ("x-b-bin", bytearray(b"\x01"))]) == (
        ("x-a", "1"),
        ("x-a", "2"),
        ("x-b-bin", b"\x01"),
    )


@pytest.mark.parametrize("kind", ["sync", "local"])
def test_session_calls_check_metadata_and_timeout(server, kind):
    b = np.ones((4, 3), np.int8)
    a = np.full((2, 4), 9, np.uint8)
    params = dict(b_scale=np.full(3, 0.01, np.float32), a_scale=0.05, a_zero=7, c_scale=0.6, c_zero=3)
    client = tensorops.Client(server.target, timeout=30) if kind == "sync" else tensorops.LocalClient()
    with client, client.quantized_inner_product(b, metadata={"x-request-id": "1"}, **params) as session:
        expected = session.forward(a)
        assert np.array_equal(session.forward(a, metadata={"x-request-id": "2"}, timeout=30), expected)
        with pytest.raises(tensorops.InvalidArgumentError, match="metadata: key 'X-Id'"):
            session.forward(a, metadata={"X-Id": "1"})
        with pytest.raises(tensorops.InvalidArgumentError, match="timeout: "):
            session.external_buffer_size_for(2, timeout="5")
        with pytest.raises(tensorops.InvalidArgumentError, match="metadata: "):
            client.quantized_inner_product(b, metadata=[("x-a",)], **params)


BAD_TIMEOUTS = [
    ("5", "got str '5'"),
    (0, "positive finite"),
    (-1.5, "positive finite"),
    (float("nan"), "positive finite"),
    (float("inf"), "positive finite"),
    (True, "got bool"),
    ([5], "got list"),
]


@KINDS
@pytest.mark.parametrize("timeout,reason", BAD_TIMEOUTS, ids=[repr(t) for t, _ in BAD_TIMEOUTS])
def test_bad_timeout_is_named(server, kind, timeout, reason):
    with pytest.raises(tensorops.InvalidArgumentError) as err:
        call_with(kind, server.target, timeout=timeout)
    assert err.value.field == "timeout" and reason in str(err.value)
    if kind != "local":
        with pytest.raises(tensorops.InvalidArgumentError, match="timeout: "):
            call_with(kind, server.target, {"timeout": timeout})


@KINDS
@pytest.mark.parametrize("timeout", [30, 30.0, np.float32(30), None])
def test_good_timeouts(server, kind, timeout):
    assert call_with(kind, server.target, timeout=timeout).shape == X.shape


TARGETS = [
    ("localhost", "localhost:50051"),
    ("localhost:7000", "localhost:7000"),
    ("10.1.2.3", "10.1.2.3:50051"),
    ("::1", "[::1]:50051"),
    ("2001:db8::1", "[2001:db8::1]:50051"),
    ("[::1]", "[::1]:50051"),
    ("[::1]:7000", "[::1]:7000"),
    ("dns:///tensorops-headless", "dns:///tensorops-headless:50051"),
    ("dns://8.8.8.8/example.com", "dns://8.8.8.8/example.com:50051"),
    ("dns:///example.com:7000", "dns:///example.com:7000"),
    ("dns:example.com", "dns:example.com:50051"),
    ("ipv4:10.0.0.1,10.0.0.2:7000", "ipv4:10.0.0.1:50051,10.0.0.2:7000"),
    ("ipv6:[::1],[::2]:7000", "ipv6:[::1]:50051,[::2]:7000"),
    ("unix:/run/tensorops.sock", "unix:/run/tensorops.sock"),
    ("unix-abstract:tensorops", "unix-abstract:tensorops"),
]


@pytest.mark.parametrize("given,dialed", TARGETS)
def test_a_target_without_port_gets_the_default_port(given, dialed):
    assert normalize_target(given) == dialed
    with tensorops.Client(given) as c:
        assert c.target == dialed


@pytest.mark.parametrize(
    "target,suggestion",
    [
        ("http://localhost:50051", "'localhost:50051'"),
        ("https://example.com", "'example.com:50051'"),
        ("grpc://127.0.0.1:7000/", "'127.0.0.1:7000'"),
        ("GRPCS://[::1]", "'[::1]:50051'"),
    ],
)
def test_a_url_scheme_is_explained(target, suggestion):
    for make in (tensorops.Client, tensorops.aio.Client):
        with pytest.raises(ValueError, match="^target: a gRPC target is 'host:port', not a URL") as err:
            make(target)
        assert f"write {suggestion} instead" in str(err.value) and "root_certificates=" in str(err.value)


@pytest.mark.parametrize("target,error", [("", ValueError), ("  ", ValueError), (None, TypeError), (50051, TypeError)])
def test_a_missing_target_is_named(target, error):
    with pytest.raises(error, match="^target: "):
        tensorops.Client(target)


def test_ipv6_targets_reach_a_server(tmp_path):
    proc = ServerProcess(tmp_path / "server.log", "--host", "::1").start()
    try:
        for target in (f"[::1]:{proc.port}", f"ipv6:[::1]:{proc.port}"):
            with tensorops.Client(target, timeout=30) as c:
                assert c.softmax(X).shape == X.shape
    finally:
        proc.kill()


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(max_attempts="3"), TypeError, "max_attempts: expected an integer, got str"),
        (dict(max_attempts=0), ValueError, "max_attempts: expected 1 .. "),
        (dict(max_message_bytes=2**40), ValueError, "max_message_bytes: expected 1 .. 2147483647"),
        (dict(max_message_bytes=1.5), TypeError, "max_message_bytes: expected an integer"),
        (dict(options=5), TypeError, "options: expected gRPC channel arguments"),
        (dict(options=[("grpc.x",)]), TypeError, "options: expected gRPC channel arguments"),
    ],
)
def test_bad_channel_settings_are_named(kwargs, error, message):
    for make in (tensorops.Client, tensorops.aio.Client):
        with pytest.raises(error, match="^" + re.escape(message)):
            make("127.0.0.1:1", **kwargs)

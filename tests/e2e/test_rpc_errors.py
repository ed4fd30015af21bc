"""Every error class over the wire: the status code, and the field the server names."""
from __future__ import annotations

import socket
import threading
import time

import grpc
import numpy as np
import pytest

import tensorops
from tensorops import _errors, _wire
from tensorops.v1 import tensor_pb2
from tensorops.v1 import tensorops_pb2 as pb
from rpc_server import metric_value


def raw_call(target, rpc, payload: bytes, timeout=30):
    """Send hand-made bytes; returns the TensorOpsError the call ended with."""
    with grpc.insecure_channel(target) as channel:
        try:
            channel.unary_unary(f"/tensorops.v1.TensorOps/{rpc}")(payload, timeout=timeout)
        except grpc.RpcError as exc:
            return _errors.from_rpc_error(exc)
    raise AssertionError("the call succeeded")


def tensor(shape, dtype=tensor_pb2.DATA_TYPE_FP32, data=None, fmt=0):
    if data is None:
        data = b"\0" * (int(np.prod(shape)) * 4)
    return tensor_pb2.Tensor(shape=shape, dtype=dtype, data=data, format=fmt)


@pytest.mark.parametrize("call,field", [
    (lambda c: c.softmax(np.zeros((2, 3), np.float64)), "x"),
    (lambda c: c.softmax(np.zeros((2, 3), np.float32), axis=2), "axis"),
    (lambda c: c.unary(np.zeros(3, np.float32), "expo"), "op"),
    (lambda c: c.eltwise([np.zeros(2, np.float32)], "sum"), "inputs"),
    (lambda c: c.eltwise([np.zeros(2, np.float32), np.zeros(3, np.float32)], "max"), "inputs[1]"),
    (lambda c: c.eltwise([np.zeros(2, np.float32)] * 2, "max", weights=[1, 2]), "weights"),
    (lambda c: c.normalize_l2(np.zeros((1, 2, 3), np.float32), [1, 2, 3]), "scale"),
    (lambda c: c.normalize_l2(np.zeros((1, 2, 3), np.float32), [1, 2], eps=-1.0), "eps"),
    (lambda c: c.layer_norm_channels(np.zeros((1, 2, 3), np.float32), [1, 2], [0, 0, 0]), "shift"),
    (lambda c: c.lrn_cross_channels(np.zeros((1, 2, 3), np.float32), -1, (1, 1, 1)), "half"),
    (lambda c: c.lrn_cross_channels(np.zeros((1, 2, 3), np.float32), 1, (1, 1)), "k"),
    (lambda c: c.shuffle(np.zeros((1, 2, 0), np.float32), np.zeros((1, 2, 0), np.float32), type=2), "type"),
    (lambda c: c.tiled_scale_2d(np.zeros((1, 2, 3), np.float32), np.ones((2, 3)), np.ones((2, 3))), "x"),
    (lambda c: c.channel_sum(np.zeros((1, 2, 3), np.float32)), "x"),
])
def test_invalid_arguments_name_the_field(client, call, field):
    with pytest.raises(tensorops.InvalidArgumentError) as err:
        call(client)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == field


@pytest.mark.parametrize("rpc,message,field", [
    ("Softmax", pb.SoftmaxRequest(x=tensor([2, 3], data=b"\0" * 23)), "x.data"),
    ("Softmax", pb.SoftmaxRequest(x=tensor([2, 3], dtype=0)), "x.dtype"),
    ("Softmax", pb.SoftmaxRequest(x=tensor([2, 3], dtype=42)), "x.dtype"),
    ("Softmax", pb.SoftmaxRequest(x=tensor([2, -3], data=b"")), "x.shape"),
    ("Softmax", pb.SoftmaxRequest(x=tensor([1] * 40)), "x.shape"),
    ("Softmax", pb.SoftmaxRequest(), "x"),  # missing: the operation names it
    ("Unary", pb.UnaryRequest(x=tensor([2])), "op"),
    ("Eltwise", pb.EltwiseRequest(inputs=[tensor([2]), tensor([2], data=b"\0")], op=1), "inputs[1].data"),
    ("Shuffle", pb.ShuffleRequest(x0=tensor([1, 2, 0], fmt=1), x1=tensor([1, 2, 0], fmt=2), type=1), "x1.format"),
    ("Shuffle", pb.ShuffleRequest(x0=tensor([1, 2, 0], fmt=7), x1=tensor([1, 2, 0]), type=1), "x0.format"),
    ("LrnCrossChannels", pb.LrnCrossChannelsRequest(x=tensor([1, 2, 0]), k=tensor([3])), "half"),
])
def test_malformed_tensors_name_the_field(server, rpc, message, field):
    err = raw_call(server.target, rpc, message.SerializeToString())
    assert isinstance(err, tensorops.InvalidArgumentError) and err.field == field, err


def test_garbage_bytes_are_invalid_argument(server):
    err = raw_call(server.target, "Softmax", b"\x0a\xff\xff\x01")
    assert isinstance(err, tensorops.InvalidArgumentError)


def test_unknown_session_is_not_found(client, server):
    for rpc, message in [("QuantizedInnerProductForward", pb.QuantizedInnerProductForwardRequest(session_id="nope")),
                         ("DescribeSession", pb.DescribeSessionRequest(session_id="nope")),
                         ("ReleaseSession", pb.ReleaseSessionRequest(session_id="")),]:
        err = raw_call(server.target, rpc, message.SerializeToString())
        assert isinstance(err, tensorops.NotFoundError) and err.field == "session_id", rpc


def test_unknown_method_is_unimplemented(server):
    err = raw_call(server.target, "Normalize2000", b"")
    assert isinstance(err, tensorops.UnimplementedError)


def test_over_limit_tensor_and_message(start_server):
    srv = start_server("--max-tensor-bytes", "4096", "--max-message-bytes", "65536")
    with tensorops.Client(srv.target, timeout=30) as c:
        assert c.softmax(np.zeros((0, 1024), np.float32)).shape == (0, 1024)
        with pytest.raises(tensorops.ResourceExhaustedError) as err:
            c.eltwise([np.zeros(16, np.float32), np.zeros(1025, np.float32)], "sum")
        assert err.value.field == "inputs[1]"
    # a message above the server's limit is refused by gRPC itself
    with tensorops.Client(srv.target, timeout=30, max_message_bytes=1 << 20) as c:
        with pytest.raises(tensorops.ResourceExhaustedError):
            c.softmax(np.zeros(100_000, np.float32))
    text = srv.metrics_text()
    assert metric_value(text, "tensorops_errors_total", operation="eltwise", code="RESOURCE_EXHAUSTED") == 1


def test_deadline_exceeded(client):
    # 16 MB cannot even reach the server within a millisecond (loopback moves it in ~50 ms)
    with pytest.raises(tensorops.DeadlineExceededError) as err:
        client.softmax(np.zeros((4096, 1024), np.float32), timeout=1e-3)
    assert isinstance(err.value, TimeoutError)


def test_unavailable_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tensorops.Client(f"127.0.0.1:{port}", timeout=5, max_attempts=2) as c:
        with pytest.raises(tensorops.UnavailableError):
            c.softmax(np.zeros(3, np.float32))


def slow_request(n_inputs=200_000):
    """A request that keeps a worker busy for a while without any kernel: many empty
    inputs to decode and validate."""
    return dict(inputs=[np.zeros(0, np.float32)] * n_inputs, op="sum")


def test_expired_or_cancelled_call_does_not_start_its_kernel(start_server):
    srv = start_server("--workers", "1", "--inline-bytes", "0")  # every call waits for the one worker
    with tensorops.Client(srv.target, timeout=60) as c:
        busy = [threading.Thread(target=c.eltwise, kwargs=slow_request()) for _ in range(2)]
        busy[0].start()
        deadline = time.monotonic() + 10
        while metric_value(srv.metrics_text(), "tensorops_requests_in_flight", operation="eltwise") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        busy[1].start()  # queued behind the first: the single worker stays busy a while longer
        time.sleep(0.05)
        with grpc.insecure_channel(srv.target) as channel:  # queued, then cancelled
            request = _wire.build_request(_wire.OPERATIONS["unary"], dict(x=np.zeros(0, np.float32), op="exp"))
            future = channel.unary_unary(_wire.OPERATIONS["unary"].path).future(request.data)
            # cancel() is False only if the call already finished: then it ran, legitimately.
            cancelled = future.cancel()
        with pytest.raises(tensorops.DeadlineExceededError):  # queued, and its deadline passes
            c.softmax(np.zeros((0, 3), np.float32), timeout=0.05)
        for t in busy:
            t.join()
        time.sleep(0.2)
    text = srv.metrics_text()
    assert metric_value(text, "tensorops_kernel_duration_seconds_count", operation="softmax") == 0
    assert metric_value(text, "tensorops_kernel_duration_seconds_count", operation="unary") == (0 if cancelled else 1)
    assert metric_value(text, "tensorops_kernel_duration_seconds_count", operation="eltwise") == 2


def test_concurrency_limit_is_resource_exhausted(start_server):
    srv = start_server("--max-concurrent-rpcs", "1", "--workers", "2")
    with tensorops.Client(srv.target, timeout=60) as c:
        busy = threading.Thread(target=c.eltwise, kwargs=slow_request())
        busy.start()
        deadline = time.monotonic() + 10
        while metric_value(srv.metrics_text(), "tensorops_requests_in_flight", operation="eltwise") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(tensorops.ResourceExhaustedError):
            c.softmax(np.zeros((0, 3), np.float32))
        busy.join()


def test_async_client_raises_the_same_errors(server, run_async):
    async def calls(c):
        found = []
        for call in (lambda: c.softmax(np.zeros(3, np.float64)),
                     lambda: c.unary(np.zeros(3, np.float32), "nope"),
                     lambda: c._invoke(_wire.method_path("ReleaseSession"),
                                       pb.ReleaseSessionRequest(session_id="x").SerializeToString())):
            try:
                await call()
            except tensorops.TensorOpsError as exc:
                found.append((type(exc), exc.field))
        return found
    assert run_async(server.target, calls) == [(tensorops.InvalidArgumentError, "x"),
                                              (tensorops.InvalidArgumentError, "op"),
                                              (tensorops.NotFoundError, "session_id")]

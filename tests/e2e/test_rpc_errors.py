"""Every error class over the wire: the status code, and the field the server names."""

from __future__ import annotations

import socket
import time

import grpc
import numpy as np
import pytest

import tensorops
from rpc_server import LongCall, metric_value
from tensorops import _errors
from tensorops.protocol import dtypes, wire
from tensorops.v1 import tensor_pb2
from tensorops.v1 import tensorops_pb2 as pb


def raw_call(target, rpc, payload: bytes, timeout=30):
    """Send hand-made bytes; returns the TensorOpsError the call ended with."""
    with grpc.insecure_channel(target) as channel:
        try:
            channel.unary_unary(f"/tensorops.v1.TensorOps/{rpc}")(payload, timeout=timeout)
        except grpc.RpcError as exc:
            return _errors.from_rpc_error(exc)
    raise AssertionError("the call succeeded")


ITEMSIZE = {d.wire: d.itemsize for d in dtypes.DTYPES}


def tensor(shape, dtype=tensor_pb2.DATA_TYPE_FP32, data=None, fmt=0):
    if data is None:
        data = b"\0" * (int(np.prod(shape)) * ITEMSIZE.get(dtype, 4))
    return tensor_pb2.Tensor(shape=shape, dtype=dtype, data=data, format=fmt)


@pytest.mark.parametrize(
    "call,field",
    [
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
    ],
)
def test_invalid_arguments_name_the_field(client, call, field):
    with pytest.raises(tensorops.InvalidArgumentError) as err:
        call(client)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == field


@pytest.mark.parametrize(
    "rpc,message,field",
    [
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
    ],
)
def test_malformed_tensors_name_the_field(server, rpc, message, field):
    err = raw_call(server.target, rpc, message.SerializeToString())
    assert isinstance(err, tensorops.InvalidArgumentError) and err.field == field, err


def test_garbage_bytes_are_invalid_argument(server):
    err = raw_call(server.target, "Softmax", b"\x0a\xff\xff\x01")
    assert isinstance(err, tensorops.InvalidArgumentError)


def test_unknown_session_is_not_found(client, server):
    for rpc, message in [
        ("QuantizedInnerProductForward", pb.QuantizedInnerProductForwardRequest(session_id="nope")),
        ("DescribeSession", pb.DescribeSessionRequest(session_id="nope")),
        ("ReleaseSession", pb.ReleaseSessionRequest(session_id="")),
    ]:
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


def test_expired_or_cancelled_call_does_not_start_its_kernel(start_server):
    # one process with one thread: every call waits for it
    srv = start_server("--workers", "1", "--threads", "1", "--inline-bytes", "0")
    busy = [LongCall(srv)]  # a long product keeps the single worker busy
    busy.append(LongCall(srv))  # queued behind the first: the worker stays busy a while longer
    time.sleep(0.05)
    with tensorops.Client(srv.target, timeout=60) as c:
        with grpc.insecure_channel(srv.target) as channel:  # queued, then cancelled
            request = wire.build_request(wire.OPERATIONS["unary"], dict(x=np.zeros(0, np.float32), op="exp"))
            future = channel.unary_unary(wire.OPERATIONS["unary"].path).future(request.data)
            # cancel() is False only if the call already finished: then it ran, legitimately.
            cancelled = future.cancel()
        with pytest.raises(tensorops.DeadlineExceededError):  # queued, and its deadline passes
            c.softmax(np.zeros((0, 3), np.float32), timeout=0.05)
        for call in busy:
            call.join()
            assert call.errors == []
        time.sleep(0.2)
    text = srv.metrics_text()
    assert metric_value(text, "tensorops_kernel_duration_seconds_count", operation="softmax") == 0
    assert metric_value(text, "tensorops_kernel_duration_seconds_count", operation="unary") == (0 if cancelled else 1)
    assert metric_value(text, "tensorops_kernel_duration_seconds_count", operation="quantized_inner_product") == 2


def test_concurrency_limit_is_resource_exhausted(start_server):
    srv = start_server("--max-concurrent-rpcs", "1", "--threads", "2", "--workers", "1")  # one process's admission
    busy = LongCall(srv)
    with tensorops.Client(srv.target, timeout=60) as c:
        with pytest.raises(tensorops.ResourceExhaustedError):
            c.softmax(np.zeros((0, 3), np.float32))
    busy.join()
    assert busy.errors == []


def test_async_client_raises_the_same_errors(server, run_async):
    async def calls(c):
        found = []
        for call in (
            lambda: c.softmax(np.zeros(3, np.float64)),
            lambda: c.unary(np.zeros(3, np.float32), "nope"),
            lambda: c._invoke(
                wire.method_path("ReleaseSession"), pb.ReleaseSessionRequest(session_id="x").SerializeToString()
            ),
        ):
            try:
                await call()
            except tensorops.TensorOpsError as exc:
                found.append((type(exc), exc.field))
        return found

    assert run_async(server.target, calls) == [
        (tensorops.InvalidArgumentError, "x"),
        (tensorops.InvalidArgumentError, "op"),
        (tensorops.NotFoundError, "session_id"),
    ]


# ---------------------------------------------------------------------------------------
# Messages in the wire's terms: callers in any language read them against the .proto files.


def details_of(target, rpc, message):
    err = raw_call(target, rpc, message.SerializeToString())
    assert isinstance(err, tensorops.TensorOpsError)
    return err


UNARY_CHOICES = ", ".join(f"{v.name} ({v.number})" for v in pb.UnaryOp.DESCRIPTOR.values if v.number)


def test_unknown_enum_number_names_the_wire_values_and_echoes_the_number(server):
    err = details_of(server.target, "Unary", pb.UnaryRequest(x=tensor([2]), op=99))
    assert isinstance(err, tensorops.InvalidArgumentError) and err.field == "op"
    assert err.field_violations[0].description == f"expected one of {UNARY_CHOICES}, got 99"
    assert "UNARY_OP_EXP (5)" in err.details and "'exp'" not in err.details


def test_unspecified_required_enum_is_refused_in_wire_terms(server):
    err = details_of(server.target, "Unary", pb.UnaryRequest(x=tensor([2])))
    assert err.field == "op"
    assert (
        err.field_violations[0].description
        == f"required: expected one of {UNARY_CHOICES}, got 0 (UNARY_OP_UNSPECIFIED)"
    )


@pytest.mark.parametrize(
    "rpc,message,field,listed",
    [
        ("Eltwise", pb.EltwiseRequest(inputs=[tensor([2]), tensor([2])], op=9), "op", "ELTWISE_OP_MIN (4)"),
        ("Eltwise", pb.EltwiseRequest(inputs=[tensor([2]), tensor([2])]), "op", "ELTWISE_OP_PRODUCT (1)"),
        (
            "Shuffle",
            pb.ShuffleRequest(x0=tensor([1, 2, 1]), x1=tensor([1, 2, 1]), type=7),
            "type",
            "SHUFFLE_TYPE_INTERLEAVE (2)",
        ),
        (
            "Normalize",
            pb.NormalizeRequest(x=tensor([2, 3]), axes=[1], activation=pb.FusedActivation(type=99)),
            "activation.type",
            "ACTIVATION_GELU (17)",
        ),
        (
            "Normalize",
            pb.NormalizeRequest(x=tensor([2, 3]), axes=[1], activation=pb.FusedActivation()),
            "activation.type",
            "ACTIVATION_IDENTITY (1)",
        ),
        ("Softmax", pb.SoftmaxRequest(x=tensor([2], dtype=42)), "x.dtype", "DATA_TYPE_BF16 (2)"),
        ("Softmax", pb.SoftmaxRequest(x=tensor([2], dtype=0)), "x.dtype", "DATA_TYPE_FP32 (1)"),
        (
            "LayerNormChannels",
            pb.LayerNormChannelsRequest(x=tensor([1, 2, 0], fmt=7), scale=tensor([2]), shift=tensor([2])),
            "x.format",
            "FORMAT_NHWC (2)",
        ),
    ],
)
def test_every_enum_error_lists_wire_names_and_numbers(server, rpc, message, field, listed):
    err = details_of(server.target, rpc, message)
    assert isinstance(err, tensorops.InvalidArgumentError) and err.field == field, err
    assert listed in err.details and "'" not in err.details, err.details


def _empty_requests():
    """Every RPC taking tensors, with an empty request: the first required field is named."""
    cases = []
    for name, op in wire.OPERATIONS.items():
        if name == "eltwise":  # its inputs are a list: empty is a value, refused as fewer than 2
            continue
        first = next(f.name for f in op.request_class.DESCRIPTOR.fields if f.message_type is not None)
        cases.append((op.rpc, first))
    cases.append(("CreateQuantizedInnerProduct", "b"))
    return cases


@pytest.mark.parametrize("rpc,field", _empty_requests())
def test_missing_tensor_is_named(server, rpc, field):
    err = raw_call(server.target, rpc, b"")
    assert isinstance(err, tensorops.InvalidArgumentError) and err.field == field, err
    assert err.field_violations[0].description == f"required tensor `{field}` is missing"
    assert "NoneType" not in err.details


@pytest.mark.parametrize(
    "rpc,message,field",
    [
        ("LayerNormChannels", pb.LayerNormChannelsRequest(x=tensor([1, 2, 3])), "scale"),
        ("LayerNormChannels", pb.LayerNormChannelsRequest(x=tensor([1, 2, 3]), scale=tensor([2])), "shift"),
        ("TiledScale2D", pb.TiledScale2DRequest(x=tensor([1, 1, 1, 1]), ver=tensor([1, 1])), "hor"),
        ("Shuffle", pb.ShuffleRequest(x0=tensor([1, 2, 1]), type=1), "x1"),
        ("QuantizedInnerProduct", pb.QuantizedInnerProductRequest(a=tensor([1, 2], tensor_pb2.DATA_TYPE_UINT8)), "b"),
        (
            "CreateQuantizedInnerProduct",
            pb.CreateQuantizedInnerProductRequest(b=tensor([2, 2], tensor_pb2.DATA_TYPE_INT8)),
            "b_scale",
        ),
    ],
)
def test_every_missing_required_tensor_is_named(server, rpc, message, field):
    err = details_of(server.target, rpc, message)
    assert err.field == field and err.field_violations[0].description == f"required tensor `{field}` is missing"


@pytest.mark.parametrize(
    "rpc,message,field",
    [
        ("LrnCrossChannels", pb.LrnCrossChannelsRequest(x=tensor([1, 2, 0]), k=tensor([3])), "half"),
        (
            "QuantizedInnerProduct",
            pb.QuantizedInnerProductRequest(
                a=tensor([1, 2], tensor_pb2.DATA_TYPE_UINT8),
                b=tensor([2, 2], tensor_pb2.DATA_TYPE_INT8),
                b_scale=tensor([2]),
                a_zero=0,
                c_scale=1,
                c_zero=0,
            ),
            "a_scale",
        ),
        ("Normalize", pb.NormalizeRequest(x=tensor([2, 3])), "axes"),
    ],
)
def test_missing_required_scalars_are_named(server, rpc, message, field):
    err = details_of(server.target, rpc, message)
    assert err.field == field and err.field_violations[0].description.startswith(f"required field `{field}` is missing")


def test_session_forward_without_a_names_it(client, server):
    b = np.zeros((4, 2), np.int8)
    with client.quantized_inner_product(
        b, b_scale=np.ones(2, np.float32), a_scale=1.0, a_zero=0, c_scale=1.0, c_zero=0
    ) as qip:
        err = details_of(
            server.target,
            "QuantizedInnerProductForward",
            pb.QuantizedInnerProductForwardRequest(session_id=qip.session_id),
        )
        assert err.field == "a" and err.field_violations[0].description == "required tensor `a` is missing"


def test_shape_numpy_cannot_describe_is_refused_in_our_words(server):
    err = details_of(server.target, "Softmax", pb.SoftmaxRequest(x=tensor([0, 2**62, 2**62], data=b"")))
    assert isinstance(err, tensorops.InvalidArgumentError) and err.field == "x.shape"
    assert "too many elements" in err.details and "arr.size" not in err.details
    # the largest shape it can describe is fine (and empty)
    y = tensorops.Client(server.target, timeout=30).softmax(np.zeros((0, 2**30, 2**30), np.float32))
    assert y.shape == (0, 2**30, 2**30)


def test_channel_sum_result_beyond_the_limit_is_refused_before_allocation(server):
    err = details_of(
        server.target,
        "ChannelSum",
        pb.ChannelSumRequest(x=tensor([2**30, 2**30, 0], tensor_pb2.DATA_TYPE_BF16, data=b"")),
    )
    assert isinstance(err, tensorops.ResourceExhaustedError) and err.field == "x"


def test_garbage_bytes_are_described_without_the_parser_text(server):
    err = raw_call(server.target, "Softmax", b"\x0a\xff\xff\x01")
    assert err.field == "message" and "tensorops.v1.SoftmaxRequest" in err.details
    assert "Error parsing" not in err.details and "Wire format" not in err.details


@pytest.mark.parametrize(
    "rpc,message,field",
    [
        ("Softmax", pb.SoftmaxRequest(x=tensor([2, 3], fmt=tensor_pb2.FORMAT_NCHW)), "x.format"),
        ("Unary", pb.UnaryRequest(x=tensor([2]), op=1), None),  # the control: no format, no error
        ("Unary", pb.UnaryRequest(x=tensor([2], fmt=tensor_pb2.FORMAT_NHWC), op=1), "x.format"),
        (
            "Eltwise",
            pb.EltwiseRequest(inputs=[tensor([2]), tensor([2], fmt=tensor_pb2.FORMAT_NCHW)], op=2),
            "inputs[1].format",
        ),
        ("Normalize", pb.NormalizeRequest(x=tensor([2, 3], fmt=tensor_pb2.FORMAT_NCHW), axes=[1]), "x.format"),
        (
            "LayerNormChannels",
            pb.LayerNormChannelsRequest(
                x=tensor([1, 2, 3], fmt=tensor_pb2.FORMAT_NHWC),
                scale=tensor([3], fmt=tensor_pb2.FORMAT_NHWC),
                shift=tensor([3]),
            ),
            "scale.format",
        ),
        (
            "QuantizedInnerProduct",
            pb.QuantizedInnerProductRequest(
                a=tensor([1, 2], tensor_pb2.DATA_TYPE_UINT8, fmt=tensor_pb2.FORMAT_NCHW),
                b=tensor([2, 2], tensor_pb2.DATA_TYPE_INT8),
                b_scale=tensor([2]),
                a_scale=1,
                a_zero=0,
                c_scale=1,
                c_zero=0,
            ),
            "a.format",
        ),
    ],
)
def test_format_is_refused_where_the_operation_has_no_layout(server, rpc, message, field):
    raw = message.SerializeToString()
    if field is None:
        with grpc.insecure_channel(server.target) as channel:
            channel.unary_unary(f"/tensorops.v1.TensorOps/{rpc}")(raw, timeout=30)
        return
    err = raw_call(server.target, rpc, raw)
    assert isinstance(err, tensorops.InvalidArgumentError) and err.field == field, err
    assert "leave it unset (FORMAT_UNSPECIFIED)" in err.details


LIBRARY_WORDS = (
    "numpy",
    "arr.",
    "NoneType",
    "cffi",
    "Traceback",
    "ndarray",
    "size_t",
    "Error parsing",
    "internal error",
)


def test_hostile_requests_get_our_words_only(server):
    """A bounded random sweep over every RPC: odd dtypes, shapes (huge dimensions beside a 0),
    truncated payloads, formats, enum numbers and scalars. Every answer is one of the
    documented refusals, in the service's words."""
    import random

    rng = random.Random(0)
    sizes = {1: 4, 2: 2, 3: 2, 4: 1, 5: 1, 6: 4, 7: 8, 8: 8}

    def random_tensor():
        dtype = rng.choice([1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 9])
        shape = [rng.choice([0, 1, 2, 3, 2**20, 2**31, 2**40]) for _ in range(rng.randrange(6))]
        n = int(np.prod(shape, dtype=object)) if shape else 1
        if n * sizes.get(dtype, 4) > 4096:
            shape[0], n = 0, 0
        data = bytes(rng.randrange(256) for _ in range(n * sizes.get(dtype, 4)))
        if data and rng.random() < 0.05:
            data = data[:-1]
        return tensor_pb2.Tensor(shape=shape, dtype=dtype, data=data, format=rng.choice([0, 0, 0, 1, 2, 5]))

    def random_message(cls):
        m = cls()
        for f in cls.DESCRIPTOR.fields:
            if rng.random() < 0.2 or f.name == "session_id":
                continue
            if f.message_type is not None and f.message_type.name == "Tensor":
                for _ in range(rng.randrange(4) if f.is_repeated else 1):
                    (getattr(m, f.name).add() if f.is_repeated else getattr(m, f.name)).CopyFrom(random_tensor())
            elif f.message_type is not None:
                getattr(m, f.name).type = rng.choice([0, 1, 4, 17, 18])
                getattr(m, f.name).params.extend(
                    rng.choice([0.0, -1.0, 1e39, float("nan")]) for _ in range(rng.randrange(4))
                )
            elif f.enum_type is not None:
                setattr(m, f.name, rng.choice([0, 1, 2, 5, 17, 99]))
            elif f.type == f.TYPE_STRING:
                setattr(m, f.name, rng.choice(["", "scalar", "float32", "x" * 50]))
            elif f.type == f.TYPE_BOOL:
                setattr(m, f.name, rng.random() < 0.5)
            elif f.type == f.TYPE_DOUBLE:
                value = lambda: rng.choice([0.0, 1e-5, -1.0, 1e39, float("inf"), float("nan")])  # noqa: E731
                getattr(m, f.name).extend(value() for _ in range(2)) if f.is_repeated else setattr(m, f.name, value())
            else:
                value = lambda: rng.choice([0, 1, -1, 3, 2**40, -(2**63), 2**63 - 1, 256])  # noqa: E731
                getattr(m, f.name).extend(value() for _ in range(3)) if f.is_repeated else setattr(m, f.name, value())
        return m

    rpcs = [op.rpc for op in wire.OPERATIONS.values()] + ["CreateQuantizedInnerProduct"]
    with grpc.insecure_channel(server.target) as channel:
        for _ in range(400):
            rpc = rng.choice(rpcs)
            message = random_message(wire.message_class(wire.SERVICE.methods_by_name[rpc].input_type))
            try:
                channel.unary_unary(f"/tensorops.v1.TensorOps/{rpc}")(message.SerializeToString(), timeout=30)
            except grpc.RpcError as exc:
                err = _errors.from_rpc_error(exc)
                assert err.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED), (rpc, err)
                assert err.field, (rpc, err)
                assert not any(word in err.details for word in LIBRARY_WORDS), (rpc, err.details)

"""Call arguments <-> request messages, enums and formats; errors raised before sending."""

from __future__ import annotations

import grpc
import ml_dtypes
import numpy as np
import pytest

import tensorops
from tensorops import _errors
from tensorops._client import channel_options, default_load_balancing, encode, retry_service_config
from tensorops.protocol import codec, wire
from tensorops.v1 import tensorops_pb2 as pb


def test_request_carries_arguments_by_name_and_format_on_the_image_tensors():
    op = wire.OPERATIONS["shuffle"]
    x = np.zeros((1, 2, 2, 4), np.float32)
    request = encode(op, dict(x0=x, x1=x, type="interleave", format="NHWC", channels=(2, 6)))
    msg = pb.ShuffleRequest.FromString(request.data)
    assert msg.type == pb.SHUFFLE_TYPE_INTERLEAVE and list(msg.channels) == [2, 6]
    assert msg.x0.format == msg.x1.format == 2 and list(msg.x0.shape) == [1, 2, 2, 4]


def test_defaults_and_none_leave_fields_unset():
    op = wire.OPERATIONS["eltwise"]
    msg = pb.EltwiseRequest.FromString(encode(op, dict(inputs=[np.zeros(2, np.float32)] * 2, op=1, weights=None)).data)
    assert msg.op == pb.ELTWISE_OP_SUM and not msg.HasField("weights") and len(msg.inputs) == 2
    msg = pb.NormalizeL2Request.FromString(
        encode(
            wire.OPERATIONS["normalize_l2"],
            dict(x=np.zeros((1, 1), np.float32), scale=[1.0], eps=1e-10, across_spatial=False, format="nchw"),
        ).data
    )
    assert msg.HasField("eps") and msg.eps == 1e-10 and msg.x.format == 1


def test_uint16_inputs_mark_bf16_results_as_bits():
    op = wire.OPERATIONS["softmax"]
    assert encode(op, dict(x=np.zeros(3, np.uint16), axis=-1)).bf16_bits
    assert not encode(op, dict(x=np.zeros(3, np.float32), axis=-1)).bf16_bits
    y = np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16)
    raw = op.response_codec.encode(None, {"y": codec.encode_tensor(y, "y")})
    assert wire.decode_response(op, raw, True).dtype == np.uint16
    out = wire.decode_response(op, raw, False)
    assert out.dtype == y.dtype and out.flags.writeable and np.array_equal(out, y)


@pytest.mark.parametrize(
    "op,args,field",
    [
        ("unary", dict(x=np.zeros(2, np.float32), op="expo"), "op"),
        ("unary", dict(x=np.zeros(2, np.float32), op=17), "op"),
        ("unary", dict(x=np.zeros(2, np.float32), op=True), "op"),
        ("softmax", dict(x=np.zeros(2, np.complex64), axis=0), "x"),
        ("softmax", dict(x=np.zeros(2, np.float32), axis="last"), "axis"),
        ("eltwise", dict(inputs=[np.zeros(2, np.float32), np.zeros(2, bool)], op="sum"), "inputs[1]"),
        ("eltwise", dict(inputs="ab", op="sum"), "inputs"),
        ("layer_norm_spatial", dict(x=np.zeros((1, 1)), scale=[1], shift=[0], eps=1e-5, format="nwhc"), "format"),
        ("shuffle", dict(x0=np.zeros((1, 2)), x1=np.zeros((1, 2)), type=0, channels=(1.5, 2)), "channels"),
        ("normalize_l2", dict(x=np.zeros((1, 1)), scale=[1.0], eps=True), "eps"),
        ("lrn_cross_channels", dict(x=np.zeros((1, 1)), half=np.True_, k=[1, 1, 1]), "half"),
    ],
)
def test_unencodable_arguments_raise_invalid_argument_naming_them(op, args, field):
    with pytest.raises(tensorops.InvalidArgumentError) as err:
        encode(wire.OPERATIONS[op], args)
    assert err.value.field == field and err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(err.value, ValueError)


def test_enum_values_follow_the_simd_numbering():
    d = pb.UnaryOp.DESCRIPTOR
    assert wire.encode_enum(d, 0, "op") == pb.UNARY_OP_ABS and wire.encode_enum(d, 16, "op") == pb.UNARY_OP_ZERO
    assert wire.encode_enum(d, "TANH", "op") == pb.UNARY_OP_TANH
    assert wire.decode_enum(d, pb.UNARY_OP_RSQRT) == "rsqrt"
    assert wire.decode_enum(d, 0) is None and wire.decode_enum(d, 1000) is None
    assert wire.encode_format("NCHW") == 1 and wire.encode_format(1) == 2


def test_channel_options_retry_unavailable_and_match_message_limits():
    opts = dict(channel_options(1234, 4))
    assert opts["grpc.max_send_message_length"] == opts["grpc.max_receive_message_length"] == 1234
    assert opts["grpc.enable_retries"] == 1
    import json

    policy = json.loads(opts["grpc.service_config"])["methodConfig"][0]
    assert policy["name"] == [{"service": "tensorops.v1.TensorOps"}]
    assert policy["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert policy["retryPolicy"]["maxAttempts"] == 4
    assert "retryPolicy" not in json.loads(retry_service_config(1))["methodConfig"][0]
    assert dict(channel_options(10, 4, [("grpc.max_send_message_length", 5)]))["grpc.max_send_message_length"] == 5


@pytest.mark.parametrize(
    "target,policy",
    [
        ("localhost:50051", "pick_first"),
        ("127.0.0.1:5", "pick_first"),
        ("ipv4:127.0.0.1:5", "pick_first"),
        ("ipv4:127.0.0.1:5,127.0.0.1:6", "round_robin"),
        ("dns:///tensorops-headless:50051", "round_robin"),
        ("dns:tensorops:50051", "round_robin"),
        ("unix:/tmp/s", "pick_first"),
    ],
)
def test_load_balancing_follows_the_target(target, policy):
    import json

    assert default_load_balancing(target) == policy
    config = json.loads(dict(channel_options(10, 4, load_balancing=policy))["grpc.service_config"])
    assert config["loadBalancingConfig"] == [{policy: {}}]
    assert config["methodConfig"][0]["retryPolicy"]["maxAttempts"] == 4  # retries kept
    with tensorops.Client(target) as c, tensorops.Client(target, load_balancing="round_robin") as rr:
        assert (c.load_balancing, rr.load_balancing) == (policy, "round_robin")
        # under round_robin a session gets a channel of its own that keeps to one server
        session_config = dict(c._session_options or ()).get("grpc.service_config")
        assert (session_config is not None) == (policy == "round_robin")
        if session_config is not None:
            assert json.loads(session_config)["loadBalancingConfig"] == [{"pick_first": {"shuffleAddressList": True}}]
    with pytest.raises(ValueError, match="load_balancing"):
        tensorops.Client(target, load_balancing="ring_hash")


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details, metadata=()):
        self._code, self._details, self._metadata = code, details, metadata

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._metadata


def test_status_codes_map_to_one_hierarchy_with_field_violations():
    from google.protobuf import any_pb2
    from google.rpc import error_details_pb2, status_pb2

    bad = error_details_pb2.BadRequest(
        field_violations=[error_details_pb2.BadRequest.FieldViolation(field="x.data", description="expected 8 bytes")]
    )
    detail = any_pb2.Any()
    detail.Pack(bad)
    status = status_pb2.Status(code=3, message="x.data: expected 8 bytes", details=[detail])
    err = _errors.from_rpc_error(
        FakeRpcError(
            grpc.StatusCode.INVALID_ARGUMENT,
            "x.data: expected 8 bytes",
            (("grpc-status-details-bin", status.SerializeToString()),),
        )
    )
    assert type(err) is tensorops.InvalidArgumentError and err.field == "x.data"
    assert err.field_violations == (tensorops.FieldViolation("x.data", "expected 8 bytes"),)
    expected = {
        grpc.StatusCode.NOT_FOUND: (tensorops.NotFoundError, LookupError),
        grpc.StatusCode.RESOURCE_EXHAUSTED: (tensorops.ResourceExhaustedError, tensorops.TensorOpsError),
        grpc.StatusCode.DEADLINE_EXCEEDED: (tensorops.DeadlineExceededError, TimeoutError),
        grpc.StatusCode.UNAVAILABLE: (tensorops.UnavailableError, ConnectionError),
        grpc.StatusCode.UNAUTHENTICATED: (tensorops.UnauthenticatedError, PermissionError),
        grpc.StatusCode.CANCELLED: (tensorops.CancelledError, tensorops.TensorOpsError),
        grpc.StatusCode.UNIMPLEMENTED: (tensorops.UnimplementedError, NotImplementedError),
        grpc.StatusCode.INTERNAL: (tensorops.InternalError, tensorops.TensorOpsError),
        grpc.StatusCode.DATA_LOSS: (tensorops.TensorOpsError, Exception),
    }
    for code, (cls, base) in expected.items():
        err = _errors.from_rpc_error(FakeRpcError(code, "boom"))
        assert type(err) is cls and isinstance(err, base) and err.code == code
        assert err.field is None and str(err) == f"{code.name}: boom"

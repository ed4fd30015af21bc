"""Refused requests: the status code, and a message naming the model, input, parameter
or output at fault (as tritonclient shows it); the server stays healthy."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tc
from tritonclient.grpc import service_pb2, service_pb2_grpc

import tensorops_native as tn
from kserve_calls import infer_input, refused
from rpc_cases import same

X = np.arange(6, dtype=np.float32).reshape(2, 3)


@pytest.mark.parametrize(
    "model, inputs, parameters, code, message",
    [
        ("no_such_model", [("x", X)], {}, "NOT_FOUND", "model_name: no model named 'no_such_model'"),
        ("softmax", [], {}, "INVALID_ARGUMENT", "x: required tensor `x` is missing"),
        ("softmax", [("x", X), ("z", X)], {}, "INVALID_ARGUMENT", "z: model softmax has no input `z` (its inputs: x)"),
        (
            "softmax",
            [("x", X)],
            {"epsilon": 0.1},
            "INVALID_ARGUMENT",
            "epsilon: model softmax has no parameter `epsilon` (its parameters: axis)",
        ),
        (
            "softmax",
            [("x", X)],
            {"axis": "last"},
            "INVALID_ARGUMENT",
            "axis: expected an int64_param, got string_param 'last'",
        ),
        ("softmax", [("x", X)], {"axis": 2}, "INVALID_ARGUMENT", "axis: "),
        (
            "layer_norm_channels",
            [("x", X[None, :, :, None]), ("scale", X[0]), ("shift", X[0])],
            {"eps": "small"},
            "INVALID_ARGUMENT",
            "eps: expected a double_param, got string_param 'small'",
        ),
        (
            "layer_norm_channels",
            [("x", X[None, :, :, None]), ("scale", X[0]), ("shift", X[0])],
            {"format": "nhcw"},
            "INVALID_ARGUMENT",
            "format: expected one of 'nchw' (0), 'nhwc' (1), got 'nhcw'",
        ),
        ("unary", [("x", X)], {"op": "exq"}, "INVALID_ARGUMENT", "op: expected one of 'abs' (0)"),
        ("unary", [("x", X)], {}, "INVALID_ARGUMENT", "op: required"),
        ("normalize", [("x", X)], {"axes": "1,x"}, "INVALID_ARGUMENT", "axes: expected comma-separated integers"),
        (
            "normalize",
            [("x", X)],
            {"axes": "1", "activation": "relu("},
            "INVALID_ARGUMENT",
            "activation: expected a string_param: a name, or name(p1, p2, ...)",
        ),
        (
            "eltwise",
            [("inputs", np.float32(1))],
            {"op": "sum"},
            "INVALID_ARGUMENT",
            "inputs.shape: expected the operands stacked along a first dimension",
        ),
        (
            "unary",
            [("x", X.astype(np.uint16))],
            {"op": "abs"},
            "INVALID_ARGUMENT",
            "x.datatype: expected one of FP32, FP16, BF16, UINT8, INT8, INT32, INT64, FP64, got 'UINT16'",
        ),
        ("unary", [("x", X.astype(np.float64))], {"op": "abs"}, "INVALID_ARGUMENT", "x: "),
    ],
)
def test_refused_infer(triton, model, inputs, parameters, code, message):
    status, text = refused(
        triton.infer,
        model,
        [infer_input(n, v) if v.dtype != np.uint16 else _uint16(n, v) for n, v in inputs],
        parameters=parameters,
    )
    assert status == f"StatusCode.{code}"
    assert text.startswith(message), text
    assert triton.is_server_ready()


def test_parameters_checked_on_every_call(triton):
    """The server reuses the conversion of parameters it has seen before: only for the same
    values of the same types. True == 1 in Python, yet axis as a bool_param after the same
    axis as an int64_param is refused, as is a bad value sent again."""
    x = infer_input("x", X)
    assert same(triton.infer("softmax", [x], parameters={"axis": 1}).as_numpy("y"), tn.softmax(X, axis=1))
    for _ in range(2):
        assert refused(triton.infer, "softmax", [x], parameters={"axis": True}) == (
            "StatusCode.INVALID_ARGUMENT",
            "axis: expected an int64_param, got bool_param True",
        )
        assert refused(triton.infer, "softmax", [x], parameters={"axis": "1"}) == (
            "StatusCode.INVALID_ARGUMENT",
            "axis: expected an int64_param, got string_param '1'",
        )
    assert same(triton.infer("softmax", [x], parameters={"axis": 1}).as_numpy("y"), tn.softmax(X, axis=1))


def test_many_parameter_values(triton):
    """More distinct parameter values than the server keeps conversions of (64 per model):
    every call still gets its own eps."""
    x, scale, shift = X[None, :, :, None], X[:, 0] + 1, X[:, 1]
    inputs = [infer_input("x", x), infer_input("scale", scale), infer_input("shift", shift)]
    for i in range(80):
        eps = 1e-3 * (i + 1)
        got = triton.infer("layer_norm_channels", inputs, parameters={"eps": eps}).as_numpy("y")
        assert same(got, tn.layer_norm_channels(x, scale, shift, eps=eps)), eps


def _uint16(name, value):
    tensor = tc.InferInput(name, list(value.shape), "UINT16")
    tensor.set_data_from_numpy(value)
    return tensor


def test_bytes_datatype(triton):
    tensor = tc.InferInput("x", [2], "BYTES")
    tensor.set_data_from_numpy(np.array([b"ab", b"c"], dtype=np.object_))
    status, text = refused(triton.infer, "softmax", [tensor])
    assert (status, text.split(",")[0]) == ("StatusCode.INVALID_ARGUMENT", "x.datatype: expected one of FP32")


def test_unknown_version_and_output(triton):
    status, text = refused(triton.infer, "softmax", [infer_input("x", X)], model_version="2")
    assert (status, text) == (
        "StatusCode.NOT_FOUND",
        "model_version: model softmax has no version '2' (its only version is 1)",
    )
    status, text = refused(triton.infer, "softmax", [infer_input("x", X)], outputs=[tc.InferRequestedOutput("z")])
    assert (status, text) == (
        "StatusCode.INVALID_ARGUMENT",
        "outputs.z: model softmax has no output `z` (its outputs: y)",
    )


def test_shared_memory_is_off_by_default(triton):
    tensor = tc.InferInput("x", [2, 3], "FP32")
    tensor.set_shared_memory("region", 24)
    status, text = refused(triton.infer, "softmax", [tensor])
    assert (status, text) == (
        "StatusCode.UNIMPLEMENTED",
        "x.shared_memory_region: system shared memory is off on this server (tensorops-server --allow-shared-memory)",
    )


@pytest.mark.parametrize(
    "call",
    ["get_cuda_shared_memory_status", "get_trace_settings", "get_log_settings", "get_system_shared_memory_status"],
)  # the last: off by default
def test_other_calls_are_unimplemented(triton, call):
    status, _ = refused(getattr(triton, call))
    assert status == "StatusCode.UNIMPLEMENTED"


def _raw_call(server, request):
    with grpc.insecure_channel(server.target) as channel:
        with pytest.raises(grpc.RpcError) as info:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    return info.value.code(), info.value.details()


def _request(**inputs) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="unary")
    request.parameters["op"].string_param = "abs"
    for name, (datatype, shape) in inputs.items():
        request.inputs.add(name=name, datatype=datatype, shape=shape)
    return request


def test_raw_contents_of_the_wrong_size(server):
    request = _request(x=("FP32", [3]))
    request.raw_input_contents.append(b"\0" * 10)
    assert _raw_call(server, request) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "x: raw_input_contents[0] holds 10 bytes; [3] of FP32 takes 12",
    )


def test_raw_contents_one_per_input(server):
    request = _request(x=("FP32", [1]))
    request.raw_input_contents.extend([b"\0" * 4, b"\0" * 4])
    assert _raw_call(server, request) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "raw_input_contents: expected one buffer per input not in shared memory (1), got 2",
    )


def test_raw_and_typed_contents_do_not_mix(server):
    request = _request(x=("FP32", [1]))
    request.raw_input_contents.append(b"\0" * 4)
    request.inputs[0].contents.fp32_contents.append(1.0)
    assert _raw_call(server, request) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "x.contents: raw_input_contents is used: no input may have contents",
    )


@pytest.mark.parametrize(
    "datatype, field, values, message",
    [
        ("FP32", "fp32_contents", [1.0, 2.0], "x.contents: expected 3 elements in fp32_contents, got 2"),
        (
            "FP16",
            "fp32_contents",
            [1.0, 2.0, 3.0],
            "x.contents: FP16 travels only as raw contents (raw_input_contents)",
        ),
        ("INT8", "int_contents", [1, 2, 300], "x.contents: a value of int_contents is outside the range of INT8"),
    ],
)
def test_typed_contents_refused(server, datatype, field, values, message):
    request = _request(x=(datatype, [3]))
    getattr(request.inputs[0].contents, field).extend(values)
    assert _raw_call(server, request) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def test_unparsable_request(server):
    with grpc.insecure_channel(server.target) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as info:
            call(b"\x0a\xff\xff", timeout=30)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "message: the request is not a valid inference.ModelInferRequest message in the protobuf binary encoding"
    )

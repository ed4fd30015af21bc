"""The self-description of the KServe endpoint: health, server and model metadata, model
configurations, the repository index and statistics, checked against the tensorops.v1
request and response messages and tensorops_native's signatures."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException

import tensorops_native as tn
from kserve_calls import infer_input
from tensorops.protocol import wire

OPERATIONS = [name for name in wire.OPERATIONS if hasattr(tn, name)]


def tensor_fields(message_class) -> list[str]:
    return [
        f.name
        for f in message_class.DESCRIPTOR.fields
        if f.message_type is not None and f.message_type.name == "Tensor"
    ]


def test_health_and_server_metadata(triton):
    assert triton.is_server_live() and triton.is_server_ready()
    metadata = triton.get_server_metadata()
    assert (metadata.name, metadata.version) == ("tensorops", tn.__version__)
    assert {"model_configuration", "model_repository", "statistics"} <= set(metadata.extensions)


def test_every_operation_is_a_ready_model(triton):
    index = triton.get_model_repository_index()
    assert {(m.name, m.version, m.state) for m in index.models} >= {(name, "1", "READY") for name in OPERATIONS}
    for name in OPERATIONS:
        assert triton.is_model_ready(name) and triton.is_model_ready(name, "1")
    assert not triton.is_model_ready("no_such_model")
    assert not triton.is_model_ready("softmax", "2")


@pytest.mark.parametrize("name", OPERATIONS)
def test_metadata_and_config_describe_the_operation(triton, name):
    op = wire.OPERATIONS[name]
    inputs = tensor_fields(op.request_class)
    outputs = tensor_fields(op.response_class)
    signature = inspect.signature(getattr(tn, name)).parameters
    parameters = {f.name for f in op.request_class.DESCRIPTOR.fields} - set(inputs)
    if op.layout:
        parameters.add("format")

    metadata = triton.get_model_metadata(name)
    assert (metadata.name, list(metadata.versions), metadata.platform) == (name, ["1"], "tensorops")
    assert [t.name for t in metadata.inputs] == inputs
    assert [t.name for t in metadata.outputs] == outputs
    assert all(t.shape and all(d == -1 or d > 0 for d in t.shape) for t in [*metadata.inputs, *metadata.outputs])

    config = triton.get_model_config(name).config
    assert config.name == name and config.max_batch_size == 0
    assert [(i.name, list(i.dims)) for i in config.input] == [(t.name, list(t.shape)) for t in metadata.inputs]
    assert [(o.name, list(o.dims)) for o in config.output] == [(t.name, list(t.shape)) for t in metadata.outputs]
    for tensor in config.input:  # optional exactly when the Python argument has a default
        assert tensor.optional == (signature[tensor.name].default is not inspect.Parameter.empty), tensor.name
    described = {key for key in config.parameters if not key.startswith(("input ", "output "))}
    assert described == parameters
    for key in parameters - {"format"}:
        required = signature[key].default is inspect.Parameter.empty
        assert config.parameters[key].string_value.endswith("required") == required, key


@pytest.mark.parametrize(
    "name, tensor, datatype, shape",
    [
        ("layer_norm_channels", "x", "FP32", [-1]),
        ("channel_sum", "x", "BF16", [-1]),
        ("channel_sum", "y", "FP32", [-1, -1]),
        ("lrn_cross_channels", "k", "FP32", [3]),
        ("eltwise", "inputs", "FP32", [-1, -1]),
        ("tiled_scale_2d", "x", "FP32", [-1, -1, -1, -1]),
        ("quantized_inner_product", "a", "UINT8", [-1, -1]),
        ("quantized_inner_product", "b", "INT8", [-1, -1]),
        ("quantized_inner_product", "c", "UINT8", [-1, -1]),
    ],
)
def test_datatypes_and_shapes(triton, name, tensor, datatype, shape):
    metadata = triton.get_model_metadata(name)
    found = {t.name: t for t in [*metadata.inputs, *metadata.outputs]}[tensor]
    assert (found.datatype, list(found.shape)) == (datatype, shape)


def test_config_lists_every_datatype_an_input_takes(triton):
    parameters = triton.get_model_config("softmax").config.parameters
    assert parameters["input x"].string_value.startswith("FP32 or BF16")
    assert parameters["axis"].string_value == "int64; optional, default -1"
    unary = triton.get_model_config("unary").config.parameters
    assert unary["op"].string_value == f"string, one of {', '.join(tn.UNARY_OPS)}; required"


def test_statistics_count_successes_and_failures(start_server):
    server = start_server()
    with tc.InferenceServerClient(server.target) as client:
        x = np.ones((2, 3), np.float32)
        for _ in range(3):
            client.infer("softmax", [infer_input("x", x)])
        with pytest.raises(InferenceServerException, match="axis"):
            client.infer("softmax", [infer_input("x", x)], parameters={"axis": 9})
        stats = client.get_inference_statistics("softmax").model_stats
        assert len(stats) == 1
        s = stats[0]
        assert (s.name, s.version, s.inference_count, s.execution_count) == ("softmax", "1", 3, 3)
        assert (s.inference_stats.success.count, s.inference_stats.fail.count) == (3, 1)
        assert s.inference_stats.success.ns > 0 and s.last_inference > 0
        every = client.get_inference_statistics().model_stats
        assert {m.name for m in every} >= set(OPERATIONS)
        assert {m.name: m.inference_count for m in every}["unary"] == 0


def test_reflection_describes_the_service_under_its_wire_name(server):
    """grpcurl and other tools find inference.GRPCInferenceService through reflection, its
    types under package `inference` as clients know them."""
    from google.protobuf import descriptor_pb2
    from grpc_reflection.v1alpha import reflection_pb2

    from rpc_server import LIST_SERVICES, reflection_call

    describe = reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService")
    responses = reflection_call(
        server.target, "grpc.reflection.v1.ServerReflection", [LIST_SERVICES, describe.SerializeToString()]
    )
    assert "inference.GRPCInferenceService" in {s.name for s in responses[0].list_services_response.service}
    [proto] = [
        descriptor_pb2.FileDescriptorProto.FromString(f)
        for f in responses[1].file_descriptor_response.file_descriptor_proto
    ]
    assert (proto.name, proto.package) == ("inference/grpc_service.proto", "inference")
    methods = {m.name: (m.input_type, m.output_type) for m in proto.service[0].method}
    assert methods["ModelInfer"] == (".inference.ModelInferRequest", ".inference.ModelInferResponse")
    assert {"ServerLive", "ModelStreamInfer", "RepositoryModelLoad", "SystemSharedMemoryRegister"} <= set(methods)
    request = next(m for m in proto.message_type if m.name == "ModelInferRequest")
    inputs = next(f for f in request.field if f.name == "inputs")
    assert (inputs.number, inputs.type_name) == (5, ".inference.ModelInferRequest.InferInputTensor")


def test_not_ready_while_draining(start_server):
    """On SIGTERM the server reports not ready (ServerReady, like the health service) for
    the drain delay, while it still serves."""
    import time

    server = start_server("--drain-delay", "3")
    with tc.InferenceServerClient(server.target) as client:
        assert client.is_server_ready()
        server.signal()
        deadline = time.monotonic() + 2
        while client.is_server_ready():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert client.is_server_live()
        x = np.ones((2, 3), np.float32)
        assert client.infer("softmax", [infer_input("x", x)]).as_numpy("y").shape == (2, 3)
    assert server.wait() == 0

"""Health, reflection and the Prometheus metrics of a real server."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import tensorops
import tensorops_native as tn
from rpc_server import LIST_SERVICES, LongCall, metric_value, reflection_call
from tensorops.protocol import wire


def test_health_serving(server):
    with grpc.insecure_channel(server.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "tensorops.v1.TensorOps"):
            assert (
                stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status
                == health_pb2.HealthCheckResponse.SERVING
            )
        with pytest.raises(grpc.RpcError) as err:
            stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def file_protos(response) -> list:
    from google.protobuf import descriptor_pb2

    return [
        descriptor_pb2.FileDescriptorProto.FromString(f)
        for f in response.file_descriptor_response.file_descriptor_proto
    ]


def containing_symbol(symbol: str) -> bytes:
    """A ServerReflectionRequest, encoded by hand: file_containing_symbol is field 4."""
    return b"\x22" + bytes([len(symbol)]) + symbol.encode()


@pytest.mark.parametrize("service", ["grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"])
def test_reflection_lists_and_describes_the_service(server, service):
    responses = reflection_call(server.target, service, [LIST_SERVICES, containing_symbol("tensorops.v1.TensorOps")])
    names = {s.name for s in responses[0].list_services_response.service}
    assert {
        "tensorops.v1.TensorOps",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= names
    protos = file_protos(responses[1])
    service_proto = next(p for p in protos if p.name == "tensorops/v1/tensorops.proto").service[0]
    assert {m.name for m in service_proto.method} >= {"Softmax", "CreateQuantizedInnerProduct", "GetServerInfo"}
    assert {p.name for p in protos} >= {"tensorops/v1/tensor.proto"}  # and its dependency


def test_reflection_v1_describes_itself_like_v1alpha(server):
    """Tools that list and then describe every service (grpcurl describe) find v1 too: its
    descriptor is v1alpha's under the v1 package, with the same field numbers."""
    [v1] = file_protos(
        reflection_call(
            server.target,
            "grpc.reflection.v1.ServerReflection",
            [containing_symbol("grpc.reflection.v1.ServerReflection")],
        )[0]
    )
    [v1alpha] = file_protos(
        reflection_call(
            server.target,
            "grpc.reflection.v1alpha.ServerReflection",
            [containing_symbol("grpc.reflection.v1alpha.ServerReflection")],
        )[0]
    )
    assert (v1.name, v1.package) == ("grpc/reflection/v1/reflection.proto", "grpc.reflection.v1")
    assert v1.service[0].method[0].input_type == ".grpc.reflection.v1.ServerReflectionRequest"

    def layout(proto):
        return {
            m.name: sorted((f.name, f.number, f.type, f.type_name.rsplit(".", 1)[-1]) for f in m.field)
            for m in proto.message_type
        }

    assert layout(v1) == layout(v1alpha)


def test_reflection_is_off_when_disabled(start_server):
    srv = start_server("--reflection", "false")
    for service in ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"):
        with pytest.raises(grpc.RpcError) as err:
            reflection_call(srv.target, service, [LIST_SERVICES])
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def request_size(op: str, **arguments) -> int:
    return len(wire.build_request(wire.OPERATIONS[op], arguments).data)


def test_metrics_count_the_traffic(start_server):
    srv = start_server()
    x = np.zeros((0, 8), np.float32)
    ok, bad = 7, 3
    with tensorops.Client(srv.target, timeout=30) as c:
        for _ in range(ok):
            c.softmax(x)
        for _ in range(bad):
            with pytest.raises(tensorops.InvalidArgumentError):
                c.softmax(np.zeros(3, np.float64))
        with pytest.raises(tensorops.NotFoundError):
            c._invoke(wire.method_path("DescribeSession"), b"\x0a\x01z")
        c.info()
    text = srv.metrics_text()
    count = "tensorops_request_duration_seconds_count"
    assert metric_value(text, count, operation="softmax", code="OK") == ok
    assert metric_value(text, count, operation="softmax", code="INVALID_ARGUMENT") == bad
    assert metric_value(text, count, operation="describe_session", code="NOT_FOUND") == 1
    assert metric_value(text, count, operation="get_server_info", code="OK") == 1
    assert metric_value(text, "tensorops_errors_total", operation="softmax", code="INVALID_ARGUMENT") == bad
    assert metric_value(text, "tensorops_errors_total", operation="describe_session", code="NOT_FOUND") == 1
    assert metric_value(text, "tensorops_kernel_duration_seconds_count", operation="softmax") == ok
    assert metric_value(text, "tensorops_requests_in_flight", operation="softmax") == 0
    expected_in = ok * request_size("softmax", x=x, axis=-1) + bad * request_size("softmax", x=np.zeros(3), axis=-1)
    assert metric_value(text, "tensorops_request_bytes_total", operation="softmax") == expected_in
    assert metric_value(text, "tensorops_response_bytes_total", operation="softmax") > 0
    assert metric_value(text, "tensorops_sessions_active") == 0
    assert metric_value(text, "tensorops_session_bytes") == 0
    assert metric_value(text, "tensorops_server_info", isa=tn.isa(), version=tn.__version__) == 1
    assert "tensorops_session_evictions_total" in text or "tensorops_session_evictions" in text
    for line in text.splitlines():  # labels never carry shapes or ids
        assert "shape" not in line and "session_id" not in line


def promtool() -> str | None:
    return shutil.which("promtool") or next(
        (str(p) for p in [Path(sys.executable).parent / "promtool"] if p.exists()), None
    )


def test_metrics_text_passes_promtool(server, client):
    tool = promtool()
    if tool is None:
        pytest.skip("promtool not installed (make test installs it from Debian's prometheus package)")
    client.softmax(np.zeros((0, 2), np.float32))
    result = subprocess.run([tool, "check", "metrics"], input=server.metrics_text(), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_both_endpoints_go_through_one_call_pipeline(start_server):
    """tensorops.v1 and KServe calls are admitted and counted by the same pipeline: with one
    call allowed at a time, a tensorops.v1 call in flight makes a KServe inference and a
    request of a KServe stream RESOURCE_EXHAUSTED (the stream goes on, and its next request
    is served once the first call is done); every call lands in the same metric series,
    under its endpoint's label."""
    from tensorops.kserve import SERVICE_NAME
    from tensorops.kserve.v2 import inference_pb2 as pb

    srv = start_server("--max-concurrent-rpcs", "1", "--threads", "2", "--workers", "1")  # one process's admission
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
    request = pb.ModelInferRequest(model_name="softmax", raw_input_contents=[x.tobytes()])
    request.inputs.add(name="x", datatype="FP32", shape=x.shape)
    wide = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    expected = wide / wide.sum(axis=-1, keepdims=True)
    done = threading.Event()

    def stream_requests():
        yield request.SerializeToString()
        done.wait(60)  # the second request of the stream, once the long call is over
        yield request.SerializeToString()

    with grpc.insecure_channel(srv.target) as channel:
        infer = channel.unary_unary(f"/{SERVICE_NAME}/ModelInfer")
        stream = channel.stream_stream(f"/{SERVICE_NAME}/ModelStreamInfer")
        busy = LongCall(srv)
        with pytest.raises(grpc.RpcError) as refused:
            infer(request.SerializeToString(), timeout=30)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        responses = stream(stream_requests(), timeout=60)
        first = pb.ModelStreamInferResponse.FromString(next(responses))
        assert first.error_message.startswith("RESOURCE_EXHAUSTED: ")
        busy.join()
        done.set()
        assert busy.errors == [] and busy.result[0].shape == busy.shape
        second = pb.ModelStreamInferResponse.FromString(next(responses))
        answered = pb.ModelInferResponse.FromString(infer(request.SerializeToString(), timeout=30))
    assert second.error_message == ""
    for response in (second.infer_response, answered):
        y = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(x.shape)
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-7)
    text = srv.metrics_text()
    count = "tensorops_request_duration_seconds_count"
    assert metric_value(text, count, operation="quantized_inner_product", code="OK") == 1
    assert metric_value(text, count, operation="kserve_model_infer", code="RESOURCE_EXHAUSTED") == 1
    assert metric_value(text, count, operation="kserve_model_infer", code="OK") == 1
    assert metric_value(text, count, operation="kserve_model_stream_infer", code="RESOURCE_EXHAUSTED") == 1
    assert metric_value(text, count, operation="kserve_model_stream_infer", code="OK") == 1
    assert metric_value(text, "tensorops_kernel_duration_seconds_count", operation="softmax") == 2

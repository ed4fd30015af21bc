"""Health, reflection and the Prometheus metrics of a real server."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import tensorops
import tensorops_native as tn
from tensorops import _wire
from rpc_server import metric_value


def test_health_serving(server):
    with grpc.insecure_channel(server.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "tensorops.v1.TensorOps"):
            assert stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == \
                health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:
            stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_and_describes_the_service(server):
    with grpc.insecure_channel(server.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        requests = [reflection_pb2.ServerReflectionRequest(list_services=""),
                    reflection_pb2.ServerReflectionRequest(file_containing_symbol="tensorops.v1.TensorOps")]
        responses = list(stub.ServerReflectionInfo(iter(requests), timeout=10))
    names = {s.name for s in responses[0].list_services_response.service}
    assert {"tensorops.v1.TensorOps", "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"} <= names
    files = responses[1].file_descriptor_response.file_descriptor_proto
    from google.protobuf import descriptor_pb2
    protos = [descriptor_pb2.FileDescriptorProto.FromString(f) for f in files]
    service = next(p for p in protos if p.name == "tensorops/v1/tensorops.proto").service[0]
    assert {m.name for m in service.method} >= {"Softmax", "CreateQuantizedInnerProduct", "GetServerInfo"}


def request_size(op: str, **arguments) -> int:
    return len(_wire.build_request(_wire.OPERATIONS[op], arguments).data)


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
            c._invoke(_wire.method_path("DescribeSession"), b"\x0a\x01z")
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
        (str(p) for p in [Path(sys.executable).parent / "promtool"] if p.exists()), None)


def test_metrics_text_passes_promtool(server, client):
    tool = promtool()
    if tool is None:
        pytest.skip("promtool not installed (make test installs it from Debian's prometheus package)")
    client.softmax(np.zeros((0, 2), np.float32))
    result = subprocess.run([tool, "check", "metrics"], input=server.metrics_text(), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr

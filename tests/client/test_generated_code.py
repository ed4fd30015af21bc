"""The checked-in code under client/tensorops/v1 and client/tensorops/kserve/v2 is what
`make proto` generates now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto"
CLIENT = ROOT / "client"


@pytest.mark.parametrize("package, stubs", [("tensorops/v1", True), ("tensorops/kserve/v2", False)])
def test_generated_code_is_current(tmp_path, package, stubs):
    pytest.importorskip("grpc_tools", reason="grpcio-tools comes with the test extra")
    protos = sorted(str(p.relative_to(PROTO)) for p in (PROTO / package).glob("*.proto"))
    outputs = [f"--python_out={tmp_path}", f"--pyi_out={tmp_path}"]
    if stubs:
        outputs.append(f"--grpc_python_out={tmp_path}")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO}", *outputs, *protos], check=True)
    fresh = {p.name: p.read_bytes() for p in (tmp_path / package).iterdir()}
    checked_in = {
        p.name: p.read_bytes()
        for p in (CLIENT / package).iterdir()
        if p.suffix in (".py", ".pyi") and p.name != "__init__.py"
    }
    assert fresh.keys() == checked_in.keys(), "run `make proto`"
    stale = [name for name in fresh if fresh[name] != checked_in[name]]
    assert not stale, f"stale generated code {stale}: run `make proto` and commit the result"


def test_kserve_messages_load_beside_tritonclient():
    """Our KServe messages live in a package of their own: importing them beside
    tritonclient's `inference` package raises no duplicate-symbol error, and the two read
    each other's bytes."""
    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
    from tensorops.kserve.v2 import inference_pb2

    theirs = service_pb2.ModelInferRequest(model_name="softmax", raw_input_contents=[b"\0" * 8])
    theirs.parameters["axis"].int64_param = -1
    ours = inference_pb2.ModelInferRequest.FromString(theirs.SerializeToString())
    assert (ours.model_name, ours.parameters["axis"].int64_param, list(ours.raw_input_contents)) == (
        "softmax",
        -1,
        [b"\0" * 8],
    )
    assert service_pb2.ModelInferRequest.FromString(ours.SerializeToString()) == theirs

"""The checked-in code under client/tensorops/v1 is what `make proto` generates now."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto"
GENERATED = ROOT / "client" / "tensorops" / "v1"


def test_generated_code_is_current(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools comes with the test extra")
    protos = sorted(str(p.relative_to(PROTO)) for p in (PROTO / "tensorops" / "v1").glob("*.proto"))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO}", f"--python_out={tmp_path}",
                    f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", *protos], check=True)
    fresh = {p.name: p.read_bytes() for p in (tmp_path / "tensorops" / "v1").iterdir()}
    checked_in = {p.name: p.read_bytes() for p in GENERATED.iterdir()
                  if p.suffix in (".py", ".pyi") and p.name != "__init__.py"}
    assert fresh.keys() == checked_in.keys(), "run `make proto`"
    stale = [name for name in fresh if fresh[name] != checked_in[name]]
    assert not stale, f"stale generated code {stale}: run `make proto` and commit the result"

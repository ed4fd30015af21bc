"""Every layer's view of every operation comes from the operation table
(tensorops.protocol.table): the native functions and the clients' methods have its
signatures, the tensorops.v1 endpoint serves its rows, the KServe endpoint describes them
from its facts (changed in the row, changed in the model), the in-process client calls its
native functions, and the docs' tables are its rendering."""

from __future__ import annotations

import dataclasses
import inspect
import pathlib

import grpc
import ml_dtypes
import numpy as np
import pytest

import tensorops
import tensorops_native as tn
from tensorops._operations import Operations
from tensorops.kserve import method_path as kserve_path
from tensorops.kserve.v2 import inference_pb2 as kpb
from tensorops.protocol import doctables, table
from tensorops_server import Config, TensorOpsServer

ROWS = {**table.OPERATIONS, "QuantizedInnerProduct": table.CREATE_SESSION}
ROOT = pathlib.Path(__file__).resolve().parents[2]
# Arguments of a call rather than of the operation (the clients' own, native `out=`, and the
# session memory the server gives a session's context: `state=`).
CALL_ONLY = {"self", "out", "timeout", "metadata", "state"}


def _parameters(fn, drop=()) -> tuple:
    return tuple(
        (p.name, p.kind is p.KEYWORD_ONLY, table.REQUIRED if p.default is p.empty else p.default)
        for p in inspect.signature(fn).parameters.values()
        if p.name not in CALL_ONLY | set(drop)
    )


@pytest.mark.parametrize("name", sorted(ROWS))
def test_native_functions_have_the_row_signature(name):
    assert _parameters(getattr(tn, ROWS[name].native_name)) == ROWS[name].parameters


@pytest.mark.parametrize("name", sorted(ROWS))
def test_client_methods_have_the_row_signature(name):
    row = ROWS[name]
    if name == "quantized_inner_product":  # (a, b) one-shot or (b) for a session: see its docstring
        client = _parameters(Operations.quantized_inner_product, drop=("arrays", "max_m"))
        assert client == tuple(p for p in row.parameters if p[0] not in ("a", "b"))
    else:
        assert _parameters(getattr(Operations, name)) == row.parameters


def test_request_fields_are_the_row_arguments():
    for row in ROWS.values():
        fields = [f.name for f in row.fields]
        assert set(fields) == set(row.arguments) - {"format"}, row.name
        assert ("format" in row.arguments) == bool(row.layout), row.name
        assert all(row.field(name).is_tensor for name in row.layout)


@pytest.mark.parametrize("name", sorted(table.OPERATIONS))
def test_local_client_calls_the_row_native_function(name, monkeypatch):
    """LocalClient resolves the native function through the row: pointed elsewhere, it
    calls that."""
    row = table.OPERATIONS[name]
    calls = []
    monkeypatch.setattr(tn, "spy", lambda **kwargs: calls.append(kwargs) or "spied", raising=False)
    monkeypatch.setitem(table.OPERATIONS, name, dataclasses.replace(row, native="spy"))
    with tensorops.LocalClient() as client:
        assert client._call(name, {"x": 1}, None, ()) == "spied"
    assert calls == [{"x": 1}]


@pytest.fixture
def server(monkeypatch):
    """A server in this process, built after the test changed the table."""
    started = []

    def start() -> str:
        s = TensorOpsServer(Config(port=0, metrics_port=-1, threads=2, grace=0.5))
        s.start()
        started.append(s)
        return f"127.0.0.1:{s.port}"

    yield start
    for s in started:
        s.stop(0.2)


def _unary(channel, service_path: str, request, response_class):
    return channel.unary_unary(
        service_path,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response_class.FromString,
    )(request, timeout=10)


def test_v1_endpoint_serves_every_row(server):
    """GetServerInfo lists the rows; each row's RPC is served by its handler, which names
    the first required argument missing from an empty request."""
    target = server()
    with tensorops.Client(target) as client:
        assert client.info()["operations"] == list(table.OPERATIONS)
    with grpc.insecure_channel(target) as channel:
        for row in table.OPERATIONS.values():
            with pytest.raises(grpc.RpcError) as err:
                _unary(channel, row.path, row.request_class(), row.response_class)
            # the first argument it cannot go without (an empty list of operands is the kernel's to refuse)
            first = next(f.name for f in row.fields if f.required and f.kind is not table.Kind.TENSORS)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, row.name
            assert err.value.details().startswith(f"{first}: required"), (row.name, err.value.details())


def _metadata(channel, name: str):
    return _unary(channel, kserve_path("ModelMetadata"), kpb.ModelMetadataRequest(name=name), kpb.ModelMetadataResponse)


def _config(channel, name: str):
    return _unary(
        channel, kserve_path("ModelConfig"), kpb.ModelConfigRequest(name=name), kpb.ModelConfigResponse
    ).config


def test_kserve_models_describe_the_rows(server):
    target = server()
    with grpc.insecure_channel(target) as channel:
        for row in table.OPERATIONS.values():
            meta = _metadata(channel, row.name)
            assert [t.name for t in meta.inputs] == [f.name for f in row.inputs]
            assert [t.name for t in meta.outputs] == list(row.outputs)
            for t in list(meta.inputs) + list(meta.outputs):
                assert t.datatype == row.spec(t.name).datatypes[0], (row.name, t.name)
            parameters = _config(channel, row.name).parameters
            for f in row.attributes:
                words = parameters[f.name].string_value
                assert ("required" in words) == f.required, (row.name, f.name, words)
                if not f.required:
                    assert f"default {f.default!r}" in words
                if f.name in row.notes:
                    assert row.notes[f.name] in words


def test_a_changed_row_changes_the_kserve_model(server, monkeypatch):
    row = table.OPERATIONS["softmax"]
    changed = dataclasses.replace(
        row,
        signature="x, axis=1",
        notes={"axis": "counted from the first dimension"},
        tensors={"x": table.TensorSpec(("BF16", "FP32"))},
    )
    monkeypatch.setitem(table.OPERATIONS, "softmax", changed)
    target = server()
    with grpc.insecure_channel(target) as channel:
        meta = _metadata(channel, "softmax")
        assert meta.inputs[0].datatype == "BF16"
        words = _config(channel, "softmax").parameters["axis"].string_value
        assert "default 1" in words and "counted from the first dimension" in words


@pytest.mark.parametrize("name", sorted(doctables.TABLES))
def test_docs_tables_are_the_rendering_of_the_table(name):
    for file in doctables.TABLES[name][1]:
        text = (ROOT / file).read_text()
        assert doctables.render(text, name) == text, (
            f"{file}: the {name} table differs from the operation table; "
            "run `python -m tensorops.protocol.doctables --write`"
        )


def test_docs_tables_follow_a_changed_row(monkeypatch):
    row = table.OPERATIONS["unary"]
    monkeypatch.setitem(table.OPERATIONS, "unary", dataclasses.replace(row, summary="a changed summary"))
    assert "a changed summary" in doctables.functions()
    text = (ROOT / "README.md").read_text()
    assert doctables.render(text, "operations") != text


def test_result_shapes_are_what_the_native_functions_return():
    """The bytes reserved before a kernel runs are the bytes of its result."""
    rng = np.random.default_rng(0)
    x = rng.random((2, 4, 3, 5), dtype=np.float32)
    b = rng.integers(-5, 5, (6, 7), dtype=np.int8)
    cases = {
        "softmax": dict(x=x),
        "channel_sum": dict(x=x.astype(ml_dtypes.bfloat16), format="nhwc"),
        "eltwise": dict(inputs=[x, x], op="sum"),
        "shuffle": dict(x0=x, x1=x, type="split"),
        "quantized_inner_product": dict(
            a=rng.integers(0, 255, (3, 6), dtype=np.uint8),
            b=b,
            b_scale=np.ones(7, np.float32),
            a_scale=0.1,
            a_zero=1,
            c_scale=0.5,
            c_zero=2,
        ),
    }
    for name, kwargs in cases.items():
        row = table.OPERATIONS[name]
        result = getattr(tn, row.native_name)(**kwargs)
        results = result if isinstance(result, tuple) else (result,)
        assert row.result_shapes(kwargs) == [(r.shape, r.dtype) for r in results], name
        assert row.result_bytes(kwargs) == (row.inputs[0].name, sum(r.nbytes for r in results))

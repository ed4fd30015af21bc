"""Quantized inner-product sessions as models: tritonclient's load_model (config and .npy
files) creates one under the caller's name, infer runs its forward, unload releases it;
the session limits, eviction and per-caller isolation hold as for tensorops sessions."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import tritonclient.grpc as tc
import tritonclient.grpc.aio as tca

from kserve_calls import PARAMS, infer_input, npy, refused
from kserve_calls import load_session as load
from kserve_calls import qip_problem as problem
from kserve_calls import session_forward as expected
from rpc_cases import same


def forward(client, name, a, headers=None):
    return client.infer(name, [infer_input("a", a)], headers=headers).as_numpy("c")


def test_lifecycle(triton, server):
    a, b, b_scale, bias = problem(1)
    load(triton, "my_qip", b, b_scale, bias)
    assert triton.is_model_ready("my_qip")
    assert same(expected(a, b, b_scale, bias), forward(triton, "my_qip", a))
    assert same(expected(a[:0], b, b_scale, bias), forward(triton, "my_qip", a[:0]))

    metadata = triton.get_model_metadata("my_qip")
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [("a", "UINT8", [-1, 24])]
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [("c", "UINT8", [-1, 10])]
    config = triton.get_model_config("my_qip").config
    assert [(i.name, list(i.dims)) for i in config.input] == [("a", [-1, 24])]
    index = {m.name: m.state for m in triton.get_model_repository_index().models}
    assert index["my_qip"] == "READY" and index["quantized_inner_product"] == "READY"
    assert triton.get_inference_statistics("my_qip").model_stats[0].inference_count == 2

    async def through_asyncio():  # the same model from the asyncio client
        async with tca.InferenceServerClient(server.target) as client:
            return (await client.infer("my_qip", [infer_input("a", a)])).as_numpy("c")

    assert same(expected(a, b, b_scale, bias), asyncio.run(through_asyncio()))

    # a reload replaces the session
    a2, b2, b_scale2, _ = problem(2)
    load(triton, "my_qip", b2, b_scale2, trans_b=False, max_m=8, **PARAMS)
    assert same(expected(a2, b2, b_scale2), forward(triton, "my_qip", a2))

    triton.unload_model("my_qip")
    assert not triton.is_model_ready("my_qip")
    assert "my_qip" not in {m.name for m in triton.get_model_repository_index().models}
    status, text = refused(forward, triton, "my_qip", a2)
    assert status == "StatusCode.NOT_FOUND" and text.startswith("model_name: no model named 'my_qip'")
    assert refused(triton.unload_model, "my_qip") == (
        "StatusCode.NOT_FOUND",
        "model_name: no session model named 'my_qip'",
    )


def test_trans_b_and_stream(triton):
    a, b, b_scale, _ = problem(3)
    bt = np.ascontiguousarray(b.T)
    load(triton, "qip_t", bt, b_scale, trans_b=True, **PARAMS)
    results = []
    triton.start_stream(callback=lambda result, error: results.append((result, error)))
    try:
        for rows in (a, a[:2]):
            triton.async_stream_infer("qip_t", [infer_input("a", rows)])
    finally:
        triton.stop_stream()
    assert [e for _, e in results] == [None, None]
    for (result, _), rows in zip(results, (a, a[:2]), strict=True):
        assert same(expected(rows, bt, b_scale, trans_b=True, **PARAMS), result.as_numpy("c"))
    triton.unload_model("qip_t")


@pytest.mark.parametrize(
    "name, config, files, message",
    [
        ("softmax", PARAMS, {}, "model_name: 'softmax' is an operation; choose another name for the session"),
        (
            "m",
            {k: v for k, v in PARAMS.items() if k != "a_scale"},
            None,
            "a_scale: required field `a_scale` is missing",
        ),
        ("m", dict(PARAMS, a_zero=1.5), None, "a_zero: expected an int64_param, got double_param 1.5"),
        ("m", dict(PARAMS, alpha=1), None, "alpha: model m has no parameter `alpha`"),
        ("m", PARAMS, {"file:b": b"not numpy"}, "file:b: expected the bytes of a .npy file (numpy.save)"),
        (
            "m",
            PARAMS,
            {"file:c": npy(np.zeros(3, np.int8))},
            "file:c: expected the files file:b, file:b_scale, file:bias",
        ),
        ("m", PARAMS, {"file:b": npy(np.zeros((4, 3), np.float32))}, "b: "),
    ],
)
def test_refused_loads(triton, name, config, files, message):
    _, b, b_scale, _ = problem(4)
    sent = {"file:b": npy(b), "file:b_scale": npy(b_scale)}
    sent.update(files or {})
    status, text = refused(triton.load_model, name, config=json.dumps(config), files=sent)
    assert status == "StatusCode.INVALID_ARGUMENT" and text.startswith(message), text
    assert not triton.is_model_ready("m")


def test_config_must_be_a_json_object(triton):
    assert refused(triton.load_model, "m", config="[1, 2]") == (
        "StatusCode.INVALID_ARGUMENT",
        "config: expected a JSON object, got list",
    )


def test_evicted_session(start_server):
    server = start_server("--max-sessions", "1")
    a, b, b_scale, bias = problem(5)
    with tc.InferenceServerClient(server.target) as client:
        load(client, "first", b, b_scale, bias)
        load(client, "second", b, b_scale)  # the store holds one session: the first goes
        assert not client.is_model_ready("first") and client.is_model_ready("second")
        assert {m.name: m.state for m in client.get_model_repository_index().models}.get("first") in (
            None,
            "UNAVAILABLE",
        )
        status, text = refused(forward, client, "first", a)
        assert status == "StatusCode.NOT_FOUND" and "first" in text
        assert same(expected(a, b, b_scale), forward(client, "second", a))


def test_session_models_belong_to_their_caller(start_server):
    server = start_server(env={"TENSOROPS_AUTH_TOKENS": "alpha-token,beta-token"})
    alpha, beta = ({"authorization": f"Bearer {t}"} for t in ("alpha-token", "beta-token"))
    a, b, b_scale, _ = problem(6)
    _, b2, b_scale2, _ = problem(7)
    with tc.InferenceServerClient(server.target) as client:
        status, _ = refused(client.load_model, "m")
        assert status == "StatusCode.UNAUTHENTICATED"
        load(client, "m", b, b_scale, headers=alpha)
        assert client.is_model_ready("m", headers=alpha) and not client.is_model_ready("m", headers=beta)
        assert refused(forward, client, "m", a, beta)[0] == "StatusCode.NOT_FOUND"
        load(client, "m", b2, b_scale2, headers=beta)  # the same name, another caller's model
        assert same(expected(a, b, b_scale), forward(client, "m", a, alpha))
        assert same(expected(a, b2, b_scale2), forward(client, "m", a, beta))
        client.unload_model("m", headers=beta)
        assert same(expected(a, b, b_scale), forward(client, "m", a, alpha))

"""Every operation as a KServe V2 model, called with tritonclient (sync and asyncio):
results bit-identical to tensorops_native in-process."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tc
import tritonclient.grpc.aio as tca
from tritonclient.grpc import service_pb2, service_pb2_grpc

import tensorops_native as tn
from kserve_calls import BF16, infer_input, infer_request, request
from rpc_cases import cases, same

# uint16 arrays holding BF16 bits are a tensorops SDK convenience: KServe has BF16 itself
CASES = [c for c in cases(seed=11) if "bits" not in c.id]
OUTPUTS = {"shuffle": ("y0", "y1"), "quantized_inner_product": ("c",)}


def outputs_of(result, names):
    return tuple(result.as_numpy(n) for n in names) if len(names) > 1 else result.as_numpy(names[0])


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_operation_sync(triton, case):
    assert not case.missing()
    expected = getattr(tn, case.op)(*case.args, **case.kwargs)
    inputs, parameters = request(case.op, case.args, case.kwargs)
    result = triton.infer(case.op, inputs, parameters=parameters)
    assert same(expected, outputs_of(result, OUTPUTS.get(case.op, ("y",))))
    assert result.get_response().model_name == case.op


def same_argument(a, b) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same_argument, a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and (a.dtype, a.shape) == (b.dtype, b.shape) and a.tobytes() == b.tobytes()
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_native_call_is_tensorops_v1s(case):
    """In process: the native keyword arguments the KServe endpoint makes of a call are the
    ones the tensorops.v1 endpoint makes of the same call encoded by the client: the same
    arrays (bytes, dtypes, shapes), attributes (values and types) and format."""
    from tensorops.protocol import wire
    from tensorops_server import optable
    from tensorops_server.kserve import conversion, models

    entry = optable.build_table()[case.op]
    bound = inspect.signature(getattr(tn, case.op)).bind(*case.args, **case.kwargs).arguments
    v1_kwargs, v1_fmt = entry.arguments(entry.op.request_codec.decode(wire.build_request(entry.op, bound).data), None)
    message, raws = infer_request(case.op, case.args, case.kwargs)
    converted = conversion.infer_request(models.operation_model(entry), message, raws)
    kwargs, fmt = entry.arguments(converted, None)  # the one entry point of both endpoints
    assert fmt == v1_fmt
    assert kwargs.keys() == v1_kwargs.keys()
    assert all(same_argument(kwargs[name], value) for name, value in v1_kwargs.items()), case.id


def test_operations_asyncio(server):
    """The asyncio client, all cases at once on one channel."""
    runnable = [c for c in CASES if not c.missing()]

    async def main():
        async with tca.InferenceServerClient(server.target) as client:

            async def one(case):
                inputs, parameters = request(case.op, case.args, case.kwargs)
                return await client.infer(case.op, inputs, parameters=parameters)

            return await asyncio.gather(*(one(c) for c in runnable))

    for case, result in zip(runnable, asyncio.run(main()), strict=True):
        expected = getattr(tn, case.op)(*case.args, **case.kwargs)
        assert same(expected, outputs_of(result, OUTPUTS.get(case.op, ("y",)))), case.id


@pytest.mark.parametrize(
    "kwargs, sent",
    [
        (dict(axes=[2, 3]), dict(axes="2,3")),
        (dict(axes=0b1100), dict(axes=0b1100)),  # TensorRT's bitmask
        (dict(axes=[-1], activation="relu"), dict(axes="-1", activation="relu")),
        (
            dict(axes=[1, 2, 3], num_groups=2, eps=1e-3, activation=("linear", 2.0, 0.5)),
            dict(axes="1,2,3", num_groups=2, eps=1e-3, activation="linear(2, 0.5)"),
        ),
        (
            dict(axes=[2, 3], normalize_variance=False, compute_dtype="float32"),
            dict(axes="2,3", normalize_variance=False, compute_dtype="float32"),
        ),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["FP32", "FP16", "BF16"])
def test_normalize(triton, kwargs, sent, dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 3, 5)).astype(dtype)
    scale = rng.standard_normal((1, 4, 1, 1)).astype(np.float32)
    expected = tn.normalize(x, scale, **kwargs)
    result = triton.infer("normalize", [infer_input("x", x), infer_input("scale", scale)], parameters=sent)
    assert same(expected, result.as_numpy("y"))


def test_requested_outputs_in_their_order(triton):
    rng = np.random.default_rng(4)
    x0, x1 = (rng.standard_normal((1, 4, 2, 2)).astype(np.float32) for _ in range(2))
    y0, y1 = tn.shuffle(x0, x1, type="split")
    result = triton.infer(
        "shuffle",
        [infer_input("x0", x0), infer_input("x1", x1)],
        parameters={"type": "split"},
        outputs=[tc.InferRequestedOutput("y1"), tc.InferRequestedOutput("y0")],
    )
    response = result.get_response()
    assert [o.name for o in response.outputs] == ["y1", "y0"]
    assert same(y1, result.as_numpy("y1")) and same(y0, result.as_numpy("y0"))


def test_request_id_is_echoed(triton):
    x = np.arange(6, dtype=np.float32)
    result = triton.infer("unary", [infer_input("x", x)], parameters={"op": "neg"}, request_id="call-7")
    response = result.get_response()
    assert (response.id, response.model_version) == ("call-7", "1")
    assert same(-x, result.as_numpy("y"))


def test_typed_contents(server):
    """Inputs in the typed `contents` fields instead of raw contents (tritonclient always
    sends raw contents, so the request is built with its generated messages)."""
    rng = np.random.default_rng(5)
    a = rng.integers(0, 256, (3, 8), dtype=np.uint8)
    b = rng.integers(-128, 128, (8, 4), dtype=np.int8)
    b_scale = np.full(4, 0.01, np.float32)
    bias = rng.integers(-500, 500, 4, dtype=np.int64)
    expected = tn.quantized_inner_product(
        a, b, b_scale=b_scale, a_scale=0.05, a_zero=3, c_scale=0.4, c_zero=9, bias=bias
    )
    request = service_pb2.ModelInferRequest(model_name="quantized_inner_product")
    for name, arr, datatype, field in (
        ("a", a, "UINT8", "uint_contents"),
        ("b", b, "INT8", "int_contents"),
        ("b_scale", b_scale, "FP32", "fp32_contents"),
        ("bias", bias, "INT64", "int64_contents"),
    ):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=arr.shape)
        getattr(tensor.contents, field).extend(arr.ravel().tolist())
    for name, value in (("a_scale", 0.05), ("c_scale", 0.4)):
        request.parameters[name].double_param = value
    for name, value in (("a_zero", 3), ("c_zero", 9)):
        request.parameters[name].int64_param = value
    with grpc.insecure_channel(server.target) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [("c", "UINT8", [3, 4])]
    assert np.frombuffer(response.raw_output_contents[0], np.uint8).reshape(3, 4).tobytes() == expected.tobytes()


def test_large_tensor(triton):
    """Beyond the size where requests are walked without the protobuf runtime (and run on
    a worker): 4 MB in, 4 MB out."""
    x = np.random.default_rng(6).standard_normal((1, 64, 128, 128)).astype(np.float32)
    scale, shift = np.ones(64, np.float32), np.zeros(64, np.float32)
    expected = tn.layer_norm_channels(x, scale, shift, format="nchw")
    inputs = [infer_input("x", x), infer_input("scale", scale), infer_input("shift", shift)]
    assert same(expected, triton.infer("layer_norm_channels", inputs).as_numpy("y"))


def test_stream_infer(triton):
    """ModelStreamInfer: responses in order; a failing request answers with its error and
    the stream goes on."""
    results = []
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((2, 9)).astype(np.float32) for _ in range(3)]
    triton.start_stream(callback=lambda result, error: results.append((result, error)))
    try:
        triton.async_stream_infer("softmax", [infer_input("x", xs[0])])
        triton.async_stream_infer("softmax", [infer_input("x", xs[1])], parameters={"axis": 5})
        triton.async_stream_infer("softmax", [infer_input("x", xs[2])], request_id="third")
    finally:
        triton.stop_stream()
    assert len(results) == 3
    assert results[0][1] is None and same(tn.softmax(xs[0]), results[0][0].as_numpy("y"))
    assert results[1][0] is None and "INVALID_ARGUMENT" in str(results[1][1]) and "axis" in str(results[1][1])
    assert results[2][1] is None and same(tn.softmax(xs[2]), results[2][0].as_numpy("y"))
    assert results[2][0].get_response().id == "third"


def test_idle_stream_is_closed_after_the_read_timeout(start_server):
    """A stream that sends nothing is held to the read timeout like any request that does
    not arrive: it ends with DEADLINE_EXCEEDED, and the server keeps serving."""
    srv = start_server("--read-timeout", "1")
    x = np.random.default_rng(9).standard_normal((2, 7)).astype(np.float32)
    results = []
    with tc.InferenceServerClient(srv.target) as client:
        client.start_stream(callback=lambda result, error: results.append((result, error)))
        try:
            client.async_stream_infer("softmax", [infer_input("x", x)])
            deadline = time.monotonic() + 10
            while len(results) < 2 and time.monotonic() < deadline:  # the answer, then the end
                time.sleep(0.05)
        finally:
            client.stop_stream()
        assert results[0][1] is None and same(tn.softmax(x), results[0][0].as_numpy("y"))
        error = results[1][1]
        assert error.status() == "StatusCode.DEADLINE_EXCEEDED"
        assert error.message() == (
            "no request arrived on the stream within 1 s (the server's read timeout): the stream is closed"
        )
        assert client.is_server_live() and same(
            tn.softmax(x), client.infer("softmax", [infer_input("x", x)]).as_numpy("y")
        )

    # a raw stream that never sends: ended the same way, and within the timeout's reach
    with grpc.insecure_channel(srv.target) as channel:
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        start = time.monotonic()
        done = threading.Event()

        def silent():  # requests that never come
            done.wait()
            yield from ()

        responses = stream(silent(), timeout=20)
        try:
            with pytest.raises(grpc.RpcError) as info:
                next(responses)
        finally:
            done.set()
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "read timeout" in info.value.details()
        assert 0.9 < time.monotonic() - start < 5
    assert srv.proc.poll() is None


def test_stream_infer_asyncio(server):
    rng = np.random.default_rng(8)
    xs = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(4)]

    async def main():
        async with tca.InferenceServerClient(server.target) as client:

            async def requests():
                for x in xs:
                    yield {"model_name": "unary", "inputs": [infer_input("x", x)], "parameters": {"op": "tanh"}}

            out = []
            async for result, error in client.stream_infer(requests()):
                assert error is None
                out.append(result.as_numpy("y"))
                if len(out) == len(xs):
                    break
            return out

    for x, y in zip(xs, asyncio.run(main()), strict=True):
        assert same(tn.unary(x, "tanh"), y)

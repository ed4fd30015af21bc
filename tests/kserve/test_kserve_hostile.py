"""Small requests that used to cost the server far more than their size, on both protocols:
stacked or repeated operands without data, outputs listed many times, long names and
parameter values, deep JSON, undecodable health requests. Each is refused at once with
INVALID_ARGUMENT naming what is at fault, within a bounded amount of memory, while health
checks keep answering, and legitimate calls succeed afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tc
from tritonclient.grpc import service_pb2, service_pb2_grpc

import tensorops
import tensorops_native as tn
from kserve_calls import PARAMS, infer_input, npy, qip_problem, refused, session_forward
from rpc_server import ServerProcess, resident_bytes
from tensorops.protocol import codec, wire
from tensorops.v1 import tensor_pb2

OPERANDS = codec.MAX_OPERANDS
NAME = wire.MAX_NAME_CHARS
# Generous bounds for a shared CI machine; the refusals measured take a few milliseconds.
REFUSED_WITHIN = 1.0  # seconds
HEALTH_WITHIN = 0.25  # seconds, worst health check while an attack is refused
PEAK_GROWTH = 150 << 20  # bytes the server's peak resident memory may grow by in one test
MESSAGE_CHARS = 1000  # the longest status message (docs/protocol.md)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A server of its own, so that its peak resident memory is this module's."""
    proc = ServerProcess(tmp_path_factory.mktemp("hostile") / "server.log").start()
    yield proc
    assert proc.stop() == 0


# The health checks run in a process of their own: in this one, they would wait for the
# interpreter while the test serializes its large requests.
HEALTH_WATCHER = """
import sys, threading, time
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
halt = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), halt.set()), daemon=True).start()
worst = 0.0
with grpc.insecure_channel(sys.argv[1]) as channel:
    stub = health_pb2_grpc.HealthStub(channel)
    stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
    print("ready", flush=True)
    while not halt.is_set():
        start = time.perf_counter()
        stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        worst = max(worst, time.perf_counter() - start)
        time.sleep(0.01)
print(worst, flush=True)
"""


class Attack:
    """Watches the server while requests are refused: health checked every 10 ms from
    another process, peak resident memory compared before and after. On exit: the server
    is alive, health never took longer than HEALTH_WITHIN, the peak grew by less than
    PEAK_GROWTH, and a legitimate call succeeds."""

    def __init__(self, server: ServerProcess):
        self.server = server

    def __enter__(self):
        self.peak = resident_bytes(self.server.proc.pid, "VmHWM")
        self._watcher = subprocess.Popen(
            [sys.executable, "-c", HEALTH_WATCHER, self.server.target],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._watcher.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc):
        worst = float(self._watcher.communicate(timeout=30)[0])
        if exc[0] is not None:
            return
        assert self.server.proc.poll() is None, "the server died"
        grown = resident_bytes(self.server.proc.pid, "VmHWM") - self.peak
        assert grown < PEAK_GROWTH, f"peak resident memory grew by {grown >> 20} MiB"
        assert worst < HEALTH_WITHIN, f"a health check took {worst * 1e3:.0f} ms"
        x = np.array([-1.5, 2.0], np.float32)
        with tc.InferenceServerClient(self.server.target) as client:
            y = client.infer("unary", [infer_input("x", x)], parameters={"op": "abs"}).as_numpy("y")
        assert np.array_equal(y, np.abs(x))


def call_raw(server: ServerProcess, method: str, request: bytes) -> tuple[grpc.StatusCode, str]:
    """(code, details) of a call of `method` (a full path) with hand-made request bytes,
    which must be refused within REFUSED_WITHIN."""
    with grpc.insecure_channel(server.target, options=[("grpc.max_send_message_length", -1)]) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        start = time.perf_counter()
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(method)(request, timeout=30)
        elapsed = time.perf_counter() - start
    assert elapsed < REFUSED_WITHIN, f"refused after {elapsed:.2f} s"
    details = info.value.details()
    assert len(details) <= MESSAGE_CHARS, len(details)
    return info.value.code(), details


def infer_raw(server: ServerProcess, request: service_pb2.ModelInferRequest) -> tuple[grpc.StatusCode, str]:
    return call_raw(server, "/inference.GRPCInferenceService/ModelInfer", request.SerializeToString())


def stacked(n: int, datatype: str = "FP32", model: str = "eltwise", data: bytes = b"") -> service_pb2.ModelInferRequest:
    """An eltwise request whose input `inputs` has shape [n, 0] (n operands without data)."""
    request = service_pb2.ModelInferRequest(model_name=model)
    request.parameters["op"].string_param = "sum"
    request.inputs.add(name="inputs", datatype=datatype, shape=[n, 0])
    request.raw_input_contents.append(data)
    return request


# ---------------------------------------------------------------------------------------
# Operands: at most MAX_OPERANDS, counted before any is built


@pytest.mark.parametrize("n", [OPERANDS + 1, 10**6, 2**32, 2**62])
@pytest.mark.parametrize("datatype", ["FP32", "BF16", "INT8"])
def test_kserve_stacked_operands_beyond_the_cap(target, n, datatype):
    with Attack(target):
        code, details = infer_raw(target, stacked(n, datatype))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert details == f"inputs.shape: at most {OPERANDS} operands (the first dimension, the limit), got {n}"


def test_kserve_operands_up_to_the_cap_are_computed(target):
    operands = np.arange(OPERANDS * 3, dtype=np.float32).reshape(OPERANDS, 3)
    with tc.InferenceServerClient(target.target) as client:
        y = client.infer("eltwise", [infer_input("inputs", operands)], parameters={"op": "max"}).as_numpy("y")
        assert np.array_equal(y, operands[-1])
        status, message = refused(
            client.infer,
            "eltwise",
            [infer_input("inputs", np.zeros((OPERANDS + 1, 1), np.float32))],
            parameters={"op": "max"},
        )
    assert (status, message.split(",")[0]) == (
        "StatusCode.INVALID_ARGUMENT",
        f"inputs.shape: at most {OPERANDS} operands (the first dimension",
    )


def test_kserve_eltwise_without_inputs_names_them(target):
    request = service_pb2.ModelInferRequest(model_name="eltwise")
    request.parameters["op"].string_param = "sum"
    code, details = infer_raw(target, request)
    assert code is grpc.StatusCode.INVALID_ARGUMENT and details.startswith("inputs: expected at least 2"), details


def v1_eltwise(operands: int) -> bytes:
    """An EltwiseRequest of `operands` empty FP32 tensors of shape [0] (7 bytes each) and op sum."""
    tensor = tensor_pb2.Tensor(dtype=tensor_pb2.DATA_TYPE_FP32, shape=[0]).SerializeToString()
    operand = b"\x0a" + bytes([len(tensor)]) + tensor  # field 1 (inputs), length-delimited
    return operand * operands + b"\x10\x02"


@pytest.mark.parametrize("operands", [OPERANDS + 1, 4000, 10**6])  # 4000: a message small enough for protobuf's path
def test_v1_eltwise_operands_beyond_the_cap(target, operands):
    with Attack(target):
        code, details = call_raw(target, "/tensorops.v1.TensorOps/Eltwise", v1_eltwise(operands))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert details == f"inputs: at most {OPERANDS} tensors (the limit), got more"


def test_v1_eltwise_operands_up_to_the_cap(target):
    operands = [np.full(2, i, np.float32) for i in range(OPERANDS)]
    with tensorops.Client(target.target, timeout=30) as client:
        assert np.array_equal(client.eltwise(operands, "max"), operands[-1])
        with pytest.raises(tensorops.InvalidArgumentError) as info:  # refused before it is sent
            client.eltwise(operands + operands[:1], "max")
    assert info.value.field == "inputs" and f"at most {OPERANDS} tensors" in str(info.value)


def length_delimited(number: int, body: bytes) -> bytes:
    return codec._tag(number, 2) + codec._varint(len(body)) + body


@pytest.mark.parametrize(
    "label, message",
    [
        ("8 MB of empty unknown fields", b"\x78\x00" * (4 << 20)),  # field 15, varint 0
        ("a tensor of 8 million dimensions", length_delimited(1, length_delimited(1, b"\x01" * (8 << 20)))),
        ("a group of 2 million fields", b"\x7b" + b"\x08\x00" * (2 << 20) + b"\x7c"),  # group 15 of field 1 = 0
    ],
)
def test_v1_messages_of_too_many_fields(target, label, message):
    """The in-place decoder walks at most MAX_FIELDS fields and dimensions of a message."""
    with Attack(target):
        code, details = call_raw(target, "/tensorops.v1.TensorOps/Softmax", message)
    assert code is grpc.StatusCode.INVALID_ARGUMENT, label
    assert details == f"message: more than {codec.MAX_FIELDS} fields and shape dimensions in all (the limit)"


# ---------------------------------------------------------------------------------------
# Outputs: each at most once; the response charged and bounded before it is assembled


@pytest.mark.parametrize(
    "model, inputs, parameters, outputs",
    [
        ("unary", {"x": np.ones(256 * 1024, np.float32)}, {"op": "abs"}, ["y"] * 1000),
        (
            "shuffle",
            {"x0": np.ones((1, 4, 8), np.float32), "x1": np.ones((1, 4, 8), np.float32)},
            {"type": "split"},
            ["y0", "y1", "y0"],
        ),
    ],
)
def test_outputs_listed_twice(target, model, inputs, parameters, outputs):
    with Attack(target), tc.InferenceServerClient(target.target) as client:
        start = time.perf_counter()
        status, message = refused(
            client.infer,
            model,
            [infer_input(n, v) for n, v in inputs.items()],
            parameters=parameters,
            outputs=[tc.InferRequestedOutput(o) for o in outputs],
        )
        assert time.perf_counter() - start < REFUSED_WITHIN
    twice = outputs[-1]
    assert (status, message) == ("StatusCode.INVALID_ARGUMENT", f"outputs.{twice}: output `{twice}` is listed twice")


# ---------------------------------------------------------------------------------------
# Names and parameter values: at most MAX_NAME_CHARS, checked before anything is kept

LONG = 100_000  # within the 256 KiB a ModelInfer request may hold besides its raw contents
HUGE = 8 << 20  # 8 MiB, for RepositoryModelLoad, whose files make large messages legitimate


@pytest.mark.parametrize(
    "name, value",
    [
        ("axes", "1" + "," * LONG),
        ("compute_dtype", "float32" + " " * LONG),
        ("activation", "relu(" + "1," * (LONG // 2) + "1)"),
        ("timeout", "x" * LONG),  # one of tritonclient's own parameters, otherwise ignored
    ],
)
def test_long_parameter_values(target, name, value):
    """Every value distinct, as in the attack that filled the conversion cache with them."""
    with Attack(target):
        for i in range(4):
            request = service_pb2.ModelInferRequest(model_name="normalize")
            request.parameters[name].string_param = str(i) + value
            request.inputs.add(name="x", datatype="FP32", shape=[2, 3])
            request.raw_input_contents.append(np.ones(6, np.float32).tobytes())
            code, details = infer_raw(target, request)
            assert code is grpc.StatusCode.INVALID_ARGUMENT
            assert details == f"{name}: at most {NAME} characters, got {len(value) + 1}"


def test_parameter_values_up_to_the_cap(target):
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    with tc.InferenceServerClient(target.target) as client:
        y = client.infer("normalize", [infer_input("x", x)], parameters={"axes": "2" + " " * (NAME - 1)}).as_numpy("y")
    assert np.array_equal(y, tn.normalize(x, axes=[2]))


@pytest.mark.parametrize("where", ["model", "input", "parameter", "output", "version", "id", "datatype", "region"])
def test_long_names(target, where):
    """Names echoed in errors or kept: refused by length, the message within its limit and
    without the name."""
    long = "n" * LONG
    request = service_pb2.ModelInferRequest(
        model_name=long if where == "model" else "unary",
        model_version=long if where == "version" else "",
        id=long if where == "id" else "",
    )
    request.parameters[long if where == "parameter" else "op"].string_param = "abs"
    x = request.inputs.add(
        name=long if where == "input" else "x", datatype=long if where == "datatype" else "FP32", shape=[2]
    )
    if where == "region":
        x.parameters["shared_memory_region"].string_param = long
        x.parameters["shared_memory_byte_size"].int64_param = 8
    else:
        request.raw_input_contents.append(bytes(8))
    if where == "output":
        request.outputs.add(name=long)
    with Attack(target):
        code, details = infer_raw(target, request)
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert details.endswith(f": at most {NAME} characters, got {LONG}"), details[:300]
    assert "nnnn" not in details


def test_error_messages_echo_a_name_once_within_the_limit(target):
    name = "p" * NAME  # the longest name allowed, unknown to the model
    with tc.InferenceServerClient(target.target) as client:
        status, message = refused(
            client.infer, "softmax", [infer_input("x", np.ones(3, np.float32))], parameters={name: 1}
        )
    assert status == "StatusCode.INVALID_ARGUMENT"
    assert message.startswith(f"{name[:50]}") and len(message) <= MESSAGE_CHARS
    assert "more characters" in message  # the field and the description share the limit


def load_request(name: str, config: str | None = None, **files) -> bytes:
    a, b, b_scale, bias = qip_problem(0)
    request = service_pb2.RepositoryModelLoadRequest(model_name=name)
    request.parameters["config"].string_param = json.dumps(PARAMS) if config is None else config
    for key, value in {"file:b": npy(b), "file:b_scale": npy(b_scale), **files}.items():
        request.parameters[key].bytes_param = value
    return request.SerializeToString()


LOAD = "/inference.GRPCInferenceService/RepositoryModelLoad"


def test_long_model_names_are_not_loaded(target):
    with Attack(target):
        for i in range(5):
            code, details = call_raw(target, LOAD, load_request(str(i) + "m" * HUGE))
            assert (code, details) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                f"model_name: at most {NAME} characters, got {HUGE + 1}",
            )
        with tc.InferenceServerClient(target.target) as client:
            start = time.perf_counter()
            index = client.get_model_repository_index()
            assert time.perf_counter() - start < REFUSED_WITHIN
    assert all(len(m.name) <= NAME for m in index.models)


def test_longest_model_name_loads_and_is_listed(target):
    name = "s" * NAME
    a, b, b_scale, bias = qip_problem(0)
    with tc.InferenceServerClient(target.target) as client:
        client.load_model(name, config=json.dumps(PARAMS), files={"file:b": npy(b), "file:b_scale": npy(b_scale)})
        try:
            assert name in [m.name for m in client.get_model_repository_index().models]
            c = client.infer(name, [infer_input("a", a)]).as_numpy("c")
            assert np.array_equal(c, session_forward(a, b, b_scale))
        finally:
            client.unload_model(name)


@pytest.mark.parametrize(
    "config, message",
    [
        ("[" * 100_000 + "]" * 100_000, "config: at most 4096 characters, got 200000"),
        (
            "[" * 2000 + "]" * 2000,
            "config: expected a JSON object of scalars, got text that is not JSON or is nested too deep",
        ),
        (
            '{"a_scale": ' + "[" * 500 + "]" * 500 + "}",
            "a_scale: expected a number, a string or a bool, got a JSON array",
        ),
        ('{"a_scale": {"x": 1}}', "a_scale: expected a number, a string or a bool, got a JSON object"),
    ],
)
def test_deep_or_large_json_config(target, config, message):
    with Attack(target):
        assert call_raw(target, LOAD, load_request("deep", config)) == (grpc.StatusCode.INVALID_ARGUMENT, message)


# ---------------------------------------------------------------------------------------
# .npy files in either byte order


def npy_big_endian(arr) -> bytes:
    return npy(arr.astype(arr.dtype.newbyteorder(">")))


def test_big_endian_npy_files_load_the_same_session(target):
    a, b, b_scale, bias = qip_problem(3)
    bias = bias.astype(np.int32)
    expected = session_forward(a, b, b_scale, bias)
    assert expected.any()
    with tc.InferenceServerClient(target.target) as client:
        for name, encode in (("little", npy), ("big", npy_big_endian)):
            client.load_model(
                name,
                config=json.dumps(PARAMS),
                files={"file:b": encode(b), "file:b_scale": encode(b_scale), "file:bias": encode(bias)},
            )
            try:
                assert np.array_equal(client.infer(name, [infer_input("a", a)]).as_numpy("c"), expected), name
            finally:
                client.unload_model(name)


def test_big_endian_npy_of_the_wrong_size_is_refused(target):
    truncated = npy_big_endian(qip_problem(3)[2])[:-4]
    code, details = call_raw(target, LOAD, load_request("short", **{"file:b_scale": truncated}))
    assert (code, details) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "b_scale.data: expected 40 bytes for shape [10] of DATA_TYPE_FP32, got 36",
    )


# ---------------------------------------------------------------------------------------
# Liveness and readiness


@pytest.mark.parametrize("rpc", ["ServerLive", "ServerReady"])
@pytest.mark.parametrize("garbage", [b"\xff\xff\xff", b"\x0a\x05ab", b"\x08"])
def test_undecodable_health_requests(target, rpc, garbage):
    code, details = call_raw(target, f"/inference.GRPCInferenceService/{rpc}", garbage)
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"message: the request is not a valid inference.{rpc}Request message"), details
    with tc.InferenceServerClient(target.target) as client:
        assert client.is_server_live() and client.is_server_ready()


# ---------------------------------------------------------------------------------------
# Large messages: walked within the field limit before the protobuf runtime parses them


def description_bytes(request: service_pb2.ModelInferRequest) -> int:
    without_raw = service_pb2.ModelInferRequest()
    without_raw.CopyFrom(request)
    del without_raw.raw_input_contents[:]
    return without_raw.ByteSize()


@pytest.mark.parametrize("label", ["dimensions", "typed contents", "outputs", "parameters"])
def test_large_descriptions_are_refused_before_they_are_parsed(target, label):
    """Millions of 1-byte dimensions or int64 elements take 8 bytes each once parsed, and
    typed contents are converted element by element: beyond 256 KiB besides the raw
    contents, a request is refused as it arrives."""
    request = service_pb2.ModelInferRequest(model_name="unary")
    request.parameters["op"].string_param = "abs"
    x = request.inputs.add(name="x", datatype="INT64", shape=[1])
    if label == "dimensions":
        x.shape.extend([1] * (4 << 20))
    elif label == "typed contents":
        x.shape[:] = [4 << 20]
        x.contents.int64_contents.extend([1] * (4 << 20))
    elif label == "outputs":
        for _ in range(60_000):
            request.outputs.add(name="y" * 8)
    else:
        for i in range(40_000):
            request.parameters[f"{i}"].int64_param = 1
    if label != "typed contents":
        request.raw_input_contents.append(bytes(8 << 20))  # some raw contents, for a large message
    size = description_bytes(request)
    with Attack(target):
        code, details = infer_raw(target, request)
    assert code is grpc.StatusCode.INVALID_ARGUMENT, label
    assert details == (
        f"message: {size} bytes besides raw_input_contents, more than the limit of "
        f"{256 * 1024}: send large tensors as raw contents"
    )


def test_load_of_millions_of_parameters(target):
    """RepositoryModelLoad has no raw contents: its fields are counted before it is parsed."""
    request = service_pb2.RepositoryModelLoadRequest(model_name="many")
    entry = service_pb2.RepositoryModelLoadRequest.ParametersEntry(key="k").SerializeToString()
    raw = request.SerializeToString() + (b"\x1a" + bytes([len(entry)]) + entry) * (1 << 20)
    with Attack(target):
        code, details = call_raw(target, LOAD, raw)
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, f"message: {codec.TOO_MANY_FIELDS}")


def test_typed_contents_within_the_limit(target):
    x = np.linspace(-1, 1, 60_000, dtype=np.float32)  # 240 KB of fp32_contents
    request = service_pb2.ModelInferRequest(model_name="unary")
    request.parameters["op"].string_param = "abs"
    request.inputs.add(name="x", datatype="FP32", shape=[x.size]).contents.fp32_contents.extend(x.tolist())
    with grpc.insecure_channel(target.target) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert np.array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), np.abs(x))


def test_stream_answers_each_refusal_in_place_and_goes_on(target):
    """On ModelStreamInfer, the same refusals arrive as error messages in the stream, which
    then serves the next request."""
    legit = service_pb2.ModelInferRequest(model_name="unary")
    legit.parameters["op"].string_param = "abs"
    legit.inputs.add(name="x", datatype="FP32", shape=[2])
    legit.raw_input_contents.append(np.array([-1, 2], np.float32).tobytes())
    listed_twice = service_pb2.ModelInferRequest()
    listed_twice.CopyFrom(legit)
    listed_twice.outputs.add(name="y")
    listed_twice.outputs.add(name="y")
    requests = [
        stacked(2**32).SerializeToString(),
        listed_twice.SerializeToString(),
        b"\xff\xff\xff",
        legit.SerializeToString(),
    ]
    with Attack(target), grpc.insecure_channel(target.target) as channel:
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        responses = list(stream(iter(requests), timeout=30))
    assert [r.error_message.split(":")[:2] for r in responses[:3]] == [
        ["INVALID_ARGUMENT", " inputs.shape"],
        ["INVALID_ARGUMENT", " outputs.y"],
        ["INVALID_ARGUMENT", " message"],
    ]
    assert responses[3].error_message == ""
    assert np.array_equal(np.frombuffer(responses[3].infer_response.raw_output_contents[0], np.float32), [1, 2])


def test_parameters_are_measured_before_any_is_converted():
    """In process: a value refused for its length is refused before any parameter is
    converted (the unconvertible value beside it is not what is reported), and the values
    become what the native function takes: the text forms read, canonical names, a bitmask
    as its bits. Nothing is kept between calls: the same parameters convert the same."""
    from tensorops.kserve.v2 import inference_pb2
    from tensorops_server import errors, kserve, optable

    table = optable.build_table()
    normalize = kserve.operation_model(table["normalize"])

    def parameters(**values):
        request = inference_pb2.ModelInferRequest()
        for name, value in values.items():
            if isinstance(value, int):
                request.parameters[name].int64_param = value
            else:
                request.parameters[name].string_param = value
        return request.parameters

    for value in ("1" + " " * NAME, "float32" + " " * NAME):
        with pytest.raises(errors.Failure, match=f"at most {NAME} characters"):
            kserve.request_attributes(normalize, parameters(axes=value, activation="not an activation(", eps=value))
    for _ in range(2):
        attributes, fmt = kserve.request_attributes(
            normalize, parameters(axes=" 1, 3 ", activation="Leaky_Relu( 0.5 )")
        )
        assert (attributes, fmt) == ({"axes": [1, 3], "activation": ("leaky_relu", 0.5)}, 0)
    assert kserve.request_attributes(normalize, parameters(axes=0b1010))[0] == {"axes": [1, 3]}
    unary = kserve.operation_model(table["unary"])
    assert kserve.request_attributes(unary, parameters(op="EXP"))[0] == {"op": "exp"}
    assert kserve.request_attributes(unary, parameters(op=list(tn.UNARY_OPS).index("exp")))[0] == {"op": "exp"}
    layout = kserve.operation_model(table["channel_sum"])
    assert kserve.request_attributes(layout, parameters(format="NHWC")) == ({}, tensor_pb2.FORMAT_NHWC)

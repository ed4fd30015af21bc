"""System shared memory through tritonclient's shared_memory utilities: inputs read from
and outputs written into registered regions, bit-identical to tensorops_native; bad
regions (unregistered, out of bounds, shrunk, disallowed key, too many) refused cleanly,
the server healthy afterwards; regions unmapped on Unregister."""

from __future__ import annotations

import os
import uuid

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as tc
import tritonclient.utils.shared_memory as shm

import tensorops_native as tn
from kserve_calls import infer_input, load_session, qip_problem, refused, session_forward
from rpc_cases import same
from rpc_server import process_tree


@pytest.fixture
def client(shm_server):
    with tc.InferenceServerClient(shm_server.target) as c:
        yield c
        c.unregister_system_shared_memory()


@pytest.fixture
def regions():
    """Create shared-memory objects (keys under the server's default prefix), destroyed after."""
    handles = []

    def create(byte_size: int, prefix: str = "tensorops_"):
        key = f"/{prefix}{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key.lstrip("/"), key, byte_size)
        handles.append(handle)
        return key, handle

    yield create
    for handle in handles:
        shm.destroy_shared_memory_region(handle)


def layer_norm_problem(seed=0, shape=(2, 16, 8, 8)):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    return x, (rng.random(shape[1]) + 0.5).astype(np.float32), rng.standard_normal(shape[1]).astype(np.float32)


def test_inputs_and_outputs_in_shared_memory(client, regions):
    x, scale, shift = layer_norm_problem()
    expected = tn.layer_norm_channels(x, scale, shift, eps=1e-4)
    key_in, handle_in = regions(x.nbytes + 64)
    key_out, handle_out = regions(x.nbytes)
    shm.set_shared_memory_region(handle_in, [x], offset=64)
    client.register_system_shared_memory("in", key_in, x.nbytes, offset=64)
    client.register_system_shared_memory("out", key_out, x.nbytes)
    assert "system_shared_memory" in client.get_server_metadata().extensions
    status = client.get_system_shared_memory_status().regions
    assert {n: (r.key, r.offset, r.byte_size) for n, r in status.items()} == {
        "in": (key_in, 64, x.nbytes),
        "out": (key_out, 0, x.nbytes),
    }

    x_in = tc.InferInput("x", list(x.shape), "FP32")
    x_in.set_shared_memory("in", x.nbytes)
    y_out = tc.InferRequestedOutput("y")
    y_out.set_shared_memory("out", x.nbytes)
    for _ in range(2):  # the regions serve call after call
        result = client.infer(
            "layer_norm_channels",
            [x_in, infer_input("scale", scale), infer_input("shift", shift)],
            parameters={"eps": 1e-4},
            outputs=[y_out],
        )
        output = result.get_output("y")
        assert (output.datatype, list(output.shape)) == ("FP32", list(x.shape))
        assert output.parameters["shared_memory_region"].string_param == "out"
        assert len(result.get_response().raw_output_contents[0]) == 0
        assert same(expected, shm.get_contents_as_numpy(handle_out, np.float32, x.shape))
        shm.set_shared_memory_region(handle_out, [np.zeros_like(x)])


@pytest.mark.parametrize("offset", [0, 2], ids=["aligned", "misaligned"])  # kernel writes it / a copy
def test_eltwise_result_into_shared_memory(client, regions, offset):
    rng = np.random.default_rng(2)
    inputs = np.stack([rng.standard_normal((3, 70)).astype(np.float32) for _ in range(3)])
    expected = tn.eltwise(list(inputs), "max")
    key, handle = regions(expected.nbytes + offset)
    client.register_system_shared_memory("y", key, expected.nbytes + offset)
    y_out = tc.InferRequestedOutput("y")
    y_out.set_shared_memory("y", expected.nbytes, offset=offset)
    client.infer("eltwise", [infer_input("inputs", inputs)], parameters={"op": "max"}, outputs=[y_out])
    assert same(expected, shm.get_contents_as_numpy(handle, np.float32, expected.shape, offset=offset).copy())


@pytest.mark.parametrize(
    "model, expected, inputs, parameters",
    [
        (
            "normalize",
            lambda x, g: tn.normalize(x, g, axes=[2, 3], activation=("leaky_relu", 0.1)),
            lambda x, g: [infer_input("x", x), infer_input("scale", g)],
            {"axes": "2,3", "activation": "leaky_relu(0.1)"},
        ),
        (
            "channel_sum",
            lambda x, g: tn.channel_sum(x.astype(ml_dtypes.bfloat16), format="nhwc"),
            lambda x, g: [infer_input("x", x.astype(ml_dtypes.bfloat16))],
            {"format": "nhwc"},
        ),
    ],
    ids=["normalize", "channel_sum"],
)
def test_results_written_into_shared_memory(client, regions, model, expected, inputs, parameters):
    """normalize (the shape of x) and channel_sum ((batch, channels) fp32) write into the region."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 6, 5, 4)).astype(np.float32)
    g = (rng.random((1, 6, 1, 1)) + 0.5).astype(np.float32)
    want = expected(x, g)
    key, handle = regions(want.nbytes + 64)
    client.register_system_shared_memory("y", key, want.nbytes + 64)
    y_out = tc.InferRequestedOutput("y")
    y_out.set_shared_memory("y", want.nbytes + 64, offset=0)
    for _ in range(2):
        shm.set_shared_memory_region(handle, [np.full(want.nbytes + 64, 7, np.uint8)])
        result = client.infer(model, inputs(x, g), parameters=parameters, outputs=[y_out])
        output = result.get_output("y")
        assert (
            list(output.shape) == list(want.shape)
            and output.parameters["shared_memory_byte_size"].int64_param == want.nbytes
        )
        got = shm.get_contents_as_numpy(handle, np.uint8, (want.nbytes,)).copy()
        assert got.tobytes() == want.view(np.uint8).tobytes()


def test_one_output_in_shared_memory_the_other_in_the_message(client, regions):
    rng = np.random.default_rng(1)
    x0, x1 = (rng.standard_normal((1, 6, 3, 3)).astype(np.float32) for _ in range(2))
    y0, y1 = tn.shuffle(x0, x1, type="split")
    key, handle = regions(4096)
    client.register_system_shared_memory("y0", key, 4096)
    y0_out = tc.InferRequestedOutput("y0")
    y0_out.set_shared_memory("y0", 4096)
    result = client.infer(
        "shuffle",
        [infer_input("x0", x0), infer_input("x1", x1)],
        parameters={"type": "split"},
        outputs=[y0_out, tc.InferRequestedOutput("y1")],
    )
    assert same(y1, result.as_numpy("y1"))  # tritonclient finds raw contents by the output's index
    assert same(y0, shm.get_contents_as_numpy(handle, np.float32, y0.shape))


def test_session_model_through_shared_memory(client, regions):
    a, b, b_scale, bias = qip_problem(9)
    load_session(client, "shm_qip", b, b_scale, bias)
    key, handle = regions(a.nbytes + 4096)
    shm.set_shared_memory_region(handle, [a])
    client.register_system_shared_memory("qip", key, a.nbytes + 4096)
    a_in = tc.InferInput("a", list(a.shape), "UINT8")
    a_in.set_shared_memory("qip", a.nbytes)
    c_out = tc.InferRequestedOutput("c")
    c_out.set_shared_memory("qip", 4096, offset=a.nbytes)
    client.infer("shm_qip", [a_in], outputs=[c_out])
    want = session_forward(a, b, b_scale, bias)
    assert same(want, shm.get_contents_as_numpy(handle, np.uint8, want.shape, offset=a.nbytes))
    client.unload_model("shm_qip")


def _x_in(region, byte_size, offset=0, shape=(2, 16, 8, 8)):
    tensor = tc.InferInput("x", list(shape), "FP32")
    tensor.set_shared_memory(region, byte_size, offset)
    return tensor


def _infer_x(client, x_in):
    _, scale, shift = layer_norm_problem()
    return client.infer("layer_norm_channels", [x_in, infer_input("scale", scale), infer_input("shift", shift)])


def test_bad_uses_of_regions(client, regions, shm_server):
    x, _, _ = layer_norm_problem()
    key, handle = regions(x.nbytes)
    shm.set_shared_memory_region(handle, [x])
    client.register_system_shared_memory("r", key, x.nbytes)
    assert refused(_infer_x, client, _x_in("nope", x.nbytes)) == (
        "StatusCode.NOT_FOUND",
        "x.shared_memory_region: no shared-memory region named 'nope' is registered",
    )
    assert refused(_infer_x, client, _x_in("r", x.nbytes, offset=4)) == (
        "StatusCode.INVALID_ARGUMENT",
        f"x.shared_memory_region: offset 4 + byte_size {x.nbytes} exceed the region's {x.nbytes} bytes",
    )
    assert refused(_infer_x, client, _x_in("r", x.nbytes - 4)) == (
        "StatusCode.INVALID_ARGUMENT",
        f"x: shared_memory_byte_size is {x.nbytes - 4}; [2, 16, 8, 8] of FP32 takes {x.nbytes}",
    )
    small = tc.InferRequestedOutput("y")
    small.set_shared_memory("r", 16)
    status, text = refused(client.infer, "softmax", [infer_input("x", x)], outputs=[small])
    assert (status, text) == (
        "StatusCode.INVALID_ARGUMENT",
        f"outputs.y.shared_memory_byte_size: the result takes {x.nbytes} bytes, more than the 16 given",
    )
    # the object shrinks behind the server's back: refused, not a crash
    os.truncate(f"/dev/shm/{key.lstrip('/')}", 1024)
    status, text = refused(_infer_x, client, _x_in("r", x.nbytes))
    assert status == "StatusCode.INVALID_ARGUMENT" and "shrank" in text
    client.unregister_system_shared_memory("r")
    assert refused(_infer_x, client, _x_in("r", x.nbytes))[0] == "StatusCode.NOT_FOUND"
    assert client.is_server_ready() and shm_server.proc.poll() is None


def test_each_part_of_a_region_checked_against_its_size(client, regions, shm_server):
    """x and y in one region: the object's size is read once per call, and every part the
    call uses is checked against it. A shrink that leaves x whole and cuts into y is
    refused, naming y, before the kernel runs; once the object is grown back, the region
    serves again (the size is read anew by each call)."""
    x, scale, shift = layer_norm_problem()
    key, handle = regions(2 * x.nbytes)
    shm.set_shared_memory_region(handle, [x])
    client.register_system_shared_memory("xy", key, 2 * x.nbytes)
    y_out = tc.InferRequestedOutput("y")
    y_out.set_shared_memory("xy", x.nbytes, offset=x.nbytes)

    def call():
        client.infer(
            "layer_norm_channels",
            [_x_in("xy", x.nbytes), infer_input("scale", scale), infer_input("shift", shift)],
            outputs=[y_out],
        )

    path = f"/dev/shm/{key.lstrip('/')}"
    os.truncate(path, x.nbytes + 64)
    status, text = refused(call)
    assert (
        status == "StatusCode.INVALID_ARGUMENT"
        and text.startswith("outputs.y.shared_memory_region: ")
        and "shrank" in text
    ), text
    os.truncate(path, 2 * x.nbytes)
    call()
    y = shm.get_contents_as_numpy(handle, np.float32, x.shape, offset=x.nbytes)
    assert same(y, tn.layer_norm_channels(x, scale, shift))
    assert client.is_server_ready() and shm_server.proc.poll() is None


@pytest.mark.parametrize(
    "key, size, code, message",
    [
        (
            "/other_region",
            64,
            "PERMISSION_DENIED",
            "key: this server maps only the shared-memory objects whose names start with 'tensorops_'",
        ),
        ("/tensorops_does_not_exist", 64, "NOT_FOUND", "key: no shared-memory object of that name"),
        ("/tensorops_../etc", 64, "INVALID_ARGUMENT", "key: expected the name of a POSIX shared-memory object"),
        (None, 1 << 20, "INVALID_ARGUMENT", "byte_size: offset 0 + byte_size 1048576 exceed the object's 4096 bytes"),
    ],
)
def test_refused_registrations(client, regions, key, size, code, message):
    created, _ = regions(4096)
    status, text = refused(client.register_system_shared_memory, "r", key or created, size)
    assert status == f"StatusCode.{code}" and text.startswith(message), text
    assert "r" not in client.get_system_shared_memory_status().regions


def test_a_disallowed_key_is_not_echoed(client, regions):
    key, _ = regions(64, prefix="secret_")
    status, text = refused(client.register_system_shared_memory, "r", key, 64)
    assert status == "StatusCode.PERMISSION_DENIED" and key.lstrip("/") not in text


def test_region_limits(start_server, regions):
    server = start_server(
        "--allow-shared-memory", "true", "--max-shared-memory-regions", "2", "--max-shared-memory-bytes", "8192"
    )
    with tc.InferenceServerClient(server.target) as client:
        keys = [regions(4096)[0] for _ in range(3)]
        client.register_system_shared_memory("a", keys[0], 4096)
        assert refused(client.register_system_shared_memory, "a", keys[1], 16)[0] == "StatusCode.ALREADY_EXISTS"
        assert refused(client.register_system_shared_memory, "b", keys[1], 4097)[0] == "StatusCode.RESOURCE_EXHAUSTED"
        client.register_system_shared_memory("b", keys[1], 4096)
        status, text = refused(client.register_system_shared_memory, "c", keys[2], 16)
        assert status == "StatusCode.RESOURCE_EXHAUSTED" and "2 regions" in text
        client.unregister_system_shared_memory("a")
        client.register_system_shared_memory("c", keys[2], 16)


def test_regions_are_unmapped_on_unregister(client, regions, shm_server):
    key, _ = regions(8192)
    path = f"/dev/shm/{key.lstrip('/')}"

    def mapped() -> bool:
        for pid in process_tree(shm_server.proc.pid):  # the server's workers too
            with open(f"/proc/{pid}/maps") as maps:
                if any(line.rstrip().endswith(path) for line in maps):
                    return True
        return False

    client.register_system_shared_memory("m", key, 8192)
    assert mapped()
    client.unregister_system_shared_memory("m")
    assert not mapped()


def test_off_by_default(triton, regions):
    key, _ = regions(64)
    assert refused(triton.register_system_shared_memory, "r", key, 64) == (
        "StatusCode.UNIMPLEMENTED",
        "system shared memory is off on this server (tensorops-server --allow-shared-memory)",
    )
    assert "system_shared_memory" not in triton.get_server_metadata().extensions

"""Two workers of one server (tests/support/workers.py): session models and shared-memory
regions made through one worker are used, listed, unloaded and capped through the other, with
results bit-identical to tensorops_native in-process."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import tritonclient.grpc as tc
import tritonclient.utils.shared_memory as tshm
from tritonclient.utils import InferenceServerException

import tensorops_native as tn
from kserve_calls import infer_input, load_session, qip_problem, session_forward
from workers import workers  # noqa: F401 (the fixture)


def test_a_session_model_loaded_through_one_worker_is_served_by_the_other(workers):
    w = workers()
    a, b, b_scale, bias = qip_problem(3)
    with tc.InferenceServerClient(w.target(0)) as one, tc.InferenceServerClient(w.target(1)) as two:
        load_session(one, "dense", b, b_scale, bias)
        assert two.is_model_ready("dense")
        assert [m.name for m in two.get_model_repository_index().models if m.name == "dense"] == ["dense"]
        assert [tuple(i.shape) for i in two.get_model_metadata("dense").inputs] == [(-1, b.shape[0])]
        result = two.infer("dense", [infer_input("a", a)]).as_numpy("c")
        assert np.array_equal(result, session_forward(a, b, b_scale, bias))
        two.unload_model("dense")
        with pytest.raises(InferenceServerException) as err:
            one.infer("dense", [infer_input("a", a)])
        assert err.value.status() == "StatusCode.NOT_FOUND"


@pytest.fixture
def region():
    handles = []

    def create(byte_size):
        key = f"/tensorops_{uuid.uuid4().hex[:12]}"
        handles.append(tshm.create_shared_memory_region(key.lstrip("/"), key, byte_size))
        return key, handles[-1]

    yield create
    for handle in handles:
        tshm.destroy_shared_memory_region(handle)


def test_a_region_registered_through_one_worker_is_used_by_the_other(workers, region):
    w = workers(allow_shared_memory=True, max_shared_memory_regions=2)
    x = np.random.default_rng(1).standard_normal((2, 8, 4, 4)).astype(np.float32)
    scale, shift = np.full(8, 1.5, np.float32), np.full(8, 0.25, np.float32)
    key, handle = region(x.nbytes)
    tshm.set_shared_memory_region(handle, [x])
    with tc.InferenceServerClient(w.target(0)) as one, tc.InferenceServerClient(w.target(1)) as two:
        one.register_system_shared_memory("x", key, x.nbytes)
        assert list(two.get_system_shared_memory_status().regions) == ["x"]
        inputs = [infer_input("x", x), infer_input("scale", scale), infer_input("shift", shift)]
        inputs[0].set_shared_memory("x", x.nbytes)
        result = two.infer("layer_norm_channels", inputs).as_numpy("y")
        assert np.array_equal(result, tn.layer_norm_channels(x, scale, shift))
        two.register_system_shared_memory("x2", key, x.nbytes)
        with pytest.raises(InferenceServerException) as err:  # the cap counts both workers' regions
            one.register_system_shared_memory("x3", key, x.nbytes)
        assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        two.unregister_system_shared_memory("x")
        with pytest.raises(InferenceServerException) as err:
            one.infer("layer_norm_channels", inputs)
        assert err.value.status() == "StatusCode.NOT_FOUND"
        one.unregister_system_shared_memory()


def test_a_region_whose_object_was_replaced_is_refused_by_the_other_worker(workers, region):
    w = workers(allow_shared_memory=True)
    x = np.ones((1, 4, 2, 2), np.float32)
    key, _ = region(x.nbytes)
    path = "/dev/shm/" + key.lstrip("/")
    with tc.InferenceServerClient(w.target(0)) as one, tc.InferenceServerClient(w.target(1)) as two:
        one.register_system_shared_memory("x", key, x.nbytes)
        os.unlink(path)  # another object under the same name (the fixture's clean-up removes it)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, x.nbytes)
        os.close(fd)
        inputs = [infer_input("x", x), infer_input("scale", np.ones(4, np.float32))]
        inputs.append(infer_input("shift", np.zeros(4, np.float32)))
        inputs[0].set_shared_memory("x", x.nbytes)
        with pytest.raises(InferenceServerException) as err:
            two.infer("layer_norm_channels", inputs)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and "replaced" in err.value.message()
        one.unregister_system_shared_memory()

"""Hostile uses of system shared memory against a live server: objects shrunk while calls
read and write them (on the event loop and on a worker thread), one caller registering all
it may, hard links, symbolic links and other objects that only look allowed by their name,
odd keys. Each is refused with a clear error, the server stays alive and answers health
checks, and legitimate calls still get exact results."""

from __future__ import annotations

import os
import threading
import time
import uuid

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import tensorops_native as tn
from kserve_calls import refused
from rpc_server import process_tree, resident_bytes
from tensorops_server.config import Config

N = 1 << 20  # float32 elements: 4 MB tensors
NBYTES = 4 * N
SHRANK_DURING = "shrank while the call used it"


@pytest.fixture
def objects():
    """Create shared-memory objects of `size` bytes in /dev/shm (a prefix chosen by the
    caller), unlinked after: returns the path."""
    paths = []

    def create(size: int, prefix: str = "tensorops_") -> str:
        path = f"/dev/shm/{prefix}{uuid.uuid4().hex[:12]}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, size)
        os.close(fd)
        paths.append(path)
        return path

    yield create
    for path in paths:
        if os.path.lexists(path):
            os.unlink(path) if not os.path.isdir(path) or os.path.islink(path) else os.rmdir(path)


def key_of(path: str) -> str:
    return "/" + os.path.basename(path)


def write(path: str, offset: int, arr: np.ndarray) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(arr.tobytes())


def read(path: str, offset: int, like: np.ndarray) -> np.ndarray:
    with open(path, "rb") as f:
        f.seek(offset)
        return np.frombuffer(f.read(like.nbytes), like.dtype).reshape(like.shape)


class HealthProbe:
    """Health checks every 20 ms on a connection of their own; the slowest answer."""

    def __init__(self, target: str):
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._channel = grpc.insecure_channel(target)
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        stub = health_pb2_grpc.HealthStub(self._channel)
        while not self._stop.is_set():
            start = time.perf_counter()
            stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
            self.latencies.append(time.perf_counter() - start)
            time.sleep(0.02)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self._channel.close()
        return max(self.latencies)


def unary_call(region: str, op: str, out_offset: int):
    """unary `op` of x (the region's first NBYTES) into y (at `out_offset` in the same
    region: aligned, the kernel writes there; misaligned, the result is copied there)."""
    x = tc.InferInput("x", [N], "FP32")
    x.set_shared_memory(region, NBYTES)
    y = tc.InferRequestedOutput("y")
    y.set_shared_memory(region, NBYTES, offset=out_offset)
    return [x], {"op": op}, [y]


def layer_norm_call(region: str):
    """layer_norm_channels reading x from the region, its result in the message."""
    x = tc.InferInput("x", [4, 64, 64, 64], "FP32")
    x.set_shared_memory(region, NBYTES)
    scale, shift = tc.InferInput("scale", [64], "FP32"), tc.InferInput("shift", [64], "FP32")
    scale.set_data_from_numpy(np.ones(64, np.float32))
    shift.set_data_from_numpy(np.zeros(64, np.float32))
    return [x, scale, shift], {}, None


def infer(client, model: str, call) -> None:
    inputs, parameters, outputs = call
    client.infer(model, inputs, parameters=parameters, outputs=outputs)


CALLS = [
    ("unary", lambda r: unary_call(r, "exp", NBYTES)),
    ("unary", lambda r: unary_call(r, "abs", NBYTES + 2)),
    ("layer_norm_channels", layer_norm_call),
]


@pytest.mark.parametrize("path", ["inline", "worker"])
def test_objects_shrunk_during_calls_fail_those_calls_only(start_server, objects, path):
    """Hundreds of calls on a region whose object a thread shrinks to nothing and grows back
    without pause: each call succeeds, or fails with INVALID_ARGUMENT saying the object
    shrank (before the call, or during it, then the region is unregistered and is
    registered again here), in well under a second. Calls that were running when the object
    shrank are among them (the SIGBUS of their accesses is absorbed). The server stays
    alive, answers health checks, keeps its memory, and a region nobody shrank serves exact
    results throughout and after."""
    flags = ["--allow-shared-memory", "true"] + (["--inline-shared-memory-bytes", "0"] if path == "worker" else [])
    server = start_server(*flags)
    region_size = 2 * NBYTES + 64
    attacked, intact = objects(region_size), objects(region_size)
    x = np.random.default_rng(7).standard_normal(N).astype(np.float32)
    write(intact, 0, x)
    expected = tn.unary(x, "exp")
    client = tc.InferenceServerClient(server.target)
    client.register_system_shared_memory("attacked", key_of(attacked), region_size)
    client.register_system_shared_memory("intact", key_of(intact), region_size)
    infer(client, "unary", unary_call("intact", "exp", NBYTES))
    baseline_peak = resident_bytes(server.proc.pid, "VmHWM")

    stop = threading.Event()

    def shrink_and_grow():
        while not stop.is_set():
            os.truncate(attacked, 0)
            time.sleep(0.0005)
            os.truncate(attacked, region_size)
            time.sleep(0.002)

    shrinker = threading.Thread(target=shrink_and_grow)
    health = HealthProbe(server.target)
    shrinker.start()
    outcomes: dict[str, int] = {}
    slowest = 0.0
    try:
        for i in range(240):
            model, make = CALLS[i % len(CALLS)]
            start = time.perf_counter()
            try:
                infer(client, model, make("attacked"))
                outcome = "ok"
            except tc.InferenceServerException as exc:
                outcome = exc.status()
                if outcome == "StatusCode.INVALID_ARGUMENT":
                    assert "shrank" in exc.message(), exc.message()
                    outcome += (
                        " before"
                        if SHRANK_DURING not in exc.message()
                        else " fault"
                        if "the region is unregistered" in exc.message()
                        else " during"
                    )
                else:
                    assert outcome == "StatusCode.NOT_FOUND" and "'attacked'" in exc.message(), exc.message()
            slowest = max(slowest, time.perf_counter() - start)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if outcome != "ok" and "attacked" not in client.get_system_shared_memory_status().regions:
                try:  # unregistered by a fault: registered again (refused while the object is short)
                    client.register_system_shared_memory("attacked", key_of(attacked), region_size)
                except tc.InferenceServerException as exc:
                    assert exc.status() == "StatusCode.INVALID_ARGUMENT", exc.message()
            if i % 40 == 0:  # the region nobody shrinks, meanwhile
                infer(client, "unary", unary_call("intact", "exp", NBYTES))
                assert read(intact, NBYTES, expected).tobytes() == expected.tobytes()
    finally:
        stop.set()
        shrinker.join()
        worst_health = health.stop()
    assert server.proc.poll() is None, server.log_path.read_text()[-3000:]
    assert outcomes.get("StatusCode.INVALID_ARGUMENT fault", 0) > 0, outcomes  # faults were absorbed
    assert slowest < 1.0 and worst_health < 1.0, (slowest, worst_health)
    # mapped objects count as resident when touched; beyond them, little grows
    assert resident_bytes(server.proc.pid, "VmHWM") - baseline_peak < 4 * region_size + (64 << 20)

    write(attacked, 0, x)  # the attacked region, registered anew, serves exact results again
    client.unregister_system_shared_memory("attacked")
    client.register_system_shared_memory("attacked", key_of(attacked), region_size)
    for name, path_ in (("attacked", attacked), ("intact", intact)):
        infer(client, "unary", unary_call(name, "exp", NBYTES))
        assert read(path_, NBYTES, expected).tobytes() == expected.tobytes()
    assert client.is_server_live()
    client.close()


def bearer(token: str) -> dict:
    return {"authorization": f"Bearer {token}"}


PER_CALLER_CAPS = [
    pytest.param(
        (), Config.max_shared_memory_regions_per_caller, Config.max_shared_memory_bytes_per_caller, id="defaults"
    ),
    pytest.param(
        ("--max-shared-memory-regions-per-caller", "3", "--max-shared-memory-bytes-per-caller", str(1 << 20)),
        3,
        1 << 20,
        id="flags",
    ),
]


@pytest.mark.parametrize("flags, most, most_bytes", PER_CALLER_CAPS)
def test_one_caller_cannot_lock_the_others_out(start_server, objects, flags, most, most_bytes):
    """Region count and bytes are capped per caller under the global caps: a caller that
    registers all it may is refused more, at once, while another still registers and
    computes."""
    server = start_server("--allow-shared-memory", "true", *flags, env={"TENSOROPS_AUTH_TOKENS": "alpha,beta"})
    client = tc.InferenceServerClient(server.target)
    alpha, beta = bearer("alpha"), bearer("beta")
    small = key_of(objects(4096))
    for i in range(most):
        client.register_system_shared_memory(f"a{i}", small, 4096, headers=alpha)
    start = time.perf_counter()
    status, text = refused(client.register_system_shared_memory, "one-more", small, 4096, headers=alpha)
    assert time.perf_counter() - start < 1.0
    assert (status, text) == (
        "StatusCode.RESOURCE_EXHAUSTED",
        f"name: this caller has {most} regions registered, the limit per caller; unregister some first",
    )

    # the other caller: registers, and its region serves
    x = np.arange(16, dtype=np.float32)
    path = objects(2 * x.nbytes)
    write(path, 0, x)
    client.register_system_shared_memory("b", key_of(path), 2 * x.nbytes, headers=beta)
    x_in = tc.InferInput("x", [16], "FP32")
    x_in.set_shared_memory("b", x.nbytes)
    result = client.infer("unary", [x_in], parameters={"op": "neg"}, headers=beta)
    assert result.as_numpy("y").tobytes() == (-x).tobytes()
    assert set(client.get_system_shared_memory_status(headers=beta).regions) == {"b"}
    assert len(client.get_system_shared_memory_status(headers=alpha).regions) == most

    # bytes: one region of all the caller may hold (a sparse object: nothing is touched), then a byte more
    client.unregister_system_shared_memory(headers=beta)
    big = key_of(objects(most_bytes))
    client.register_system_shared_memory("big", big, most_bytes, headers=beta)
    status, text = refused(client.register_system_shared_memory, "more", small, 1, headers=beta)
    assert (status, text) == (
        "StatusCode.RESOURCE_EXHAUSTED",
        f"byte_size: this caller's regions hold {most_bytes} bytes; 1 more exceed the limit of {most_bytes} per caller",
    )
    client.unregister_system_shared_memory("a0", headers=alpha)  # room again for alpha
    client.register_system_shared_memory("one-more", small, 4096, headers=alpha)
    client.close()


def test_objects_judged_by_identity_not_by_name(shm_server, objects):
    """A hard link or a symbolic link named with the allowed prefix to an object without
    it, and other files of /dev/shm with an allowed name, are refused without being
    mapped; the object they lead to stays unmapped."""
    client = tc.InferenceServerClient(shm_server.target)
    secret = objects(4096, prefix="secret_")
    hard = f"/dev/shm/tensorops_{uuid.uuid4().hex[:12]}"
    soft = f"/dev/shm/tensorops_{uuid.uuid4().hex[:12]}"
    directory = f"/dev/shm/tensorops_{uuid.uuid4().hex[:12]}"
    fifo = f"/dev/shm/tensorops_{uuid.uuid4().hex[:12]}"
    os.link(secret, hard)
    os.symlink(secret, soft)
    os.mkdir(directory)
    os.mkfifo(fifo, 0o600)
    try:
        cases = {
            hard: "key: the object has 2 names (hard links); only objects with one name are mapped",
            soft: "key: the shared-memory object is a symbolic link",
            directory: "key: the shared-memory object cannot be opened for reading and writing",
            fifo: "key: not a shared-memory object (a regular file of /dev/shm)",
        }
        for path, message in cases.items():
            start = time.perf_counter()
            status, text = refused(client.register_system_shared_memory, "r", key_of(path), 64)
            assert time.perf_counter() - start < 1.0
            assert status == "StatusCode.INVALID_ARGUMENT" and text.startswith(message), (path, text)
            assert "secret_" not in text
        for pid in process_tree(shm_server.proc.pid):  # no worker mapped any of them
            with open(f"/proc/{pid}/maps") as maps:
                assert not any(line.rstrip().endswith((secret, hard, soft, fifo)) for line in maps)
        assert not client.get_system_shared_memory_status().regions
        os.unlink(secret)  # the hard link is now the object's only name: it is the caller's own object
        client.register_system_shared_memory("r", key_of(hard), 64)
        client.unregister_system_shared_memory("r")
    finally:
        for path in (hard, soft, fifo):
            os.unlink(path)
        os.rmdir(directory)
        client.close()


@pytest.mark.parametrize(
    "key, message",
    [
        (
            "/tensorops_a\0b",
            "key: expected the name of a POSIX shared-memory object (no NUL, no '/' after the leading ones)",
        ),
        ("/tensorops_" + "k" * 300, "key: at most 256 characters, got 311"),
        ("/tensorops_a/b", "key: expected the name of a POSIX shared-memory object"),
    ],
)
def test_odd_keys_are_refused_naming_the_key(shm_server, key, message):
    with tc.InferenceServerClient(shm_server.target) as client:
        status, text = refused(client.register_system_shared_memory, "r", key, 64)
        assert status == "StatusCode.INVALID_ARGUMENT" and text.startswith(message), text
        status, text = refused(client.register_system_shared_memory, "n" * 300, "/tensorops_x", 64)
        assert (status, text) == ("StatusCode.INVALID_ARGUMENT", "name: at most 256 characters, got 300")
        assert client.is_server_live()

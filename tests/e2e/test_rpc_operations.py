"""Every operation through both clients against a real server: results identical, bit for
bit, to tensorops_native in-process."""

from __future__ import annotations

import numpy as np
import pytest

import tensorops
import tensorops_native as tn
from rpc_cases import cases, same
from tensorops_server import config

CASES = cases()


def _check_built(case):
    missing = case.missing()
    assert not missing, f"missing from this build (a call would crash): {', '.join(missing)}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_blocking_client_matches_native(client, case):
    _check_built(case)
    expected = getattr(tn, case.op)(*case.args, **case.kwargs)
    got = getattr(client, case.op)(*case.args, **case.kwargs)
    assert same(expected, got)


def test_async_client_matches_native(server, run_async):
    for case in CASES:
        _check_built(case)

    async def calls(c):
        return [await getattr(c, case.op)(*case.args, **case.kwargs) for case in CASES]

    results = run_async(server.target, calls)
    for case, got in zip(CASES, results, strict=True):
        assert same(getattr(tn, case.op)(*case.args, **case.kwargs), got), case.id


def test_local_client_matches_native():
    for case in CASES:
        _check_built(case)
    with tensorops.LocalClient() as c:
        for case in CASES:
            assert same(getattr(tn, case.op)(*case.args, **case.kwargs), getattr(c, case.op)(*case.args, **case.kwargs))


# Empty tensors never reach C, so these exercise the whole path even before the kernels land.
EMPTY = [
    ("softmax", (np.zeros((0, 3), np.float32),), {}),
    ("unary", (np.zeros((2, 0), np.float32), "exp"), {}),
    ("normalize_l2", (np.zeros((0, 3, 4), np.float32), [1, 2, 3, 4]), dict(format="nhwc")),
    ("layer_norm_channels", (np.zeros((2, 3, 0), tn._checks.BF16), [1, 1, 1], [0, 0, 0]), {}),
    ("layer_norm_channels", (np.zeros((2, 3, 0), np.uint16), [1, 1, 1], [0, 0, 0]), {}),
    ("channel_sum", (np.zeros((2, 0, 3), np.uint16),), dict(format="nhwc")),
    ("eltwise", ([np.zeros((0, 4), np.float32)] * 3, "sum"), {}),
    ("shuffle", (np.zeros((1, 4, 0), np.float32), np.zeros((1, 2, 0), np.float32)), dict(type="split")),
    ("tiled_scale_2d", (np.zeros((0, 2, 3, 4), np.float32), np.ones((2, 4)), np.ones((2, 3))), {}),
]


@pytest.mark.parametrize("op,args,kwargs", EMPTY, ids=[f"{e[0]}-{i}" for i, e in enumerate(EMPTY)])
def test_empty_tensors_round_trip(client, op, args, kwargs):
    expected = getattr(tn, op)(*args, **kwargs)
    got = getattr(client, op)(*args, **kwargs)
    assert same(expected, got)


def test_results_are_new_writable_arrays(client):
    y = client.softmax(np.zeros((0, 5), np.float32))
    assert y.flags.writeable and y.flags.c_contiguous


def test_server_info_describes_the_server(client):
    info = client.info()
    native = tn.info()
    assert info["isa"] == tn.isa() and info["version"] == native["version"]
    assert info["kernels"] == native["kernels"]
    assert set(info["cpu_features"]) == set(native["cpu_features"])
    assert set(info["operations"]) <= set(native["operations"]) | {"quantized_inner_product", "normalize"}
    assert {"softmax", "unary", "eltwise"} <= set(info["operations"])
    assert info["limits"]["max_message_bytes"] > 0 and info["threads"] == 4  # the fixture's --threads
    assert info["workers"] == config.Config().workers and 1 <= info["worker"] <= info["workers"]  # the default

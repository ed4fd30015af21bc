"""Generic normalization over the wire: both clients (and the in-process LocalClient) give
results bit-identical to tensorops_native.normalize, and bad input is INVALID_ARGUMENT naming
the field."""

from __future__ import annotations

import grpc
import ml_dtypes
import numpy as np
import pytest

import tensorops
import tensorops_native as tn
from rpc_cases import same
from tensorops.v1 import tensor_pb2
from tensorops.v1 import tensorops_pb2 as pb

BF16 = ml_dtypes.bfloat16


def cases():
    rng = np.random.default_rng(4)

    def f32(*shape):
        return rng.normal(0.3, 1.5, shape).astype(np.float32)

    x4 = f32(2, 8, 5, 3)
    ch = f32(1, 8, 1, 1)
    out = [
        ("layer-norm", (f32(3, 7, 33), f32(33), f32(33)), dict(axes=[-1])),
        ("bitmask", (x4, ch, ch), dict(axes=1 << 2 | 1 << 3)),
        ("group-per-channel", (x4, ch, f32(1, 4, 1, 1)), dict(axes=[2, 3], num_groups=4)),
        ("group-nc", (f32(5, 12), None, None), dict(axes=[1], num_groups=3)),
        ("columns", (x4, None, f32(5, 3)), dict(axes=[1], eps=1e-3)),
        ("transposed", (x4, f32(2, 1, 5, 1), None), dict(axes=(0, 2), normalize_variance=False)),
        ("scalar-params", (f32(17), np.float32(2.0), np.float32(-1.0)), dict(axes=[0])),
        ("compute-dtype", (f32(4, 9), None, None), dict(axes=[1], compute_dtype="float32")),
        ("compute-dtype-type", (f32(4, 9), None, None), dict(axes=[1], compute_dtype=np.float32)),
        ("empty", (np.zeros((0, 4), np.float32), None, None), dict(axes=[1])),
    ]
    for dtype in (np.float16, BF16):
        out.append((f"{np.dtype(dtype).name}", (x4.astype(dtype), ch, ch.astype(dtype)), dict(axes=[1, 2, 3])))
    out.append(("bf16-bits", (x4.astype(BF16).view(np.uint16), ch, None), dict(axes=[2, 3], activation="gelu")))
    for name, (_, spec) in tn.ACTIVATIONS.items():
        params = tuple(1.25 - 0.5 * i for i in range(len(spec)))
        out.append((f"act-{name}", (x4, ch, ch), dict(axes=[2, 3], activation=(name, *params) if spec else name)))
        if spec and all(d is not None for _, d in spec):
            out.append((f"act-{name}-defaults", (x4, None, ch), dict(axes=[1], activation=name.upper())))
    return out


CASES = cases()


@pytest.mark.parametrize("args,kwargs", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_blocking_client_matches_native(client, args, kwargs):
    expected = tn.normalize(*args, **kwargs)
    got = client.normalize(*args, **kwargs)
    assert same(expected, got)


def test_async_client_matches_native(server, run_async):
    async def calls(c):
        return [await c.normalize(*args, **kwargs) for _, args, kwargs in CASES]

    results = run_async(server.target, calls)
    for (name, args, kwargs), got in zip(CASES, results, strict=True):
        assert same(tn.normalize(*args, **kwargs), got), name


def test_local_client_matches_native():
    with tensorops.LocalClient() as c:
        for name, args, kwargs in CASES:
            assert same(tn.normalize(*args, **kwargs), c.normalize(*args, **kwargs)), name


X = np.zeros((2, 6, 3), np.float32)
BAD = [
    (dict(axes=[3]), "axes"),
    (dict(axes=[1, -2]), "axes"),
    (dict(axes=[]), "axes"),
    (dict(axes=0), "axes"),
    (dict(axes=-2), "axes"),
    (dict(axes=1 << 5), "axes"),
    (dict(axes=[2], num_groups=4), "num_groups"),
    (dict(axes=[2], num_groups=0), "num_groups"),
    (dict(axes=[2], scale=np.ones(2, np.float32)), "scale"),
    (dict(axes=[2], bias=np.ones((1, 4, 1), np.float32)), "bias"),
    (dict(axes=[2], activation="swish"), "activation"),
    (dict(axes=[2], activation=("relu", 1.0)), "activation"),
    (dict(axes=[2], activation="linear"), "activation"),
    (dict(axes=[2], activation=("softplus", 0.5)), "activation"),
    (dict(axes=[2], activation=("elu", "a")), "activation"),
    (dict(axes=[2], compute_dtype="float16"), "compute_dtype"),
    (dict(axes=[2], eps=-1.0), "eps"),
]


@pytest.mark.parametrize("kwargs,field", BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)])
def test_bad_arguments_name_the_field(client, kwargs, field):
    kwargs = dict(kwargs)
    scale, bias = kwargs.pop("scale", None), kwargs.pop("bias", None)
    with pytest.raises(tensorops.InvalidArgumentError) as err:
        client.normalize(X, scale, bias, **kwargs)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == field, err.value
    with tensorops.LocalClient() as local, pytest.raises(tensorops.InvalidArgumentError) as err:
        local.normalize(X, scale, bias, **kwargs)
    assert err.value.field == field


@pytest.mark.parametrize(
    "x,field",
    [
        (np.zeros((2, 3), np.float64), "x"),
        (np.zeros((2, 3), np.int32), "x"),
        (np.zeros((1,) * 9, np.float32), "x"),
        (np.zeros(4, np.float32), "num_groups"),
    ],
)
def test_bad_inputs_name_the_field(client, x, field):
    with pytest.raises(tensorops.InvalidArgumentError) as err:
        client.normalize(x, axes=[0], num_groups=2 if field == "num_groups" else 1)
    assert err.value.field == field


def raw_normalize(target, request: pb.NormalizeRequest):
    with grpc.insecure_channel(target) as channel:
        try:
            channel.unary_unary("/tensorops.v1.TensorOps/Normalize")(request.SerializeToString(), timeout=30)
        except grpc.RpcError as exc:
            return tensorops._errors.from_rpc_error(exc)
    raise AssertionError("the call succeeded")


def wire(arr):
    return tensor_pb2.Tensor(shape=arr.shape, dtype=tensor_pb2.DATA_TYPE_FP32, data=arr.tobytes())


@pytest.mark.parametrize(
    "request_,field",
    [
        (pb.NormalizeRequest(x=wire(X)), "axes"),  # axes missing
        (pb.NormalizeRequest(axes=[1]), "x"),  # x missing
        (pb.NormalizeRequest(x=wire(X), axes=[1], activation=pb.FusedActivation()), "activation.type"),  # unset
        (pb.NormalizeRequest(x=wire(X), axes=[1], activation=pb.FusedActivation(type=99)), "activation.type"),
        (
            pb.NormalizeRequest(
                x=wire(X), axes=[1], activation=pb.FusedActivation(type=pb.ACTIVATION_RELU, params=[1.0])
            ),
            "activation",
        ),
    ],
)
def test_malformed_requests_name_the_field(server, request_, field):
    err = raw_normalize(server.target, request_)
    assert isinstance(err, tensorops.InvalidArgumentError) and err.field == field, err

"""Several threads calling the kernels at once (cffi releases the GIL during each call, so
they really run concurrently) get exactly the results of one thread: kernels are
reentrant, with no shared mutable state."""

import threading

import numpy as np
import pytest

import reference as ref
import tensorops_native as tn
from tn_testing import assert_same_bits, require

THREADS = 4


def _ops():
    s = np.linspace(0.5, 1.5, 67, dtype=np.float32)
    return {
        "normalize_l2": (["SynetNormalizeLayerForward"], (2, 67, 49), np.float32, lambda x: tn.normalize_l2(x, s)),
        "layer_norm_channels": (
            ["SynetNormalizeLayerForwardV2"],
            (2, 67, 49),
            np.float32,
            lambda x: tn.layer_norm_channels(x, s, s),
        ),
        "layer_norm_channels_bf16": (
            ["SynetNormalizeLayerForward16bV2"],
            (2, 49, 67),
            ref.BF16,
            lambda x: tn.layer_norm_channels(x, s, s, format="nhwc"),
        ),
        "layer_norm_spatial": (
            ["SynetNormalizeLayerForwardV3"],
            (2, 49, 67),
            np.float32,
            lambda x: tn.layer_norm_spatial(x, s, s, format="nhwc"),
        ),
        "channel_norm": (["SynetNormalizeLayerForwardV4"], (2, 67, 49), np.float32, lambda x: tn.channel_norm(x, s, s)),
        "channel_sum": (["SynetChannelSum16b"], (2, 67, 49), ref.BF16, lambda x: tn.channel_sum(x)),
        "eltwise": (
            ["SynetEltwiseLayerForward"],
            (2, 67, 49),
            np.float32,
            lambda x: tn.eltwise([x, x[::-1].copy(), x], "sum", [0.5, 2, -1]),
        ),
        "lrn": (
            ["SynetLrnLayerCrossChannels"],
            (2, 67, 49),
            np.float32,
            lambda x: tn.lrn_cross_channels(x, 2, (1, 0.1, -0.75)),
        ),
        "shuffle": (
            ["SynetShuffleLayerForward"],
            (2, 66, 49),
            np.float32,
            lambda x: np.concatenate(tn.shuffle(x, x, type=0), axis=1),
        ),
        "softmax": (["SynetSoftmax32f"], (2, 67, 49), np.float32, lambda x: tn.softmax(x, axis=1)),
        "softmax_bf16": (["SynetSoftmax16b"], (98, 67), ref.BF16, lambda x: tn.softmax(x)),
        "tiled_scale_2d": (
            ["SynetTiledScale2D32f"],
            (2, 67, 7, 7),
            np.float32,
            lambda x: tn.tiled_scale_2d(x, np.ones((67, 7)) * 0.5, np.ones((67, 7)) * 3),
        ),
        "unary": (["SynetUnaryOperation32f"], (2, 67, 49), np.float32, lambda x: tn.unary(x, "erf")),
    }


@pytest.mark.parametrize("op", list(_ops()))
def test_concurrent_calls_match_a_single_thread(rng, op):
    kernels, shape, dtype, call = _ops()[op]
    require(*kernels)
    inputs = [rng.normal(size=shape).astype(np.float32).astype(dtype) for _ in range(8)]
    expected = [call(x) for x in inputs]
    results = [[None] * len(inputs) for _ in range(THREADS)]
    errors = []
    start = threading.Barrier(THREADS)

    def work(t):
        try:
            start.wait()
            order = list(range(len(inputs)))
            if t % 2:
                order.reverse()
            for _ in range(3):
                for i in order:
                    results[t][i] = call(inputs[i])
        except Exception as exc:  # reported below, with the thread
            errors.append((t, exc))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors, errors
    for t in range(THREADS):
        for i, want in enumerate(expected):
            got = results[t][i]
            assert_same_bits(
                np.asarray(got).view(np.uint16 if got.dtype.itemsize == 2 else np.uint32),
                np.asarray(want).view(np.uint16 if want.dtype.itemsize == 2 else np.uint32),
                what=f"{op}: thread {t}, input {i}",
            )

"""Direct C calls (tensorops_native._native) of every kernel with canary-guarded memory:

- scratch: with buf = NULL and with a caller buffer of exactly the size docs/kernels.md states
  (spatial floats for L2 in NCHW without acrossSpatial and for V2 in NCHW; channels for V3
  in NHWC, V4 and 16bV2; none otherwise), filled with garbage and followed by canaries
  that must survive;
- outputs pre-filled with poison (a NaN payload for fp32, 0xFFFF for BF16): every element
  must be overwritten, with exactly what the Python API returns, and nothing written
  before or after them;
- inputs (also between canaries, and misaligned for vector loads) never modified.
"""

import numpy as np
import pytest

from c_cases import all_cases, materialize
from tn_testing import Guarded, assert_same_bits, c_call, require

CASES = all_cases()
PARAMS = [
    pytest.param(case, mode, id=f"{case.kernel}-{case.label}-{mode}")
    for case in CASES
    for mode in (("buf-null", "buf-exact") if case.scratch is not None else ("no-buf",))
]


@pytest.mark.parametrize("case,mode", PARAMS)
def test_c_call_with_guarded_memory(case, mode):
    require(case.kernel)
    buf = Guarded(shape=(case.scratch,), dtype=np.float32) if mode == "buf-exact" else None
    args, ins, outs = materialize(case, lambda v: Guarded(v), buf)
    c_call(case.kernel, *args)
    for name, g in ins.items():
        g.assert_unchanged(f"{case.kernel} input {name}")
    if buf is not None:
        buf.assert_guards(f"{case.kernel} scratch buffer of {case.scratch} floats")
    expected = case.api()
    for name, g in outs.items():
        g.assert_guards(f"{case.kernel} output {name}")
        g.assert_no_poison_left(f"{case.kernel} output {name}")
        assert_same_bits(
            g.arr,
            np.asarray(expected[name]).reshape(g.arr.shape),
            what=f"{case.kernel} {case.label} {mode}: C output {name} vs the Python API",
        )


def test_every_kernel_has_direct_cases():
    from c_cases import KERNELS

    assert {c.kernel for c in CASES} == set(KERNELS)
    assert {c.kernel for c in CASES if c.scratch is not None} == {
        "SynetNormalizeLayerForward",
        "SynetNormalizeLayerForwardV2",
        "SynetNormalizeLayerForwardV3",
        "SynetNormalizeLayerForwardV4",
        "SynetNormalizeLayerForward16bV2",
    }

"""Run the direct C cases of one kernel (c_cases.py) with every array placed right against
an inaccessible page, once ending at the page ("tail": catches reads or writes past the
end, and leaves most starts misaligned) and once starting at one ("head": catches accesses
before the start), at every level the kernel tests run at. An access outside the tensors
kills this process with SIGSEGV; the last line printed names the case. Run by
test_guard_pages.py: python guard_page_probe.py <kernel>.
"""

import ctypes
import mmap
import sys

import numpy as np

from c_cases import all_cases, materialize
from tensorops_native._info import set_isa_for_testing
from tn_testing import c_call, kernel_levels

PAGE = mmap.PAGESIZE
PROT_NONE = 0
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_keep = []


def fenced(values, where):
    values = np.ascontiguousarray(values)
    if values.nbytes == 0:
        return values.copy()
    pages = -(-values.nbytes // PAGE)
    mm = mmap.mmap(-1, (pages + 2) * PAGE)
    anchor = ctypes.c_char.from_buffer(mm)
    addr = ctypes.addressof(anchor)
    del anchor
    for page in (0, pages + 1):
        if _libc.mprotect(addr + page * PAGE, PAGE, PROT_NONE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")
    offset = PAGE if where == "head" else (pages + 1) * PAGE - values.nbytes
    arr = np.frombuffer(mm, values.dtype, values.size, offset).reshape(values.shape)
    arr[...] = values
    _keep.append(mm)
    return arr


def main(kernel):
    cases = [c for c in all_cases() if c.kernel == kernel]
    assert cases, f"no cases for {kernel}"
    failures = 0
    for level, case in ((level, case) for level in kernel_levels() for case in cases):
        set_isa_for_testing(level)
        for where in ("tail", "head"):
            for mode in ("null", "exact") if case.scratch is not None else ("none",):
                print(f"{level}: {case.label} {where} buf={mode}", flush=True)
                buf = fenced(np.full(case.scratch, np.nan, np.float32), where) if mode == "exact" else None
                if buf is not None and buf.size == 0:
                    buf = (
                        fenced(np.zeros(1, np.float32), where)[1:]
                        if where == "tail"
                        else fenced(np.zeros(1, np.float32), where)[:0]
                    )
                args, _, outs = materialize(case, lambda v, where=where: fenced(v, where), buf)
                c_call(kernel, *args)
                expected = case.api()
                for name, arr in outs.items():
                    want = np.asarray(expected[name]).reshape(arr.shape)
                    utype = np.uint32 if arr.dtype.itemsize == 4 else np.uint16
                    if not np.array_equal(arr.view(utype), want.view(utype)):
                        print(
                            f"MISMATCH {level}: {case.label} {where} buf={mode}: output {name} differs from the API",
                            flush=True,
                        )
                        failures += 1
    print("OK" if not failures else f"FAILED {failures}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

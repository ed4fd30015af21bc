"""cffi build script (API mode) for tensorops_native._native.

The cdef is read from native/include/tensorops.h, the single declaration of the C API,
with preprocessor lines and the C++ guard dropped. Every .c file under native/src (and its
family folders) is compiled; ISA flags are applied per file by the `#pragma GCC target` in
the level header each variant includes first (simd/avx512.h, simd/avx2.h), never to the
whole build.

TENSOROPS_SANITIZE=1 builds the extension under AddressSanitizer and UndefinedBehaviorSanitizer
(`make test-sanitize`); the interpreter then needs the ASan runtime preloaded. Unset (the
default), the build is unchanged.
"""

import os
import pathlib
import re

import cffi

NATIVE = pathlib.Path(__file__).resolve().parent
HEADER = NATIVE / "include" / "tensorops.h"
# Any UB finding aborts (no recovery), so that a test run cannot pass with one; -g gives
# the reports file and line numbers.
SANITIZE_FLAGS = (
    ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g"]
    if os.environ.get("TENSOROPS_SANITIZE") == "1"
    else []
)


def header_cdef(text: str) -> str:
    text = re.sub(r"#ifdef __cplusplus.*?#endif", "", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


ffibuilder = cffi.FFI()
ffibuilder.cdef(header_cdef(HEADER.read_text()))
ffibuilder.set_source(
    "tensorops_native._native",
    '#include "tensorops.h"',
    # Relative paths keep the build reproducible from the project root (setuptools runs
    # this script from there).
    sources=sorted(str(p.relative_to(NATIVE.parent)) for p in (NATIVE / "src").rglob("*.c")),
    include_dirs=[str(NATIVE / "include"), str(NATIVE / "src")],
    # Headers hold shared inline math: a change to one must rebuild every object.
    depends=sorted(str(p.relative_to(NATIVE.parent)) for p in NATIVE.rglob("*.h")),
    extra_compile_args=[
        "-O3",
        "-std=gnu11",
        "-fvisibility=hidden",
        # No silent contraction into FMA: the vector math relies on the exact operation
        # sequence to give identical results on every ISA level.
        "-ffp-contract=off",
        "-fno-math-errno",
        "-Wall",
        "-Wno-unused-function",
    ]
    + SANITIZE_FLAGS,
    extra_link_args=SANITIZE_FLAGS,
    libraries=["m"],
)

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=str(NATIVE / "build"), verbose=True)

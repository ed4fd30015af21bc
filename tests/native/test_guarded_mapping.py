"""tensorops_native's GuardedMapping (native/src/guard.c): a mapped file shrunk under an
access turns into zero pages instead of killing the process, on any thread, in a kernel or
in NumPy; a SIGBUS anywhere else still ends the process as before (with faulthandler's
report when it is on); the mapping lives as long as any view of it."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import uuid

import numpy as np
import pytest

import tensorops_native as tn
from tensorops_native._guard import GuardedMapping

# The mapping (guard.c) and its fault handling are the same at every level: run once, at the process's level.
pytestmark = pytest.mark.level_independent

SIZE = 1 << 20


@pytest.fixture
def shm_file():
    """A file in /dev/shm of SIZE bytes, open read-write: (path, fd)."""
    path = f"/dev/shm/tensorops_test_{uuid.uuid4().hex[:12]}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, SIZE)
    yield path, fd
    os.close(fd)
    os.unlink(path)


def mapped(path: str) -> bool:
    with open("/proc/self/maps") as maps:
        return any(line.rstrip().endswith(path) for line in maps)


def test_reads_and_writes_the_file(shm_file):
    path, fd = shm_file
    mapping = GuardedMapping(fd, SIZE)
    np.frombuffer(mapping.memory, np.float32)[:] = 2.0
    assert os.pread(fd, 8, 0) == np.full(2, 2.0, np.float32).tobytes()
    os.pwrite(fd, np.full(1, 3.0, np.float32).tobytes(), 4)
    assert np.frombuffer(mapping.memory, np.float32)[:3].tolist() == [2.0, 3.0, 2.0]
    assert not mapping.broken


@pytest.mark.parametrize("on_thread", [False, True])
def test_a_shrink_under_a_kernel_gives_zeros_and_broken(shm_file, on_thread):
    """The kernel reads the input and writes its result into the same shrunk file: both
    land on zero pages, the call returns, and the mapping says it broke."""
    path, fd = shm_file
    mapping = GuardedMapping(fd, SIZE)
    x = np.frombuffer(mapping.memory, np.float32)[: SIZE // 8]
    out = np.frombuffer(mapping.memory, np.float32)[SIZE // 8 : SIZE // 4]
    x[:] = 1.0
    os.ftruncate(fd, 0)
    run = lambda: tn.unary(x, "exp", out=out)  # noqa: E731
    if on_thread:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    else:
        run()
    assert mapping.broken
    assert not x.any() and (out == 1.0).all()  # exp(0), written over the zero pages
    assert not mapped(path)  # the file is no longer mapped: zero pages stand in its place


def test_a_shrink_under_numpy_is_caught_too(shm_file):
    path, fd = shm_file
    mapping = GuardedMapping(fd, SIZE)
    np.frombuffer(mapping.memory, np.uint8)[:] = 7
    os.ftruncate(fd, 4096)
    np.frombuffer(mapping.memory, np.uint8).sum()  # faults past the first page
    assert mapping.broken
    assert not np.frombuffer(mapping.memory, np.uint8).any()  # the whole mapping, the first page too


def test_other_mappings_are_untouched(shm_file, tmp_path):
    path, fd = shm_file
    other_path = f"{path}_other"
    other_fd = os.open(other_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(other_fd, SIZE)
        broken, intact = GuardedMapping(fd, SIZE), GuardedMapping(other_fd, SIZE)
        np.frombuffer(intact.memory, np.uint8)[:] = 5
        os.ftruncate(fd, 0)
        assert not np.frombuffer(broken.memory, np.uint8).any() and broken.broken
        assert not intact.broken and (np.frombuffer(intact.memory, np.uint8) == 5).all()
        assert mapped(other_path)
    finally:
        os.close(other_fd)
        os.unlink(other_path)


def test_unmapped_when_the_last_view_goes(shm_file):
    path, fd = shm_file
    mapping = GuardedMapping(fd, SIZE)
    view = np.frombuffer(mapping.memory[4096:8192], np.uint8)
    del mapping
    assert mapped(path)
    view[:] = 1  # still valid
    del view
    assert not mapped(path)


def test_zero_size_and_bad_descriptor_are_refused():
    with pytest.raises(OSError):
        GuardedMapping(-1, 4096)
    with pytest.raises(OSError):
        GuardedMapping(0, 0)


def test_the_slots_are_bounded_and_freed(shm_file):
    """Every guarded mapping takes one of a fixed table's slots (the SIGBUS handler scans
    it): past the last, ENOSPC; a mapping gone frees its slot."""
    path, fd = shm_file
    mappings = []
    with pytest.raises(OSError) as refused:
        for _ in range(1 << 16):
            mappings.append(GuardedMapping(fd, 4096))
    assert refused.value.errno == errno.ENOSPC and len(mappings) >= 1024
    mappings.pop()
    mappings.append(GuardedMapping(fd, 4096))
    mappings.clear()
    assert not mapped(path)


# A mapping guarded, then a plain mmap of another file shrunk and read: that SIGBUS is no
# guarded mapping's, so the process ends as it would without the guard.
UNGUARDED_FAULT = """
import mmap, os, sys
from tensorops_native._guard import GuardedMapping
path = sys.argv[1]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 8192)
guarded = GuardedMapping(fd, 8192)
if sys.argv[2] == "faulthandler-after":
    import faulthandler
    faulthandler.enable()
    guarded_later = GuardedMapping(fd, 8192)  # takes SIGBUS back, chaining to faulthandler
    os.ftruncate(fd, 0)
    print("guarded read", guarded_later.memory[5000], guarded_later.broken, guarded.broken, flush=True)
    os.ftruncate(fd, 8192)
plain = mmap.mmap(fd, 8192)
os.ftruncate(fd, 0)
os.unlink(path)
print("plain read", plain[5000], flush=True)
"""


@pytest.mark.parametrize("mode", ["plain", "faulthandler-before", "faulthandler-after"])
def test_a_fault_outside_every_guarded_mapping_still_ends_the_process(mode, tmp_path):
    path = f"/dev/shm/tensorops_test_{uuid.uuid4().hex[:12]}"
    flags = ["-X", "faulthandler"] if mode == "faulthandler-before" else []
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    try:
        done = subprocess.run(
            [sys.executable, *flags, "-c", UNGUARDED_FAULT, path, mode],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        if os.path.exists(path):
            os.unlink(path)
    assert "plain read" not in done.stdout
    if mode == "faulthandler-after":
        assert "guarded read 0 True False" in done.stdout, done.stdout + done.stderr
    if mode.startswith("faulthandler"):
        assert "Fatal Python error: Bus error" in done.stderr, done.stderr
    # SIGBUS, or the abort of a sanitizer's handler when one is preloaded (make test-sanitize)
    assert done.returncode in (-7, -6, 1), (done.returncode, done.stderr)


REFUSED_HANDLER = """
import errno, os, sys
from tensorops_native._guard import GuardedMapping
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
os.unlink(sys.argv[1])
os.ftruncate(fd, 4096)
try:
    GuardedMapping(fd, 4096)
except OSError as exc:
    print("refused", errno.errorcode[exc.errno])
"""


@pytest.mark.skipif(
    "libasan" not in os.environ.get("LD_PRELOAD", ""),
    reason="AddressSanitizer preloaded (make test-sanitize) is what can refuse the handler",
)
def test_nothing_is_mapped_when_the_handler_cannot_be_installed():
    """ASan with handle_sigbus=2 ignores every other SIGBUS handler without an error: the
    mapping is then refused (ENOTSUP) rather than made unguarded."""
    env = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":handle_sigbus=2")
    path = f"/dev/shm/tensorops_test_{uuid.uuid4().hex[:12]}"
    done = subprocess.run(
        [sys.executable, "-c", REFUSED_HANDLER, path], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.stdout.strip() == "refused ENOTSUP", done.stdout + done.stderr

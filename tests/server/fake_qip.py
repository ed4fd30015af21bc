"""A NumPy stand-in for tensorops_native.QuantizedInnerProduct (same interface), so the
session machinery can be tested whether or not the kernel is in this build."""

from __future__ import annotations

import threading

import numpy as np

import tensorops_native as tn


class FakeQuantizedInnerProduct:
    instances: list[FakeQuantizedInnerProduct] = []
    lock = threading.Lock()

    def __init__(
        self, b, *, b_scale, a_scale, a_zero, c_scale, c_zero, bias=None, trans_b=False, max_m=1, algorithm=None
    ):
        if not isinstance(b, np.ndarray) or b.dtype != np.int8 or b.ndim != 2:
            raise tn.ArgumentTypeError("b", "expected a 2-D int8 array")
        if a_scale is None:
            raise tn.ArgumentTypeError("a_scale", "expected a real number, got NoneType")
        self.b = (b.T if trans_b else b).astype(np.int64)  # (K, N)
        k, n = self.b.shape
        self.b_scale = np.asarray(b_scale, np.float32).reshape(n)
        self.bias = np.zeros(n, np.int64) if bias is None else np.asarray(bias, np.int64)
        self.norm = (np.float32(a_scale) * self.b_scale / np.float32(c_scale)).astype(np.float32)
        self.a_zero, self.c_zero = int(a_zero), int(c_zero)
        self.max_m = max_m
        self.closed = False
        self.forwards = 0
        with self.lock:
            self.instances.append(self)

    @property
    def info(self) -> str:
        return "fake: numpy int64"

    @property
    def internal_buffer_size(self) -> int:
        return self.b.size

    def external_buffer_size_for(self, m: int) -> int:
        if m < 0:
            raise tn.ArgumentError("m", f"must be >= 0, got {m}")
        return 4 * m * self.b.shape[1]

    def forward(self, a):
        assert not self.closed, "forward on a closed context"
        if not isinstance(a, np.ndarray) or a.dtype != np.uint8 or a.ndim != 2:
            raise tn.ArgumentTypeError("a", "expected a 2-D uint8 array")
        if a.shape[1] != self.b.shape[0]:
            raise tn.ArgumentError("a", f"expected {self.b.shape[0]} columns, got {a.shape[1]}")
        self.forwards += 1
        acc = a.astype(np.int64) @ self.b + self.bias - self.a_zero * self.b.sum(axis=0)
        c = np.rint(acc.astype(np.float32) * self.norm) + self.c_zero
        return np.clip(c, 0, 255).astype(np.uint8)

    def close(self) -> None:
        self.closed = True

"""A NumPy stand-in for tensorops_native.QuantizedInnerProduct (same interface), so the
session machinery can be tested whether or not the kernel is in this build."""

from __future__ import annotations

import io
import threading

import numpy as np

import tensorops_native as tn


class FakeQuantizedInnerProduct:
    instances: list[FakeQuantizedInnerProduct] = []
    lock = threading.Lock()

    def __init__(
        self,
        b,
        *,
        b_scale,
        a_scale,
        a_zero,
        c_scale,
        c_zero,
        bias=None,
        trans_b=False,
        max_m=1,
        algorithm=None,
        state=None,
    ):
        if not isinstance(b, np.ndarray) or b.dtype != np.int8 or b.ndim != 2:
            raise tn.ArgumentTypeError("b", "expected a 2-D int8 array")
        if a_scale is None:
            raise tn.ArgumentTypeError("a_scale", "expected a real number, got NoneType")
        b = (b.T if trans_b else b).astype(np.int64)  # (K, N)
        n = b.shape[1]
        b_scale = np.asarray(b_scale, np.float32).reshape(n)
        bias = np.zeros(n, np.int64) if bias is None else np.asarray(bias, np.int64)
        norm = (np.float32(a_scale) * b_scale / np.float32(c_scale)).astype(np.float32)
        self._set(b, bias, norm, np.array([a_zero, c_zero], np.int64), max_m)
        if state is not None:  # as the kernel's context does: its parameters in the caller's memory
            packed = io.BytesIO()
            np.savez(packed, b=b, bias=bias, norm=norm, zeros=np.array([a_zero, c_zero], np.int64))
            memory = state(len(packed.getvalue()))
            memory[:] = packed.getvalue()

    def _set(self, b, bias, norm, zeros, max_m):
        self.b, self.bias, self.norm = b, bias, norm
        self.a_zero, self.c_zero = (int(z) for z in zeros)
        self.k, self.n = b.shape
        self.max_m = max_m
        self.closed = False
        self.forwards = 0
        with self.lock:
            self.instances.append(self)

    @classmethod
    def attach(cls, memory, *, max_m=1):
        arrays = np.load(io.BytesIO(bytes(memory)))
        fake = cls.__new__(cls)
        fake._set(arrays["b"], arrays["bias"], arrays["norm"], arrays["zeros"], max_m)
        return fake

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

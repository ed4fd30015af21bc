"""The operations with the names and arguments of tensorops_native, shared by every client.

A client class supplies `_call(name, arguments, timeout, metadata)` (which runs the
operation: remotely, or in-process for LocalClient; the async client returns an awaitable)
and `_open_session(arguments, timeout, metadata)`. `timeout` (seconds) and `metadata`
(pairs of strings) apply to one call and override the client's defaults.
"""
from __future__ import annotations


class Operations:
    def normalize_l2(self, x, scale, *, eps=1e-10, across_spatial=False, format="nchw",
                     timeout=None, metadata=None):
        """L2 normalization with per-channel scale (SimdSynetNormalizeLayerForward)."""
        return self._call("normalize_l2", dict(x=x, scale=scale, eps=eps, across_spatial=across_spatial,
                                               format=format), timeout, metadata)

    def layer_norm_channels(self, x, scale, shift, *, eps=1e-5, format="nchw", timeout=None, metadata=None):
        """Layer normalization across channels (SimdSynetNormalizeLayerForwardV2; 16bV2 for
        BF16 x, which gives a BF16 result)."""
        return self._call("layer_norm_channels", dict(x=x, scale=scale, shift=shift, eps=eps, format=format),
                          timeout, metadata)

    def layer_norm_spatial(self, x, scale, shift, *, eps=1e-5, format="nchw", timeout=None, metadata=None):
        """Layer normalization across spatial positions (SimdSynetNormalizeLayerForwardV3)."""
        return self._call("layer_norm_spatial", dict(x=x, scale=scale, shift=shift, eps=eps, format=format),
                          timeout, metadata)

    def channel_norm(self, x, scale, shift, *, eps=1e-5, format="nchw", timeout=None, metadata=None):
        """Channel-norm scaling (SimdSynetNormalizeLayerForwardV4)."""
        return self._call("channel_norm", dict(x=x, scale=scale, shift=shift, eps=eps, format=format),
                          timeout, metadata)

    def channel_sum(self, x, *, format="nchw", timeout=None, metadata=None):
        """Per-channel sums of a BF16 image tensor, fp32 (batch, channels)
        (SimdSynetChannelSum16b)."""
        return self._call("channel_sum", dict(x=x, format=format), timeout, metadata)

    def eltwise(self, inputs, op, weights=None, *, timeout=None, metadata=None):
        """Product, weighted sum, max or min of >= 2 fp32 arrays of one shape
        (SimdSynetEltwiseLayerForward)."""
        return self._call("eltwise", dict(inputs=inputs, op=op, weights=weights), timeout, metadata)

    def lrn_cross_channels(self, x, half, k, *, format="nchw", timeout=None, metadata=None):
        """Local response normalization across channels (SimdSynetLrnLayerCrossChannels)."""
        return self._call("lrn_cross_channels", dict(x=x, half=half, k=k, format=format), timeout, metadata)

    def shuffle(self, x0, x1, *, type, format="nchw", channels=None, timeout=None, metadata=None):
        """Channel shuffle of two tensors (SimdSynetShuffleLayerForward); returns (y0, y1)."""
        return self._call("shuffle", dict(x0=x0, x1=x1, type=type, format=format, channels=channels),
                          timeout, metadata)

    def softmax(self, x, axis=-1, *, timeout=None, metadata=None):
        """Softmax along `axis` (SimdSynetSoftmax32f, Softmax16b for BF16 x)."""
        return self._call("softmax", dict(x=x, axis=axis), timeout, metadata)

    def tiled_scale_2d(self, x, ver, hor, *, format="nchw", timeout=None, metadata=None):
        """Multiply a 4-D tensor by two tiled 2-D scales (SimdSynetTiledScale2D32f)."""
        return self._call("tiled_scale_2d", dict(x=x, ver=ver, hor=hor, format=format), timeout, metadata)

    def unary(self, x, op, *, timeout=None, metadata=None):
        """Element-wise unary operation (SimdSynetUnaryOperation32f); op by name or value."""
        return self._call("unary", dict(x=x, op=op), timeout, metadata)

    def normalize(self, x, scale=None, bias=None, *, axes, num_groups=1, eps=1e-5, normalize_variance=True,
                  activation=None, compute_dtype=None, timeout=None, metadata=None):
        """Generic normalization (TensorRT INormalization, DirectML MVN1): mean and variance
        over `axes` (indices or a TensorRT bitmask), optional groups, scale, bias and fused
        activation; FP32, FP16 or BF16 x."""
        return self._call("normalize", dict(x=x, scale=scale, bias=bias, axes=axes, num_groups=num_groups, eps=eps,
                                            normalize_variance=normalize_variance, activation=activation,
                                            compute_dtype=compute_dtype), timeout, metadata)

    def quantized_inner_product(self, *arrays, b_scale, a_scale, a_zero, c_scale, c_zero, bias=None,
                                trans_b=False, max_m=None, algorithm=None, timeout=None, metadata=None):
        """UINT8 x INT8 -> UINT8 matrix product with requantization
        (SimdSynetQuantizedInnerProduct*).

        With one array, `quantized_inner_product(b, ...)` opens a session like
        tensorops_native.QuantizedInnerProduct(b, ...): B is sent and packed once and
        `session.forward(a)` sends A only. With two, `quantized_inner_product(a, b, ...)`
        is the one-shot call of tensorops_native.quantized_inner_product. `max_m` (rows
        expected per forward) applies to sessions only.
        """
        params = dict(b_scale=b_scale, a_scale=a_scale, a_zero=a_zero, c_scale=c_scale, c_zero=c_zero,
                      bias=bias, trans_b=trans_b, algorithm=algorithm)
        if len(arrays) == 2:
            if max_m is not None:
                raise TypeError("max_m applies to sessions: quantized_inner_product(b, ..., max_m=...)")
            return self._call("quantized_inner_product", dict(a=arrays[0], b=arrays[1], **params), timeout, metadata)
        if len(arrays) == 1:
            return self._open_session(dict(b=arrays[0], max_m=max_m, **params), timeout, metadata)
        raise TypeError(f"quantized_inner_product() takes b (a session) or a, b (one call), got {len(arrays)} arrays")

    def QuantizedInnerProduct(self, b, *, b_scale, a_scale, a_zero, c_scale, c_zero, bias=None, trans_b=False,
                              max_m=1, algorithm=None, timeout=None, metadata=None):
        """A quantized inner-product session for a constant B (as
        tensorops_native.QuantizedInnerProduct): `.forward(a)`, `.info`,
        `.internal_buffer_size`, `.external_buffer_size_for(m)`, `.close()`."""
        return self._open_session(dict(b=b, b_scale=b_scale, a_scale=a_scale, a_zero=a_zero, c_scale=c_scale,
                                       c_zero=c_zero, bias=bias, trans_b=trans_b, max_m=max_m, algorithm=algorithm),
                                  timeout, metadata)

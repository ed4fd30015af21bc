"""The KServe V2 / Triton inference protocol messages (see proto/tensorops/kserve/v2)."""

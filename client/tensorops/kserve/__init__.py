"""The KServe V2 / Triton inference protocol as tensorops serves it (server:
tensorops_server.kserve; messages: tensorops.kserve.v2, from proto/tensorops/kserve/v2).
What both ends share: the service name clients call and the names of the shared-memory
parameters (the datatypes are tensorops.protocol.dtypes')."""

from __future__ import annotations

# The name Triton's clients call (not the .proto's package: see inference.proto).
SERVICE_NAME = "inference.GRPCInferenceService"

# Parameters of an input or requested output placed in a system shared-memory region.
REGION, BYTE_SIZE, OFFSET = "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"


def method_path(rpc: str) -> str:
    return f"/{SERVICE_NAME}/{rpc}"

"""tensorops_server: the gRPC service of tensorops (`tensorops-server`).

Handlers come from a declarative op table (optable.py) over tensorops_native; sessions.py
holds the quantized inner-product contexts; metrics.py the Prometheus metrics; config.py
the flags and TENSOROPS_* variables; cli.py the process (signals, graceful shutdown).
"""

from .config import Config
from .server import TensorOpsServer

__all__ = ["Config", "TensorOpsServer"]

"""tensorops_server: the gRPC service of tensorops (`tensorops-server`).

Handlers come from a declarative op table (optable.py) over tensorops_native; sessions.py
holds the quantized inner-product contexts; metrics.py the Prometheus metrics; config.py
the flags and TENSOROPS_* variables; cli.py the process (signals, graceful shutdown);
supervisor.py and worker.py a server of several processes.

TensorOpsServer is imported on first use: the supervisor of several workers imports this
package without grpc, whose objects must not exist there.
"""

from .config import Config

__all__ = ["Config", "TensorOpsServer"]


def __getattr__(name: str):
    if name == "TensorOpsServer":
        from .server import TensorOpsServer

        return TensorOpsServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

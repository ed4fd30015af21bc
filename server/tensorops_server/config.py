"""Server configuration: command-line flags, each also read from TENSOROPS_<NAME>
(--metrics-port <-> TENSOROPS_METRICS_PORT). A flag wins over the environment, which wins
over the default. The defaults suit a server on localhost."""
from __future__ import annotations

import argparse
import importlib.metadata
import os
from dataclasses import dataclass, fields

from tensorops.protocol.wire import DEFAULT_MAX_MESSAGE_BYTES

ENV_PREFIX = "TENSOROPS_"
HEALTH_WATCHES_PER_CONNECTION = 8  # a client watches a few services, one stream each
LOG_LEVELS = ("debug", "info", "warning", "error")


def _default_workers() -> int:
    return max(4, min(64, 2 * (os.cpu_count() or 1)))


@dataclass(frozen=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_host: str = "127.0.0.1"   # scrapers elsewhere need an address of theirs (0.0.0.0 in the image)
    metrics_port: int = 9100          # -1: no metrics endpoint
    workers: int = _default_workers()
    max_concurrent_rpcs: int = 0      # 0: no limit; beyond it new calls get RESOURCE_EXHAUSTED
    max_inflight_bytes: int = 1 << 30  # bytes calls in flight may hold; beyond it new calls get RESOURCE_EXHAUSTED
    max_pending_requests: int = 64    # calls whose request is still arriving
    max_connections: int = 2048       # client connections open at once; more are closed at once
    handshake_timeout: float = 5.0    # seconds a new connection gets to complete TLS and the HTTP/2 preface
    max_connection_idle: float = 60.0  # seconds a connection without calls stays open (0: no limit)
    max_health_watches: int = 256     # health Watch streams open at once, all connections together
    read_timeout: float = 30.0        # seconds a request may take to arrive
    inline_bytes: int = 256 * 1024    # requests up to this size run on the event loop, larger ones on a worker
    max_batch_rows: int = 256         # rows of concurrent session forwards merged into one kernel call
    batch_window_us: int = 0          # extra time a forward batch waits for more rows (0: none)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_tensor_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_sessions: int = 256
    max_session_bytes: int = 1 << 30
    max_sessions_per_caller: int = 64
    max_session_bytes_per_caller: int = 256 << 20
    session_ttl: float = 600.0
    grace: float = 10.0
    drain_delay: float = 2.0          # seconds NOT_SERVING is reported, still serving, before the drain starts
    max_connection_age: float = 300.0  # seconds before a client connection is asked to reconnect (0: never)
    max_connection_age_grace: float = 30.0  # seconds the calls of such a connection get to finish (0: no limit)
    instance_name: str = ""           # GetServerInfo's instance; empty: the host name
    auth_tokens: str = ""             # comma-separated bearer tokens (prefer the environment variable)
    auth_token_file: str = ""         # one token per line, re-read when it changes
    reflection: bool = True
    log_level: str = "info"
    log_format: str = "json"
    tls_cert: str = ""                # PEM certificate chain; with tls_key: TLS on the gRPC port
    tls_key: str = ""                 # PEM private key of tls_cert
    tls_client_ca: str = ""           # PEM CA bundle: clients must present a certificate it signed (mTLS)
    allow_shared_memory: bool = False  # KServe system shared memory (co-located callers only)
    shared_memory_prefix: str = "tensorops_"  # the only shared-memory keys that may be registered
    max_shared_memory_regions: int = 64
    max_shared_memory_bytes: int = 1 << 30
    max_shared_memory_regions_per_caller: int = 16
    max_shared_memory_bytes_per_caller: int = 256 << 20
    inline_shared_memory_bytes: int = 8 << 20  # calls in shared memory touching up to this many bytes run on the loop

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


_HELP = {
    "host": "address to listen on",
    "port": "gRPC port (0: any free port)",
    "metrics_host": "address of the Prometheus endpoint (0.0.0.0: every interface)",
    "metrics_port": "Prometheus /metrics port (0: any free port, -1: disabled)",
    "workers": "threads running requests (kernels release the GIL)",
    "max_concurrent_rpcs": "calls running at once (health checks excluded); 0 means no limit; beyond it "
                           "new calls get RESOURCE_EXHAUSTED",
    "max_inflight_bytes": "bytes the calls in flight may hold, from admission until their response was sent "
                          "(request, result, encoded response); a call that would pass it gets RESOURCE_EXHAUSTED",
    "max_pending_requests": "calls whose request message is still arriving; more are refused at once",
    "read_timeout": "seconds a request message (or a metrics scrape's request) may take to arrive before "
                    "the call is cut off",
    "max_connections": "client connections open at once (handshakes included); more are closed as they "
                       "arrive (lowered to fit the file-descriptor limit)",
    "handshake_timeout": "seconds a new connection gets to complete its TLS handshake and HTTP/2 preface "
                         "before it is closed",
    "max_connection_idle": "seconds a connection with no call in progress stays open (clients reconnect "
                           "at their next call), so that idle connections do not keep others under "
                           "--max-connections out (0: no limit)",
    "max_health_watches": f"health Watch streams open at once, all connections together (and "
                          f"{HEALTH_WATCHES_PER_CONNECTION} per connection); more get RESOURCE_EXHAUSTED",
    "inline_bytes": "requests of up to this many bytes are computed on the event loop (no thread hand-off); "
                    "larger ones, and every call that may take long, on a worker thread",
    "max_batch_rows": "most rows of concurrent forwards on one session merged into one kernel call "
                      "(1: no batching; a larger single request still runs, alone)",
    "batch_window_us": "microseconds a forward batch waits for more rows before it starts (0: only what "
                       "queued while the previous batch ran)",
    "max_message_bytes": "largest request or response message",
    "max_tensor_bytes": "largest tensor in a request (RESOURCE_EXHAUSTED above)",
    "max_sessions": "quantized inner-product sessions kept (least recently used evicted)",
    "max_session_bytes": "memory all sessions may hold (least recently used evicted)",
    "max_sessions_per_caller": "sessions one caller (token or client certificate) may hold; its own least "
                               "recently used are evicted first",
    "max_session_bytes_per_caller": "memory the sessions of one caller may hold",
    "session_ttl": "seconds an idle session lives",
    "auth_tokens": "bearer tokens accepted, comma-separated (set it in the environment, not on the command "
                   "line); empty with no token file: no authentication",
    "auth_token_file": "file of bearer tokens, one per line, re-read when it changes (rotation)",
    "reflection": "serve gRPC reflection (true/false)",
    "grace": "seconds in-flight calls get to finish on SIGTERM/SIGINT",
    "drain_delay": "seconds between SIGTERM/SIGINT and the drain during which the health service reports "
                   "NOT_SERVING while calls are still served, so that balancers and orchestrators stop "
                   "routing here first (0: drain at once)",
    "max_connection_age": "seconds after which a client connection is sent GOAWAY (with 10%% jitter) so that "
                          "clients reconnect and spread over replicas added meanwhile (0: never)",
    "max_connection_age_grace": "seconds the calls of a connection past its age get to finish before it is "
                                "closed (0: no limit)",
    "instance_name": "name of this server process reported by GetServerInfo (default: the host name)",
    "log_level": "one of " + ", ".join(LOG_LEVELS),
    "log_format": "json (one object per line) or text",
    "tls_cert": "PEM certificate chain file: serve TLS (needs --tls-key); the files are re-read when they "
                "change, checked at each new connection, or on SIGHUP",
    "tls_key": "PEM private key file of --tls-cert (unencrypted)",
    "tls_client_ca": "PEM CA bundle file: require mutual TLS, clients must present a certificate it signed",
    "allow_shared_memory": "serve KServe system shared memory (true/false): co-located callers pass tensors "
                           "through POSIX shared-memory regions they register",
    "shared_memory_prefix": "shared-memory keys must start with this prefix (leading slashes aside)",
    "max_shared_memory_regions": "shared-memory regions registered at once, all callers together",
    "max_shared_memory_bytes": "bytes of the shared-memory regions registered at once, all callers together",
    "max_shared_memory_regions_per_caller": "shared-memory regions one caller (token or client certificate) may "
                                            "have registered at once",
    "max_shared_memory_bytes_per_caller": "bytes of the shared-memory regions one caller may have registered at once",
    "inline_shared_memory_bytes": "a call whose message is small (--inline-bytes) and whose tensors in shared "
                                  "memory (inputs and outputs) hold up to this many bytes is computed on the "
                                  "event loop: its kernel is the only work (no decoding, no copies), and a thread "
                                  "hand-off would cost more than a short kernel; larger ones on a worker thread",
}


_KIND_NAMES = {int: "an integer", float: "a number"}


def _number(kind, accept=lambda value: True, bound_text=""):
    """A parser of `kind` values that `accept`, whose errors say what was expected."""
    def parse(text: str):
        expected = f"expected {_KIND_NAMES[kind]}{bound_text}, got {text!r}"
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(expected) from None
        if not accept(value):
            raise argparse.ArgumentTypeError(expected)
        return value
    parse.__name__ = kind.__name__
    return parse


def _positive(kind):
    return _number(kind, lambda value: value > 0, " > 0")


def _non_negative(kind):
    return _number(kind, lambda value: value >= 0, " >= 0")


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


_port = _number(int, lambda value: 0 <= value <= 65535, " (a port number 0-65535)")


_metrics_port = _number(int, lambda value: -1 <= value <= 65535, " (a port number 0-65535, or -1)")


def _choice(choices):
    def parse(text: str) -> str:
        if text.lower() not in choices:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(choices)}, got {text}")
        return text.lower()
    parse.__name__ = "choice"
    return parse


_TYPES = {
    "host": str, "metrics_host": str, "port": _port, "metrics_port": _metrics_port,
    "workers": _positive(int), "max_concurrent_rpcs": _non_negative(int),
    "max_inflight_bytes": _positive(int), "max_pending_requests": _positive(int), "read_timeout": _positive(float),
    "max_connections": _positive(int), "handshake_timeout": _positive(float),
    "max_connection_idle": _non_negative(float),
    "max_health_watches": _positive(int),
    "inline_bytes": _non_negative(int), "max_batch_rows": _positive(int), "batch_window_us": _non_negative(int),
    "max_message_bytes": _positive(int), "max_tensor_bytes": _positive(int),
    "max_sessions": _positive(int), "max_session_bytes": _positive(int),
    "max_sessions_per_caller": _positive(int), "max_session_bytes_per_caller": _positive(int),
    "auth_tokens": str, "auth_token_file": str, "reflection": _bool,
    "session_ttl": _positive(float), "grace": _non_negative(float), "drain_delay": _non_negative(float),
    "max_connection_age": _non_negative(float), "max_connection_age_grace": _non_negative(float),
    "instance_name": str,
    "log_level": _choice(LOG_LEVELS), "log_format": _choice(("json", "text")),
    "tls_cert": str, "tls_key": str, "tls_client_ca": str,
    "allow_shared_memory": _bool, "shared_memory_prefix": str, "max_shared_memory_regions": _positive(int),
    "inline_shared_memory_bytes": _non_negative(int),
    "max_shared_memory_bytes": _positive(int),
    "max_shared_memory_regions_per_caller": _positive(int), "max_shared_memory_bytes_per_caller": _positive(int),
}


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tensorops-server",
        description="The tensorops gRPC service. Every flag can also be set as TENSOROPS_<FLAG> "
                    "(e.g. TENSOROPS_METRICS_PORT=9100).")
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    for f in fields(Config):
        # A boolean also takes the bare form: `--allow-shared-memory` is `--allow-shared-memory true`.
        bare = {"nargs": "?", "const": True} if f.type in (bool, "bool") else {}
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=_TYPES[f.name], default=None,
                       help=f"{_HELP[f.name]} [{env_name(f.name)}, default {f.default!r}]", **bare)
    return p


def version() -> str:
    """The installed distribution's version (the kernels' when run from a bare source tree)."""
    try:
        return importlib.metadata.version("tensorops")
    except importlib.metadata.PackageNotFoundError:
        import tensorops_native
        return tensorops_native.__version__


def load(argv=None, environ=None) -> Config:
    """The configuration from flags, then TENSOROPS_* variables, then defaults. Exits with
    status 2 and a message naming the flag or variable on a bad value."""
    environ = os.environ if environ is None else environ
    p = parser()
    args = p.parse_args(argv)
    values = {}
    for f in fields(Config):
        value = getattr(args, f.name)
        if value is None and environ.get(env_name(f.name), "") != "":
            try:
                value = _TYPES[f.name](environ[env_name(f.name)])
            except (ValueError, argparse.ArgumentTypeError) as exc:
                p.error(f"{env_name(f.name)}={environ[env_name(f.name)]!r}: {exc}")
        if value is not None:
            values[f.name] = value
    return Config(**values)

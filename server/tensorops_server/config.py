"""Server configuration. Every setting is declared once, as a field of Config: its type,
default, value parser and help. From that declaration come its flag (--metrics-port), its
environment variable (TENSOROPS_METRICS_PORT), the messages refusing a bad value, and
README's settings table (settings_table.py). A flag wins over the environment, which wins
over the default. The defaults suit a server on localhost."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

ENV_PREFIX = "TENSOROPS_"
HEALTH_WATCHES_PER_CONNECTION = 8  # a client watches a few services, one stream each
LOG_LEVELS = ("debug", "info", "warning", "error")
# The client's default too (tensorops.protocol.wire.DEFAULT_MAX_MESSAGE_BYTES, held equal by a
# test): importing the client's package here would bring grpc into the workers' supervisor.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class Parser:
    """Turns a flag's or variable's text into a value; refuses other text with ArgumentTypeError
    `expected <expects>, got <text>`. `expects` is also what the settings table says a value
    is, with its `unit` (bytes, seconds); `metavar` is what --help shows as a value."""

    def __init__(
        self,
        name: str,
        expects: str,
        convert: Callable[[str], Any],
        *,
        unit: str = "",
        shown: Callable[[str], str] = repr,
        metavar: str | None = None,
    ):
        self.__name__ = name  # argparse names the type by it
        self.expects, self.unit, self.metavar = expects, unit, metavar
        self._convert, self._shown = convert, shown

    def __call__(self, text: str) -> Any:
        try:
            value = self._convert(text)  # None: refused
        except ValueError:
            value = None
        if value is None:
            raise argparse.ArgumentTypeError(f"expected {self.expects}, got {self._shown(text)}")
        return value


_KIND_NAMES = {int: "an integer", float: "a number"}


def _number(kind, accept=lambda value: True, bound_text="", unit=""):
    """A parser of `kind` values that `accept`, whose errors say what was expected."""

    def convert(text: str):
        value = kind(text)
        return value if accept(value) else None

    return Parser(kind.__name__, _KIND_NAMES[kind] + bound_text, convert, unit=unit)


def _positive(kind, unit=""):
    return _number(kind, lambda value: value > 0, " > 0", unit)


def _non_negative(kind, unit=""):
    return _number(kind, lambda value: value >= 0, " >= 0", unit)


_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
_bool = Parser("bool", "true or false", lambda text: _BOOLS.get(text.strip().lower()), metavar="{true,false}")
_port = _number(int, lambda value: 0 <= value <= 65535, " (a port number 0-65535)")
_metrics_port = _number(int, lambda value: -1 <= value <= 65535, " (a port number 0-65535, or -1)")


def _choice(choices):
    return Parser(
        "choice",
        "one of " + ", ".join(choices),
        lambda text: text.lower() if text.lower() in choices else None,
        shown=str,
        metavar="{" + ",".join(choices) + "}",
    )


def _text(expects: str):
    """Any string: `expects` only says what it is for (the settings table shows it)."""
    return Parser("str", expects, str)


def setting(default, parse: Parser, help_text: str, *, shown: str | None = None):
    """A Config field. `parse` turns a flag's or variable's text into the value; `help_text` may
    hold Markdown code spans (`like this`); `shown`, when given, is how README's table shows a
    default whose value depends on the machine or is a placeholder."""
    return field(default=default, metadata={"parse": parse, "help": help_text, "shown": shown})


def _default_threads() -> int:
    return max(4, min(64, 2 * (os.cpu_count() or 1)))


CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: pathlib.Path, proc_cgroup: str) -> float | None:
    """The CPUs a cgroup quota grants this process (1.5: 150 ms of CPU time per 100 ms), the
    tightest of its cgroup and every parent's, or None without a quota. `proc_cgroup` is the
    text of /proc/self/cgroup; `root` where the hierarchies are mounted. cgroup v2 writes
    `cpu.max` ("max 100000" or "200000 100000"); v1 `cpu.cfs_quota_us` (-1: none) and
    `cpu.cfs_period_us` in the cpu controller's hierarchy."""
    limits = []
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy at the root
            bases = [root]
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own hierarchy
            bases = [root / name for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu")]
        else:
            continue
        for base in bases:
            # Inside a container the hierarchy is often mounted at the container's own cgroup
            # while the path names the host's: the directories that exist are the ones that count.
            directory = base / path.lstrip("/")
            while True:
                limits.append(_quota_of(directory))
                if directory == base or base not in directory.parents:
                    break
                directory = directory.parent
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def _quota_of(directory: pathlib.Path) -> float | None:
    try:
        if (directory / "cpu.max").exists():
            quota, period = (directory / "cpu.max").read_text().split()[:2]
        else:
            quota = (directory / "cpu.cfs_quota_us").read_text().strip()
            period = (directory / "cpu.cfs_period_us").read_text().strip()
        if quota in ("max", "-1") or int(period) <= 0:
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        return None


def usable_cpus(affinity: int, cgroup_limit: float | None) -> int:
    """CPUs this process may keep busy: those it may run on, capped by the cgroup quota,
    rounded down (a quota of 1.5 CPUs keeps one worker busy without throttling), at least 1."""
    cpus = affinity if cgroup_limit is None else min(affinity, int(cgroup_limit))
    return max(1, cpus)


def _default_workers() -> int:
    try:
        proc_cgroup = pathlib.Path("/proc/self/cgroup").read_text()
    except OSError:
        proc_cgroup = ""
    return usable_cpus(len(os.sched_getaffinity(0)), cgroup_cpu_limit(CGROUP_ROOT, proc_cgroup))


@dataclass(frozen=True)
class Config:
    host: str = setting("127.0.0.1", _text("an address"), "address to listen on")
    port: int = setting(50051, _port, "gRPC port (0: any free port; the `serving` log line names it)")
    # Loopback by default: scrapers on other hosts are opted in (the container image sets 0.0.0.0).
    metrics_host: str = setting(
        "127.0.0.1",
        _text("an address"),
        "address of the Prometheus endpoint (`0.0.0.0`: every interface, as the container image sets it)",
    )
    metrics_port: int = setting(9100, _metrics_port, "Prometheus `/metrics` port (0: any free port, -1: none)")
    workers: int = setting(
        _default_workers(),
        _positive(int),
        "server processes accepting calls on the same port, started and restarted by a supervisor (1: one "
        "process, no supervisor); the per-process caps below (calls, bytes in flight, connections, health "
        "watches, pending requests) are the server's totals, shared out among the workers",
        shown="usable CPUs (affinity, cgroup quota)",
    )
    threads: int = setting(
        _default_threads(),
        _positive(int),
        "threads of each worker running large calls, session creation and forwards (kernels release the GIL)",
        shown="2 x CPUs (4 to 64)",
    )
    max_concurrent_rpcs: int = setting(
        0,
        _non_negative(int),
        "calls running at once, health checks excluded (0: no limit); beyond it new calls get RESOURCE_EXHAUSTED",
    )
    max_inflight_bytes: int = setting(
        1 << 30,
        _positive(int, "bytes"),
        "bytes the calls in flight may hold, from admission until their response was sent (request, result, "
        "encoded response); a call that would pass it gets RESOURCE_EXHAUSTED",
    )
    max_pending_requests: int = setting(
        64,
        _positive(int),
        "calls whose request message is still arriving; beyond it the one waiting longest loses its place",
    )
    max_connections: int = setting(
        2048,
        _positive(int),
        "client connections open at once (handshakes included); more are closed as they arrive (lowered to fit "
        "the file-descriptor limit)",
    )
    handshake_timeout: float = setting(
        5.0,
        _positive(float, "seconds"),
        "seconds a new connection gets to complete its TLS handshake and HTTP/2 preface before it is closed",
    )
    max_connection_idle: float = setting(
        60.0,
        _non_negative(float, "seconds"),
        "seconds a connection with no call in progress stays open (clients reconnect at their next call), so "
        "that idle connections do not keep others under `--max-connections` out (0: no limit)",
    )
    max_health_watches: int = setting(
        256,
        _positive(int),
        f"health `Watch` streams open at once, all connections together (and {HEALTH_WATCHES_PER_CONNECTION} "
        f"per connection); more get RESOURCE_EXHAUSTED",
    )
    read_timeout: float = setting(
        30.0,
        _positive(float, "seconds"),
        "seconds a request message (or a metrics scrape's request) may take to arrive before the call is cut off",
    )
    inline_bytes: int = setting(
        256 * 1024,
        _non_negative(int, "bytes"),
        "requests of up to this many bytes are computed on the event loop (no thread hand-off); larger ones, "
        "and every call that may take long, on a worker thread",
    )
    max_batch_rows: int = setting(
        256,
        _positive(int),
        "most rows of concurrent forwards on one session merged into one kernel call (1: no batching; a larger "
        "single request still runs, alone)",
    )
    batch_window_us: int = setting(
        0,
        _non_negative(int, "microseconds"),
        "microseconds a forward batch waits for more rows before it starts (0: only what queued while the "
        "previous batch ran)",
    )
    max_message_bytes: int = setting(
        DEFAULT_MAX_MESSAGE_BYTES,
        _positive(int, "bytes"),
        "largest request or response message (the client's default too)",
    )
    max_tensor_bytes: int = setting(
        DEFAULT_MAX_MESSAGE_BYTES,
        _positive(int, "bytes"),
        "largest tensor in a request or result (RESOURCE_EXHAUSTED above)",
    )
    max_sessions: int = setting(
        256, _positive(int), "quantized inner-product sessions kept (least recently used evicted)"
    )
    max_session_bytes: int = setting(
        1 << 30, _positive(int, "bytes"), "memory all sessions may hold (least recently used evicted)"
    )
    max_sessions_per_caller: int = setting(
        64,
        _positive(int),
        "sessions one caller (token or client certificate) may hold; its own least recently used are evicted first",
    )
    max_session_bytes_per_caller: int = setting(
        256 << 20, _positive(int, "bytes"), "memory the sessions of one caller may hold"
    )
    session_ttl: float = setting(600.0, _positive(float, "seconds"), "seconds an idle session lives")
    grace: float = setting(
        10.0, _non_negative(float, "seconds"), "seconds in-flight calls get to finish on SIGTERM/SIGINT"
    )
    drain_delay: float = setting(
        2.0,
        _non_negative(float, "seconds"),
        "seconds between SIGTERM/SIGINT and the drain during which the health service reports NOT_SERVING while "
        "calls are still served, so that balancers and orchestrators stop routing here first (0: drain at once)",
    )
    max_connection_age: float = setting(
        300.0,
        _non_negative(float, "seconds"),
        "seconds after which a client connection is sent GOAWAY (with 10% jitter) so that clients reconnect and "
        "spread over replicas added meanwhile (0: never)",
    )
    max_connection_age_grace: float = setting(
        30.0,
        _non_negative(float, "seconds"),
        "seconds the calls of a connection past its age get to finish before it is closed (0: no limit)",
    )
    instance_name: str = setting(
        "",
        _text("a name"),
        "name of this server process reported by GetServerInfo (empty: the host name)",
        shown="host name",
    )
    auth_tokens: str = setting(
        "",
        _text("comma-separated tokens"),
        "bearer tokens accepted, comma-separated (set `TENSOROPS_AUTH_TOKENS` rather than the flag); empty with "
        "no token file: no authentication",
    )
    auth_token_file: str = setting(
        "", _text("a file path"), "file of bearer tokens, one per line, re-read when it changes (rotation)"
    )
    reflection: bool = setting(True, _bool, "serve gRPC server reflection")
    log_level: str = setting("info", _choice(LOG_LEVELS), "least severe level logged (`debug`: a line per call)")
    log_format: str = setting("json", _choice(("json", "text")), "log lines on stderr (`json`: one object a line)")
    tls_cert: str = setting(
        "",
        _text("a file path"),
        "PEM certificate chain file of the server (its own, then any intermediates): serve TLS (needs "
        "`--tls-key`); the files are re-read when they change, checked at each new connection, or on SIGHUP",
    )
    tls_key: str = setting("", _text("a file path"), "PEM private key file of `--tls-cert`, unencrypted")
    tls_client_ca: str = setting(
        "",
        _text("a file path"),
        "PEM bundle of the CAs that sign client certificates: require mutual TLS (a client without a certificate "
        "from one of them cannot connect)",
    )
    allow_shared_memory: bool = setting(
        False,
        _bool,
        "serve KServe system shared memory: co-located callers pass tensors through POSIX shared-memory regions "
        "they register (docs/kserve.md)",
    )
    shared_memory_prefix: str = setting(
        "tensorops_", _text("a key prefix"), "shared-memory keys must start with this prefix (leading slashes aside)"
    )
    max_shared_memory_regions: int = setting(
        64, _positive(int), "shared-memory regions registered at once, all callers together"
    )
    max_shared_memory_bytes: int = setting(
        1 << 30, _positive(int, "bytes"), "bytes of the shared-memory regions registered at once, all callers together"
    )
    max_shared_memory_regions_per_caller: int = setting(
        16, _positive(int), "shared-memory regions one caller (token or client certificate) may have registered at once"
    )
    max_shared_memory_bytes_per_caller: int = setting(
        256 << 20, _positive(int, "bytes"), "bytes of the shared-memory regions one caller may have registered at once"
    )
    inline_shared_memory_bytes: int = setting(
        8 << 20,
        _non_negative(int, "bytes"),
        "a call whose message is small (`--inline-bytes`) and whose tensors in shared memory (inputs and outputs) "
        "hold up to this many bytes is computed on the event loop: its kernel is the only work (no decoding, no "
        "copies), and a thread hand-off would cost more than a short kernel; larger ones on a worker thread",
    )

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def parse_of(f) -> Parser:
    """The parser of a Config field's flag and variable."""
    return f.metadata["parse"]


def help_of(f) -> str:
    """A Config field's help as plain text (code spans unmarked)."""
    return f.metadata["help"].replace("`", "")


_UNITS = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def shown_default(f) -> str:
    """A field's default as a reader takes it in: 1 GiB, 30 (seconds), true, (none)."""
    value = f.default
    if f.metadata["shown"] is not None:
        return f.metadata["shown"]
    if isinstance(value, bool):
        return str(value).lower()
    if value == "":
        return "(none)"
    if parse_of(f).unit == "bytes":
        for size, unit in _UNITS:
            if value % size == 0:
                return f"{value // size} {unit}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tensorops-server",
        description="The tensorops gRPC service. Every flag can also be set as TENSOROPS_<FLAG> "
        "(e.g. TENSOROPS_METRICS_PORT=9100).",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    for f in fields(Config):
        # A boolean also takes the bare form: `--allow-shared-memory` is `--allow-shared-memory true`.
        bare = {"nargs": "?", "const": True} if parse_of(f) is _bool else {}
        described = f"{help_of(f)} [{env_name(f.name)}, default {shown_default(f)}]"
        p.add_argument(
            flag_name(f.name),
            dest=f.name,
            type=parse_of(f),
            default=None,
            metavar=parse_of(f).metavar,
            help=described.replace("%", "%%"),
            **bare,
        )  # argparse %-formats help
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
        text = environ.get(env_name(f.name), "")
        if value is None and text != "":
            try:
                value = parse_of(f)(text)
            except argparse.ArgumentTypeError as exc:
                p.error(f"{env_name(f.name)}={text!r}: {exc}")
        if value is not None:
            values[f.name] = value
    return Config(**values)

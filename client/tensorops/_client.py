"""The blocking client and its quantized inner-product session."""

from __future__ import annotations

import copy
import ipaddress
import json
import numbers
import os
import secrets
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Self, TypedDict, TypeVar, Unpack, cast, overload

import grpc
import grpc.aio
import numpy as np
import numpy.typing as npt

from ._errors import (
    ClientClosedError,
    NotFoundError,
    TensorOpsError,
    explain_connection_failure,
    from_rpc_error,
    invalid_argument,
)
from ._operations import (
    F32,
    U8,
    ArrayOf,
    DTypeChoice,
    Float32Array,
    Float32Pair,
    FloatArray,
    Floats,
    Metadata,
    NamedArray,
    Operations,
    Pair,
    Pairs,
    Scalar,
    Session,
    Shape,
    Timeout,
    UInt8Array,
    UInt8Input,
    check_metadata,
    check_timeout,
    result_into,
)
from ._shared_memory import MIN_BYTES, SharedMemoryTransport
from .protocol import wire
from .protocol.codec import WireError
from .v1 import tensorops_pb2

DEFAULT_PORT = 50051  # the server's default port, also the port of a target that names none
DEFAULT_TARGET = f"localhost:{DEFAULT_PORT}"
# Schemes of URLs, which people write in front of an address but gRPC reads as a host name.
URL_SCHEMES = ("http://", "https://", "grpc://", "grpcs://")
# gRPC target schemes whose addresses are not host:port (left as they are).
_OTHER_ADDRESS_SCHEMES = ("unix:", "unix-abstract:", "vsock:", "xds:", "google-c2p:")

# Metadata sent with every call of a quantized inner-product session: a random key chosen
# by the client when it opens the session, the same for the session's whole life (and its
# re-creations). Balancers hash on it so that a session's calls reach the replica holding
# it; the server ignores it (the session id it hands out stays the only handle).
SESSION_KEY_HEADER = "x-tensorops-session-key"

# The client-side load-balancing policies a Client accepts (gRPC names).
LoadBalancing = Literal["round_robin", "pick_first"]
LOAD_BALANCING_POLICIES: tuple[LoadBalancing, ...] = ("round_robin", "pick_first")


def default_load_balancing(target: str) -> LoadBalancing:
    """round_robin for a target that names several servers: a list of addresses
    ("ipv4:a:p,b:p") or an explicit DNS name ("dns:///name:port", whose name may resolve to
    many); pick_first otherwise. pick_first reconnects at the next call after a lone server
    restarts, where round_robin would wait out its reconnection backoff."""
    if "," in target or target.startswith("dns:"):
        return "round_robin"
    return "pick_first"


PEM = bytes | str | os.PathLike[str]
# gRPC channel arguments: (name, value) pairs or a mapping.
ChannelOptions = Iterable[tuple[str, object]] | Mapping[str, object]


def retry_service_config(max_attempts: int, load_balancing: str = "round_robin", shuffle: bool = False) -> str:
    """gRPC service config: the load-balancing policy over the addresses the target
    resolves to (`shuffle`: pick_first tries them in random order), and retries of
    UNAVAILABLE (server restarting, draining, unreachable) with exponential backoff.
    Every operation is a pure function, so a retry is safe."""
    if load_balancing not in LOAD_BALANCING_POLICIES:
        raise ValueError(
            f"load_balancing: expected one of {', '.join(LOAD_BALANCING_POLICIES)}, got {load_balancing!r}"
        )
    policy = {"shuffleAddressList": True} if shuffle and load_balancing == "pick_first" else {}
    method_config: dict[str, Any] = {"name": [{"service": wire.SERVICE_NAME}]}
    if max_attempts > 1:
        method_config["retryPolicy"] = {
            "maxAttempts": max_attempts,
            "initialBackoff": "0.05s",
            "maxBackoff": "2s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        }
    return json.dumps({"loadBalancingConfig": [{load_balancing: policy}], "methodConfig": [method_config]})


INT32_MAX = 2**31 - 1  # gRPC's integer channel arguments are 32-bit


def whole_number(value: object, name: str, minimum: int, maximum: int = INT32_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}")
    if not minimum <= int(value) <= maximum:
        raise ValueError(f"{name}: expected {minimum} .. {maximum}, got {value}")
    return int(value)


def channel_options(
    max_message_bytes: int,
    max_attempts: int,
    options: ChannelOptions = (),
    load_balancing: str = "round_robin",
    shuffle: bool = False,
) -> list[tuple[str, object]]:
    max_message_bytes = whole_number(max_message_bytes, "max_message_bytes", 1)
    max_attempts = whole_number(max_attempts, "max_attempts", 1)
    base: list[tuple[str, object]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.enable_retries", 1 if max_attempts > 1 else 0),
        ("grpc.service_config", retry_service_config(max_attempts, load_balancing, shuffle)),
        # A retry resends the request from this buffer; let it hold the largest message.
        ("grpc.per_rpc_retry_buffer_size", max_message_bytes),
    ]
    try:
        given = dict(cast(Iterable[tuple[str, object]], options))  # a mapping too (checked here)
    except (TypeError, ValueError):
        raise TypeError(
            f"options: expected gRPC channel arguments as (name, value) pairs or a mapping, got {options!r:.80}"
        ) from None
    return [(k, v) for k, v in base if k not in given] + list(given.items())


def merge_metadata(default: Pairs, call: Pairs | None) -> Pairs | None:
    return (default + tuple(call or ())) or None


def normalize_target(target: object) -> str:
    """The gRPC target to dial: `target` with the default port (50051) added to each address
    that names none (gRPC itself would dial 443). A URL scheme in front (http://, ...) is
    refused with the reason, as gRPC would take it for part of a host name."""
    if not isinstance(target, str):
        raise TypeError(f"target: expected a str such as 'localhost:{DEFAULT_PORT}', got {type(target).__name__}")
    if not target.strip():
        raise ValueError(f"target: empty; expected 'host:port', such as 'localhost:{DEFAULT_PORT}'")
    lowered = target.lower()
    for scheme in URL_SCHEMES:
        if lowered.startswith(scheme):
            address = normalize_target(target[len(scheme) :].rstrip("/"))
            raise ValueError(
                f"target: a gRPC target is 'host:port', not a URL: write {address!r} instead of "
                f"{target!r}; TLS comes from root_certificates= or credentials=, not from a scheme"
            )
    if lowered.startswith(_OTHER_ADDRESS_SCHEMES):
        return target
    if lowered.startswith("dns:"):
        scheme_and_authority, name = "dns:", target[4:]
        if name.startswith("//"):  # dns://[authority]/host:port
            authority, _, name = name[2:].partition("/")
            scheme_and_authority = f"dns://{authority}/"
        return scheme_and_authority + _with_port(name)
    for scheme in ("ipv4:", "ipv6:"):
        if lowered.startswith(scheme):
            return target[: len(scheme)] + ",".join(_with_port(a) for a in target[len(scheme) :].split(","))
    return _with_port(target)


def _with_port(address: str) -> str:
    """host:port as given; host, [v6] or a bare IPv6 address with DEFAULT_PORT."""
    if address.startswith("["):
        host, _, rest = address.partition("]")
        return address if rest[1:] else f"{host}]:{DEFAULT_PORT}"
    if address.count(":") > 1:  # no brackets: gRPC reads it all as the host, an IPv6 address
        try:
            return f"[{ipaddress.IPv6Address(address)}]:{DEFAULT_PORT}"
        except ValueError:
            return address  # not an address: gRPC names the problem
    host, _, port = address.partition(":")
    return address if port else f"{host}:{DEFAULT_PORT}"


def read_pem(name: str, value: PEM | None) -> bytes | None:
    """PEM bytes as given, or read from a path (str or os.PathLike); a str that holds PEM
    text itself (starts with "-----BEGIN") is taken as it is."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str) and value.lstrip().startswith("-----BEGIN"):
        return value.encode("ascii")
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name}: expected PEM bytes or a file path, got {type(value).__name__}")
    try:
        with open(value, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ValueError(f"{name}: cannot read {os.fspath(value)!r}: {exc.strerror or exc}") from None


def channel_credentials(
    credentials: grpc.ChannelCredentials | None,
    root_certificates: PEM | None = None,
    certificate_chain: PEM | None = None,
    private_key: PEM | None = None,
) -> grpc.ChannelCredentials | None:
    """The credentials of the channel: `credentials` as given, or TLS from the PEM
    arguments, or None (a plaintext channel)."""
    pems = {"root_certificates": root_certificates, "certificate_chain": certificate_chain, "private_key": private_key}
    given = [name for name, value in pems.items() if value is not None]
    if not given:
        return credentials
    if credentials is not None:
        raise ValueError(f"credentials: give either a ready grpc.ChannelCredentials or {', '.join(given)}, not both")
    if (certificate_chain is None) != (private_key is None):
        missing = "private_key" if private_key is None else "certificate_chain"
        raise ValueError(f"{missing}: a client certificate needs both certificate_chain and private_key")
    return grpc.ssl_channel_credentials(**{name: read_pem(name, value) for name, value in pems.items()})


def is_loopback_target(target: str) -> bool:
    """Whether a gRPC target can only reach this machine: a unix socket, localhost, or
    addresses in 127.0.0.0/8 or ::1 (with or without the dns:, ipv4:, ipv6: schemes)."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in ("dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme) :]
            if target.startswith("//"):  # dns://authority/host:port
                target = target[2:].partition("/")[2]
            break
    return bool(target) and all(_is_loopback_host(address) for address in target.split(","))


def _is_loopback_host(address: str) -> bool:
    if address.startswith("["):
        host = address[1:].partition("]")[0]
    elif address.count(":") == 1:
        host = address.partition(":")[0]
    else:
        host = address  # no port, or a bare IPv6 address
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_metadata(token: str | None, target: str, secure: bool, allow_insecure_token: bool) -> Pairs:
    """The authorization header for `token`; ValueError if it would travel in the clear
    to anything but this machine."""
    if token is None:
        return ()
    if not isinstance(token, str) or not token:
        raise ValueError("token: expected a non-empty str")
    if not secure:
        if not allow_insecure_token:
            raise ValueError(
                f"token: refusing to send a bearer token over the plaintext channel to {target!r}; "
                "use TLS (root_certificates= or credentials=), or allow_insecure_token=True for a "
                "loopback target"
            )
        if not is_loopback_target(target):
            raise ValueError(
                f"token: allow_insecure_token=True only allows loopback targets (127.0.0.0/8, ::1, "
                f"localhost, unix:), not {target!r}; use TLS"
            )
    return (("authorization", f"Bearer {token}"),)


def encode(op: wire.Operation, arguments: dict[str, object]) -> wire.Request:
    try:
        return wire.build_request(op, arguments)
    except WireError as exc:
        raise invalid_argument(exc.field, exc.message) from None


class ClientBase(Operations[F32, Floats, Pair, U8, Session]):
    """What the blocking and the asyncio clients share: configuration, the channel
    credentials and encoding.

    target: "host:port" ("[::1]:50051" for IPv6), or a gRPC target ("dns:///name:port",
      "ipv4:a:p,b:p", "unix:/path"). An address without a port gets 50051, the server's
      default. A URL (http://, https://, grpc://, grpcs://) is refused: TLS is chosen by
      the arguments below, not by a scheme.
    timeout: default seconds per call (a positive number; None: no deadline).
    metadata: default metadata of every call, as a mapping or (key, value) pairs; keys are
      lowercase ASCII letters, digits and "-_." ("grpc-" is reserved), values printable
      ASCII str, or bytes under keys ending in "-bin". Each call may add its own.
    Mistakes in these raise ValueError or TypeError naming the argument, at construction
    or before the call is sent.

    Transport security (all keyword arguments):
      root_certificates, certificate_chain, private_key: PEM bytes, or a path to a PEM
        file. Any of them makes the channel TLS: root_certificates are the CAs the
        server's certificate must chain to (default: the system's), certificate_chain
        and private_key (together) the client certificate for mutual TLS.
      credentials: a ready grpc.ChannelCredentials instead (not with the PEM arguments).
      server_name_override: the name checked in the server's certificate instead of the
        target's host (the channel option grpc.ssl_target_name_override); for tests.
      token: a bearer token sent with every call ("authorization: Bearer <token>"). It is
        refused (ValueError at construction) on a plaintext channel, unless
        allow_insecure_token=True and the target is a loopback address (127.0.0.0/8,
        ::1, localhost or a unix: socket), where it never leaves the machine.
    With none of them the channel is plaintext.

    Several servers: the target may list addresses ("ipv4:10.0.0.1:50051,10.0.0.2:50051")
    or be a DNS name that resolves to several ("dns:///tensorops-headless:50051").
      load_balancing: "round_robin" keeps a connection to every address and spreads the
        calls over the ready ones, one call at a time; "pick_first" uses one connection,
        to the first address that answers. Default: round_robin for a list of addresses
        or a dns: target, pick_first otherwise (a plain "host:port" is resolved through
        DNS as well: write "dns:///host:port" or pass load_balancing="round_robin" when
        the name stands for several servers, as a headless Service does). A session
        holds state on one server, so under round_robin each session opens a channel of
        its own that keeps to one server, picked at random (closed with the session)."""

    _channel: grpc.Channel | grpc.aio.Channel

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: Timeout = None,
        metadata: Metadata = None,
        credentials: grpc.ChannelCredentials | None = None,
        root_certificates: PEM | None = None,
        certificate_chain: PEM | None = None,
        private_key: PEM | None = None,
        server_name_override: str | None = None,
        token: str | None = None,
        allow_insecure_token: bool = False,
        max_message_bytes: int = wire.DEFAULT_MAX_MESSAGE_BYTES,
        max_attempts: int = 4,
        options: ChannelOptions = (),
        load_balancing: LoadBalancing | None = None,
    ):
        self.target = target = normalize_target(target)
        self.timeout = check_timeout(timeout)
        self._credentials = channel_credentials(credentials, root_certificates, certificate_chain, private_key)
        self.metadata: Pairs = check_metadata(metadata) + token_metadata(
            token, target, self._credentials is not None, allow_insecure_token
        )
        if server_name_override is not None:
            options = [
                *cast(Iterable[tuple[str, object]], options),
                ("grpc.ssl_target_name_override", server_name_override),
            ]
        self.load_balancing = load_balancing or default_load_balancing(target)
        self._options = channel_options(max_message_bytes, max_attempts, options, self.load_balancing)
        self._session_options: list[tuple[str, object]] | None = None
        if self.load_balancing == "round_robin":
            self._session_options = channel_options(
                max_message_bytes, max_attempts, options, "pick_first", shuffle=True
            )
        self._callables: dict[str, Callable[..., object]] = {}
        # Held while a method is created on the channel and while the channel closes: gRPC
        # crashes the process when a method is created on a closed channel.
        self._lock = threading.Lock()
        self._shared: SharedMemoryTransport | None = None  # shared_memory=True

    def _open_channel(self, options: list[tuple[str, object]]) -> grpc.Channel | grpc.aio.Channel:
        raise NotImplementedError

    def _session_transport(self) -> Self:
        """What a session's calls go through: the client itself, or, when the client
        spreads calls over several servers, a copy of it whose channel keeps to one server
        (picked at random), since the session lives on the server that created it."""
        if self._session_options is None:
            return self
        pinned = copy.copy(self)
        pinned._callables = {}
        pinned._lock = threading.Lock()
        pinned._session_options = None
        pinned._shared = None  # sessions never use shared memory; the owner's regions stay the owner's
        pinned._channel = self._open_channel(self._session_options)
        return pinned

    def _method(self, path: str) -> Callable[..., object]:
        fn = self._callables.get(path)
        if fn is None:  # bytes in, bytes out: the codec does the (de)serialization
            with self._lock:
                self._check_open()
                # _registered_method: gRPC's own generated code passes it; its stubs omit it.
                fn = self._callables[path] = self._channel.unary_unary(path, _registered_method=True)  # type: ignore[call-arg]
        return fn

    def _call_options(self, timeout: float | None, metadata: Pairs | None) -> dict[str, object]:
        """gRPC's keyword arguments for a call whose timeout and metadata were checked."""
        return {
            "timeout": self.timeout if timeout is None else timeout,
            "metadata": merge_metadata(self.metadata, metadata),
        }

    def _failure(self, exc: Exception) -> Exception:
        """The exception to raise for what the channel raised: a TensorOpsError (with the
        likely cause of a connection failure), or ClientClosedError when the channel was
        closed under the call."""
        if isinstance(exc, grpc.RpcError):
            return explain_connection_failure(from_rpc_error(exc), self._credentials is not None)
        return ClientClosedError() if self._closed else exc

    def _close_channel(self) -> bool:
        """Mark the client closed: True when this call did (its channel is then to close),
        False if it was closed already."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            return True

    @property
    def shared_memory(self) -> bool:
        """Whether calls may move their tensors through shared memory (asked for with
        `shared_memory=True`, and not refused by the server; see shared_memory_refusal)."""
        return self._shared is not None and self._shared.off_reason is None

    @property
    def shared_memory_refusal(self) -> str | None:
        """Why the server refused shared memory (calls then go over the wire), if it did."""
        return None if self._shared is None else self._shared.off_reason


class ClientOptions(TypedDict, total=False):
    """The keyword arguments of ClientBase, as Client and tensorops.aio.Client pass them on
    (described on ClientBase; a test holds the two lists together)."""

    timeout: float | None
    metadata: Metadata
    credentials: grpc.ChannelCredentials | None
    root_certificates: PEM | None
    certificate_chain: PEM | None
    private_key: PEM | None
    server_name_override: str | None
    token: str | None
    allow_insecure_token: bool
    max_message_bytes: int
    max_attempts: int
    options: ChannelOptions
    load_balancing: LoadBalancing | None


class Client(ClientBase[Float32Array, FloatArray, Float32Pair, UInt8Array, "QuantizedInnerProductSession"]):
    """Blocking client: `Client("localhost:50051")`, one method per operation (NumPy in,
    NumPy out), per-call `timeout` and `metadata`, errors as TensorOpsError subclasses.
    Thread-safe; use it as a context manager or call close(). After close(), every method
    (and those of its sessions) raises ClientClosedError, a ValueError.

    A connection failure with a likely cause (a plaintext client and a TLS server or the
    reverse, a certificate not trusted or missing) raises UnavailableError whose details
    name that cause first, then gRPC's own words.

    TLS: `Client("host:50051", root_certificates="ca.pem")`; mutual TLS adds
    `certificate_chain=` and `private_key=`; `token=` sends a bearer token (never over
    plaintext, but see allow_insecure_token). All keyword arguments are described on
    ClientBase.

    On the server's host, `shared_memory=True` moves the tensors of the stateless
    operations through POSIX shared memory (regions named `shared_memory_prefix`...,
    registered with the server's KServe endpoint; the server needs
    --allow-shared-memory), so that only a small message crosses the socket. Calls go
    over the wire whenever shared memory cannot serve them: small ones, and all of them
    once the server refused a region (see `shared_memory_refusal`). Calls whose tensors
    hold fewer than `shared_memory_min_bytes` (64 KiB) bytes always use the wire."""

    _channel: grpc.Channel

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        shared_memory: bool = False,
        shared_memory_prefix: str = "tensorops_",
        shared_memory_min_bytes: int = MIN_BYTES,
        **kwargs: Unpack[ClientOptions],
    ):
        super().__init__(target, **kwargs)
        self._channel = self._open_channel(self._options)
        self._shared = (
            SharedMemoryTransport(self._invoke, shared_memory_prefix, shared_memory_min_bytes)
            if shared_memory
            else None
        )

    def _open_channel(self, options: list[tuple[str, object]]) -> grpc.Channel:
        if self._credentials is None:
            return grpc.insecure_channel(self.target, options=options)
        return grpc.secure_channel(self.target, self._credentials, options=options)

    def close(self) -> None:
        """Release the shared-memory regions and the channel; every method then raises
        ClientClosedError. Closing again does nothing."""
        if self._closed:
            return
        if self._shared is not None:
            self._shared.close()
        if self._close_channel():
            self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _invoke(self, path: str, data: bytes, timeout: float | None = None, metadata: Pairs | None = None) -> bytes:
        try:
            return cast(bytes, self._method(path)(data, **self._call_options(timeout, metadata)))
        except (grpc.RpcError, ValueError) as exc:  # ValueError: the channel closed
            raise self._failure(exc) from None

    def _call(self, name: str, arguments: dict[str, object], timeout: float | None, metadata: Pairs) -> object:
        out = cast("np.ndarray | None", arguments.pop("out", None))
        if self._shared is not None:
            result = self._shared.call(name, arguments, timeout, metadata, out)
            if result is not NotImplemented:
                return result_into(out, result)
        op = wire.OPERATIONS[name]
        request = encode(op, arguments)
        raw = self._invoke(op.path, request.data, timeout, metadata)
        return result_into(out, wire.decode_response(op, raw, request.bf16_bits))

    @overload
    def shared_array(self, shape: Shape) -> Float32Array: ...

    @overload
    def shared_array(self, shape: Shape, dtype: type[Scalar] | np.dtype[Scalar]) -> ArrayOf[Scalar]: ...

    @overload
    def shared_array(self, shape: Shape, dtype: str) -> NamedArray: ...

    def shared_array(self, shape: Shape, dtype: DTypeChoice = np.float32) -> npt.NDArray[Any]:
        """A new (uninitialized) array in a shared-memory region of its own, registered with
        the server: as an input it is read where it is, and as `out=` it receives the result
        from the kernel, so a call copies no tensor at all (needs `shared_memory=True` and a
        server that accepts regions: else ValueError, see shared_memory_refusal). Its region
        is released when the array and every view of it are gone, or at close()."""
        self._check_open()
        if self._shared is None:
            raise ValueError("shared_array: the client was made without shared_memory=True")
        return self._shared.shared_array(shape, dtype, None, ())

    def _open_session(
        self, arguments: dict[str, object], timeout: float | None, metadata: Pairs
    ) -> QuantizedInnerProductSession:
        return QuantizedInnerProductSession(self, encode(wire.CREATE_SESSION, arguments).data, timeout, metadata)

    def info(self, *, timeout: Timeout = None, metadata: Metadata = None) -> ServerInfo:
        """The server's version, ISA level, CPU features, kernels, limits and operations."""
        checked_timeout, checked_metadata = self._begin(timeout, metadata)
        raw = self._invoke(wire.method_path("GetServerInfo"), b"", checked_timeout, checked_metadata)
        return server_info(tensorops_pb2.ServerInfo.FromString(raw))

    def list_sessions(self, *, timeout: Timeout = None, metadata: Metadata = None) -> list[SessionInfo]:
        """The server's quantized inner-product sessions (without their buffer sizes)."""
        checked_timeout, checked_metadata = self._begin(timeout, metadata)
        raw = self._invoke(wire.method_path("ListSessions"), b"", checked_timeout, checked_metadata)
        return [session_info(s) for s in tensorops_pb2.ListSessionsResponse.FromString(raw).sessions]


class ServerLimits(TypedDict):
    max_message_bytes: int
    max_tensor_bytes: int
    max_ndim: int
    max_sessions: int
    max_session_bytes: int
    session_ttl_seconds: float


class ServerInfo(TypedDict):
    """What Client.info() returns (the tensorops.v1 ServerInfo message)."""

    version: str
    isa: str
    cpu_features: list[str]
    kernels: dict[str, str]
    operations: list[str]
    workers: int
    worker: int
    threads: int
    instance: str
    limits: ServerLimits


class SessionInfo(TypedDict):
    """A session as the server describes it (the tensorops.v1 SessionInfo message)."""

    session_id: str
    info: str
    internal_buffer_size: int
    external_buffer_size: int
    m: int
    n: int
    k: int
    bytes: int
    idle_seconds: float
    forward_count: int
    max_m: int


def server_info(msg: tensorops_pb2.ServerInfo) -> ServerInfo:
    limits = msg.limits
    return {
        "version": msg.version,
        "isa": msg.isa,
        "cpu_features": list(msg.cpu_features),
        "kernels": dict(msg.kernels),
        "operations": list(msg.operations),
        "workers": msg.workers,
        "worker": msg.worker,
        "threads": msg.threads,
        "instance": msg.instance,
        "limits": {
            "max_message_bytes": limits.max_message_bytes,
            "max_tensor_bytes": limits.max_tensor_bytes,
            "max_ndim": limits.max_ndim,
            "max_sessions": limits.max_sessions,
            "max_session_bytes": limits.max_session_bytes,
            "session_ttl_seconds": limits.session_ttl_seconds,
        },
    }


def session_info(msg: tensorops_pb2.SessionInfo) -> SessionInfo:
    return cast(SessionInfo, {f.name: getattr(msg, f.name) for f in msg.DESCRIPTOR.fields})


# Any client, as a session sees its owner (the type parameters are only its results').
AnyClient = ClientBase[object, object, object, object, object]
T = TypeVar("T")


class SessionClosedError(TensorOpsError, ValueError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class SessionBase:
    """State shared by the blocking and asyncio sessions. The server's session id is the
    only handle; the parameters are kept (as the encoded create request) so the session
    can be re-created when the server no longer has it. Every call of the session carries
    its routing key (SESSION_KEY_HEADER), so that a balancer sends them all, re-creations
    included, to one replica."""

    def __init__(self, client: AnyClient, create_request: bytes):
        self._owner = client
        self._client = client._session_transport()  # what the session's calls go through
        self._create_request = create_request
        self._info: tensorops_pb2.SessionInfo | None = None
        self._closed = False
        self._routing_key = secrets.token_hex(16)

    @property
    def routing_key(self) -> str:
        """The random key sent as SESSION_KEY_HEADER with each call of this session."""
        return self._routing_key

    def _metadata(self, metadata: Pairs | None) -> Pairs:
        """Checked call metadata with the session's routing key in front."""
        return ((SESSION_KEY_HEADER, self._routing_key),) + tuple(metadata or ())

    def _begin(self, timeout: object, metadata: object) -> tuple[float | None, Pairs]:
        """What every method of an open session does first: checks, then the call's
        timeout and metadata (with the routing key)."""
        self._check_open()
        return check_timeout(timeout), self._metadata(check_metadata(metadata))

    @property
    def _created(self) -> tensorops_pb2.SessionInfo:
        """The server's answer to the session's creation, which comes before any other call."""
        assert self._info is not None, "the session is used before it was created"
        return self._info

    @property
    def session_id(self) -> str:
        return self._created.session_id

    @property
    def info(self) -> str:
        """The implementation the server selected (ISA and algorithm)."""
        return self._created.info

    @property
    def internal_buffer_size(self) -> int:
        return self._created.internal_buffer_size

    @property
    def recreated(self) -> int:
        """How many times the session was re-created after the server lost it."""
        return self._recreated

    _recreated = 0

    def _check_open(self) -> None:
        self._owner._check_open()
        if self._closed:
            raise SessionClosedError("the quantized inner-product session is closed")

    def _close_without_server(self) -> bool:
        """At close() of an open session whose client is closed: mark it closed without
        calling the server (True); False otherwise."""
        if self._closed or not self._owner._closed:
            return False
        self._closed = True
        return True

    def _forward_request(self, a: UInt8Input) -> wire.Request:
        return encode(wire.FORWARD_SESSION, {"session_id": self._created.session_id, "a": a})

    @staticmethod
    def _describe_request(session_id: str, m: int | None) -> bytes:
        request = tensorops_pb2.DescribeSessionRequest(session_id=session_id)
        if m is not None:
            request.m = m
        return request.SerializeToString()

    def __repr__(self) -> str:
        state = "closed" if self._closed else self._info.session_id if self._info else "new"
        return f"<{type(self).__name__} {state}>"


class QuantizedInnerProductSession(SessionBase):
    """A quantized inner-product context on the server (the remote twin of
    tensorops_native.QuantizedInnerProduct). If the server answers NOT_FOUND (restart,
    eviction, another replica), the session re-creates itself and retries the call once.
    Thread-safe."""

    _client: Client

    def __init__(
        self, client: Client, create_request: bytes, timeout: float | None = None, metadata: Pairs | None = None
    ):
        super().__init__(client, create_request)
        self._lock = threading.Lock()
        try:
            self._create(timeout, self._metadata(metadata))
        except BaseException:
            self._close_transport()
            raise

    def _close_transport(self) -> None:
        if self._client is not self._owner:
            self._client.close()

    def _create(self, timeout: float | None, metadata: Pairs) -> None:
        raw = self._client._invoke(wire.CREATE_SESSION.path, self._create_request, timeout, metadata)
        self._info = tensorops_pb2.SessionInfo.FromString(raw)

    def _recreate(self, lost_id: str, timeout: float | None, metadata: Pairs) -> None:
        with self._lock:
            if self._created.session_id == lost_id:  # another thread may have done it already
                self._create(timeout, metadata)
                self._recreated += 1

    def _retrying(self, call: Callable[[], T], timeout: float | None, metadata: Pairs) -> T:
        session_id = self._created.session_id
        try:
            return call()
        except NotFoundError:
            self._recreate(session_id, timeout, metadata)
            return call()

    def forward(self, a: UInt8Input, *, timeout: Timeout = None, metadata: Metadata = None) -> UInt8Array:
        """C = requantized A x B for a uint8 (M, K) array A; any M."""
        checked_timeout, checked_metadata = self._begin(timeout, metadata)
        op = wire.FORWARD_SESSION

        def call() -> UInt8Array:
            request = self._forward_request(a)
            raw = self._client._invoke(op.path, request.data, checked_timeout, checked_metadata)
            return cast(UInt8Array, wire.decode_response(op, raw))

        return self._retrying(call, checked_timeout, checked_metadata)

    def describe(self, m: int | None = None, *, timeout: Timeout = None, metadata: Metadata = None) -> SessionInfo:
        """The server's description of the session (sizes, use count, idle time)."""
        checked_timeout, checked_metadata = self._begin(timeout, metadata)

        def call() -> SessionInfo:
            raw = self._client._invoke(
                wire.method_path("DescribeSession"),
                self._describe_request(self._created.session_id, m),
                checked_timeout,
                checked_metadata,
            )
            return session_info(tensorops_pb2.SessionInfo.FromString(raw))

        return self._retrying(call, checked_timeout, checked_metadata)

    def external_buffer_size_for(self, m: int, *, timeout: Timeout = None, metadata: Metadata = None) -> int:
        """Scratch bytes the server needs for a forward of `m` rows."""
        return self.describe(m, timeout=timeout, metadata=metadata)["external_buffer_size"]

    def close(self, *, timeout: Timeout = None, metadata: Metadata = None) -> None:
        """Release the session on the server (an unknown session counts as released). After
        its client closed, the session is only marked closed (the server drops it after
        its idle time)."""
        if self._close_without_server():
            self._close_transport()
        if self._closed:
            return
        checked_timeout, checked_metadata = self._begin(timeout, metadata)
        self._closed = True
        request = tensorops_pb2.ReleaseSessionRequest(session_id=self._created.session_id).SerializeToString()
        try:
            self._client._invoke(wire.method_path("ReleaseSession"), request, checked_timeout, checked_metadata)
        except NotFoundError:
            pass
        finally:
            self._close_transport()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

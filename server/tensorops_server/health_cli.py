"""`tensorops-health`: ask a server's gRPC health service (grpc.health.v1.Health/Check)
whether it is serving. Prints the status and exits 0 on SERVING, 1 on anything else
(NOT_SERVING while the server drains, SERVICE_UNKNOWN, or an RPC error such as
UNAVAILABLE when nothing listens), 2 on a usage error.

For container health checks (the image's HEALTHCHECK runs it) and for operators:

    tensorops-health                                   # localhost:$TENSOROPS_PORT (50051)
    tensorops-health --address 10.0.0.7:50051 --service tensorops.v1.TensorOps
    tensorops-health --address api.example:443 --ca ca.pem [--cert c.pem --key k.pem]

Every flag can also be set as TENSOROPS_HEALTH_<FLAG> (TENSOROPS_HEALTH_ADDRESS, ...);
a flag wins over the variable. Health checks need no bearer token (the server exempts
them), so none is sent.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .config import _bool, _number

ENV_PREFIX = "TENSOROPS_HEALTH_"
OK, NOT_OK, USAGE = 0, 1, 2


def default_address(environ) -> str:
    port = environ.get("TENSOROPS_PORT", "") or "50051"
    return f"localhost:{port}"


def parser(environ) -> argparse.ArgumentParser:
    def variable(flag: str) -> str:
        return ENV_PREFIX + flag.upper().replace("-", "_")

    def add(group, flag: str, help_text: str, default=None, shown_default: str | None = None, **kwargs):
        """--flag, defaulting to its variable, then to `default`; --help names both."""
        shown = f", default {shown_default}" if shown_default else ""
        group.add_argument(
            "--" + flag,
            default=environ.get(variable(flag), "") or default,
            help=f"{help_text} [{variable(flag)}{shown}]",
            **kwargs,
        )

    p = argparse.ArgumentParser(
        prog="tensorops-health",
        description="Check a tensorops server through the gRPC health service: exit 0 if it is SERVING, "
        "1 otherwise. Every flag can also be set as TENSOROPS_HEALTH_<FLAG>.",
    )
    add(
        p,
        "address",
        "host:port of the server",
        default_address(environ),
        "localhost:$TENSOROPS_PORT, else localhost:50051",
    )
    seconds = _number(float, lambda value: value > 0, " of seconds > 0")
    add(p, "timeout", "seconds to wait for the answer, connection included", "3", "3", type=seconds)
    add(
        p,
        "service",
        "service to ask about: empty (the default) is the whole server, tensorops.v1.TensorOps the operations",
        "",
    )
    tls = p.add_argument_group("TLS (any of these makes the connection TLS)")
    try:
        tls_default = _bool(environ.get(variable("tls"), "") or "false")
    except argparse.ArgumentTypeError as exc:  # the server's rule: a wrong word is no silent false
        p.error(f"{variable('tls')}: {exc}")
    tls.add_argument(
        "--tls",
        action="store_true",
        default=tls_default,
        help=f"use TLS with the system's root certificates [{variable('tls')}]",
    )
    add(tls, "ca", "PEM file of the CAs the server's certificate must chain to")
    add(tls, "cert", "PEM client certificate chain, for mutual TLS")
    add(tls, "key", "PEM private key of --cert")
    add(tls, "server-name", "name expected in the server's certificate instead of the address's host")
    return p


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def check(
    address: str,
    *,
    timeout: float = 3.0,
    service: str = "",
    credentials: grpc.ChannelCredentials | None = None,
    options=(),
) -> str:
    """The status name the server reports for `service` (e.g. "SERVING"); grpc.RpcError
    when the call fails."""
    if credentials is None:
        channel = grpc.insecure_channel(address, options=list(options))
    else:
        channel = grpc.secure_channel(address, credentials, options=list(options))
    with channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def main(argv=None, environ=None) -> int:
    environ = os.environ if environ is None else environ
    p = parser(environ)
    args = p.parse_args(argv)
    if bool(args.cert) != bool(args.key):
        p.error("--cert and --key go together")
    credentials, options = None, []
    if args.tls or args.ca or args.cert:
        try:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(args.ca), private_key=_read(args.key), certificate_chain=_read(args.cert)
            )
        except OSError as exc:
            print(f"cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
            return USAGE
        if args.server_name:
            options.append(("grpc.ssl_target_name_override", args.server_name))
    label = f"{args.address}" + (f" {args.service}" if args.service else "")
    try:
        status = check(
            args.address, timeout=args.timeout, service=args.service, credentials=credentials, options=options
        )
    except grpc.RpcError as exc:
        details = (exc.details() or "").splitlines()[0] if exc.details() else ""
        print(f"{label}: {exc.code().name}" + (f": {details}" if details else ""))
        return NOT_OK
    print(f"{label}: {status}")
    return OK if status == "SERVING" else NOT_OK


if __name__ == "__main__":
    sys.exit(main())
